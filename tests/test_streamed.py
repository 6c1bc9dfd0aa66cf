"""The streamed form (2-D stencil chains walked down the rows) on chains drawn at random,
against the numpy backend (the NumPy reference of the IR), on the cpu backend.

Each chain: 2-4 steps of stencils (the first of radius 1 or 2) over random windows (the point always
among them, rows above and below as often as not), each step under a random boundary mode,
the first step and some others also reading the second input or an earlier step at
the point, some an input
with periodic boundaries (read from memory), one intermediate among the outputs. Blocks of
32 threads (128 columns) and chunks of 8 rows on odd sizes, so that blocks meet across
columns and rows and chunks hold iterations near the top and bottom and away from them.
"""

from __future__ import annotations

import numpy as np
import pytest

import kfuse
import kfuse.dsl as kf
from kfuse.schedule.forms import Streamed

MODES = ["clamp", "mirror", kfuse.constant(0.25)]
SIZES = [(29, 141), (8, 9), (45, 262)]


def cpu_or_skip():
    from kfuse.runtime.cpu_backend import CpuBackend
    if not CpuBackend.available():
        pytest.skip("no host C++ compiler")


def random_chain(seed: int, most_steps: int = 4, dtype: str = "float32") -> kf.Pipeline:
    rng = np.random.default_rng(seed)
    p = kf.Pipeline(f"chain{seed}")
    a = p.input("a", ndim=2, dtype=dtype)
    b = p.input("b", shape=a.shape, dtype=dtype)
    steps = [a]
    for step in range(min(int(rng.integers(2, 5)), most_steps)):
        radius = int(rng.integers(1, 3)) if step == 0 else 1
        rows = range(-radius, radius + 1) if rng.random() < 0.8 else [0]
        window = [(dy, dx) for dy in rows for dx in range(-radius, radius + 1)
                  if (dy, dx) == (0, 0) or rng.random() < 0.5]
        source = steps[-1]
        total = None
        for dy, dx in window:
            term = source.at(dy, dx) * float(rng.uniform(0.05, 0.3))
            total = term if total is None else total + term
        if step == 0:
            total = total + 0.5 * b
        elif rng.random() < 0.5:  # an earlier step, or the second input, at the point
            total = total + 0.5 * (steps[int(rng.integers(len(steps)))] if rng.random() < 0.5
                                   else b)
        if rng.random() < 0.3:  # a periodic read of an input
            total = total - 0.1 * b.at(1, -1, boundary="repeat")
        mode = MODES[int(rng.integers(len(MODES)))]
        steps.append(kf.local(total, boundary=mode, name=f"s{step}"))
    p.output(steps[-1], steps[len(steps) // 2])
    return p


def streamed_chain(seed: int, dtype: str = "float32") -> tuple[kf.Pipeline, object, int]:
    """The random chain of ``seed`` with as many of its steps as the streamed form's queues
    hold (a chain whose queues would take too many registers loses its last steps), its
    plan as one streamed group (blocks of 32 threads, chunks of 8 rows), and its steps."""
    form = Streamed(threads=32, chunk_rows=8)
    for most_steps in (4, 3, 2):
        pipeline = random_chain(seed, most_steps, dtype)
        members = [k.name for k in pipeline.graph().kernels]
        reason = form.why_not(pipeline.graph(), members)
        if reason is None or "registers" not in reason:
            break
    assert reason is None, reason
    return pipeline, pipeline.fuse([members], forms=[form]), most_steps


def check_one_input_chain(p: kf.Pipeline, sizes: list[tuple[int, int]],
                          rng: np.random.Generator) -> None:
    """The chain of ``p`` (input ``u``, output ``s2``) streamed in blocks of 32 threads and
    chunks of 8 rows equals the numpy backend at each of ``sizes``."""
    members = [k.name for k in p.graph().kernels]
    plan = p.fuse([members], forms=[Streamed(threads=32, chunk_rows=8)])
    for size in sizes:
        data = rng.uniform(0.5, 2.0, size).astype(np.float32)
        got = p.run(backend="cpu", plan=plan, u=data)["s2"]
        want = p.run(backend="numpy", plan="unfused", u=data)["s2"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=str(size))


@pytest.mark.integration
@pytest.mark.parametrize("seed", [*range(12), "float64-2", "float64-6", "float64-9"])
def test_random_chains_streamed_equal_numpy(seed):
    """(A chain whose queues would take too many registers loses its last steps; float64
    chains keep their rows in 8 bytes, copied 16 bytes at a time, their queues two registers
    a value.)"""
    cpu_or_skip()
    dtype, seed = ("float64", int(seed.split("-")[1])) if isinstance(seed, str) \
        else ("float32", seed)
    pipeline, plan, _ = streamed_chain(seed, dtype)
    rng = np.random.default_rng(100 + seed)
    tolerance = 1e-12 if dtype == "float64" else 2e-5
    for size in [*SIZES, (23, 136)]:  # (136 columns: whole vectors)
        arrays = {name: rng.uniform(0.5, 2.0, size).astype(dtype) for name in "ab"}
        got = pipeline.run(backend="cpu", plan=plan, **arrays)
        want = pipeline.run(backend="numpy", plan="unfused", **arrays)
        for name, value in want.items():
            assert got[name].dtype == np.dtype(dtype)
            np.testing.assert_allclose(got[name], value, rtol=tolerance, atol=tolerance,
                                       err_msg=f"{name} at {size}")


@pytest.mark.integration
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("seed", [1, 5, 8])
def test_random_chains_of_two_byte_floats_streamed(dtype, seed):
    """Chains of float16 and bfloat16 (rows kept in float32, inputs fetched into registers
    and converted into their rings at the iteration's end, every step's result rounded as
    its unfused kernel stores it, four outputs in one 8-byte store) equal the unfused
    kernels on the cpu backend (to a quarter ulp), and the NumPy reference in float64
    to the error of the chain, on odd sizes in every mode drawn."""
    cpu_or_skip()
    from kfuse.runtime.numpy_backend import numpy_dtype

    pipeline, plan, most_steps = streamed_chain(seed, dtype)
    ulp = {"float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
    rng = np.random.default_rng(200 + seed)
    for size in [*SIZES, (23, 136)]:  # (136 columns: 8-byte accesses)
        arrays = {name: rng.uniform(0.5, 2.0, size).astype(numpy_dtype(dtype))
                  for name in "ab"}
        got = pipeline.run(backend="cpu", plan=plan, **arrays)
        apart = pipeline.run(backend="cpu", plan="unfused", **arrays)
        wide = random_chain(seed, most_steps, "float64").run(  # (the same chain)
            backend="numpy", plan="unfused", **{k: v.astype(np.float64) for k, v in arrays.items()})
        for name, value in apart.items():
            assert got[name].dtype == numpy_dtype(dtype)
            fused, alone = got[name].astype(np.float64), value.astype(np.float64)
            scale = np.abs(alone).max()
            # (equal here; a step's result left unrounded differs by 0.7-1 ulp of the largest)
            assert np.abs(fused - alone).max() <= ulp * scale / 4, (name, size)
            assert np.abs(fused - wide[name]).max() <= 16 * ulp * scale, (name, size)


@pytest.mark.integration
@pytest.mark.parametrize("seed", range(4))
def test_random_periodic_chains_streamed_equal_numpy(seed):
    """Chains whose every read at an offset is periodic: the blocks compute the rows and
    columns beyond the grid's edges as their wrapped copies (sizes smaller than the halo
    wrap several times)."""
    cpu_or_skip()
    rng = np.random.default_rng(seed)
    p = kf.Pipeline(f"periodic{seed}")
    u = p.input("u", ndim=2)
    steps = [u]
    for step in range(3):
        window = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)
                  if (dy, dx) == (0, 0) or rng.random() < 0.6]
        total = None
        for dy, dx in window:
            term = steps[-1].at(dy, dx) * float(rng.uniform(0.05, 0.3))
            total = term if total is None else total + term
        steps.append(kf.local(total + 0.5 * steps[0], boundary="repeat", name=f"s{step}"))
    p.output(steps[-1])
    check_one_input_chain(p, [(29, 141), (3, 5), (2, 2)], rng)


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["clamp", "mirror", "repeat", kfuse.constant(0.5)], ids=str)
def test_an_input_every_step_reads_at_the_point_stays_in_its_ring(mode):
    """Five Jacobi sweeps each reading the right-hand side at the point: the late sweeps
    read rows of it many rows old, kept in its ring of rows in shared memory rather than in
    registers (the layout says so), and the results equal NumPy's."""
    from kfuse.schedule.streaming import stream_layout

    cpu_or_skip()
    p = kf.Pipeline("jacobi")
    u = p.input("u", ndim=2)
    f = p.input("f", shape=u.shape)
    for step in range(5):
        u = kf.local(0.25 * (u.at(-1, 0) + u.at(1, 0) + u.at(0, -1) + u.at(0, 1)) - 0.1 * f,
                     boundary=mode, name=f"j{step}")
    p.output(u)
    members = [k.name for k in p.graph().kernels]
    layout = stream_layout(p.graph(), members)
    assert any(slot.buffer == "f" and not slot.held for slot in layout.slots), layout.slots
    plan = p.fuse([members], forms=[Streamed(threads=32, chunk_rows=8)])
    rng = np.random.default_rng(3)
    for size in [(29, 141), (6, 7)]:
        arrays = {name: rng.uniform(0.5, 2.0, size).astype(np.float32) for name in "uf"}
        got = p.run(backend="cpu", plan=plan, **arrays)["j4"]
        want = p.run(backend="numpy", plan="unfused", **arrays)["j4"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=str(size))


