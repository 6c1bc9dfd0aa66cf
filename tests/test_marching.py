"""3-D chains whose threads march along z (kfuse.codegen.marching), on the cpu backend.

The generated source runs under the host compiler with the asynchronous copies queued
until their wait (kfuse's prelude), so a plane read before it has landed reads the slot's
old content and fails these tests. Volumes are random; every boundary mode the marching
path takes; several chunks per volume (chunks of 8 planes), volumes thinner than the
chain's reach, and sizes that take the register-tiled path instead.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kfuse as kf
from kfuse.apps import get_app
from kfuse.apps.base import taps
from kfuse.bench.harness import max_relative_error
from kfuse.codegen import generate, marching
from kfuse.runtime import get_backend
from kfuse.runtime.numpy_backend import NumpyBackend
from kfuse.schedule import marching as schedule_marching

MARCHING_BOUNDARIES = ["clamp", "mirror", kf.constant(0.5)]


def chain(boundary: object) -> kf.Pipeline:
    """Two inputs, reaches of 1 below and 2 above along z and up to 3 along x, the first
    operator's result written out as well as read by the second."""
    p = kf.Pipeline("chain3d")
    u = p.input("u", ndim=3)
    w = p.input("w", ndim=3)
    c = p.param("c")
    s = kf.local(u.at(-1, 0, 0) + 2.0 * u.at(2, 0, 0) + u.at(0, -2, 0) * w + u.at(0, 1, 3)
                 - c * u, boundary=boundary, name="s")
    t = kf.local(s.at(1, 0, 0) - s.at(0, 0, -1) + s.at(-1, 1, 0) * w.at(0, 0, 1),
                 boundary=boundary, name="t")
    p.output(s, t)
    return p


def chain_reference(u: np.ndarray, w: np.ndarray, c: float, boundary: object
                    ) -> dict[str, np.ndarray]:
    at_u, at_w = taps(u, 3, boundary), taps(w, 1, boundary)
    s = at_u(-1, 0, 0) + 2.0 * at_u(2, 0, 0) + at_u(0, -2, 0) * w + at_u(0, 1, 3) - c * u
    at_s = taps(s, 1, boundary)
    return {"s": s, "t": at_s(1, 0, 0) - at_s(0, 0, -1) + at_s(-1, 1, 0) * at_w(0, 0, 1)}


@pytest.fixture(autouse=True)
def marching_on(configure):
    configure(march=True)


@pytest.fixture
def short_chunks(configure):
    configure(march_planes=8)


def run_whole_group(graph, arrays, params, variant: str = "recompute"):
    program = generate(graph, [(tuple(k.name for k in graph.kernels), graph.outputs, variant)])
    return program, get_backend("cpu").run(graph, arrays | params, program=program)


@pytest.mark.parametrize("shape", [(21, 12, 24), (9, 8, 12), (4, 4, 8), (2, 8, 4)], ids=str)
@pytest.mark.parametrize("boundary", MARCHING_BOUNDARIES, ids=str)
def test_diffusion_marches_and_equals_the_reference(boundary, shape, short_chunks):
    app = get_app("diffusion3d")
    graph = app.build(boundary=boundary).graph()
    arrays, params = app.make_inputs(shape, np.random.default_rng(7), "float32")
    expected = app.reference({k: v.astype(np.float64) for k, v in arrays.items()}, params,
                             boundary)["u2"]
    program, outputs = run_whole_group(graph, arrays, params)
    assert "threads march along z" in program.source
    assert max_relative_error(outputs["u2"], expected) <= 1e-5


