"""Register tiles that fill the GPU: a plan's 2-D tiled kernels over few points (a pyramid's
coarse levels) get smaller tiles, so that their grids offer every multiprocessor enough
threads to hide memory latency (:func:`kfuse.schedule.tiles.filling_tile`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from math import prod

from kfuse.fusion.plan import FusionPlan
from kfuse.model.device import DeviceProfile
from kfuse.schedule import tiles
from kfuse.schedule.forms import Tiled


def filled_plan(plan: FusionPlan, sizes: Mapping[str, int], profile: DeviceProfile
                ) -> FusionPlan:
    """``plan`` with each 2-D tiled group's register tile shrunk where its grid would give
    the device's multiprocessors fewer than :data:`~kfuse.schedule.tiles.FILL_THREADS_PER_SM`
    threads each (arithmetic-bound groups keep their narrow tiles); the group's reason says
    so."""
    graph = plan.graph
    groups = []
    for group in plan.groups:
        kernels = [graph.kernel_by_name[name] for name in group.members]
        domain = kernels[-1].domain
        if isinstance(group.form, Tiled) and len(domain) == 2 and \
                not tiles.is_arithmetic_heavy(kernels) and all(s in sizes for s in domain):
            tile = group.form.register_tile(kernels, len(domain))
            points = prod(sizes[s] for s in domain)
            fitted = tiles.filling_tile(tile, points, profile.sm_count)
            if fitted != tile:
                why = (f"a {'x'.join(map(str, fitted))} register tile: "
                       f"{'x'.join(map(str, tile))} would give {points // prod(tile)} "
                       f"threads, too few to fill {profile.sm_count} multiprocessors")
                group = replace(group, form=replace(group.form, tile=fitted),
                                reason=f"{group.reason}; {why}" if group.reason else why)
        groups.append(group)
    return replace(plan, groups=tuple(groups))
