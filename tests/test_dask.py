"""kfuse pipelines over chunked Dask arrays (kfuse.scaleout.dask_arrays) on the cpu backend:
the chunked result equals the one-shot run in every boundary mode, on chunkings that do not
divide the array, through Dask's threaded scheduler and a local cluster of two processes."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.scaleout import ChunkingError, halo_depths

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

MODES = ["clamp", "mirror", "repeat", kf.constant(0.25)]


def chain(mode, second_mode=None) -> kf.Pipeline:
    """A blur, then an asymmetric stencil of it (reaching 1 up and 2 right), then a point
    operator reading both: halo 2 before and 3 after along x, 2 and 1 along y."""
    p = kf.Pipeline("chain")
    x = p.input("x", 2)
    blur = kf.local((x.at(-1, 0) + x.at(1, 0) + x.at(0, -1) + x.at(0, 1)) * 0.25, boundary=mode,
                    name="blur")
    edge = kf.local(blur.at(-1, 2) - blur.at(0, -1) + x.at(0, 1) * 0.5,
                    boundary=second_mode or mode, name="edge")
    p.output(kf.point(edge * edge + blur, name="out"), edge)
    return p


def chunked_equals_one_shot(pipeline: kf.Pipeline, values: dict, chunks, **compute):
    # (one plan for both: on the cpu backend one program then serves every size)
    plan = "unfused"
    want = pipeline.run(backend="cpu", plan=plan, **values)
    got = pipeline.run(backend="cpu", plan=plan, **{
        name: da.from_array(value, chunks=chunks) for name, value in values.items()})
    assert all(isinstance(array, da.Array) for array in got.values())  # lazy
    results = dask.compute(got, **compute)[0]
    for name in want:
        np.testing.assert_allclose(results[name], want[name], rtol=2e-6, atol=1e-6,
                                   err_msg=name)
    return got


def test_the_halo_is_the_pipelines_reach_along_each_axis():
    # blur reaches 1 each way; edge reads blur 1 up, 2 right, 1 left and x 1 right
    assert halo_depths(chain("clamp").graph()) == [(2, 1), (2, 3)]


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_chunks_that_do_not_divide_equal_the_one_shot_run(mode):
    values = {"x": np.random.default_rng(7).random((29, 47), dtype=np.float32)}
    got = chunked_equals_one_shot(chain(mode), values, (8, 11), scheduler="threads")
    assert got["out"].chunks == ((8, 8, 8, 5), (11, 11, 11, 11, 3))


def test_chunks_smaller_than_the_halo_are_merged():
    values = {"x": np.random.default_rng(6).random((17, 19), dtype=np.float32)}
    got = chunked_equals_one_shot(chain("mirror"), values, (5, 2), scheduler="threads")
    assert min(got["out"].chunks[1]) >= 3  # (Dask's overlap needs chunks as deep as it)


def test_an_axis_read_periodically_and_clamped_is_one_chunk():
    values = {"x": np.random.default_rng(8).random((23, 31), dtype=np.float32)}
    got = chunked_equals_one_shot(chain("repeat", "clamp"), values, (7, 9),
                                  scheduler="threads")
    assert got["out"].chunks == ((23,), (31,))  # both axes read under both kinds of mode


def test_a_volume_in_chunks():
    from kfuse.apps import get_app

    app = get_app("diffusion3d")
    pipeline = app.build(boundary="mirror")
    arrays, params = app.make_inputs((7, 10, 13), np.random.default_rng(9), "float32")
    want = pipeline.run(backend="cpu", plan="unfused", **arrays, **params)
    got = pipeline.run(backend="cpu", plan="unfused", **{
        k: da.from_array(v, chunks=(3, 4, 6)) for k, v in arrays.items()}, **params)
    results = dask.compute(got, scheduler="threads")[0]
    for name in want:
        np.testing.assert_allclose(results[name], want[name], rtol=2e-6, atol=1e-6)


def test_two_worker_processes():
    distributed = pytest.importorskip("distributed")
    values = {"x": np.random.default_rng(10).random((26, 35), dtype=np.float32)}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        got = chunked_equals_one_shot(chain("mirror"), values, (9, 12), scheduler=client)
        assert len(client.has_what()) == 2 and got["out"].npartitions == 9


def test_held_chunks_are_found_on_the_client_holding_them():
    """Chunks persisted by one client are found held by that client though another became
    Dask's default since (a stale or other default client sent calls down the lazy path);
    chunks of no running client are not held."""
    distributed = pytest.importorskip("distributed")
    from kfuse.scaleout.dask_arrays import _held_chunks

    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as one, \
            distributed.Client(one, set_as_default=False) as holder:
        x = holder.persist(da.from_array(np.arange(24.0).reshape(4, 6), chunks=(2, 3)))
        with holder.as_current():
            distributed.wait(x)
        with distributed.LocalCluster(n_workers=1, processes=False,
                                      dashboard_address=None) as two, \
                distributed.Client(two):  # (the default client now)
            held = _held_chunks([x])
            assert held is not None and held[0] is holder
            assert [sorted(found) for found in held[1]] == [sorted(np.ndindex(2, 2))]
        assert _held_chunks([da.from_array(np.ones((4, 6)), chunks=(2, 3))]) is None


def test_chunks_held_on_a_cluster_run_where_they_lie():
    """Persisted chunks on a cluster: each chunk's task runs on the worker holding the chunk
    and only halos move (left to Dask's scheduler, whole chunks moved to balance its queues:
    on two GPUs, gigabytes through the host per call); equal to the one-shot run in a
    periodic and a clamped mode, with reductions."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        values = np.random.default_rng(14).random((256, 96), dtype=np.float32)
        x = da.from_array(values, chunks=(64, 48)).persist()
        distributed.wait(x)
        assert len(client.has_what()) == 2

        def moved(dask_worker) -> int:
            return sum(entry["total"] for entry in dask_worker.transfer_incoming_log)

        for mode in ("repeat", "clamp"):
            pipeline = chain(mode)
            want = pipeline.run(backend="cpu", plan="unfused", x=values)
            for _ in range(3):
                before = client.run(moved)
                got = pipeline.run(backend="cpu", plan="unfused", x=x)
                persisted = [array.persist() for array in got.values()]
                distributed.wait(persisted)
                after = client.run(moved)
                assert all(after[w] - before[w] < 64 * 48 * 4 for w in after), mode
            for name, array in zip(got, persisted, strict=True):
                np.testing.assert_allclose(array.compute(), want[name], rtol=2e-6,
                                           atol=1e-6, err_msg=f"{mode} {name}")
        # in bands: workers hold consecutive block rows; halos cross only at a band's edges
        from kfuse.scaleout import persist_in_bands

        banded = persist_in_bands(da.from_array(values, chunks=(32, 48)), client)
        distributed.wait(banded)
        holders = client.who_has(distributed.futures_of(banded))
        rows = {}
        for key, where in holders.items():
            rows.setdefault(next(iter(where)), set()).add(key[1])
        assert sorted(map(sorted, rows.values())) == [[0, 1, 2, 3], [4, 5, 6, 7]]
        pipeline = chain("mirror")
        want = pipeline.run(backend="cpu", plan="unfused", x=values)
        before = client.run(moved)
        got = pipeline.run(backend="cpu", plan="unfused", x=banded)
        persisted = [array.persist() for array in got.values()]
        distributed.wait(persisted)
        after = client.run(moved)
        # two chunks' halos cross each way (2 x 3 rows of 96 columns), nothing else
        assert sum(after[w] - before[w] for w in after) < 4 * 3 * 96 * 4 + 4096
        for name, array in zip(got, persisted, strict=True):
            np.testing.assert_allclose(array.compute(), want[name], rtol=2e-6, atol=1e-6)
        # chunks of whole rows: each computed as it lies, its edge rows patched from strips
        # (the cuda backend's default; every mode; a reduction folded over the patched rows;
        # 20-row chunks, and 5-row ones shorter than twice the halo, joined whole instead)
        from kfuse.scaleout import run_on_dask_arrays

        for mode in MODES:
            pipeline = chain(mode)
            stats_of = kf.Pipeline("patched")
            w = stats_of.input("w", 2)
            smooth = kf.local(w.at(-2, 0) + w.at(1, 1) * 0.5 + w, boundary=mode, name="smooth")
            stats_of.output(smooth, kf.reduce_sum(smooth * smooth, name="energy"))
            vertical = kf.Pipeline("vertical")  # reads along the rows only (periodic too)
            v = vertical.input("v", 2)
            vertical.output(kf.local(v.at(-3, 0) - v.at(2, 0) * v, boundary=mode, name="dv"))
            # (every mode through the chain; the reduction and the vertical reads in two
            # modes; chunks shorter than twice the halo in one: for the suite's time)
            cases = [(20, pipeline, "x")]
            if mode in ("clamp", "repeat"):
                cases += [(20, stats_of, "w"), (20, vertical, "v")]
            if mode == "mirror":
                cases.append((5, pipeline, "x"))
            for rows, piped, input_name in cases:
                given = {input_name: persist_in_bands(da.from_array(values,
                                                                    chunks=(rows, 96)), client)}
                want = piped.run(backend="cpu", plan="unfused", **{input_name: values})
                got = dask.compute(run_on_dask_arrays(piped, "cpu", "unfused", given,
                                                      patch_edges=True))[0]
                for name in want:
                    np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=1e-5,
                                               err_msg=f"{mode} {rows} {name}")
        one = kf.Pipeline("one")  # one output: the chunks' tasks are the output's chunks
        z = one.input("z", 2)
        one.output(kf.local((z.at(-1, 0) + z.at(1, 0) + z.at(0, 1)) / 3.0, boundary="clamp",
                            name="blurred"))
        got = one.run(backend="cpu", plan="unfused", z=banded)["blurred"]
        assert len(got.__dask_graph__()) == got.npartitions
        np.testing.assert_allclose(got.compute(), one.run(
            backend="cpu", plan="unfused", z=values)["blurred"], rtol=2e-6, atol=1e-6)
        stats = kf.Pipeline("stats")
        y = stats.input("y", 2)
        smooth = kf.local((y.at(-1, 0) + y + y.at(1, 1)) / 3.0, boundary="mirror",
                          name="smooth")
        stats.output(kf.reduce_sum(smooth * smooth, name="energy"),
                     kf.reduce_max(smooth, axis=0, name="columns"))
        want = stats.run(backend="cpu", plan="unfused", y=values)
        got = dask.compute(stats.run(backend="cpu", plan="unfused", y=x))[0]
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-6, atol=1e-6)
        from kfuse.apps import get_app
        from kfuse.scaleout import iterate

        # normalisations of rows held whole on the workers: each chunk's task runs where
        # it lies (a gain given whole to every task; a result per row chunked with the rows)
        for name in ("rmsnorm", "logsumexp"):
            app = get_app(name)
            pipeline = app.build()
            arrays, params = app.make_inputs((256, 96), np.random.default_rng(16), "float32")
            want = pipeline.run(backend="cpu", plan="unfused", **arrays, **params)
            given = {key: persist_in_bands(da.from_array(
                value, chunks=(64, 96) if value.ndim == 2 else 96), client)
                for key, value in arrays.items()}
            got = pipeline.run(backend="cpu", **given, **params)
            for output, array in got.items():
                assert all(isinstance(value, distributed.Future)
                           for value in dict(array.__dask_graph__()).values()), output
                assert array.shape == want[output].shape
                np.testing.assert_allclose(array.compute(), want[output], rtol=2e-6,
                                           atol=2e-6, err_msg=f"{name} {output}")
        scaled = kf.Pipeline("scaled_rows")  # a value per row, cut as the rows are
        v = scaled.input("v", 2)
        scale = scaled.input("scale", shape=(v.shape[0],))
        squares = kf.reduce_sum(v * v, axis=1, name="squares")
        scaled.output(kf.point(v * scale.at(0, dims=(0,)) / kf.sqrt(squares.at(0, dims=(0,))),
                               name="y"))
        factors = np.random.default_rng(17).random(256, dtype=np.float32)
        want = scaled.run(backend="cpu", plan="unfused", v=values, scale=factors)["y"]
        got = scaled.run(backend="cpu", v=persist_in_bands(da.from_array(values, chunks=(64, 96)),
                                                           client),
                         scale=persist_in_bands(da.from_array(factors, chunks=64), client))["y"]
        assert all(isinstance(value, distributed.Future)
                   for value in dict(got.__dask_graph__()).values())
        np.testing.assert_allclose(got.compute(), want, rtol=2e-6, atol=2e-6)

        wave = get_app("wave2d").build(boundary="clamp")  # two inputs, fed back twice
        rng = np.random.default_rng(15)
        arrays = {name: rng.random((40, 33), dtype=np.float32) for name in ("u_prev", "u_cur")}
        state = dict(arrays)
        for _ in range(2):
            out = wave.run(backend="cpu", plan="unfused", **state, c=0.2)
            state = {"u_prev": out["w3"], "u_cur": out["w4"]}
        held = {name: da.from_array(value, chunks=(10, 33)).persist()
                for name, value in arrays.items()}
        got = iterate(wave, 2, {"w3": "u_prev", "w4": "u_cur"}, plan="unfused", **held,
                      c=0.2)
        # the second call's inputs (the first's outputs, perhaps still computing) were
        # placed where kfuse put them: its outputs are futures too, not a lazy graph
        assert all(isinstance(value, distributed.Future)
                   for value in dict(got["w4"].__dask_graph__()).values())
        np.testing.assert_allclose(got["w4"].compute(), state["u_cur"], rtol=1e-5, atol=1e-5)


