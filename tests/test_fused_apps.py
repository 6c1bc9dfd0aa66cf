"""Every app fused (the default plan, and everything in one kernel where legal) equals the
reference on the cpu backend, for every boundary mode; the staged (shared-memory) variant
is exercised on several tiles, partial tiles and images smaller than one tile."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app, list_apps
from kfuse.apps.check import reference_errors, relative_error

BOUNDARIES = ["clamp", "mirror", "repeat", kf.constant(0.5)]


def check_app(name: str, boundary, plan_kind: str, size=None) -> str:
    app = get_app(name)
    pipeline = app.build(boundary=boundary)
    arrays, params = app.make_inputs(size or app.test_size, np.random.default_rng(3), "float32")
    if plan_kind == "all":
        plan = pipeline.fuse([[k.name for k in pipeline.graph().kernels]])
    else:
        plan = pipeline.plan()
    outputs = pipeline.run(backend="cpu", plan=plan, **arrays, **params)
    errors = reference_errors(app, arrays, params, outputs, boundary)
    assert max(errors.values()) <= 1e-5, errors
    return plan.groups[-1].variant


def harris_case(size, boundary, seed):
    """Harris's graph, random inputs of ``size`` and the float64 reference outputs."""
    app = get_app("harris")
    graph = app.build(boundary=boundary).graph()
    arrays, params = app.make_inputs(size, np.random.default_rng(seed), "float32")
    reference = app.reference({k: v.astype(np.float64) for k, v in arrays.items()}, params,
                              boundary)
    return graph, arrays, params, reference


# every image app in every mode, but Shi-Tomasi (Harris's plan with another response: the
# same kernels but the last) in two of them and Harris in the other two (its fused kernels
# run in every mode compiled for their sizes, tests/test_specialise.py, and partitioned,
# tests/test_borders.py)
@pytest.mark.parametrize(("app", "boundary"), [
    (a.name, boundary) for a in list_apps() for index, boundary in enumerate(BOUNDARIES)
    if a.name not in ("shi_tomasi", "harris") or index % 2 == (a.name == "harris")],
    ids=str)
def test_default_plan_matches_reference(app, boundary):
    check_app(app, boundary, "auto")


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize("app", ["harris", "night", "diffusion3d"])
def test_everything_in_one_kernel_matches_reference(app, boundary):
    check_app(app, boundary, "all")


@pytest.mark.parametrize("size", [(70, 130), (5, 7), (33, 65)])
@pytest.mark.parametrize("boundary", ["clamp", "mirror", kf.constant(-0.25)], ids=str)
def test_staged_variant_on_many_tiles(size, boundary):
    from kfuse.codegen import generate
    from kfuse.runtime import get_backend

    graph, arrays, params, reference = harris_case(size, boundary, 5)
    program = generate(graph, [(tuple(k.name for k in graph.kernels), graph.outputs,
                                "staged")])
    assert "__shared__" in program.source
    outputs = get_backend("cpu").run(graph, arrays | params, program=program)
    assert relative_error(outputs["hc"], reference["hc"]) <= 1e-5


def test_periodic_reads_of_an_intermediate_are_recomputed_not_staged():
    assert check_app("harris", "repeat", "all", (21, 23)) == "recompute"


