"""Serpentine block order (kfuse.codegen.block_order): which kernels of a program visit their
blocks last-first, and that every kind of generated kernel computes the reference when it
does (the renumbering must be a permutation of the blocks)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app
from kfuse.apps.check import reference_errors, relative_error
from kfuse.codegen import block_order, generate
from kfuse.runtime import get_backend
from kfuse.runtime.numpy_backend import NumpyBackend

KERNEL_HEADER = re.compile(r"^KF_KERNEL void __launch_bounds__\(\d+\) (\w+)\(", re.MULTILINE)


def last_first(program) -> list[str]:
    """The kernels of ``program`` that visit their blocks last-first, in program order."""
    headers = list(KERNEL_HEADER.finditer(program.source))
    result = []
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(program.source)
        if "kf_reversed_block();" in program.source[header.end():end]:
            result.append(header.group(1))
    return result


def chain(with_unrelated: bool = False) -> kf.Pipeline:
    """b = 2a, (f = 3e), c = b + a, d = c b: one kernel each, over matrices of one size."""
    p = kf.Pipeline("chain")
    a = p.input("a", ndim=2)
    e = p.input("e", shape=a.shape) if with_unrelated else None
    b = kf.point(a * 2.0, name="b")
    f = kf.point(e * 3.0, name="f") if e is not None else None
    c = kf.point(b + a, name="c")
    d = kf.point(c * b, name="d")
    p.output(d, *([f] if f is not None else []))
    return p


def test_sgemvt_row_kernel_follows_the_column_sums_last_first(configure):
    graph = get_app("sgemvt").build().graph()
    groups = [(("x_prod", "x"), ("x",), "mapreduce:32x32:r4:i1:w:shuffle:wc"),
              (("w",), ("w",), "mapreduce:512x1:r1:i1:w8:stream:u16")]
    program = generate(graph, groups)
    assert last_first(program) == ["sgemvt_w"]
    assert "'sgemvt_x_prod_x' before it streamed 'A'" in program.source
    configure(serpentine_blocks=False)
    assert last_first(generate(graph, groups)) == []


def test_kernels_over_one_array_alternate():
    program = generate(chain().graph())  # unfused: b, c, d
    assert last_first(program) == ["chain_c"]


def test_another_large_array_in_between_starts_over():
    graph = chain(with_unrelated=True).graph()
    order = [k.name for k in graph.topological_kernels()]
    assert order.index("f") == order.index("b") + 1 and order.index("c") == order.index("f") + 1
    assert last_first(generate(graph)) == ["chain_d"]  # c after f: first-to-last


def test_a_kernel_whose_blocks_walk_stays_first_to_last_and_the_next_reverses():
    """GEMVER: B is written, the whole-column kernel walks B's rows in its own loops (its
    block numbers are not its order in time), the row kernel after it reads B last-first."""
    graph = get_app("gemver").build().graph()
    program = generate(graph, [(("B",), ("B",)),
                               (("x_prod", "x"), ("x",), "mapreduce:32x32:r4:i1:w:shuffle:wc"),
                               (("w",), ("w",), "mapreduce:32x4:r1:i1:w:stream:u16")])
    assert [launch.blocks_walk for launch in program.launches] == [False, True, False]
    assert last_first(program) == ["gemver_w"]


@pytest.fixture
def every_kernel_last_first(monkeypatch):
    """Every kernel generated visits its blocks last-first, whatever its kind."""
    def place(self, symbol, members, outputs, blocks_walk):
        return "every kernel (test)"
    monkeypatch.setattr(block_order.Serpentine, "place", place)


CASES = [  # (app, boundary, plan: "auto" | "unfused" | "all" | a variant for one group)
    ("harris", "mirror", "auto"),  # recompute register tiles
    ("harris", kf.constant(0.5), "unfused"),  # 2-D maps and stencils
    ("harris", "clamp", "staged"),  # shared-memory tiles
    ("night", "repeat", "all"),
    ("diffusion3d", "clamp", "marching"),  # 3-D, threads march along z
    ("sgemvt", None, "auto"), ("gemver", None, "unfused"), ("bicgk", None, "auto"),
    ("atax", None, "mapreduce:256x1:r1:i1:w:stream:g3:u2:hr"),  # held rows, persistent grid
    ("axpydot", None, "mapreduce:128x1:r1:i2:w:shuffle:g3"),  # vectors, persistent grid
    ("bicgk", None, "mapreduce:32x8:r4:i2:w:smem"),  # padded shared tiles, atomics
    ("gesummv", None, "auto"),
    ("madd", None, "auto"),
]


@pytest.mark.parametrize(("name", "boundary", "plan"), CASES, ids=str)
def test_every_kind_of_kernel_computes_the_reference_last_first(
        configure, name, boundary, plan, every_kernel_last_first):
    app = get_app(name)
    pipeline = app.build() if boundary is None else app.build(boundary=boundary)
    graph = pipeline.graph()
    size = (7, 9, 12) if plan == "marching" else app.test_size
    arrays, params = app.make_inputs(size, np.random.default_rng(11), "float32")
    if plan in ("auto", "unfused"):
        program = None
        outputs = pipeline.run(backend="cpu", plan=plan, **arrays, **params)
    else:
        if plan == "marching":
            configure(march=True, march_planes=4)
        variant = {"all": "auto", "marching": "recompute"}.get(plan, plan)
        program = generate(graph, [(tuple(k.name for k in graph.kernels), graph.outputs,
                                    variant)])
        outputs = get_backend("cpu").run(graph, {**arrays, **params}, program=program)
        assert last_first(program) == [launch.symbol for launch in program.launches]
    errors = reference_errors(app, arrays, params, outputs, boundary)
    assert max(errors.values()) <= app.tolerance, errors


def test_reductions_last_first(every_kernel_last_first):
    rng = np.random.default_rng(5)
    p = kf.Pipeline("sums")
    m = p.input("m", ndim=2)
    total = kf.reduce_sum(m * 2.0, name="total")
    rows = kf.reduce_max(m, axis=1, name="rows")
    columns = kf.reduce_sum(m, axis=0, name="columns")
    p.output(total, rows, columns)
    graph = p.graph()
    given = {"m": rng.uniform(0.1, 1.1, size=(37, 4099)).astype(np.float32)}
    program = generate(graph)
    assert len(last_first(program)) == 3
    out = get_backend("cpu").run(graph, given, program=program)
    reference = NumpyBackend(precision="float64").run(graph, given)
    for name in graph.outputs:
        assert relative_error(out[name], reference[name]) <= 1e-5, name


def test_the_plan_says_which_kernels_run_last_first_and_why():
    app = get_app("sgemvt")
    pipeline = app.build()
    plan = pipeline.plan()  # the column sums with their epilogue (whole columns), then A x
    assert [g.members for g in plan.groups] == [("x_prod", "x"), ("w",)]
    assert plan.to_dict()["last_first"] == [
        "", "'sgemvt_x_prod_x' before it streamed 'A' first-to-last, so the end of it is in L2"]
    assert "    blocks last-first: 'sgemvt_x_prod_x' before it streamed 'A'" in plan.explain()
