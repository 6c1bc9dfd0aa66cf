"""Resource legality of a fused group: shared memory per block and registers per thread.

With ``nvcc`` on PATH the group's kernel is generated (through the lowering that code
generation installs, :mod:`kfuse.schedule.lowering`) and compiled for sm_90, and the ptxas
figures decide (Wahib & Maruyama 2014, constraints 1.6 and 1.7); without it nothing is
checked here. Where the sizes are known the kernel is compiled for them, as the cuda backend
runs it (a kernel compiled for any size keeps more values in registers: diffusion3d's
8 x 2 x 4 tile with constant borders spills 60 bytes for any size, 24 at 512³). Results are
cached on disk by source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from kfuse.errors import CompileError
from kfuse.fusion.legality import Violation, resource_violation
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import Form, GroupSchedule, Tiled, as_form, default_form
from kfuse.schedule.lowering import LoweredKernel, lowering
from kfuse.schedule.tiles import tile_choices


def group_resource_violation(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                             form: Form | str, sizes: Mapping[str, int] | None = None
                             ) -> Violation | None:
    """Why the group's kernel would not fit the device with any register tile, or None
    (compiled for ``sizes`` where given)."""
    return fitting_tile(graph, members, outputs, form, sizes)[1]


# Kernels longer than this (lines of CUDA C) take seconds to minutes to compile: for them the
# smallest tile is compiled first, and where it does not fit no tile is tried (registers grow
# with the tile; a chain of six 5-point stencils fused: 15,800 lines, a minute of ptxas).
LARGE_KERNEL_LINES = 6000


def fitting_tile(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                 form: Form | str, sizes: Mapping[str, int] | None = None
                 ) -> tuple[tuple[int, ...] | None, Violation | None]:
    """(the largest register tile whose kernel fits the device, None) or (None, why not);
    the kernels compiled for ``sizes`` where given, else for any size. A form that names
    its own tile is checked with that tile only.

    Without nvcc nothing is measured: the default tile, no violation.
    """
    form = as_form(form) or default_form(graph, members)
    named = getattr(form, "tile", None)  # a form that names its tile is checked with it alone
    tiles = [named] if named else tile_choices(form.name, graph.kernel_by_name[members[0]].ndim)
    if len(members) < 2 or not lowering().measures():
        return tiles[0], None
    key = ("fitting tile", tuple(members), tuple(outputs), form,
           None if sizes is None else tuple(sorted(sizes.items())))
    return graph.remembered(  # (the search and make_plan ask for the same groups)
        key, lambda: _fitting_tile(graph, members, outputs, form, tiles, sizes))


def _fitting_tile(graph: Graph, members: Sequence[str], outputs: Sequence[str], form: Form,
                  tiles: Sequence[tuple[int, ...] | None], sizes: Mapping[str, int] | None
                  ) -> tuple[tuple[int, ...] | None, Violation | None]:
    largest = _kernel(graph, members, outputs, form, tiles[0], sizes)
    checked: dict[tuple[int, ...] | None, Violation | None] = {}  # each tile generated once

    def violation_of(tile: tuple[int, ...] | None) -> Violation | None:
        if tile not in checked:
            kernel = largest if tile == tiles[0] else _kernel(graph, members, outputs, form,
                                                              tile, sizes)
            checked[tile] = _violation(kernel)
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


def _kernel(graph: Graph, members: Sequence[str], outputs: Sequence[str], form: Form,
            tile: tuple[int, ...] | None, sizes: Mapping[str, int] | None) -> LoweredKernel:
    """The group's kernel alone with register tile ``tile`` (None: the form as it is)."""
    if isinstance(form, Tiled):
        form = replace(form, tile=tile)
    return lowering().lower(graph, GroupSchedule(tuple(members), tuple(outputs), form), sizes)


def _violation(kernel: LoweredKernel) -> Violation | None:
    """Why the kernel does not fit the device (the compiler's figures), or None."""
    try:
        figures = lowering().figures(kernel)
    except CompileError as error:
        return Violation("resources", f"the fused kernel does not compile: {error}")
    if figures is None:
        return None
    return resource_violation(figures.registers,
                              figures.shared_bytes + kernel.dynamic_shared_bytes,
                              figures.spill_store_bytes)