@pytest.mark.parametrize("width", [71, 72])
@pytest.mark.parametrize("tile", [(3, 4), (1, 2)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_register_tiles_of_rows_and_columns(tile, boundary, width, monkeypatch):
    """Threads computing several rows and columns (partial tiles at the right and bottom)
    equal the reference, unfused and with every Harris operator recomputed in one kernel.

    Width 71 takes the scalar path; at width 72 the vector path (one vector load or store
    per row of a thread's columns) is forced, so a wrong vector path cannot hide. The
    interior test is a warp's or, in blocks narrower than a warp, a block's: blocks of 8 x 2
    threads here, so that the blocks away from the edges take the vector path (a
    warp-wide image: ``test_register_tiles_with_edge_and_interior_warps``).
    """
    from kfuse.codegen import generate, kernels
    from kfuse.runtime import get_backend
    from kfuse.schedule import tiles

    if width % tile[1] == 0 and tile[1] in (2, 4):
        monkeypatch.setattr(kernels, "_vector_condition", lambda group, columns: "true")

    for variant in ("single", "recompute"):
        monkeypatch.setitem(tiles.REGISTER_TILES, (variant, 2), tile)
        monkeypatch.setitem(tiles.TILED_BLOCKS, (variant, 2), (8, 2))
    app = get_app("harris")
    graph = app.build(boundary=boundary).graph()
    arrays, params = app.make_inputs((38, width), np.random.default_rng(7), "float32")
    reference = app.reference({k: v.astype(np.float64) for k, v in arrays.items()}, params,
                              boundary)
    whole = [(tuple(k.name for k in graph.kernels), graph.outputs, "recompute")]
    for groups in (None, whole):
        program = generate(graph, groups)
        assert f"a {tile[0]} x {tile[1]} register tile" in program.source
        if width == 72 and tile[1] in (2, 4):
            assert f"float{tile[1]} vec_" in program.source
        outputs = get_backend("cpu").run(graph, arrays | params, program=program)
        assert relative_error(outputs["hc"], reference["hc"]) <= 1e-5


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_register_tiles_with_edge_and_interior_warps(boundary, monkeypatch):
    """Blocks of 32 x 2 threads and 10 x 4 tiles (the planned ones) over an image 392 wide
    (3 warps' columns and 2 threads' more): the first and last warps of each row take the
    edge path as a whole, the two between them the vector path; every pixel equals the
    reference (a wrong vector path fails it: checked by mutation)."""
    from kfuse.codegen import generate, kernels
    from kfuse.runtime import get_backend

    monkeypatch.setattr(kernels, "_vector_condition", lambda group, columns: "true")
    app = get_app("shi_tomasi")
    graph = app.build(boundary=boundary).graph()
    arrays, params = app.make_inputs((23, 3 * 32 * 4 + 2 * 4), np.random.default_rng(8),
                                     "float32")
    reference = app.reference({k: v.astype(np.float64) for k, v in arrays.items()}, params,
                              boundary)
    program = generate(graph, [(tuple(k.name for k in graph.kernels), graph.outputs,
                                "recompute")])
    assert "a 10 x 4 register tile" in program.source
    assert "warp_ix >= 4 && warp_ix_last + 8 <=" in program.source
    outputs = get_backend("cpu").run(graph, arrays | params, program=program)
    assert relative_error(outputs["st"], reference["st"]) <= 1e-5


@pytest.mark.parametrize("shape", [(9, 11, 13), (7, 6, 12)], ids=str)
@pytest.mark.parametrize("tile", [(3, 2, 4)], ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_register_tiles_in_three_dimensions(tile, boundary, shape, monkeypatch):
    """3-D register tiles (planes x rows x columns per thread), unfused and both diffusion
    steps in one kernel; the 12-wide volume takes the vector path."""
    from kfuse.codegen import generate, kernels
    from kfuse.runtime import get_backend
    from kfuse.schedule import tiles

    for variant in ("single", "recompute"):
        monkeypatch.setitem(tiles.REGISTER_TILES, (variant, 3), tile)
    if shape[-1] % tile[-1] == 0 and tile[-1] in (2, 4):
        monkeypatch.setattr(kernels, "_vector_condition", lambda group, columns: "true")
    app = get_app("diffusion3d")
    graph = app.build(boundary=boundary).graph()
    arrays, params = app.make_inputs(shape, np.random.default_rng(11), "float32")
    whole = [(tuple(k.name for k in graph.kernels), graph.outputs, "recompute")]
    for groups in (None, whole):
        program = generate(graph, groups)
        assert f"a {' x '.join(map(str, tile))} register tile" in program.source
        outputs = get_backend("cpu").run(graph, arrays | params, program=program)
        errors = reference_errors(app, arrays, params, outputs, boundary)
        assert max(errors.values()) <= 1e-5, errors
