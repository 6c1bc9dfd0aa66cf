"""The typed schedule (kfuse.schedule): a group's form is data, chosen, checked and lowered.

A form names how a group's kernel is written; plans carry forms, code generation lowers
them, and a form given by name is read back or refused with a named error. A form's own
tile and block are honoured by the lowering and give the same results as the defaults.
"""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app
from kfuse.bench.harness import max_relative_error
from kfuse.codegen import generate
from kfuse.errors import FusionError
from kfuse.fusion.plan import make_plan
from kfuse.runtime import get_backend
from kfuse.schedule import (
    GroupSchedule,
    MapReduceVariant,
    Recompute,
    Registers,
    Single,
    Staged,
    as_form,
    default_form,
    group_schedule,
    parse_form,
)
from kfuse.schedule.lowering import lowering


def chain() -> kf.Pipeline:
    p = kf.Pipeline("chain")
    x = p.input("x", ndim=2)
    a = kf.local(x.at(0, 1) + x.at(1, 0) - x, name="a")
    b = kf.local(a.at(-1, 0) * a.at(0, -1) + a, name="b")
    p.output(b)
    return p


@pytest.mark.parametrize("form", [Single(), Registers(), Recompute(), Staged(),
                                  MapReduceVariant((32, 8), 4, 8)], ids=str)
def test_a_form_reads_back_from_its_text(form):
    assert parse_form(form.text()) == form
    assert as_form(form.text()) == form and as_form(form) is form


def test_an_unknown_form_is_refused_by_name():
    with pytest.raises(FusionError, match="unknown implementation 'tiles'"):
        parse_form("tiles")
    graph = chain().graph()
    with pytest.raises(FusionError, match="unknown implementation"):
        generate(graph, [(("a", "b"), ("b",), "recompute-ish")])
    with pytest.raises(FusionError, match="unknown implementation"):
        make_plan(graph, [["a", "b"]], variants={frozenset({"a", "b"}): "bogus"},
                  check_resources=False)
    assert parse_form("auto") is None


def test_plans_carry_forms_and_show_their_names():
    graph = chain().graph()
    plan = make_plan(graph, [["a", "b"]], check_resources=False)
    (group,) = plan.groups
    assert isinstance(group.form, type(default_form(graph, ["a", "b"])))
    assert group.variant == group.form.text() in plan.explain()
    assert plan.kernel_groups == [GroupSchedule(("a", "b"), ("b",), group.form)]
    staged = make_plan(graph, [["a", "b"]], variants={frozenset({"a", "b"}): Staged()},
                       check_resources=False)
    assert staged.groups[0].form == Staged() and staged.groups[0].variant == "staged"


def test_the_default_form_follows_the_group():
    graph = chain().graph()
    assert default_form(graph, ["a"]) == Single()
    assert isinstance(default_form(graph, ["a", "b"]), (Recompute, Staged))
    p = kf.Pipeline("points")
    x = p.input("x", ndim=2)
    y = kf.point(x * 2.0, name="y")
    p.output(kf.point(y + x, name="z"))
    assert default_form(p.graph(), ["y", "z"]) == Registers()


def test_a_form_says_why_it_cannot_implement_a_group():
    p = kf.Pipeline("periodic")
    x = p.input("x", ndim=2)
    a = kf.local(x.at(0, 1) + x, boundary="repeat", name="a")
    p.output(kf.local(a.at(1, 0) - a, boundary="repeat", name="b"))
    graph = p.graph()
    assert "periodic" in Staged().why_not(graph, ["a", "b"])
    assert Recompute().why_not(graph, ["a", "b"]) is None
    with pytest.raises(FusionError, match="periodic"):
        generate(graph, [(("a", "b"), ("b",), Staged())])


def test_tuples_become_group_schedules():
    group = group_schedule((["a", "b"], ["b"], "recompute", (4, 2)))
    assert group == GroupSchedule(("a", "b"), ("b",), Recompute(tile=(4, 2)))
    assert group.tile == (4, 2) and group.with_tile((8, 4)).tile == (8, 4)
    with pytest.raises(FusionError, match="no register tile"):
        group_schedule((["a", "b"], ["b"], "staged", (4, 2)))


@pytest.mark.integration
@pytest.mark.parametrize("boundary", ["clamp", "mirror", kf.constant(0.25)], ids=str)
def test_a_forms_own_tile_and_block_are_lowered_and_compute_the_same(boundary):
    """Harris in one recompute kernel with a tile and block of its own (not the tables'):
    the source says so, and the cpu backend's results equal the NumPy reference on an odd
    size at every border."""
    app = get_app("harris")
    graph = app.build(boundary=boundary).graph()
    members = tuple(k.name for k in graph.kernels)
    form = Recompute(tile=(3, 2), block=(8, 2))
    program = generate(graph, [(members, graph.outputs, form)])
    assert "__launch_bounds__(16" in program.source
    default = generate(graph, [(members, graph.outputs, Recompute())])
    assert default.source != program.source
    rng = np.random.default_rng(3)
    arrays, params = app.make_inputs((29, 37), rng, "float32")
    reference = app.reference({k: v.astype(np.float64) for k, v in arrays.items()}, params,
                              boundary)
    backend = get_backend("cpu")
    executable = backend.prepare(graph, {**arrays, **params}, program=program)
    executable.launch_all()
    for name in graph.outputs:
        assert max_relative_error(executable.buffers[name], reference[name]) < 1e-4


def test_code_generation_is_the_lowering_planning_asks():
    graph = chain().graph()
    group = GroupSchedule(("a", "b"), ("b",), Recompute())
    kernel = lowering().lower(graph, group, None)
    assert kernel.symbol in kernel.source and kernel.source == generate(graph, [group]).source
    assert lowering().last_first(graph, [group]) == ("",)


def test_users_name_a_groups_form_when_they_fuse():
    p = chain()
    plan = p.fuse([["a", "b"]], forms=[Recompute(tile=(4, 2))])
    assert plan.groups[0].form == Recompute(tile=(4, 2))  # its own tile kept
    assert p.fuse([["a", "b"]], forms=["staged"]).groups[0].form == Staged()
    default = p.fuse([["a", "b"]], forms=[None]).groups[0].form
    assert type(default) is type(default_form(p.graph(), ["a", "b"]))
    with pytest.raises(FusionError, match="one form"):
        p.fuse([["a", "b"]], forms=["staged", "recompute"])
    periodic = kf.Pipeline("periodic")
    x = periodic.input("x", ndim=2)
    a = kf.local(x.at(0, 1) + x, boundary="repeat", name="a")
    periodic.output(kf.local(a.at(1, 0) - a, boundary="repeat", name="b"))
    with pytest.raises(FusionError, match="staged implementation cannot compute it"):
        periodic.fuse([["a", "b"]], forms=[Staged()])
