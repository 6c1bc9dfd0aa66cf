"""Does where the output lies in device memory change a streaming kernel's time? (GPU
experiment)

kfuse and torch.compile read the very same input arrays in ``interleaved_bench.py``, but
each writes its own output buffer (kfuse allocates its own; torch.compile's comes from
PyTorch's caching allocator). Here kfuse's planned program writes its outputs into views of
fresh allocations at several byte offsets, each timed in alternating rounds beside
torch.compile; and torch.compile is also given inputs at other offsets (copies).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/placement_experiment.py [app ...] [--rounds 3]
"""

from __future__ import annotations

from kfuse.bench.experiment import device_case
from kfuse.cli.arguments import alternating_main
from kfuse.runtime import get_backend
from kfuse.tune.timing import print_rounds, time_alternating

OFFSETS = (0, 256, 4096, 65536, 1 << 20, 3 << 20)   # bytes


def shifted(cupy, like, offset: int):
    """A view like ``like`` (same shape and dtype) starting ``offset`` bytes into a fresh
    allocation."""
    raw = cupy.empty(like.nbytes + offset, dtype=cupy.uint8)
    return raw[offset:offset + like.nbytes].view(like.dtype).reshape(like.shape)


def compare(name: str, rounds: int, runs: int) -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    case = device_case(name)
    graph, given, plan = case.graph, case.given, case.plan
    runs_by_label = {}
    for offset in OFFSETS:
        executable = get_backend("cuda").prepare(graph, given, plan=plan)
        moved = {output: shifted(cupy, executable.buffers[output], offset)
                 for output in graph.outputs}
        executable.check_alignment(moved)  # the program may be compiled for aligned arrays
        executable.buffers.update(moved)
        executable.launch_all()
        runs_by_label[f"kfuse out+{offset}"] = executable.launch_all
    for offset in OFFSETS[:3]:
        copies = {}
        for key, value in given.items():
            copies[key] = value
            if not isinstance(value, float):
                copies[key] = shifted(cupy, value, offset)
                copies[key][...] = value
        runs_by_label[f"compile in+{offset}"] = compiled_on(graph, copies)
    print_rounds(name, time_alternating(runs_by_label, rounds, repeat=runs),
                 "compile in+0")


def main() -> None:
    alternating_main(__doc__.splitlines()[0], compare, ("vadd", "madd", "sgemv"))


if __name__ == "__main__":
    main()
