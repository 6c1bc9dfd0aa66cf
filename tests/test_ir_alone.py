"""A group alone under canonical names (kfuse.ir.alone): groups alike up to names and
weights are one structure, measured once; other groups are not confused with them."""

import pytest

import kfuse as kf
from kfuse.ir.alone import FIRST_REPRESENTATIVE, group_alone


def _chain(weights, boundaries=None):
    p = kf.Pipeline("chain", names_from_source=False)
    z = p.input("x", ndim=2)
    scale = p.param("scale")
    for index, weight in enumerate(weights):
        mode = (boundaries or {}).get(index, "clamp")
        z = kf.local(weight * (z.at(0, 1, boundary=mode) + z.at(-1, 0, boundary=mode))
                     + z * scale, name=f"s{index}")
    p.output(z)
    return p.graph()


def test_groups_alike_up_to_names_and_weights_are_one_structure():
    graph = _chain([0.2, 0.21, 0.37, 0.2, 0.25, 0.2])
    alone = [group_alone(graph, (f"s{i}", f"s{i + 1}"), (f"s{i + 1}",)) for i in (0, 2, 4)]
    assert len({a.graph.fingerprint for a in alone}) == 1
    first = alone[0]
    assert first.members == ("k0", "k1") and first.outputs == ("b2",)
    assert first.graph.inputs == ("b0",) and first.kernel_name("s1") == "k1"
    first.graph.validate()
    constants = {node.value for kernel in first.graph.kernels for node in kernel.body.walk()
                 if type(node).__name__ == "Const"}
    assert FIRST_REPRESENTATIVE in constants and 0.2 not in constants


def test_constants_equal_or_not_stay_so():
    """Two weights of one group that differ stay different (code generation shares equal
    values: merging them would measure a kernel that keeps fewer)."""
    p = kf.Pipeline("weights", names_from_source=False)
    x = p.input("x", ndim=1)
    y = kf.point(x * 0.2 + x * 0.3, name="y")
    z = kf.point(y * 0.3 + x * 0.2, name="z")
    p.output(z)
    alone = group_alone(p.graph(), ("y", "z"), ("z",))
    values = [node.value for kernel in alone.graph.kernels for node in kernel.body.walk()
              if type(node).__name__ == "Const"]
    assert sorted(set(values)) == [FIRST_REPRESENTATIVE, FIRST_REPRESENTATIVE + 1]
    assert values.count(FIRST_REPRESENTATIVE) == values.count(FIRST_REPRESENTATIVE + 1) == 2


@pytest.mark.parametrize("change", ["boundary", "outputs", "special weight", "sizes"])
def test_groups_that_differ_in_what_decides_their_kernel_are_not_confused(change):
    graph = _chain([0.2, 0.2, 0.2, 0.2], {2: "mirror"} if change == "boundary" else None)
    base = group_alone(graph, ("s0", "s1"), ("s1",))
    other_graph = _chain([0.2, 0.2, 1.0, 0.2]) if change == "special weight" else graph
    outputs = ("s2", "s3") if change == "outputs" else ("s3",)
    sizes = dict(zip(graph.buffers["x"].shape, (64, 96), strict=True)) \
        if change == "sizes" else None
    other = group_alone(other_graph, ("s2", "s3"), outputs, sizes)
    assert (base.graph.fingerprint, base.outputs, base.sizes) != (
        other.graph.fingerprint, other.outputs, other.sizes)


def test_parameters_keep_their_order_and_the_sizes_their_values():
    p = kf.Pipeline("params", names_from_source=False)
    x = p.input("x", ndim=1)
    beta, alpha = p.param("beta"), p.param("alpha")
    y = kf.point(x * alpha + beta, name="y")
    z = kf.point(y * beta, name="z")
    p.output(z)
    graph = p.graph()
    (symbol,) = graph.buffers["x"].shape
    alone = group_alone(graph, ("y", "z"), ("z",), {symbol: 1000, "unrelated": 3})
    assert alone.graph.params == {"p000": "float32", "p001": "float32"}  # alpha, beta
    assert [p.name for p in alone.graph.kernel_by_name["k0"].params] == ["p000", "p001"]
    assert alone.sizes == (("n0", 1000),)


def test_a_group_alone_fits_as_it_does_in_its_pipeline(nvcc_figures):
    """The register tile found for the group alone is the one found in the pipeline."""
    from kfuse.codegen import resources as compiler
    from kfuse.fusion import resources
    from kfuse.schedule.forms import default_form
    from kfuse.schedule.tiles import tile_choices

    if not compiler.nvcc_available():
        pytest.skip("nvcc is not on PATH")
    graph = _chain([0.2, 0.3, 0.4])
    members, outputs = ("s1", "s2"), ("s2",)
    form = default_form(graph, members)
    tiles = tuple(tile_choices(form.name, 2))
    direct = resources._fitting_tile(graph, members, outputs, form, tiles, None)
    assert resources.fitting_tile(graph, members, outputs, form) == direct