@pytest.mark.parametrize("resident", [5, 2, 1])
def test_one_wave_of_blocks_takes_the_planes(configure, resident, monkeypatch):
    """Where the device's resident blocks are known, the planes split into one chunk per
    block of that wave (23 planes among 5 blocks: chunks of 5, the last of 3)."""
    from kfuse.runtime.cpu_backend import CpuLoadedProgram

    monkeypatch.setattr(CpuLoadedProgram, "resident_blocks", lambda self, spec: resident)
    configure(march_least_planes=3)
    app = get_app("diffusion3d")
    graph = app.build().graph()
    arrays, params = app.make_inputs((23, 8, 12), np.random.default_rng(5), "float32")
    expected = app.reference({k: v.astype(np.float64) for k, v in arrays.items()}, params,
                             "clamp")["u2"]
    program, outputs = run_whole_group(graph, arrays, params)
    (launch,) = program.launches
    sizes = graph.bind_shapes({k: v.shape for k, v in arrays.items()})
    assert launch.grid_size(sizes, resident)[2] == resident
    assert max_relative_error(outputs["u2"], expected) <= 1e-5


def test_a_wave_fills_the_device_beside_the_other_axes():
    from kfuse.codegen.program import GridAxis, LaunchSpec

    grid = (GridAxis(("x",), 128), GridAxis(("y",), 16),
            GridAxis(("z",), 256, least_per_block=16))
    spec = LaunchSpec("k", ("k",), (), (32, 4, 1), grid)
    sizes = {"x": 512, "y": 512, "z": 512}
    assert spec.grid_size(sizes) == (4, 32, 2)  # chunks of 256 planes
    assert spec.grid_size(sizes, 264) == (4, 32, 2)  # 2 x 132 resident: one wave
    assert spec.grid_size({"x": 256, "y": 256, "z": 256}, 264) == (2, 16, 8)
    assert spec.grid_size({"x": 256, "y": 256, "z": 40}, 264) == (2, 16, 3)  # >= 16 planes
    assert spec.grid_size({"x": 4096, "y": 4096, "z": 64}, 264) == (32, 256, 1)


def test_marching_pays_where_dram_bandwidth_per_cycle_is_high():
    assert schedule_marching.pays_on(4.8e12, 132, 1.98e9)  # H200: 18 bytes per SM cycle
    assert not schedule_marching.pays_on(3.35e12, 132, 1.98e9)  # H100 SXM: 13
    assert not schedule_marching.pays_on(4.8e12, 0, 1.98e9)


def test_marching_needs_long_chunks_in_a_full_wave():
    """The H200 measurements (132 multiprocessors, two marching blocks each)."""
    assert schedule_marching.fills_device(512, 512, 512, 132)  # 2 chunks of 256 planes, 256 of 264
    assert schedule_marching.fills_device(512, 1024, 1024, 132)  # 512 blocks of rows and columns
    assert not schedule_marching.fills_device(256, 256, 256, 132)  # chunks of 32 planes
    assert not schedule_marching.fills_device(384, 384, 384, 132)  # 216 blocks for 264 places
    assert not schedule_marching.fills_device(128, 512, 512, 132)  # chunks of 64 planes


def test_programs_march_where_asked_unless_forced(configure):
    graph = get_app("diffusion3d").build().graph()
    groups = [(tuple(k.name for k in graph.kernels), graph.outputs, "recompute")]
    configure(march=None)
    assert "threads march" in generate(graph, groups, march=True).source
    assert "threads march" not in generate(graph, groups).source
    configure(march=False)
    assert "threads march" not in generate(graph, groups, march=True).source


def test_resident_blocks_follow_registers_threads_and_shared_memory():
    from kfuse.model.occupancy import blocks_per_multiprocessor

    # the marching kernel on an H200: 245 registers (7,936 a warp), 128 threads, 43.5 KB
    assert blocks_per_multiprocessor(245, 128, 43520) == 2
    assert blocks_per_multiprocessor(128, 128, 43520) == 4
    assert blocks_per_multiprocessor(32, 256, 0) == 8  # threads and registers both: 8
    assert blocks_per_multiprocessor(32, 128, 100 * 1024) == 2  # shared memory
    assert blocks_per_multiprocessor(16, 32, 0) == 32  # the block limit
    assert blocks_per_multiprocessor(255, 1024, 0) == 0