def test_reductions_fold_each_chunk_then_through_dasks_tree():
    p = kf.Pipeline("stats")
    x = p.input("x", 2)
    smooth = kf.local((x.at(0, -1) + x + x.at(0, 1)) / 3.0, boundary="mirror", name="smooth")
    p.output(smooth, kf.reduce_sum(smooth * smooth, name="energy"),
             kf.reduce_max(smooth - x, name="peak"), kf.reduce_min(x.at(1, 0), name="low"),
             kf.reduce_sum(smooth, axis=1, name="rows"),
             kf.reduce_min(smooth.at(0, 1), axis=0, name="columns"))
    values = np.random.default_rng(11).random((21, 34), dtype=np.float32)
    got = chunked_equals_one_shot(p, {"x": values}, (6, 9), scheduler="threads")
    assert got["energy"].shape == () and got["smooth"].chunks == ((6, 6, 6, 3), (9, 9, 9, 7))
    assert got["rows"].chunks == ((6, 6, 6, 3),) and got["columns"].shape == (34,)
    # the halo's points are not folded twice: the sum of ones is the number of points
    q = kf.Pipeline("count")
    y = q.input("y", 2)
    q.output(kf.reduce_sum(kf.local(y.at(0, 1) * 0.0 + 1.0, name="one"), name="n"))
    counted = q.run(backend="cpu", plan="unfused", y=da.from_array(values, chunks=(5, 8)))
    assert float(counted["n"].compute(scheduler="threads")) == values.size


