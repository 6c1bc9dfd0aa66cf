"""Property: any legal grouping of a random pipeline computes what the reference computes.

Random pipelines of point, local (every boundary mode, offsets on any axis) and reduce
operators in 1-D, 2-D and 3-D at odd sizes are fused by random legal groupings, run as
generated CUDA C on the cpu backend and compared with the float64 NumPy reference.
Random illegal groupings must be refused with the failing rule named.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kfuse as kf
from kfuse.apps.check import relative_error
from kfuse.errors import FusionError
from kfuse.fusion.plan import check_groups
from kfuse.runtime import get_backend
from kfuse.runtime.numpy_backend import NumpyBackend

MODES = ["clamp", "mirror", "repeat", "constant"]


@st.composite
def pipelines(draw):
    """(pipeline, inputs, names of operators in order)."""
    ndim = draw(st.integers(1, 3))
    limits = {1: (5, 41), 2: (3, 15), 3: (3, 8)}[ndim]
    shape = tuple(draw(st.integers(*limits)) for _ in range(ndim))
    p = kf.Pipeline("random")
    arrays = [p.input("a", ndim=ndim), p.input("b", ndim=ndim)]
    scalars = []
    operators = []
    for index in range(draw(st.integers(2, 5))):
        kind = draw(st.sampled_from(["point", "local", "local", "reduce"]))
        name = f"op{index}"
        x = draw(st.sampled_from(arrays))
        y = draw(st.sampled_from(arrays))
        if index == 0:  # both inputs are used
            kind, x, y = "point", arrays[0], arrays[1]
        if kind == "point":
            choice = draw(st.integers(0, 3))
            body = [x + y * 0.5, kf.sqrt(x * y + 0.25), kf.maximum(x, y) - 0.25 * kf.minimum(x, y),
                    kf.where(x > y, x, y * 0.75)][choice]
            if scalars and draw(st.booleans()):
                body = body / draw(st.sampled_from(scalars))
            array = kf.point(body, name=name)
        elif kind == "local":
            taps = draw(st.integers(1, 4))
            terms = []
            for _ in range(taps):
                offsets = tuple(draw(st.integers(-min(2, n - 1), min(2, n - 1))) for n in shape)
                mode = draw(st.sampled_from(MODES))
                boundary = kf.constant(0.5) if mode == "constant" else mode
                terms.append(x.at(*offsets, boundary=boundary))
            body = terms[0]
            for term in terms[1:]:
                body = body + term
            array = kf.local(body * (1.0 / taps), name=name)
        else:
            op = draw(st.sampled_from(["sum", "min", "max"]))
            axis = draw(st.sampled_from([None, *range(ndim)]))
            reduced = kf.reduce(x * y, op, axis, name=name)
            operators.append(name)
            if axis is None:
                scalars.append(reduced)
            p.output(reduced)
            continue
        arrays.append(array)
        operators.append(name)
    for array in arrays[2:]:
        p.output(array)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    inputs = {n: rng.uniform(0.5, 1.5, size=shape).astype(np.float32) for n in ("a", "b")}
    return p, inputs, operators


@st.composite
def groupings(draw, graph):
    """A random legal partition: random merges along data edges, kept when legal."""
    groups = [[k.name] for k in graph.kernels]
    edges = list(graph.order_dag().edges)
    for _ in range(draw(st.integers(0, 2 * len(edges)))):
        if not edges:
            break
        source, target = draw(st.sampled_from(edges))
        a = next(g for g in groups if source in g)
        b = next(g for g in groups if target in g)
        if a is b:
            continue
        trial = [g for g in groups if g is not a and g is not b] + [a + b]
        if not check_groups(graph, trial):
            groups = trial
    return groups


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_legal_groupings_compute_the_reference(data):
    pipeline, inputs, _ = data.draw(pipelines())
    graph = pipeline.graph()
    groups = data.draw(groupings(graph))
    plan = pipeline.fuse(groups)
    out = get_backend("cpu").run(graph, inputs, plan=plan)
    ref = NumpyBackend(precision="float64").run(graph, inputs)
    for name in graph.outputs:
        error = relative_error(out[name], ref[name])
        assert error <= 1e-5, (name, error, groups)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_illegal_groupings_are_refused_with_the_rule(data):
    pipeline, _, operators = data.draw(pipelines())
    graph = pipeline.graph()
    members = data.draw(st.lists(st.sampled_from(operators), min_size=2, unique=True))
    others = [[k.name] for k in graph.kernels if k.name not in members]
    violations = check_groups(graph, [members, *others])
    if violations:
        with pytest.raises(FusionError) as caught:
            pipeline.fuse([members])
        assert violations[0].rule in str(caught.value)
    else:
        assert pipeline.fuse([members]).group_of(members[0]).members == tuple(
            sorted(members, key=[k.name for k in graph.kernels].index))


def test_reduction_consumed_in_its_own_kernel_is_refused():
    p = kf.Pipeline("red")
    x = p.input("x", ndim=2)
    total = kf.reduce_sum(x)
    y = kf.point(x / total)
    p.output(y)
    with pytest.raises(FusionError, match="no_reduction_consumed_inside"):
        p.fuse([["total", "y"]])


def test_non_convex_group_is_refused():
    p = kf.Pipeline("convex")
    x = p.input("x", ndim=1)
    a = kf.point(x + 1)
    b = kf.local(a.at(1) + a)
    c = kf.point(a * b)
    p.output(c)
    with pytest.raises(FusionError, match="convex"):
        p.fuse([["a", "c"]])
    p.fuse([["a", "b", "c"]])  # the whole chain is fine


def test_different_iteration_spaces_are_refused():
    p = kf.Pipeline("spaces")
    m = p.input("m", ndim=2)
    rows = kf.reduce_sum(m, axis=1)
    scaled = kf.point(rows * 2.0)
    p.output(scaled)
    with pytest.raises(FusionError, match="iteration spaces differ"):
        p.fuse([["rows", "scaled"]])


def test_explain_names_every_edge():
    p = kf.Pipeline("explain")
    x = p.input("x", ndim=2)
    a = kf.local(x.at(0, 1) + x, boundary="mirror")
    total = kf.reduce_sum(a)
    b = kf.point(a / total)
    p.output(b)
    plan = p.fuse([["a", "total"]])
    text = plan.explain()
    assert "fused     a -> total" in text.replace("fused    a", "fused     a")
    assert "not fused total -> b" in text and "no_reduction_consumed_inside" in text
    data = plan.to_dict()
    assert data["groups"] == [["a", "total"], ["b"]]
    assert {(r["producer"], r["consumer"]) for r in data["rejected"]} == {("a", "b"),
                                                                           ("total", "b")}


def test_resources_are_checked_with_ptxas(monkeypatch, nvcc_figures):
    from kfuse.codegen import resources
    if not resources.nvcc_available():
        pytest.skip("nvcc is not on PATH")
    p = kf.Pipeline("big")
    x = p.input("x", ndim=2)
    a = kf.local(x.at(1, 0) + x.at(0, 1) + x, name="a")
    b = kf.local(a.at(-1, 0) * a.at(0, -1) + a, name="b")
    p.output(b)
    p.fuse([["a", "b"]])  # fits
    real = resources.kernel_resources

    def pretend_spills(source, arch="sm_90"):
        return {symbol: r.__class__(**{**r.__dict__, "spill_store_bytes": 64})
                for symbol, r in real(source, arch).items()}

    monkeypatch.setattr(resources, "kernel_resources", pretend_spills)
    p.graph().memo.clear()  # the graph remembers the tile that fitted
    with pytest.raises(FusionError, match="resources.*spilled"):
        p.fuse([["a", "b"]])


def test_register_tiles_are_checked_compiled_for_the_sizes_they_run_at(monkeypatch,
                                                                      nvcc_figures):
    """A plan made for known sizes checks its kernels compiled for them (as the cuda backend
    runs them); without sizes, compiled for any size. Here only kernels for any size spill,
    so the plan for sizes keeps the largest tile and the other takes a smaller one."""
    from kfuse.apps import get_app
    from kfuse.codegen import resources
    from kfuse.fusion.plan import make_plan
    from kfuse.schedule.tiles import tile_choices

    if not resources.nvcc_available():
        pytest.skip("nvcc is not on PATH")
    real = resources.kernel_resources

    def spills_unless_specialised(source, arch="sm_90"):
        spilled = 0 if "compiled for these sizes" in source else 64
        return {symbol: r.__class__(**{**r.__dict__, "spill_store_bytes": spilled})
                for symbol, r in real(source, arch).items()}

    monkeypatch.setattr(resources, "kernel_resources", spills_unless_specialised)
    graph = get_app("diffusion3d").build().graph()
    members = [[k.name for k in graph.kernels]]
    largest = tile_choices("recompute", 3)[0]
    sized = make_plan(graph, members, sizes=graph.bind_shapes({"u0": (9, 10, 12)}))
    assert sized.groups[0].tile == largest
    with pytest.raises(FusionError, match="resources.*spilled"):
        make_plan(graph, members)  # every tile spills when compiled for any size


def _counting_spills(monkeypatch, spills: Callable[[str], bool]) -> list[str]:
    """Fake ptxas figures: kernels for which ``spills(source)`` holds spill 64 bytes; the
    compiled sources are listed in the returned list."""
    from kfuse.codegen import resources

    monkeypatch.delenv("KFUSE_NVCC", raising=False)  # (the nvcc_figures fixture's work)
    if not resources.nvcc_available():
        pytest.skip("nvcc is not on PATH")
    real, compiled = resources.kernel_resources, []

    def fake(source, arch="sm_90"):
        compiled.append(source)
        return {symbol: r.__class__(**{**r.__dict__, "spill_store_bytes": 64 * spills(source)})
                for symbol, r in real(source, arch).items()}

    monkeypatch.setattr(resources, "kernel_resources", fake)
    return compiled


def _stencil_chain(length: int, boundaries: dict[int, str] | None = None) -> kf.Pipeline:
    """Stencils in a chain (each reading with its boundary mode, clamp by default)."""
    p = kf.Pipeline("chain")
    z = p.input("x", ndim=2)
    for index in range(length):
        mode = (boundaries or {}).get(index, "clamp")
        z = kf.local(z.at(0, 1, boundary=mode) + z.at(1, 0, boundary=mode) - z,
                     name=f"s{index}")
    p.output(z)
    return p


def test_large_kernels_try_the_smallest_tile_first(monkeypatch):
    """Past LARGE_KERNEL_LINES a group whose smallest register tile spills is refused after
    that one compile (registers grow with the tile), not after one per tile."""
    from kfuse.fusion import resources
    from kfuse.schedule.tiles import tile_choices

    compiled = _counting_spills(monkeypatch, lambda source: True)
    graph = _stencil_chain(3).graph()
    members, outputs = ("s0", "s1", "s2"), ("s2",)
    tile, violation = resources.fitting_tile(graph, members, outputs, "recompute")
    assert tile is None and "spilled" in violation.reason
    assert len(compiled) == len(tile_choices("recompute", 2))  # every tile, largest first
    compiled.clear()
    assert resources.fitting_tile(graph, members, outputs, "recompute") == (tile, violation)
    assert not compiled  # asked again for the same graph: remembered, not compiled again
    monkeypatch.setattr(resources, "LARGE_KERNEL_LINES", 0)
    graph = _stencil_chain(3).graph()  # (a graph remembers the answers given for it)
    tile, violation = resources.fitting_tile(graph, members, outputs, "recompute")
    assert tile is None and violation is not None and len(compiled) == 1


def test_groups_holding_one_that_fits_no_tile_are_not_compiled(monkeypatch):
    from kfuse.search.problem import problem_from_graph

    # (s1 reads with mirrored borders, s2 with periodic ones: a kernel calling both spills;
    # the prelude defines both)
    compiled = _counting_spills(
        monkeypatch, lambda source: source.count("kf_mirror(") > 1 < source.count("kf_repeat("))
    problem = problem_from_graph(_stencil_chain(4, {1: "mirror", 2: "repeat"}).graph(),
                                 "roofline")
    assert problem.group_reason(("s0", "s1")) is None
    assert "spilled" in problem.group_reason(("s1", "s2"))
    count = len(compiled)
    reason = problem.group_reason(("s0", "s1", "s2", "s3"))
    assert "as its part ['s1', 's2']" in reason and len(compiled) == count


def test_a_plan_made_again_reads_the_fits_it_stored(monkeypatch, tmp_path, nvcc_figures):
    """The register tile a fused group fits is stored on disk: planning the same pipeline
    again (another graph object, as another process would) runs no compiler."""
    from kfuse.codegen import resources

    if not resources.nvcc_available():
        pytest.skip("nvcc is not on PATH")
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    first = _stencil_chain(3).plan()
    assert list((tmp_path / "ptxas").glob("*.log"))  # the fused groups were compiled
    (tmp_path / "ptxas").rename(tmp_path / "ptxas-gone")  # (no figures to read either)
    again = _stencil_chain(3).plan()
    assert not (tmp_path / "ptxas").exists()  # nothing compiled again
    assert [g.tile for g in again.groups] == [g.tile for g in first.groups]