@pytest.mark.parametrize("boundary", MARCHING_BOUNDARIES, ids=str)
def test_intermediates_recomputed_below_their_newest_plane(configure, boundary, short_chunks):
    """The form without ``NEWEST_PLANES_ONLY`` (an intermediate's lower planes recomputed
    where the step reads them, not carried) is exact too."""
    configure(march_newest_planes_only=False)
    test_diffusion_marches_and_equals_the_reference(boundary, (21, 12, 24), None)


@pytest.mark.parametrize("shape", [(19, 12, 24), (6, 16, 8), (11, 10, 13)], ids=str)
@pytest.mark.parametrize("boundary", MARCHING_BOUNDARIES, ids=str)
def test_a_chain_of_two_inputs_and_two_outputs(configure, boundary, shape, short_chunks):
    """Asymmetric reaches, a second staged input, an intermediate written out; the last
    volume (13 columns, 10 rows) takes the register tiles inside the same kernel. Its
    steps read 5 planes of each input (130 KiB staged with those copied ahead): above the
    default limit, which keeps two blocks per SM."""
    configure(march_shared_bytes=227 * 1024)
    graph = chain(boundary).graph()
    rng = np.random.default_rng(3)
    arrays = {name: rng.uniform(0.5, 1.5, shape).astype(np.float32) for name in ("u", "w")}
    params = {"c": 0.3}
    expected = chain_reference(arrays["u"].astype(np.float64), arrays["w"].astype(np.float64),
                               0.3, boundary)
    program, outputs = run_whole_group(graph, arrays, params)
    assert "kf_staged_w" in program.source
    for name in ("s", "t"):
        assert max_relative_error(outputs[name], expected[name]) <= 1e-5, name


@st.composite
def marching_chains(draw):
    """(pipeline, inputs): a chain of 2-4 operators over two 3-D inputs, each reading its
    predecessor (stencils at random offsets in random modes, also reading inputs or earlier
    results, sometimes pointwise); the last result and sometimes an intermediate written
    out."""
    shape = (draw(st.integers(3, 12)), draw(st.sampled_from([4, 8, 12])),
             draw(st.sampled_from([8, 12, 16])))
    p = kf.Pipeline("marching_chain")
    arrays = [p.input("a", ndim=3), p.input("b", ndim=3)]
    for index in range(draw(st.integers(2, 4))):
        if index and draw(st.integers(0, 3)) == 0:
            x, y = draw(st.sampled_from(arrays)), arrays[-1]
            arrays.append(kf.point(x * y + 0.25, name=f"op{index}"))
            continue
        terms = []
        for tap in range(draw(st.integers(2, 4))):
            if index == 0 and tap < 2:  # the first operator reads both inputs
                source = arrays[tap]
            elif index and tap == 0:  # each later one its predecessor
                source = arrays[-1]
            else:
                source = draw(st.sampled_from(arrays))
            offsets = tuple(draw(st.integers(-1, 1)) for _ in range(3))
            mode = draw(st.sampled_from(["clamp", "mirror", "constant"]))
            terms.append(source.at(*offsets, boundary=kf.constant(0.5) if mode == "constant"
                                   else mode))
        body = terms[0]
        for term in terms[1:]:
            body = body + term
        arrays.append(kf.local(body * (1.0 / len(terms)), name=f"op{index}"))
    written = [arrays[-1]]
    if len(arrays) > 3 and draw(st.booleans()):
        written.append(arrays[2])
    p.output(*written)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    inputs = {n: rng.uniform(0.5, 1.5, size=shape).astype(np.float32) for n in ("a", "b")}
    return p, inputs


