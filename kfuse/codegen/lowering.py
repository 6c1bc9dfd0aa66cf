"""Code generation as planning asks for it (:mod:`kfuse.schedule.lowering`): one group's
kernel, the compiler's figures for it, and the order the kernels of a program visit their
blocks in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod

from kfuse.codegen import resources
from kfuse.codegen.generate import generate, lower_group, resizes
from kfuse.codegen.prelude import PRELUDE
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import GroupSchedule
from kfuse.schedule.lowering import KernelFigures, LaunchShape, LoweredKernel


class CodegenLowering:
    """The :class:`~kfuse.schedule.lowering.Lowering` of :mod:`kfuse.codegen`."""

    def lower(self, graph: Graph, group: GroupSchedule,
              fixed_sizes: Mapping[str, int] | None) -> LoweredKernel:
        program = generate(graph, [group], fixed_sizes=fixed_sizes)
        (launch,) = program.launches
        return LoweredKernel(program.source, launch.symbol, launch.dynamic_shared_bytes)

    def measures(self) -> bool:
        return resources.nvcc_available()

    def measurer(self) -> str | None:
        if resources.kernel_resources is not resources.COMPILER_FIGURES:
            return None  # a stand-in measures: its answers are not kept
        return f"nvcc {resources.nvcc_version()}"

    def figures(self, kernel: LoweredKernel) -> KernelFigures | None:
        found = resources.kernel_resources(kernel.source).get(kernel.symbol)
        if found is None:
            return None
        return KernelFigures(found.registers, found.shared_bytes, found.spill_store_bytes)

    def last_first(self, graph: Graph, groups: Sequence[GroupSchedule]) -> tuple[str, ...]:
        return generate(graph, groups).last_first

    def launch_shape(self, graph: Graph, group: GroupSchedule, sizes: Mapping[str, int],
                     threads: int | None = None) -> LaunchShape:
        kernel, launch = lower_group(graph, group, threads=threads)
        source = "\n".join([PRELUDE, "typedef int kf_index_t;", *kernel.lines()])
        return LaunchShape(prod(launch.block), prod(launch.grid_size(sizes)),
                           launch.dynamic_shared_bytes,
                           LoweredKernel(source, launch.symbol, launch.dynamic_shared_bytes))

    def resizes(self, graph: Graph, group: GroupSchedule) -> bool:
        return resizes(graph, group)
