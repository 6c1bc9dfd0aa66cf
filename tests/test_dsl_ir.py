"""The DSL builds the IR it should, derived views are right, bad input gets named errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import kfuse as kf
from kfuse.errors import (
    BindError,
    BoundaryError,
    CycleError,
    DslError,
    DtypeError,
    ShapeError,
    ValidationError,
)
from kfuse.ir import Boundary, Buffer, Graph, Kernel
from kfuse.ir.expr import Load


def small_pipeline():
    p = kf.Pipeline("small")
    img = p.input("img", ndim=2)
    dx = kf.convolve(img, [[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], boundary="mirror")
    dy = kf.local(img.at(1, 0) - img.at(-1, 0), boundary=kf.constant(0.25))
    mag = kf.point(kf.sqrt(dx * dx + dy * dy))
    p.output(mag)
    return p


def test_names_come_from_the_users_assignment():
    graph = small_pipeline().graph()
    assert [k.name for k in graph.kernels] == ["dx", "dy", "mag"]
    assert [k.kind for k in graph.kernels] == ["local", "local", "point"]
    assert graph.kernels[0].where and "test_dsl_ir.py" in graph.kernels[0].where


@pytest.mark.skipif(sys.version_info < (3, 11), reason="call columns need Python 3.11")
def test_the_assigned_name_goes_to_the_outermost_call():
    """A call nested in the assigned expression runs first; it must not take the name."""
    p = kf.Pipeline("nested")
    x = p.input("x", ndim=1)
    q = kf.point(x - kf.reduce_max(x))
    r = (kf.point(q * 2))
    s = kf.point(
        r + kf.reduce_sum(r))
    p.output(q, r, s)
    assert p.outputs == ("q", "r", "s")
    assert [k.name for k in p.graph().kernels] == ["reduce", "q", "r", "reduce_2", "s"]
    other = kf.Pipeline("named")
    x = other.input("x", ndim=1)
    q = kf.point(x - kf.reduce_max(x), name="q")  # (the name was taken by the reduction)
    assert q.name == "q"


def test_accesses_halo_and_thread_load():
    graph = small_pipeline().graph()
    dx, dy, mag = graph.kernels
    assert dx.halo_radius("img") == (1, 1)
    assert dx.thread_load("img") == 6          # six non-zero taps of the Sobel mask
    assert dy.halo_radius("img") == (1, 0)
    assert dy.thread_load("img") == 2
    assert mag.thread_load("dx") == 1 and mag.halo_radius("dx") == (0, 0)
    (access,) = dy.accesses
    assert set(access.boundaries) == {Boundary("constant", 0.25)}
    assert access.window == (3, 1)


def test_graph_views():
    graph = small_pipeline().graph()
    dag = graph.order_dag()
    assert set(dag.edges) == {("dx", "mag"), ("dy", "mag")}
    assert graph.sharing_set("img") == ("dx", "dy")
    assert graph.sharing_set("dx") == ("dx", "mag")
    dependency = graph.dependency_graph()
    assert dependency.has_edge(("buffer", "img"), ("kernel", "dx"))
    assert dependency.has_edge(("kernel", "mag"), ("buffer", "mag"))
    assert dependency.edges[("buffer", "img"), ("kernel", "dx")]["thread_load"] == 6
    assert graph.intermediates == ("dx", "dy")


def test_graph_remembers_a_bounded_number_of_answers(monkeypatch):
    """Each answer is worked out once per key; past MEMO_ENTRIES the one used longest ago
    goes (a pipeline run on many shapes keeps a plan per shape otherwise)."""
    from kfuse.ir import graph as graph_module

    monkeypatch.setattr(graph_module, "MEMO_ENTRIES", 3)
    graph = small_pipeline().graph()
    made: list[int] = []

    def answer(n: int) -> int:
        return graph.remembered(("shape", n), lambda: made.append(n) or n * 10)

    assert [answer(n) for n in (1, 2, 3, 1)] == [10, 20, 30, 10] and made == [1, 2, 3]
    assert answer(4) == 40 and len(graph.memo) == 3  # 2, used longest ago, goes
    assert answer(1) == 10 and answer(3) == 30 and made == [1, 2, 3, 4]
    assert answer(2) == 20 and made == [1, 2, 3, 4, 2]  # worked out again


def test_shapes_unify_and_bind():
    p = kf.Pipeline("two")
    a = p.input("a", ndim=2)
    b = p.input("b", ndim=2)
    c = kf.point(a + b)
    p.output(c)
    graph = p.graph()
    assert graph.buffers["a"].shape == graph.buffers["b"].shape == graph.buffers["c"].shape
    with pytest.raises(ShapeError, match="must agree"):
        graph.bind_shapes({"a": (4, 5), "b": (4, 6)})
    assert graph.bind_shapes({"a": (4, 5), "b": (4, 5)})[graph.buffers["a"].shape[1]] == 5


def test_reductions_shape_and_dtype():
    p = kf.Pipeline("red")
    x = p.input("x", ndim=3, dtype="float64")
    total = kf.reduce_sum(x)
    rows = kf.reduce_max(x * 2.0, axis=1)
    scaled = kf.point(x / total)
    p.output(total, rows, scaled)
    graph = p.graph()
    assert graph.buffers["total"].shape == ()
    assert graph.buffers["rows"].ndim == 2
    assert graph.buffers["rows"].dtype == "float64"
    assert graph.kernel_by_name["rows"].reduction.axes == (1,)


def test_type_promotion():
    p = kf.Pipeline("types")
    i = p.input("i", ndim=1, dtype="int32")
    f = p.input("f", ndim=1, dtype="float32")
    d = p.input("d", ndim=1, dtype="float64")
    assert (i * 2).dtype == "int32"
    assert (i * 0.5).dtype == "float32"
    assert (i + f).dtype == "float32"
    assert (f + d).dtype == "float64"
    assert (f * 2).dtype == "float32"
    assert kf.sqrt(i).dtype == "float32"
    assert (f < 1.0).dtype == "bool"
    assert kf.where(f < 0.0, i, f).dtype == "float32"
    assert kf.astype(f, "int32").dtype == "int32"


# ---------------------------------------------------------------------------------------------
# errors: each names the kind of mistake, the operator and the user's line
# ---------------------------------------------------------------------------------------------

def test_point_operator_rejects_offsets_and_names_the_line():
    p = kf.Pipeline("bad")
    x = p.input("x", ndim=2)
    with pytest.raises(DslError) as caught:
        shifted = kf.point(x.at(0, 1) * 2)  # noqa: F841
    message = str(caught.value)
    assert "shifted" in message and "test_dsl_ir.py" in message and "local()" in message


def test_wrong_number_of_offsets():
    p = kf.Pipeline("bad")
    x = p.input("x", ndim=2)
    with pytest.raises(DslError, match="2 offsets"):
        x.at(1)


def test_unknown_boundary_mode():
    p = kf.Pipeline("bad")
    x = p.input("x", ndim=1)
    with pytest.raises(BoundaryError, match="wrap"):
        kf.local(x.at(1), boundary="wrap")


def test_arrays_of_two_pipelines_do_not_mix():
    p, q = kf.Pipeline("p"), kf.Pipeline("q")
    a, b = p.input("a", ndim=1), q.input("b", ndim=1)
    with pytest.raises(DslError, match="different pipelines"):
        kf.point(a + b)


def test_mixing_dimensions_without_broadcast():
    p = kf.Pipeline("bad")
    m = p.input("m", ndim=2)
    v = p.input("v", ndim=1)
    with pytest.raises(ShapeError, match="dims"):
        kf.point(m + v)
    # with explicit dims it is a broadcast read
    w = kf.point(m + v.at(0, dims=(1,)))
    assert w.ndim == 2


def test_python_control_flow_is_refused():
    p = kf.Pipeline("bad")
    x = p.input("x", ndim=1)
    with pytest.raises(DslError, match="where"):
        if x > 0:
            pass


def test_unsupported_dtype():
    p = kf.Pipeline("bad")
    with pytest.raises(DtypeError, match="complex64"):
        p.input("x", ndim=1, dtype="complex64")


def test_duplicate_names():
    p = kf.Pipeline("bad")
    x = p.input("x", ndim=1)
    kf.point(x + 1, name="y")
    with pytest.raises(DslError, match="already used"):
        kf.point(x + 2, name="y")


def test_unused_input_and_unused_operator():
    p = kf.Pipeline("bad")
    x = p.input("x", ndim=1)
    p.input("unused", ndim=1)
    y = kf.point(x + 1)
    p.output(y)
    with pytest.raises(ValidationError, match="never used"):
        p.graph()
    q = kf.Pipeline("dead")
    x = q.input("x", ndim=1)
    y = kf.point(x + 1)
    dead = kf.point(x * 3)  # noqa: F841
    q.output(y)
    with pytest.raises(ValidationError, match="dead"):
        q.graph()


def test_no_outputs():
    p = kf.Pipeline("bad")
    x = p.input("x", ndim=1)
    kf.point(x + 1)
    with pytest.raises(ValidationError):
        p.graph()


def test_cycle_is_detected():
    body_a = Load("b", "float32", (0,), (0,))
    body_b = Load("a", "float32", (0,), (0,))
    buffers = {name: Buffer(name, "float32", ("n",)) for name in ("x", "a", "b")}
    kernels = (Kernel("a", "point", ("n",), body_a + Load("x", "float32", (0,), (0,)), ("a",)),
               Kernel("b", "point", ("n",), body_b, ("b",)))
    graph = Graph("cyclic", buffers, kernels, ("x",), ("b",))
    with pytest.raises(CycleError, match="cycle"):
        graph.validate()


def test_undefined_array_in_hand_built_graph():
    buffers = {"x": Buffer("x", "float32", ("n",)), "y": Buffer("y", "float32", ("n",))}
    kernels = (Kernel("y", "point", ("n",), Load("ghost", "float32", (0,), (0,)), ("y",)),)
    with pytest.raises(ValidationError, match="ghost"):
        Graph("g", buffers, kernels, ("x",), ("y",)).validate()


def test_bind_errors():
    p = kf.Pipeline("bind")
    x = p.input("x", ndim=2)
    s = p.param("s")
    y = kf.local(x.at(0, 3) * s)
    p.output(y)
    data = np.random.default_rng(0).random((5, 9), dtype=np.float32)
    with pytest.raises(BindError, match="needs 's'"):
        p.run(backend="numpy", x=data)
    with pytest.raises(BindError, match="no input or parameter named 'z'"):
        p.run(backend="numpy", x=data, s=1.0, z=2)
    with pytest.raises(BindError, match="float64"):
        p.run(backend="numpy", x=data.astype(np.float64), s=1.0)
    with pytest.raises(ShapeError, match="2-D"):
        p.run(backend="numpy", x=data[0], s=1.0)
    with pytest.raises(ShapeError, match="offset 3"):
        p.run(backend="numpy", x=data[:, :3].copy(), s=1.0)
    with pytest.raises(BindError, match="scalar"):
        p.run(backend="numpy", x=data, s=np.ones(2))


def test_every_error_is_a_kfuse_error():
    for error in (BindError, BoundaryError, CycleError, DslError, DtypeError, ShapeError,
                  ValidationError):
        assert issubclass(error, kf.KfuseError)