@settings(max_examples=7, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(case=marching_chains())
def test_random_chains_march_and_equal_the_reference(configure, case, short_chunks):
    configure(march_shared_bytes=227 * 1024)
    pipeline, inputs = case
    graph = pipeline.graph()
    program, outputs = run_whole_group(graph, inputs, {})
    reference = NumpyBackend(precision="float64").run(graph, inputs)
    marches = "threads march along z" in program.source
    stencil = any(not access.is_point for kernel in graph.kernels for access in kernel.accesses
                  if access.buffer in {k.output for k in graph.kernels})
    assert marches or not stencil, "a chain of 3-D stencils did not march"
    for name in graph.outputs:
        assert max_relative_error(outputs[name], reference[name]) <= 1e-5, name


def test_too_many_staged_planes_take_the_register_tiles():
    graph = chain("clamp").graph()
    program = generate(graph, [(("s", "t"), ("s", "t"), "recompute")])
    assert "threads march" not in program.source
    assert "register tile" in program.source


def test_periodic_rows_take_the_register_tiles():
    app = get_app("diffusion3d")
    graph = app.build(boundary="repeat").graph()
    members = [k.name for k in graph.kernels]
    assert "periodic" in schedule_marching.march_reasons(graph, members, graph.outputs)
    program = generate(graph, [(tuple(k.name for k in graph.kernels), graph.outputs,
                                "recompute")])
    assert "threads march" not in program.source


def test_a_step_carries_what_it_computes_one_plane_higher():
    from kfuse.codegen.cexpr import EmitState, index_key

    state = EmitState()
    state.declare("int", "iz_p1", "iz + 1", index_key("iz", 1))
    state.declare("int", "iy_m1_clamp", "kf_clamp(iy - 1, n)", index_key("iy", -1, "n", "clamp"))

    def u_at(z: int, y: tuple) -> tuple:
        return ("load", "u", "float32", index_key("iz", z), y, ("text", "ix"))
    at_a, at_b = u_at(0, ("text", "iy")), u_at(1, ("text", "iy"))
    at_d = u_at(0, index_key("iy", -1, "n", "clamp"))
    state.declare("float", "a", "u[KF_AT(u|iz|iy|ix)]", at_a)
    state.declare("float", "b", "u[KF_AT(u|iz_p1|iy|ix)]", at_b, ("iz_p1",))
    state.declare("float", "d", "u[KF_AT(u|iz|iy_m1_clamp|ix)]", at_d, ("iy_m1_clamp",))
    a, b, d = ("stmt", "a"), ("stmt", "b"), ("stmt", "d")  # how keys name statements
    state.declare("float", "s", "a + b", ("{} + {}", "float32", a, b), ("a", "b"))
    state.declare("float", "r", "a * d", ("{} * {}", "float32", a, d), ("a", "d"))
    step = marching._split_step(state, ["s", "r"])
    # a is b one plane lower; s's copy one plane higher would need u at iz + 2; d is read
    # only at iz (its copy one plane higher is not computed)
    assert step.carried == {"a": "b"}
    assert step.needed == {"a", "b", "d", "s", "r"}
    assert step.z_indices == ["const int iz_p1 = iz + 1;"]
    assert step.thread_indices == ["const int iy_m1_clamp = kf_clamp(iy - 1, n);"]


@pytest.mark.parametrize("memory_clock_khz,bus_bits,volume,expected", [
    (3201000, 6144, (512, 512, 512), True),  # H200, a volume one wave covers in 256 planes
    (3201000, 6144, (256, 256, 256), False),  # H200, chunks of 32 planes
    (2619000, 5120, (512, 512, 512), False),  # H100 SXM: 13 bytes per SM cycle
])
def test_the_cuda_backend_decides_from_the_device_and_the_volume(
        memory_clock_khz, bus_bits, volume, expected, monkeypatch):
    """The cuda backend's decision, its device attributes faked (no GPU needed)."""
    from types import SimpleNamespace

    from kfuse.runtime import cuda_backend

    attributes = {"MemoryClockRate": memory_clock_khz, "GlobalMemoryBusWidth": bus_bits,
                  "ClockRate": 1980000, "MultiProcessorCount": 132}
    device = SimpleNamespace(id=0, attributes=attributes)
    fake = SimpleNamespace(cuda=SimpleNamespace(Device=lambda *index: device))
    monkeypatch.setattr(cuda_backend, "_cupy", lambda: fake)
    cuda_backend._device_attributes.cache_clear()
    graph = get_app("diffusion3d").build().graph()
    sizes = graph.bind_shapes({"u0": volume})
    try:
        assert cuda_backend.CudaBackend().marches_along_z(graph, sizes) is expected
    finally:
        cuda_backend._device_attributes.cache_clear()