def test_streamed_refuses_what_it_cannot_walk():
    """A periodic read of an intermediate, a 3-D chain and a clamped read of rows above only
    are refused with reasons that name them."""
    p = kf.Pipeline("periodic")
    u = p.input("u", ndim=2)
    v = kf.local(u.at(-1, 0) + u.at(1, 0), name="v")
    w = kf.local(v.at(0, 1) + v.at(1, 0), boundary="repeat", name="w")
    p.output(w)
    reason = Streamed().why_not(p.graph(), ["v", "w"])
    assert reason and "'w' reads 'v' with periodic boundaries" in reason

    q = kf.Pipeline("volume")
    x = q.input("x", ndim=3)
    y = kf.local(x.at(1, 0, 0) + x.at(-1, 0, 0), name="y")
    z = kf.local(y.at(1, 0, 0) + y, name="z")
    q.output(z)
    assert "2-D" in Streamed().why_not(q.graph(), ["y", "z"])

    r = kf.Pipeline("above")
    s = r.input("s", ndim=2)
    t = kf.local(s.at(-1, 0) * 2.0, name="t")
    m = kf.local(t.at(-2, 0) + t.at(-1, 1), name="m")
    r.output(m)
    reason = Streamed().why_not(r.graph(), ["t", "m"])
    assert reason and "'t' reads 's' at rows -1..-1" in reason


@pytest.mark.integration
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_separable_steps_streamed_equal_numpy(mode):
    """Steps whose weights are an outer product (summed down the columns first, the sums
    shared by a thread's 4 columns), one with a second term at an offset of its own, on
    grids whose middle blocks reach no edge (rows kept in shared memory by the warps' edge
    lanes only) and whose outer blocks do."""
    cpu_or_skip()
    rng = np.random.default_rng(7)
    p = kf.Pipeline("separable")
    u = p.input("u", ndim=2)
    for step in range(3):
        down, across = rng.uniform(0.1, 0.5, 3), rng.uniform(0.1, 0.5, 3)
        total = None
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                term = u.at(dy, dx) * float(down[dy + 1] * across[dx + 1])
                total = term if total is None else total + term
        if step == 1:
            total = total - 0.05 * u.at(0, 2)
        u = kf.local(total, boundary=mode, name=f"s{step}")
    p.output(u)
    check_one_input_chain(p, [(45, 262), (29, 141), (8, 9)], rng)
