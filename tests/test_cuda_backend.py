"""The cuda backend on a real GPU (skipped where no GPU with CuPy is usable, as in CI)."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app, list_apps
from kfuse.apps.check import reference_errors, relative_error
from kfuse.runtime.binding import bind, to_numpy
from kfuse.runtime.cuda_backend import CudaBackend
from kfuse.search import default_plan

pytestmark = pytest.mark.gpu  # (skipped where no GPU is usable: tests/conftest.py)

BOUNDARIES = ["clamp", "mirror", "repeat", kf.constant(0.5)]


@pytest.mark.parametrize("plan", ["auto", "unfused"])
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize("app", [a.name for a in list_apps()])
def test_apps_on_cuda_match_the_reference(app, boundary, plan):
    spec = get_app(app)
    arrays, params = spec.make_inputs(spec.test_size, np.random.default_rng(7), "float32")
    outputs = spec.build(boundary=boundary).run(backend="cuda", plan=plan, **arrays, **params)
    errors = reference_errors(spec, arrays, params, outputs, boundary)
    assert max(errors.values()) <= 1e-5, errors


def test_cupy_and_torch_inputs_are_not_copied():
    import cupy

    p = kf.Pipeline("inplace")
    x = p.input("x", ndim=2)
    total = kf.reduce_sum(x)
    p.output(kf.point(x / total, name="y"), total)
    data = cupy.random.random((301, 257), dtype=cupy.float32) + 0.5
    executable = CudaBackend().prepare(p.graph(), {"x": data})
    assert executable.buffers["x"].data.ptr == data.data.ptr
    executable.launch_all()
    y = executable.results()["y"]
    assert isinstance(y, cupy.ndarray)
    expected = data.get().astype(np.float64)
    assert relative_error(y.get(), expected / expected.sum()) <= 1e-5

    torch = pytest.importorskip("torch")
    tensor = torch.rand(301, 257, device="cuda") + 0.5
    executable = CudaBackend().prepare(p.graph(), {"x": tensor})
    assert executable.buffers["x"].data.ptr == tensor.data_ptr()
    executable.launch_all()
    y = executable.results()["y"]
    assert isinstance(y, torch.Tensor) and y.is_cuda
    expected = tensor.double().cpu().numpy()
    assert relative_error(y.cpu().numpy(), expected / expected.sum()) <= 1e-5


@pytest.mark.parametrize(("app", "size"), [("waxpby", (100003,)), ("madd", (301, 257)),
                                           ("bicgk", (301, 260)), ("harris", (67, 260))],
                         ids=str)
def test_views_at_odd_addresses_on_cuda(app, size):
    """CuPy views that start one element inside another array are not copied: kfuse compiles
    a program that tests its pointers (a vector load there would be a misaligned address)."""
    import cupy

    spec = get_app(app)
    arrays, params = spec.make_inputs(size, np.random.default_rng(5), "float32")
    views = {}
    for name, array in arrays.items():
        base = cupy.empty(array.size + 1, dtype=array.dtype)
        views[name] = base[1:].reshape(array.shape)
        views[name][...] = cupy.asarray(array)
    pipeline = spec.build()
    graph = pipeline.graph()
    plan = default_plan(graph, bind(graph, {**arrays, **params}).sizes)
    executable = CudaBackend().prepare(graph, {**views, **params}, plan=plan)
    assert executable.program.array_alignment == 4
    executable.launch_all()
    errors = reference_errors(spec, arrays, params, executable.buffers)
    assert max(errors.values()) <= spec.tolerance, errors
    aligned = CudaBackend().prepare(graph, {**arrays, **params})
    assert aligned.program.array_alignment == 16


@pytest.mark.parametrize("app", [a.name for a in list_apps("blas") + list_apps("norm")])
def test_blas_apps_on_cuda_match_the_reference(app):
    spec = get_app(app)
    arrays, params = spec.make_inputs(spec.test_size, np.random.default_rng(7), "float32")
    outputs = spec.build().run(backend="cuda", plan="auto", **arrays, **params)
    errors = reference_errors(spec, arrays, params, outputs)
    assert max(errors.values()) <= spec.tolerance, errors


# (app, variant, sizes): rows held in segments (several, a partial last one; every pass,
# online rescaling, stashes; rows of whole 16-byte vectors: the loads with L2 priorities)
# and held columns (segments of rows, a partial last strip)
SEGMENT_CASES = [
    *[(app, variant, ((9, 40003), (3, 1001), (5, 40000)))
      for app in ("logsoftmax", "softmax", "crossentropy", "layernorm", "logsumexp")
      for variant in ("mapreduce:1024x1:r1:i1:w:stream:g40:u4:hr:sg",
                      "mapreduce:1024x1:r1:i1:w:stream:g40:u2:hr:sg:st7",
                      "mapreduce:128x1:r1:i1:s:stream:g3:u2:hr:sg:st5")],
    *[("colstandardise", variant, ((40003, 9), (1001, 37)))
      for variant in ("mapreduce:2x128:r1:i1:w:shuffle:u8:hc:st3",
                      "mapreduce:8x32:r1:i1:s:shuffle:u2:hc")],
]


@pytest.mark.parametrize("app, variant, sizes", SEGMENT_CASES)
def test_rows_in_segments_and_held_columns_on_cuda_match_the_reference(app, variant, sizes):
    spec = get_app(app)
    pipeline = spec.build()
    members = tuple(k.name for k in pipeline.graph().kernels)
    plan = pipeline.fuse([members], forms=[variant])
    for size in sizes:
        arrays, params = spec.make_inputs(size, np.random.default_rng(size[0]), "float32")
        outputs = pipeline.run(backend="cuda", plan=plan, **arrays, **params)
        errors = reference_errors(spec, arrays, params, outputs)
        assert max(errors.values()) <= spec.tolerance, (size, errors)


@pytest.mark.parametrize("variant", ["mapreduce:2x128:r1:i1:w:shuffle:u8:hc:st3",
                                     "mapreduce:8x32:r1:i1:s:shuffle:u2:hc"])
def test_a_column_tail_after_held_columns_on_cuda_matches_numpy(variant):
    """A column's log-sum-exp times a vector along the columns, after held columns."""
    p = kf.Pipeline("column_tail")
    x = p.input("x", ndim=2)
    c = p.input("c", shape=(x.shape[1],))
    top = kf.reduce_max(x, axis=0, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(1,))), axis=0, name="total")
    p.output(kf.point((top + kf.log(total)) * c, name="scaled"))
    plan = p.fuse([("top", "total", "scaled")], forms=[variant])
    rng = np.random.default_rng(5)
    for rows, cols in ((40003, 9), (1001, 37)):
        x_value = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
        c_value = rng.uniform(0.5, 1.5, cols).astype(np.float32)
        got = to_numpy(p.run(backend="cuda", plan=plan, x=x_value, c=c_value)["scaled"])
        v = x_value.astype(np.float64)
        m = v.max(axis=0)
        expected = (m + np.log(np.exp(v - m).sum(axis=0))) * c_value
        assert relative_error(got, expected) <= 1e-5, (variant, rows, cols)