@pytest.mark.parametrize("name", ["rmsnorm", "logsumexp", "colstandardise"])
def test_normalisations_run_chunked_with_their_rows_whole(name):
    """Reductions that other operators read: the chunks keep the axes they fold whole (a
    row's, or a column's), cut the others as given, give a vector along those axes (a gain)
    whole to every chunk, and cut the results over the other axes (a row's log-sum-exp) as
    the grid; equal to the one-shot run on chunkings that do not divide the array."""
    from kfuse.apps import get_app

    app = get_app(name)
    pipeline = app.build()
    arrays, params = app.make_inputs((29, 67), np.random.default_rng(21), "float32")
    want = pipeline.run(backend="cpu", plan="unfused", **arrays, **params)
    for chunks in ((8, 67), (8, 20), (29, 15)):
        given = {key: da.from_array(value, chunks=chunks if value.ndim == 2 else chunks[1])
                 for key, value in arrays.items()}
        got = pipeline.run(backend="cpu", **given, **params)
        for output, value in want.items():
            assert got[output].shape == value.shape
            np.testing.assert_allclose(got[output].compute(scheduler="threads"), value,
                                       rtol=2e-6, atol=2e-6, err_msg=f"{output} {chunks}")
        folded = 0 if name == "colstandardise" else 1  # (the axis kept whole)
        kept = 1 - folded
        first = next(iter(got.values()))
        assert first.chunks[0 if first.ndim == 1 else kept] == da.from_array(
            arrays["x"], chunks=chunks).chunks[kept]


