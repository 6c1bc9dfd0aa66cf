"""Host arrays streamed through the device in slabs (kfuse.scaleout.host_slabs): on the cpu
backend (and the cuda backend where a GPU is usable) the slabbed result equals the one-shot
run in every boundary mode, for slabs that do not divide the array, volumes and reductions."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.scaleout import ChunkingError, plan_slabs, run_in_slabs

MODES = ["clamp", "mirror", "repeat", kf.constant(0.25)]


def chain(mode) -> kf.Pipeline:
    """A blur, an asymmetric stencil of it (2 rows up, 1 down) and a point operator."""
    p = kf.Pipeline("chain")
    x = p.input("x", 2)
    blur = kf.local((x.at(-1, 0) + x.at(1, 0) + x.at(0, -1) + x.at(0, 1)) * 0.25, boundary=mode,
                    name="blur")
    edge = kf.local(blur.at(-1, 2) - blur.at(0, -1) + x.at(1, 1) * 0.5, boundary=mode,
                    name="edge")
    p.output(kf.point(edge * edge + blur, name="out"), edge)
    return p


def slabbed_equals_one_shot(pipeline: kf.Pipeline, values: dict, backend: str = "cpu",
                            **options):
    want = pipeline.run(backend="cpu", plan="unfused", **values)
    got = run_in_slabs(pipeline, backend=backend, **options, **values)
    assert set(got) == set(want)
    for name in want:
        result = got[name]
        assert isinstance(result, np.ndarray) and result.shape == np.shape(want[name]), name
        np.testing.assert_allclose(result, want[name], rtol=2e-6, atol=1e-6, err_msg=name)
    return got


def test_slabs_are_grown_by_the_halo_and_wrap_where_periodic():
    slabs = plan_slabs(10, 4, 2, 1, periodic=False)
    assert [(s.start, s.stop) for s in slabs] == [(0, 4), (4, 8), (8, 10)]
    # (every slab 7 rows: those at the ends and the shorter last one reach further in)
    assert [list(s.rows) for s in slabs] == [list(range(0, 7)), list(range(2, 9)),
                                             list(range(3, 10))]
    assert [s.crop for s in slabs] == [slice(0, 4), slice(2, 6), slice(5, 7)]
    wrapped = plan_slabs(10, 4, 2, 1, periodic=True)
    assert list(wrapped[0].rows) == [8, 9, 0, 1, 2, 3, 4] and wrapped[0].crop == slice(2, 6)
    assert list(wrapped[-1].rows) == [4, 5, 6, 7, 8, 9, 0] and wrapped[-1].crop == slice(4, 6)
    assert [len(s.rows) for s in plan_slabs(5, 4, 2, 1, periodic=False)] == [5, 5]


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("rows", [1, 4, 7])
def test_slabs_that_do_not_divide_equal_the_one_shot_run(mode, rows):
    values = {"x": np.random.default_rng(rows).random((23, 19), dtype=np.float32)}
    slabbed_equals_one_shot(chain(mode), values, slab_rows=rows, plan="unfused")


def test_a_volume_in_slabs_under_the_planned_program():
    from kfuse.apps import get_app

    app = get_app("heat3d")  # four steps: a halo of 4 planes each side
    pipeline = app.build(boundary="mirror")
    arrays, params = app.make_inputs((11, 9, 13), np.random.default_rng(3), "float32")
    want = pipeline.run(backend="cpu", plan="unfused", **arrays, **params)
    got = run_in_slabs(pipeline, backend="cpu", slab_rows=3, **arrays, **params)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_reductions_fold_per_slab_then_across_slabs():
    p = kf.Pipeline("stats")
    x = p.input("x", 2)
    smooth = kf.local((x.at(-1, 0) + x + x.at(1, 0)) / 3.0, boundary="mirror", name="smooth")
    p.output(smooth, kf.reduce_sum(smooth * smooth, name="energy"),
             kf.reduce_max(smooth - x, name="peak"),
             kf.reduce_sum(smooth, axis=1, name="rows"),
             kf.reduce_min(smooth.at(1, 0), axis=0, name="columns"))
    values = {"x": np.random.default_rng(4).random((21, 34), dtype=np.float32)}
    got = slabbed_equals_one_shot(p, values, slab_rows=5)
    assert got["energy"].shape == () and got["rows"].shape == (21,)


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm", "logsumexp", "crossentropy"])
def test_normalisations_of_rows_run_in_slabs(name):
    """Row reductions that other operators read: each slab holds whole rows and computes
    them completely; a gain along the rows goes whole to every slab, a result per row is
    kept for the slab's rows; equal to the one-shot run on slabs that do not divide."""
    from kfuse.apps import get_app

    app = get_app(name)
    arrays, params = app.make_inputs((29, 67), np.random.default_rng(23), "float32")
    got = slabbed_equals_one_shot(app.build(), {**arrays, **params}, slab_rows=8)
    assert any(value.shape == (29,) for value in got.values()) == (name in (
        "logsumexp", "crossentropy"))