NAMED_VARIANTS = [  # (app, the group, variant): block rows, 8-byte accesses, plain maps
    ("sgemv", ("z_prod", "z"), "mapreduce:512x1:r1:i1:w8:stream:u16"),
    ("gesummv", ("Ax", "Bx", "y"), "mapreduce:1024x1:r1:i1:w8:stream:u8"),
    ("sgemv", ("z_prod", "z"), "mapreduce:64x1:r1:i1:w8:stream:g3:u2"),
    ("atax", ("t",), "mapreduce:256x1:r2:i2:w:stream:u4"),
    ("vadd", ("wy", "x"), "mapreduce:128x1:r1:i1:w8:shuffle"),
    ("madd", ("C",), "mapreduce:128x1:r1:i1:w:shuffle"),
    ("axpydot", ("z", "r"), "mapreduce:256x1:r1:i2:w8:shuffle:g5"),
    # whole columns: plain stores, a column epilogue, with atomics for BiCGK's rows
    ("sgemvt", ("x_prod", "x"), "mapreduce:32x32:r4:i1:w:shuffle:wc"),
    ("atax", ("y",), "mapreduce:32x32:r2:i1:w8:shuffle:wc"),
    ("bicgk", ("q", "s"), "mapreduce:32x16:r2:i1:s:shuffle:wc"),
    ("gemver", ("B", "x_prod", "x"), "mapreduce:32x8:r2:i1:w:smem:wc"),
    # held rows: a row reduction feeding the same row's column sums, or beside them
    ("atax", ("t", "y"), "mapreduce:1024x1:r1:i1:w8:stream:g132:u8:hr"),
    ("atax", ("t", "y"), "mapreduce:512x1:r1:i1:w:stream:g7:u8:hr"),
    ("bicgk", ("q", "s"), "mapreduce:1024x1:r1:i1:w:stream:g132:u4:hr"),
]