def test_a_cross_entropy_of_labels_runs_chunked():
    """A read at computed columns along the axis a read-back reduction keeps whole (each
    row's logit at its label) runs chunked: rows cut, labels cut with them."""
    from kfuse.apps.normalise import build_cross_entropy_of_labels

    rng = np.random.default_rng(26)
    x = rng.standard_normal((29, 67)).astype(np.float32)
    labels = rng.integers(0, 67, 29).astype(np.int32)
    pipeline = build_cross_entropy_of_labels()
    want = pipeline.run(backend="cpu", plan="unfused", x=x, labels=labels)["loss"]
    got = pipeline.run(backend="cpu", x=da.from_array(x, chunks=(8, 67)),
                       labels=da.from_array(labels, chunks=8))["loss"]
    np.testing.assert_allclose(got.compute(scheduler="threads"), want, rtol=2e-6, atol=2e-6)


def test_row_statistics_beside_a_stencil_and_vectors_run_chunked(rows_beside_a_stencil):
    """A row reduction read back beside a stencil across the rows (chunks grown by its
    halo), a value per row (cut and grown with the rows) and a gain per column (whole in
    every chunk), and a result per row: equal to the one-shot run."""
    p = rows_beside_a_stencil()
    rng = np.random.default_rng(22)
    values = {"x": rng.random((29, 67), dtype=np.float32),
              "scale": rng.random(29, dtype=np.float32),
              "gain": rng.random(67, dtype=np.float32)}
    want = p.run(backend="cpu", plan="unfused", **values)
    for chunks in ((8, 67), (8, 20), (29, 15)):
        got = p.run(backend="cpu", x=da.from_array(values["x"], chunks=chunks),
                    scale=da.from_array(values["scale"], chunks=chunks[0]),
                    gain=da.from_array(values["gain"], chunks=chunks[1]))
        for name, value in want.items():
            np.testing.assert_allclose(got[name].compute(scheduler="threads"), value,
                                       rtol=2e-6, atol=2e-6, err_msg=f"{name} {chunks}")


