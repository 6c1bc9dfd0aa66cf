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

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

from kfuse import config
from kfuse.cache import cache_dir, code_digest, mark_used, writable_cache_dir, write_atomically
from kfuse.errors import CacheError, CompileError
from kfuse.fusion.legality import Violation, resource_violation
from kfuse.ir.alone import GroupAlone, group_alone
from kfuse.ir.fingerprint import digest
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import Form, GroupSchedule, Tiled, as_form, default_form, group_ndim
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
    tiles = [named] if named else tile_choices(form.name, group_ndim(graph, members))
    if len(members) < 2 or not lowering().measures():
        return tiles[0], None
    # (groups alike up to names fit alike: the pairs of a chain of one stencil compile once)
    fixed = None if sizes is None else tuple(sorted(sizes.items()))
    alone = graph.remembered(("group alone", tuple(members), tuple(outputs), fixed),
                             lambda: group_alone(graph, members, outputs, sizes))
    if getattr(form, "order", ()):
        form = replace(form, order=tuple(alone.kernel_name(name) for name in form.order))
    key = ("fitting tile", alone.graph.fingerprint, alone.members, alone.outputs, form,
           alone.sizes)
    return graph.remembered(  # (the search and make_plan ask for the same groups)
        key, lambda: _stored_fit(alone, form, tuple(tiles)))


FIT_FORMAT = 2  # of the fits stored on disk


def _stored_fit(alone: GroupAlone, form: Form, tiles: tuple[tuple[int, ...] | None, ...]
                ) -> tuple[tuple[int, ...] | None, Violation | None]:
    """:func:`_fitting_tile`, kept on disk (``fits/``) under a key of what decides it: the
    group alone (:mod:`kfuse.ir.alone`), its form, the sizes, kfuse's code, the switches of
    code generation and the compiler. Generating a long chain's kernels takes seconds even
    where the compiler's figures are cached; a plan made again reads its answers here."""
    sizes = None if alone.sizes is None else dict(alone.sizes)
    arguments = (alone.graph, alone.members, alone.outputs, form, tiles, sizes)
    measurer = lowering().measurer()
    if measurer is None:  # figures from a stand-in for the compiler: not kept
        return _fitting_tile(*arguments)
    key = digest((FIT_FORMAT, code_digest(), measurer, config.current().key(),
                  alone.graph.fingerprint, alone.members, alone.outputs, form, tiles,
                  alone.sizes))
    path = cache_dir("fits") / f"{key}.json"
    try:
        stored = json.loads(path.read_text())
        tile = None if stored["tile"] is None else tuple(stored["tile"])
        violation = None if stored["violation"] is None else Violation(*stored["violation"])
        mark_used(path)
        return tile, violation
    except (OSError, ValueError, KeyError, TypeError):
        pass  # never stored, or unreadable: measured again
    tile, violation = _fitting_tile(*arguments)
    record = {"tile": None if tile is None else list(tile),
              "violation": None if violation is None else [violation.rule, violation.reason]}
    try:
        write_atomically(writable_cache_dir("fits") / f"{key}.json", json.dumps(record))
    except (CacheError, OSError):
        pass  # a cache that cannot be written is only not used
    return tile, violation


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