@pytest.mark.parametrize("app,members,variant", NAMED_VARIANTS)
def test_named_map_reduce_variants_on_cuda(app, members, variant):
    """Programs compiled for their sizes (as the backend compiles its own): odd sizes, and
    rows of exactly one step of the 512 x 8-byte x 16 block rows."""
    from kfuse.codegen import generate
    from kfuse.fusion.plan import group_outputs, order_groups

    spec = get_app(app)
    graph = spec.build().graph()
    groups = [(members, group_outputs(graph, members), variant)]
    groups += [((k.name,), group_outputs(graph, (k.name,)), "auto") for k in graph.kernels
               if k.name not in members]
    order = order_groups(graph, [g[0] for g in groups])
    groups.sort(key=lambda group: order.index(tuple(group[0])))
    sizes = [(67, 1031), (16, 16384)] if spec.ndim == 2 else [(4099,), (1 << 20,)]
    for size in sizes:
        arrays, params = spec.make_inputs(size, np.random.default_rng(8), "float32")
        program = generate(graph, groups, fixed_sizes=spec.sizes(graph, size))
        outputs = CudaBackend().run(graph, {**arrays, **params}, program=program)
        errors = reference_errors(spec, arrays, params, outputs)
        assert max(errors.values()) <= spec.tolerance, (size, errors)


def test_device_case_puts_an_app_on_the_gpu_as_kfuse_bench_plans_it():
    """The start of the GPU experiment scripts: inputs on the device, sizes, the plan."""
    import cupy

    from kfuse.bench.experiment import device_case
    from kfuse.bench.harness import app_plan

    case = device_case("sgemv")
    assert isinstance(case.given["A"], cupy.ndarray) and case.given["A"].shape == (16384, 16384)
    assert case.sizes == case.app.sizes(case.graph, case.app.bench_size)
    assert case.plan.kernel_groups == app_plan(case.app, case.graph, case.sizes).kernel_groups
    assert case.given["alpha"] == device_case("sgemv").given["alpha"]  # seeded


