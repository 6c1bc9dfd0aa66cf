"""What the GPU experiment scripts share: an app on the device, named variants of one of its
groups, and programs run and checked against the planned one (``experiments/``,
``benchmarks/``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kfuse.bench.harness import app_plan
from kfuse.errors import KfuseError
from kfuse.ir.expr import HALF_DTYPES
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import MapReduceVariant, group_schedule


@dataclass(frozen=True)
class DeviceCase:
    """An app at its benchmark size on the GPU: random float32 inputs on the device (seeded)
    with its parameters, the sizes they bind, and the plan ``kfuse bench`` runs."""

    app: Any
    graph: Graph
    given: dict[str, Any]
    sizes: dict[str, int]
    plan: Any


def device_case(name: str, seed: int = 0, size: tuple[int, ...] | None = None,
                boundary: object = None, dtype: str = "float32") -> DeviceCase:
    """:class:`DeviceCase` of the app ``name`` at ``size`` (default: its benchmark size) with
    ``boundary`` (default: the app's own) in ``dtype`` (apps that take one; CuPy holds no
    bfloat16; needs CuPy and a GPU)."""
    import cupy

    from kfuse.apps import get_app

    app = get_app(name)
    options = {"boundary": boundary} if boundary is not None else {}
    if dtype != "float32":
        options["dtype"] = dtype
    graph = app.build(**options).graph()
    arrays, params = app.make_inputs(size or app.bench_size, np.random.default_rng(seed),
                                     dtype)
    given = {key: cupy.asarray(value) for key, value in arrays.items()} | dict(params)
    sizes = graph.bind_shapes({key: value.shape for key, value in arrays.items()})
    return DeviceCase(app, graph, given, sizes, app_plan(app, graph, sizes))


def planned_run(case: DeviceCase, backend: Any) -> tuple[Any, dict[str, Any]]:
    """The planned program prepared on ``backend`` and run once on ``case``'s inputs, and a
    copy of its outputs (what other programs are checked against)."""
    executable = backend.prepare(case.graph, case.given, plan=case.plan)
    executable.launch_all()
    return executable, {o: executable.buffers[o].copy() for o in case.graph.outputs}


def normalized_variants(group: Any, texts: Iterable[str], name: str) -> list[str]:
    """The variant strings ``texts`` as ``group`` (a map-reduce group) runs them, in order and
    without repeats; those that do not apply to it are skipped with a printed reason."""
    result: list[str] = []
    for text in texts:
        try:
            normal = group.normalize(MapReduceVariant.parse(text)).text()
        except KfuseError as error:
            print(f"{name}: skipped {text}: {error}", flush=True)
            continue
        if normal not in result:
            result.append(normal)
    return result


def masked_only(source: str) -> str:
    """Timing only: the straight passes of map-reduce kernels turned off (``kf_full`` false:
    every tile or chunk through the masked accesses, as before sessions 10 and 11)."""
    import re

    return re.sub(r"const bool kf_full = [^;]*;", "const bool kf_full = false;", source)


def largest_error(buffers: Mapping[str, Any], expected: Mapping[str, Any]) -> float:
    """The largest ``max|out - expected| / max|expected|`` over the outputs in ``expected``
    (CuPy arrays)."""
    import cupy

    return max(float(cupy.abs(buffers[o] - expected[o]).max() / cupy.abs(expected[o]).max())
               for o in expected)


def run_checked(backend: Any, case: DeviceCase, program: Any, expected: Mapping[str, Any],
                buffers_of: Any = None) -> tuple[Any, float, str]:
    """(executable, largest relative error of any output against ``expected``, registers of
    each kernel as ``a/b/c``, with its local memory where it has any) of ``program`` run once
    on ``case``'s inputs (``buffers_of``: an executable whose buffers it shares)."""
    executable = backend.prepare(case.graph, case.given, program=program,
                                 buffers_of=buffers_of)
    executable.launch_all()
    error = largest_error(executable.buffers, expected)
    registers = "/".join(f"{f.num_regs}" + (f" ({f.local_size_bytes} B local)"
                                            if f.local_size_bytes else "")
                         for f in executable.functions.values())
    return executable, error, registers


def planned_program(case: DeviceCase) -> Any:
    """The program of ``case``'s plan compiled for its sizes, as the cuda backend builds it
    for the aligned arrays CuPy allocates (what the source-patch experiments start from)."""
    from kfuse.codegen import generate
    from kfuse.runtime.backend import VECTOR_ALIGNMENT

    return generate(case.graph, case.plan.kernel_groups, fixed_sizes=case.sizes,
                    array_alignment=VECTOR_ALIGNMENT)


def time_sources(case: DeviceCase, programs: Mapping[str, Any], rounds: int,
                 runs: int) -> None:
    """Each of ``programs`` (labelled; ``case``'s program patched or regenerated) run once
    and checked against the planned program's outputs, then the agreeing ones timed in
    alternating rounds beside torch.compile (timing experiments on source patches)."""
    from kfuse.bench.torch_baseline import compiled_on
    from kfuse.runtime import get_backend
    from kfuse.tune.timing import print_rounds, time_alternating

    name = case.app.name
    backend = get_backend("cuda")
    _, expected = planned_run(case, backend)
    # (programs of two-byte floats may round an intermediate the other way)
    halves = any(case.graph.buffers[n].dtype in HALF_DTYPES for n in case.graph.inputs)
    tolerance = 1e-2 if halves else 1e-6
    labels = {"compile": compiled_on(case.graph, case.given)}
    for label, program in programs.items():
        executable, error, registers = run_checked(backend, case, program, expected)
        print(f"{name} {label}: error {error:.1e}, registers {registers}", flush=True)
        if error < tolerance:
            labels[label] = executable.launch_all
    print_rounds(name, time_alternating(labels, rounds, repeat=runs), "compile")


def studied_group(groups: Sequence[Any]) -> int:
    """Index of the group (a :class:`~kfuse.schedule.GroupSchedule` or a tuple of members,
    outputs and form) that runs a stream variant (else the first map-reduce one, else the
    first)."""
    forms = [group_schedule(group).form for group in groups]
    indices = [i for i, form in enumerate(forms) if isinstance(form, MapReduceVariant)]
    streams = [i for i in indices if forms[i].rowsum == "stream"]  # type: ignore[union-attr]
    return (streams or indices or [0])[0]


__all__ = ["DeviceCase", "device_case", "largest_error", "masked_only", "normalized_variants",
           "planned_program", "planned_run", "run_checked", "studied_group", "time_sources"]