def test_what_cannot_run_in_chunks_is_refused_by_name():
    p = kf.Pipeline("everything")
    x = p.input("x", 2)
    total = kf.reduce_sum(x * 2.0, name="total")
    p.output(kf.point(x - total, name="centred"))
    with pytest.raises(ChunkingError, match="operator 'total'.*a reduction over every axis "
                                            "that other operators read"):
        p.run(backend="cpu", x=da.ones((8, 8), chunks=4))
    r = kf.Pipeline("both")
    y = r.input("y", 2)
    rows = kf.reduce_sum(y, axis=1, name="rows")
    columns = kf.reduce_sum(y, axis=0, name="columns")
    r.output(kf.point(y - rows.at(0, dims=(0,)) - columns.at(0, dims=(1,)), name="centred"))
    with pytest.raises(ChunkingError, match="fold different axes"):
        r.run(backend="cpu", y=da.ones((8, 8), chunks=4))
    values = np.ones((8, 8), dtype=np.float32)
    with pytest.raises(ChunkingError, match="out= does not apply"):
        chain("clamp").run(backend="cpu", x=da.from_array(values, chunks=4), out={})
    q = kf.Pipeline("two")
    a, b = q.input("a", 2), q.input("b", 2)
    q.output(kf.point(a + b, name="s"))
    with pytest.raises(ChunkingError, match=r"inputs \['b'\] are not Dask arrays"):
        q.run(backend="cpu", a=da.from_array(values, chunks=4), b=values)
    # a vector given with the grid's shape: the shape check names it, not Dask's reshape
    from kfuse.apps import get_app
    from kfuse.errors import ShapeError
    rmsnorm = get_app("rmsnorm").build()
    with pytest.raises(ShapeError, match="input 'g' must be 1-D, got shape"):
        rmsnorm.run(backend="cpu", x=da.from_array(values, chunks=4),
                    g=da.from_array(values, chunks=4), inv_n=0.125)