@pytest.mark.parametrize("shape", [(37, 24, 32), (9, 16, 128), (70, 8, 36)], ids=str)
@pytest.mark.parametrize("boundary", ["clamp", "mirror", kf.constant(0.5)], ids=str)
def test_marching_kernels_on_cuda(configure, boundary, shape):
    """Threads marching along z (forced, whatever the device; the whole chain in one group
    with the default register tile as fallback), one wave of blocks, volumes whose depth
    splits unevenly among them and thin ones; every point against the reference."""
    from kfuse.bench.harness import max_relative_error
    from kfuse.codegen import generate
    from kfuse.runtime import get_backend

    configure(march=True)
    spec = get_app("diffusion3d")
    graph = spec.build(boundary=boundary).graph()
    arrays, params = spec.make_inputs(shape, np.random.default_rng(11), "float32")
    program = generate(graph, [(tuple(k.name for k in graph.kernels), graph.outputs,
                                "recompute")],
                       fixed_sizes=graph.bind_shapes({k: v.shape for k, v in arrays.items()}))
    executable = get_backend("cuda").prepare(graph, arrays | params, program=program)
    assert "threads march along z" in executable.program.source
    executable.launch_all()
    (launch,) = executable.program.launches
    resident = executable.loaded.resident_blocks(launch)
    x, y, z = launch.grid_size(executable.bound.sizes, resident)
    assert x * y * z <= max(resident, x * y)  # one wave (or one chunk where rows need more)
    outputs = executable.results()
    reference = spec.reference({k: v.astype(np.float64) for k, v in arrays.items()}, params,
                               boundary)
    for name, expected in reference.items():
        assert max_relative_error(outputs[name], expected) <= 1e-5, name


def test_calibration_times_the_elementwise_kernel_in_each_block():
    from kfuse.tune.calibrate import MAP_BLOCKS, measure_map_blocks

    times = measure_map_blocks(1 << 22, rounds=1, repeat=3)  # (its sums are checked inside)
    assert sorted(times) == sorted(MAP_BLOCKS) and all(t > 0 for t in times.values())


def test_calibration_times_the_gemv_in_each_block_row_form():
    from kfuse.tune.calibrate import MAX_ROW_LOADS, ROW_BLOCK_FORMS, measure_row_blocks

    times = measure_row_blocks(1 << 24, rounds=1, repeat=3)  # (checked inside)
    assert sorted(times) == ["1", "2"]
    assert sorted(times["1"]) == sorted(ROW_BLOCK_FORMS)
    assert sorted(times["2"]) == sorted(f for f in ROW_BLOCK_FORMS if 2 * f[2] <= MAX_ROW_LOADS)
    assert all(t > 0 for forms in times.values() for t in forms.values())


def test_compiled_calls_on_torch_tensors_stay_torch_and_follow_the_stream():
    """Torch in, torch out from torch's allocator, out= used as given; work ordered on a
    non-default torch stream; graph replays equal direct launches."""
    torch = pytest.importorskip("torch")
    spec = get_app("harris")
    arrays, params = spec.make_inputs((301, 257), np.random.default_rng(8), "float32")
    image = torch.as_tensor(arrays["img"], device="cuda")
    direct = spec.build().compile("cuda", graphs=False)
    replayed = spec.build().compile("cuda", plan="unfused")
    want = direct(img=image, **params)["hc"]
    assert isinstance(want, torch.Tensor) and want.is_cuda
    target = torch.empty_like(want)
    assert direct(img=image, out=target, **params)["hc"] is target
    for _ in range(3):  # the second call on the same tensors captures, the third replays
        got = replayed(img=image, out=target, **params)["hc"]
    assert replayed.stats.graph_replays >= 1
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(5):
            doubled = image * 2.0  # made on the side stream, read at once
            on_side = direct(img=doubled, **params)["hc"]
    side.synchronize()
    expected = direct(img=image * 2.0, **params)["hc"]
    torch.cuda.synchronize()
    assert torch.equal(on_side, expected)
    with pytest.raises(kf.ShapeError):
        direct(img=image, out=target[:5], **params)
    with pytest.raises(kf.BindError, match="host memory"):
        direct(img=image, out=target.cpu(), **params)