def test_a_cross_entropy_of_labels_runs_in_slabs():
    """The logit at each row's label, read at a computed column (whole in every slab), in
    slabs of whole rows; labels outside the row clamped as in the one-shot run."""
    from kfuse.apps.normalise import build_cross_entropy_of_labels

    rng = np.random.default_rng(25)
    values = {"x": rng.standard_normal((29, 67)).astype(np.float32),
              "labels": rng.integers(-3, 70, 29).astype(np.int32)}
    slabbed_equals_one_shot(build_cross_entropy_of_labels(), values, slab_rows=8)


def test_row_statistics_beside_a_stencil_run_in_slabs(rows_beside_a_stencil):
    """A row reduction read back beside a stencil across the rows (slabs grown by its
    halo), a value per row (cut with the slabs' rows, grown with them) and a gain per
    column; in a clamped and a periodic mode."""
    for mode in ("clamp", "repeat"):
        rng = np.random.default_rng(24)
        values = {"x": rng.random((31, 20), dtype=np.float32),
                  "scale": rng.random(31, dtype=np.float32),
                  "gain": rng.random(20, dtype=np.float32)}
        slabbed_equals_one_shot(rows_beside_a_stencil(mode, below=2), values, slab_rows=7)


def test_outputs_into_given_arrays():
    values = {"x": np.random.default_rng(5).random((17, 12), dtype=np.float32)}
    out = {"out": np.empty((17, 12), np.float32)}
    got = run_in_slabs(chain("clamp"), backend="cpu", slab_rows=6, out=out, **values)
    assert got["out"] is out["out"]
    np.testing.assert_allclose(out["out"], chain("clamp").run(backend="cpu", **values)["out"],
                               rtol=2e-6, atol=1e-6)


def test_what_cannot_run_in_slabs_is_refused_by_name():
    values = np.random.default_rng(6).random((9, 8), dtype=np.float32)
    p = kf.Pipeline("mixed")
    x = p.input("x", 2)
    up = kf.local(x.at(-1, 0) * 2.0, boundary="repeat", name="up")
    p.output(kf.local(up.at(1, 0) + x, boundary="clamp", name="down"))
    with pytest.raises(ChunkingError, match="first axis is read both periodically"):
        run_in_slabs(p, backend="cpu", x=values)
    with pytest.raises(ChunkingError, match="not NumPy arrays"):
        run_in_slabs(chain("clamp"), backend="cpu", x=[[1.0]])
    with pytest.raises(ChunkingError, match="slab_rows must be a positive integer"):
        run_in_slabs(chain("clamp"), backend="cpu", slab_rows=0, x=values)
    with pytest.raises(ChunkingError, match=r"out\['out'\] must be"):
        run_in_slabs(chain("clamp"), backend="cpu", out={"out": np.empty((2, 2))}, x=values)
    with pytest.raises(ChunkingError, match="is float64, the pipeline reads float32"):
        run_in_slabs(chain("clamp"), backend="cpu", x=values.astype(np.float64))
    from kfuse.apps import get_app
    columns = get_app("colstandardise")
    arrays, params = columns.make_inputs((9, 8), np.random.default_rng(6), "float32")
    with pytest.raises(ChunkingError, match="folds the first axis, which slabs cut"):
        run_in_slabs(columns.build(), backend="cpu", **arrays, **params)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_slabs_through_the_gpu_on_several_streams(mode):
    values = {"x": np.random.default_rng(7).random((61, 45), dtype=np.float32)}
    slabbed_equals_one_shot(chain(mode), values, backend="cuda", slab_rows=8, streams=3)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_pageable_arrays_through_staging_buffers(mode, monkeypatch):
    """Host arrays the driver will not page-lock go through each stream's staging buffers:
    asked for (staged=True), and where locking is refused (inputs and the outputs made);
    with a reduction folded across the slabs."""
    from kfuse.scaleout import host_slabs

    values = {"x": np.random.default_rng(11).random((67, 45), dtype=np.float32)}
    slabbed_equals_one_shot(chain(mode), values, backend="cuda", slab_rows=8, staged=True)
    monkeypatch.setattr(host_slabs, "_page_lock", lambda arrays: [])
    monkeypatch.setattr(host_slabs, "_page_locked_or_pageable",
                        lambda shape, dtype: np.empty(shape, dtype=dtype))
    slabbed_equals_one_shot(chain(mode), values, backend="cuda", slab_rows=7, streams=2)
    stats = kf.Pipeline("stats")
    y = stats.input("y", 2)
    smooth = kf.local((y.at(-1, 0) + y + y.at(1, 1)) / 3.0, boundary=mode, name="smooth")
    stats.output(smooth, kf.reduce_sum(smooth * smooth, name="energy"))
    slabbed_equals_one_shot(stats, {"y": values["x"]}, backend="cuda", slab_rows=9)