def test_time_steps_iterated_exchange_halos_once_per_call():
    from kfuse.apps import get_app
    from kfuse.scaleout import iterate

    app = get_app("wave2d")  # two time levels, 4 leapfrog steps per call
    pipeline = app.build(boundary="clamp")
    arrays, params = app.make_inputs((23, 41), np.random.default_rng(12), "float32")
    state = dict(arrays)
    for _ in range(3):  # the one-shot runs, three calls of four steps
        out = pipeline.run(backend="cpu", plan="unfused", **state, **params)
        state = {"u_prev": out["w3"], "u_cur": out["w4"]}
    chunked = {k: da.from_array(v, chunks=(8, 13)) for k, v in arrays.items()}
    got = iterate(pipeline, 3, {"w3": "u_prev", "w4": "u_cur"}, plan="unfused", **chunked,
                  **params)
    assert halo_depths(pipeline.graph()) == [(4, 4), (4, 4)]  # 4 steps of radius 1
    result = got["w4"].compute(scheduler="threads")
    np.testing.assert_allclose(result, state["u_cur"], rtol=1e-5, atol=1e-5)
    with pytest.raises(ChunkingError, match="feedback maps outputs"):
        iterate(pipeline, 2, {"w4": "nope"}, **chunked, **params)


@pytest.mark.parametrize("mode", ["clamp", "mirror", "repeat", kf.constant(0.5)], ids=str)
def test_several_calls_per_halo_exchange(mode):
    """calls_per_exchange=m: m calls in each chunk's task on a chunk grown m halos deep
    (5 calls in exchanges of 2, 2, 1 and of 3, 2), equal to the calls one after another;
    an input not fed back (a right-hand side) read by every call."""
    from kfuse.scaleout import iterate

    p = kf.Pipeline("jacobi")
    u, f = p.input("u", 2), p.input("f", 2)
    new = kf.local((u.at(-1, 0) + u.at(1, 0) + u.at(0, -1) + u.at(0, 1) + f) * 0.2,
                   boundary=mode, name="u1")
    p.output(kf.local((new.at(-1, 1) + new.at(1, 0) + new) / 3.0 + 0.1 * f, boundary=mode,
                      name="u2"))
    rng = np.random.default_rng(17)
    values = {name: rng.random((37, 29), dtype=np.float32) for name in ("u", "f")}
    state = values["u"]
    for _ in range(5):
        state = p.run(backend="cpu", plan="unfused", u=state, f=values["f"])["u2"]
    chunked = {name: da.from_array(value, chunks=(9, 11)) for name, value in values.items()}
    for per_exchange in (2, 3):
        got = iterate(p, 5, {"u2": "u"}, plan="unfused", calls_per_exchange=per_exchange,
                      **chunked)["u2"]
        np.testing.assert_allclose(got.compute(scheduler="threads"), state, rtol=1e-5,
                                   atol=1e-5, err_msg=f"{per_exchange} per exchange")
    with pytest.raises(ChunkingError, match="calls_per_exchange must be a positive"):
        iterate(p, 5, {"u2": "u"}, calls_per_exchange=0, **chunked)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_cupy_chunks_on_the_cuda_backend(mode):
    cupy = pytest.importorskip("cupy")
    values = np.random.default_rng(13).random((61, 97), dtype=np.float32)
    pipeline = chain(mode)
    want = pipeline.run(backend="cpu", plan="unfused", x=values)
    chunked = da.from_array(cupy.asarray(values), chunks=(16, 40), asarray=False)
    got = pipeline.run(backend="cuda", x=chunked)
    results = dask.compute(got, scheduler="threads")[0]
    for name in want:
        assert isinstance(results[name], cupy.ndarray), name  # the chunks stayed on the GPU
        np.testing.assert_allclose(cupy.asnumpy(results[name]), want[name], rtol=1e-5,
                                   atol=1e-5, err_msg=name)


