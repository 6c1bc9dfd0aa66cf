"""Which stream each kernel of a program launches on (Qiao 2021, §4: the multi-stream model).

Kernels with no path between them (the program's groups that read nothing another of them
writes, directly or through others) may run at once. Kernels are grouped by level (the
longest chain of kernels before them: one level's kernels are independent); for a level of
several, the wave model (:func:`kfuse.model.waves.decide`) says whether separate streams
pay, and if so its kernels go on the caller's stream and side streams, joined by events
where a kernel reads what another stream's kernel wrote. Every call forks the side streams
from the caller's stream and joins them back at its end, so calls stay ordered on the
caller's stream as a whole (and a CUDA graph captured from the call holds the branches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from math import prod

from kfuse.analysis.order import independent_sets
from kfuse.codegen.program import LaunchSpec, Program
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile
from kfuse.model.waves import Concurrency, KernelShape, decide


@dataclass(frozen=True)
class StreamSchedule:
    """Per launch: its stream (0: the caller's, then side streams), and the earlier launches
    on other streams it waits for; the wave model's decisions, level by level."""

    streams: tuple[int, ...]
    waits: tuple[tuple[int, ...], ...]
    decisions: tuple[Concurrency, ...] = ()

    @property
    def side_streams(self) -> int:
        """How many streams besides the caller's the schedule uses."""
        return max(self.streams, default=0)

    @cached_property
    def recorded(self) -> frozenset[int]:
        """Launches that another stream waits for (an event is recorded after each)."""
        return frozenset(j for waits in self.waits for j in waits)

    def explain(self) -> str:
        """One line per level of independent kernels: concurrent or not, and why."""
        if not self.decisions:
            return "no kernels without a path between them: one stream"
        return "\n".join(
            f"{', '.join(d.kernels)}: {'separate streams' if d.concurrent else 'one stream'}"
            f" ({d.reason})" for d in self.decisions)


def one_stream(program: Program) -> StreamSchedule:
    """Every launch on the caller's stream."""
    count = len(program.launches)
    return StreamSchedule((0,) * count, ((),) * count)


def launch_dependencies(launches: Sequence[LaunchSpec]) -> dict[int, set[int]]:
    """For each launch, the earlier launches that write a buffer it reads."""
    writer: dict[str, int] = {}
    dependencies: dict[int, set[int]] = {}
    for index, spec in enumerate(launches):
        dependencies[index] = {writer[p.ref] for p in spec.params
                               if p.role == "input" and p.ref in writer}
        for param in spec.params:
            if param.role == "output":
                writer[param.ref] = index
    return dependencies


def schedule(program: Program, shape_of: Callable[[int, LaunchSpec], KernelShape],
             profile: DeviceProfile, always: bool = False) -> StreamSchedule:
    """The streams of ``program``'s launches: levels of independent launches go on
    separate streams where :func:`kfuse.model.waves.decide` predicts it pays, or
    ``always`` (``shape_of(index, spec)``: the launch's blocks, resources and predicted
    time)."""
    launches = program.launches
    dependencies = launch_dependencies(launches)
    streams = [0] * len(launches)
    decisions = []
    for level in independent_sets(dependencies, len(launches)):
        if len(level) < 2:
            continue
        decision = decide([shape_of(i, launches[i]) for i in level], profile,
                          profile.notes.get("event_overhead_s"),
                          profile.notes.get("concurrency_slowdown"))
        if always and not decision.concurrent:
            decision = replace(decision, concurrent=True,
                               reason=f"asked for (streams=True); the model: {decision.reason}")
        decisions.append(decision)
        if decision.concurrent:
            for stream, index in enumerate(level):
                streams[index] = stream
    waits = tuple(tuple(sorted(j for j in dependencies[i] if streams[j] != streams[i]))
                  for i in range(len(launches)))
    return StreamSchedule(tuple(streams), waits, tuple(decisions))


def predicted_seconds(graph: Graph, spec: LaunchSpec, sizes: Mapping[str, int],
                      profile: DeviceProfile) -> float:
    """The roofline model's time of one launch alone (its operators and outputs)."""
    from kfuse.model.roofline import predict_group

    outputs = tuple(p.ref for p in spec.params if p.role == "output")
    try:
        return predict_group(graph, spec.operators, outputs, sizes, profile).time_s
    except (KeyError, ValueError, TypeError):  # a kernel form the roofline does not cover:
        moved = sum(graph.nbytes(p.ref, sizes) for p in spec.params  # its bytes at the
                    if p.role in ("input", "output"))               # copy bandwidth
        return moved / profile.copy_bandwidth_bytes_per_s + profile.launch_overhead_s


def kernel_shape(graph: Graph, spec: LaunchSpec, sizes: Mapping[str, int],
                 profile: DeviceProfile, grid: tuple[int, int, int], registers: int,
                 static_shared_bytes: int) -> KernelShape:
    """A launch as the wave model sees it."""
    return KernelShape(spec.symbol, prod(grid), prod(spec.block), registers,
                       static_shared_bytes + spec.dynamic_shared_bytes,
                       predicted_seconds(graph, spec, sizes, profile))
