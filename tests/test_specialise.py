"""Programs compiled for the sizes they run at (kfuse.codegen.specialise): the cuda backend's
default. Here through the cpu backend, which compiles the same source: every app equals its
reference at odd sizes (every boundary mode for a 2-D and a 3-D stencil); the kernels' size
arguments become constants except the outermost axis of 3-D iteration spaces; launches are
unchanged; a program compiled for some sizes refuses arrays of others."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app, list_apps
from kfuse.apps.check import reference_errors
from kfuse.codegen import generate
from kfuse.errors import BindError
from kfuse.runtime import compiles_for_sizes, get_backend
from kfuse.runtime.binding import bind
from kfuse.search import default_plan

BOUNDARIES = ["clamp", "mirror", "repeat", kf.constant(0.5)]
BLAS = {app.name for app in list_apps("blas")}


def specialised_case(name: str, boundary="clamp", size=None, seed: int = 7):
    """(app, graph, inputs, default plan, program compiled for the inputs' sizes); BLAS
    apps have no boundary."""
    app = get_app(name)
    graph = app.build(boundary=None if name in BLAS else boundary).graph()
    arrays, params = app.make_inputs(size or app.test_size, np.random.default_rng(seed),
                                     "float32")
    given = {**arrays, **params}
    sizes = bind(graph, given).sizes
    plan = default_plan(graph, sizes)
    program = generate(graph, plan.kernel_groups, fixed_sizes=sizes)
    return app, graph, given, plan, program


def check_specialised(name: str, boundary="clamp", size=None) -> None:
    app, graph, given, _, program = specialised_case(name, boundary, size)
    executable = get_backend("cpu").prepare(graph, given, program=program)
    executable.launch_all()
    arrays = {k: v for k, v in given.items() if k in graph.inputs}
    params = {k: v for k, v in given.items() if k in graph.params}
    errors = reference_errors(app, arrays, params, executable.buffers, boundary)
    assert max(errors.values()) <= app.tolerance, (name, errors)


# every app but stencil27, whose 27-point streamed kernel is heat3d's form with more taps
# (heat3d is here) and took a twentieth of the suite's time to compile
@pytest.mark.parametrize("name", [app.name for app in list_apps("all")
                                  if app.name != "stencil27"])
def test_every_app_compiled_for_its_sizes_matches_the_reference(name):
    check_specialised(name)


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize(("name", "size"), [("harris", (23, 37)), ("diffusion3d", (9, 7, 13))])
def test_stencils_compiled_for_their_sizes_match_at_every_border(name, size, boundary):
    check_specialised(name, boundary, size)


def test_sizes_become_constants_except_the_outermost_axis_of_3d_spaces():
    _, _, _, _, program = specialised_case("diffusion3d", size=(9, 7, 13))
    assert "const int n_u0_0, const int n_u0_1_argument, const int n_u0_2_argument" in \
        program.source
    assert "const int n_u0_1 = 7;" in program.source
    assert "const int n_u0_2 = 13;" in program.source
    assert "const int n_u0_0 =" not in program.source
    _, _, _, _, program = specialised_case("harris", size=(23, 37))
    assert "const int n_img_0 = 23;" in program.source
    assert "const int n_img_1 = 37;" in program.source
    assert program.fixed_sizes == (("img.0", 23), ("img.1", 37))


def test_launches_are_those_of_the_program_for_any_size():
    _, graph, _, plan, program = specialised_case("sgemvt", size=(33, 71))
    generic = generate(graph, plan.kernel_groups)
    assert program.launches == generic.launches
    assert generic.fixed_sizes is None
    assert program.source != generic.source


def test_a_program_compiled_for_other_sizes_is_refused():
    app, graph, _, _, program = specialised_case("harris", size=(23, 37))
    arrays, params = app.make_inputs((23, 38), np.random.default_rng(1), "float32")
    with pytest.raises(BindError, match=r"compiled for other sizes: 'img.1' 37 \(arrays: 38\)"):
        get_backend("cpu").prepare(graph, {**arrays, **params}, program=program)


def test_the_gpu_compiles_for_sizes_and_the_host_shim_does_not(monkeypatch):
    assert compiles_for_sizes("cuda")
    assert not compiles_for_sizes("cpu")
    assert not compiles_for_sizes("numpy")
    monkeypatch.setenv("KFUSE_SPECIALISE_SIZES", "0")
    assert not compiles_for_sizes("cuda")