@pytest.mark.gpu
def test_halos_between_gpu_workers_go_device_to_device():
    """Two worker processes on the GPUs of one host (here possibly one GPU twice): halo
    slices cross as CUDA IPC handles (kfuse.scaleout.device_halos), results exact."""
    cupy = pytest.importorskip("cupy")
    distributed = pytest.importorskip("distributed")
    from kfuse.scaleout import persist_in_bands
    from kfuse.scaleout.device_halos import links_of

    values = np.random.default_rng(16).random((203, 77), dtype=np.float32)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        assert links_of(client, client.scheduler_info(n_workers=-1)["workers"])
        # (chunks of whole rows: computed as they lie, edge rows patched from strips)
        for chunks in ((25, 40), (25, 77)):
            x = persist_in_bands(da.from_array(values, chunks=chunks).map_blocks(cupy.asarray))
            for mode in ("clamp", "repeat", "mirror"):
                pipeline = chain(mode)
                want = pipeline.run(backend="cpu", plan="unfused", x=values)
                got = pipeline.run(backend="cuda", x=x)
                for name, array in got.items():
                    result = array.compute()
                    assert isinstance(result, cupy.ndarray), name
                    np.testing.assert_allclose(cupy.asnumpy(result), want[name], rtol=1e-5,
                                               atol=1e-5, err_msg=f"{mode} {chunks} {name}")
        # the senders' allocations are reused and each is opened once by a reader: three
        # more calls, each sending a halo each way, open (almost: a release may come late)
        # nothing more
        opened = sum(client.run(_opened_allocations).values())
        for _ in range(3):
            for array in chain("clamp").run(backend="cuda", x=x).values():
                array.compute()
        assert sum(client.run(_opened_allocations).values()) - opened <= 2


def _opened_allocations() -> int:
    from kfuse.scaleout import device_halos
    return len(device_halos._OPENED)


@pytest.mark.gpu
def test_host_chunks_on_gpu_workers():
    """NumPy chunks held by worker processes, computed on the cuda backend: each chunk copied
    to its worker's GPU and its outputs back; halos between workers travel as Dask moves
    host arrays (not as device handles), results exact and in host memory."""
    pytest.importorskip("cupy")
    distributed = pytest.importorskip("distributed")
    from kfuse.scaleout import persist_in_bands

    values = np.random.default_rng(17).random((157, 83), dtype=np.float32)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        for chunks in ((30, 83), (30, 41)):
            x = persist_in_bands(da.from_array(values, chunks=chunks))
            for mode in ("clamp", "repeat", kf.constant(0.25)):
                pipeline = chain(mode)
                want = pipeline.run(backend="cpu", plan="unfused", x=values)
                for name, array in pipeline.run(backend="cuda", x=x).items():
                    result = array.compute()
                    assert isinstance(result, np.ndarray), name
                    np.testing.assert_allclose(result, want[name], rtol=1e-5, atol=1e-5,
                                               err_msg=f"{mode} {chunks} {name}")
