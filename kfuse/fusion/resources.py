"""Resource legality of a fused group: shared memory per block and registers per thread.

With ``nvcc`` on PATH the group's kernel is generated and compiled for sm_90 and the
ptxas figures decide (seed 000 constraints 1.6 and 1.7); without it only the shared
memory the generator itself allocates is checked. Where the sizes are known the kernel is
compiled for them, as the cuda backend runs it (a kernel compiled for any size keeps more
values in registers: diffusion3d's 8 x 2 x 4 tile with constant borders spills 60 bytes
for any size, 24 at 512³). Results are cached on disk by source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kfuse.codegen.program import Program
from kfuse.fusion.legality import Violation, resource_violation
from kfuse.ir.graph import Graph


def group_resource_violation(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                             variant: str, sizes: Mapping[str, int] | None = None
                             ) -> Violation | None:
    """Why the group's kernel would not fit the device with any register tile, or None
    (compiled for ``sizes`` where given)."""
    return fitting_tile(graph, members, outputs, variant, sizes)[1]


# Kernels longer than this (lines of CUDA C) take seconds to minutes to compile: for them the
# smallest tile is compiled first, and where it does not fit no tile is tried (registers grow
# with the tile; a chain of six 5-point stencils fused: 15,800 lines, a minute of ptxas).
LARGE_KERNEL_LINES = 6000


def fitting_tile(graph: Graph, members: Sequence[str], outputs: Sequence[str], variant: str,
                 sizes: Mapping[str, int] | None = None
                 ) -> tuple[tuple[int, ...] | None, Violation | None]:
    """(the largest register tile whose kernel fits the device, None) or (None, why not);
    the kernels compiled for ``sizes`` where given, else for any size.

    Without nvcc nothing is measured: the default tile, no violation.
    """
    from kfuse.codegen.kernels import tile_choices
    from kfuse.codegen.resources import nvcc_available

    tiles = tile_choices(variant, graph.kernel_by_name[members[0]].ndim)
    if len(members) < 2 or not nvcc_available():
        return tiles[0], None
    key = ("fitting tile", tuple(members), tuple(outputs), variant,
           None if sizes is None else tuple(sorted(sizes.items())))
    return graph.remembered(  # (the search and make_plan ask for the same groups)
        key, lambda: _fitting_tile(graph, members, outputs, variant, tiles, sizes))


def _fitting_tile(graph: Graph, members: Sequence[str], outputs: Sequence[str], variant: str,
                  tiles: Sequence[tuple[int, ...] | None], sizes: Mapping[str, int] | None
                  ) -> tuple[tuple[int, ...] | None, Violation | None]:
    largest = _program(graph, members, outputs, variant, tiles[0], sizes)
    checked: dict[tuple[int, ...] | None, Violation | None] = {}  # each tile generated once

    def violation_of(tile: tuple[int, ...] | None) -> Violation | None:
        if tile not in checked:
            program = largest if tile == tiles[0] else _program(graph, members, outputs,
                                                                variant, tile, sizes)
            checked[tile] = _violation(program)
        return checked[tile]

    if len(tiles) > 1 and largest.source.count("\n") > LARGE_KERNEL_LINES:
        violation = violation_of(tiles[-1])
        if violation is not None:
            return None, violation
    violation = None
    for tile in tiles:
        violation = violation_of(tile)
        if violation is None:
            return tile, None
    return None, violation


def _program(graph: Graph, members: Sequence[str], outputs: Sequence[str], variant: str,
             tile: tuple[int, ...] | None, sizes: Mapping[str, int] | None) -> Program:
    """The group's kernel alone with register tile ``tile``."""
    from kfuse.codegen import generate

    return generate(graph, [(tuple(members), tuple(outputs), variant, tile)],
                    fixed_sizes=sizes)


def _violation(program: Program) -> Violation | None:
    """Why the program's one kernel does not fit the device (ptxas figures), or None."""
    from kfuse.codegen.resources import kernel_resources
    from kfuse.errors import CompileError

    try:
        figures = kernel_resources(program.source)
    except CompileError as error:
        return Violation("resources", f"the fused kernel does not compile: {error}")
    (launch,) = program.launches
    found = figures.get(launch.symbol)
    if found is None:
        return None
    return resource_violation(found.registers, found.shared_bytes + launch.dynamic_shared_bytes,
                              found.spill_store_bytes)