def test_staging_copies_rows_on_several_threads():
    from kfuse.scaleout.host_slabs import _copy_rows

    source = np.random.default_rng(12).random((1031, 8192), dtype=np.float32)  # 34 MB
    target = np.empty_like(source)
    _copy_rows(target, source)
    np.testing.assert_array_equal(target, source)
    with pytest.raises(ChunkingError, match="staged must be None, True or False"):
        run_in_slabs(chain("clamp"), backend="cpu", staged="yes", x=source[:9, :9])


def test_calls_stream_in_slabs_only_where_the_arrays_do_not_fit():
    from kfuse.scaleout.host_slabs import slab_reason

    graph = chain("clamp").graph()
    values = {"x": np.random.default_rng(8).random((64, 32), dtype=np.float32)}
    needed = 4 * 4 * 64 * 32  # x, blur, edge, out: float32 on the grid
    assert slab_reason(graph, "cuda", values, free_bytes=2 * needed) is None  # fits
    reason = slab_reason(graph, "cuda", values, free_bytes=needed // 8)
    assert reason is not None and "in slabs" in reason
    assert slab_reason(graph, "auto", values, free_bytes=needed // 8) is not None
    assert slab_reason(graph, "cpu", values, free_bytes=1) is None  # the host has no limit
    assert slab_reason(graph, "cuda", {"x": values["x"].tolist()}, free_bytes=1) is None
    p = kf.Pipeline("readback")  # a reduction read back: not runnable in slabs, runs whole
    y = p.input("y", 2)
    total = kf.reduce_sum(y, name="total")
    p.output(kf.point(y - total, name="centred"))
    assert slab_reason(p.graph(), "cuda", {"y": values["x"]}, free_bytes=1) is None
    from kfuse.apps import get_app  # rows read back: in slabs of whole rows; columns: whole
    arrays, params = get_app("rmsnorm").make_inputs((64, 32), np.random.default_rng(8),
                                                   "float32")
    assert slab_reason(get_app("rmsnorm").build().graph(), "cuda", {**arrays, **params},
                       free_bytes=1) is not None
    arrays, params = get_app("colstandardise").make_inputs((64, 32), np.random.default_rng(8),
                                                          "float32")
    assert slab_reason(get_app("colstandardise").build().graph(), "cuda",
                       {**arrays, **params}, free_bytes=1) is None


@pytest.mark.gpu
def test_a_call_too_large_for_the_gpu_runs_in_slabs(monkeypatch):
    from kfuse.scaleout import host_slabs

    values = {"x": np.random.default_rng(9).random((96, 40), dtype=np.float32)}
    want = chain("mirror").run(backend="cpu", plan="unfused", **values)
    monkeypatch.setattr(host_slabs, "device_free_bytes", lambda: 4096)  # a tiny GPU
    got = chain("mirror").run(backend="cuda", **values)
    for name in want:
        assert isinstance(got[name], np.ndarray)
        np.testing.assert_allclose(got[name], want[name], rtol=2e-6, atol=1e-6)


def test_auto_runs_the_slabs_on_the_backend_it_picks():
    values = {"x": np.random.default_rng(10).random((19, 14), dtype=np.float32)}
    slabbed_equals_one_shot(chain("mirror"), values, backend="auto", slab_rows=5)