def test_side_streams_compute_what_one_stream_computes():
    cupy = pytest.importorskip("cupy")
    spec = get_app("levels")
    arrays, params = spec.make_inputs((300, 260), np.random.default_rng(9), "float32")
    given = {name: cupy.asarray(value) for name, value in arrays.items()}
    one = spec.build().compile("cuda", streams=False)(**given, **params)
    several = spec.build().compile("cuda", streams=True)
    for _ in range(3):  # direct launches, a capture, a replay
        out = several(**given, **params)
    assert "separate streams" in several.explain()
    for name in one:
        assert bool(cupy.array_equal(one[name], out[name])), name
    host = spec.build().run(backend="cuda", **arrays, **params)
    assert isinstance(host["detail0"], np.ndarray)


@pytest.mark.parametrize("pair", ["blur_hash", "hist_sum", "sobel_hash", "small_pair"])
def test_user_kernels_and_side_by_side_pairs_on_cuda(pair):
    """User kernels (NVRTC compiles the user's source as device functions) and their pairs
    side by side (named barriers, per-part grids) against the reference, at test and
    benchmark-like sizes."""
    cupy = pytest.importorskip("cupy")
    from kfuse.apps.pairs import get_pair

    chosen = get_pair(pair)
    pipeline = chosen.build()
    for test in (True, False):
        host = chosen.make_inputs(np.random.default_rng(11), test)
        given = {name: cupy.asarray(value) for name, value in host.items()}
        want = chosen.reference(host)
        names = [group.members[0] for group in pipeline.fuse([]).groups]
        fused_names = [k.name for k in pipeline.graph().kernels if k.name not in ("dx", "dy")]
        plans = {"apart": "unfused",
                 "side by side": pipeline.fuse([["dx", "dy", "mag"]] if "mag" in names else [],
                                               side_by_side=[fused_names[-2:]]),
                 "auto": "auto"}
        for label, plan in plans.items():
            got = pipeline.compile("cuda", plan)(**given)
            for name in want:
                error = relative_error(cupy.asnumpy(got[name]), want[name])
                assert error < 1e-5, (pair, test, label, name, error)  # (float32 sums)


@pytest.mark.parametrize("plan", ["auto", "unfused"])
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize("app", [a.name for a in list_apps("pyramid")])
@pytest.mark.parametrize("size", [(37, 53), (1, 1), (64, 29)],
                         ids=lambda size: "x".join(map(str, size)))
def test_pyramid_apps_on_cuda_match_the_reference(app, boundary, plan, size):
    spec = get_app(app)
    arrays, params = spec.make_inputs(size, np.random.default_rng(7), "float32")
    outputs = spec.build(boundary=boundary).run(backend="cuda", plan=plan, **arrays, **params)
    errors = reference_errors(spec, arrays, params, outputs, boundary)
    assert max(errors.values()) <= spec.tolerance, errors


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_reads_at_another_resolution_and_at_computed_indices_on_cuda(boundary):
    """Scaled reads by several factors and data-dependent reads (negative indices, far
    outside) on cuda against the numpy backend."""
    p = kf.Pipeline("remapped_cuda")
    x = p.input("x", 2)
    table = p.input("table", 1)
    index = kf.astype(x * 60.0, "int32") - 20
    p.output(kf.point(x.at(1, -2, down=(1, 3), boundary=boundary) * 2.0, name="down"),
             kf.point(x.at(-1, 2, up=(2, 3), boundary=boundary) + x.at(0, 0, up=(2, 3)),
                      name="up"),
             kf.point(kf.lookup(table, index, boundary=boundary) + x, name="looked"),
             kf.point(x.at(0, 1, index={0: (kf.coord(0) * 5 - 7) // 2}, dims=(-1, 1),
                           boundary=boundary) - x, name="rows"))
    rng = np.random.default_rng(8)
    given = {"x": rng.random((29, 41), dtype=np.float32),
             "table": rng.random(17, dtype=np.float32)}
    want = p.run(backend="numpy", **given)
    for plan in ("auto", "unfused"):
        got = p.run(backend="cuda", plan=plan, **given)
        for name, value in want.items():
            assert relative_error(to_numpy(got[name]), value) <= 1e-6, (plan, name)
