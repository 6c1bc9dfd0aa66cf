"""Programs compiled for aligned arrays: where every array's address is a multiple of 16
bytes (what CuPy, PyTorch and NumPy allocate), kfuse defines ``KF_ARRAYS_ALIGNED`` and the
kernels' pointer tests before vector accesses compile away. Arrays at other addresses (a view
that starts inside another array) get a program that tests its pointers and takes the scalar
paths. Here through the cpu backend, which compiles the same source: every app equals its
reference on arrays at odd addresses, and a program compiled for aligned arrays refuses
others."""

from __future__ import annotations

import numpy as np
import pytest

from kfuse.apps import get_app, list_apps
from kfuse.apps.check import reference_errors
from kfuse.codegen import generate
from kfuse.errors import BindError, CompileError
from kfuse.runtime import get_backend
from kfuse.runtime.backend import VECTOR_ALIGNMENT
from kfuse.runtime.binding import bind
from kfuse.runtime.cpu_backend import CpuBackend, CpuExecutable
from kfuse.runtime.numpy_backend import numpy_dtype
from kfuse.search import default_plan

BLAS = {app.name for app in list_apps("blas")}
# plain maps, a map-reduce, matrix tiles (rows of odd and of whole vectors), the held and
# streamed rows, and the 2-D and 3-D stencils' vector rows
MISALIGNED_CASES = [("madd", None), ("waxpby", None), ("axpydot", None), ("sgemv", (37, 45)),
                    ("sgemv", (37, 44)), ("sgemvt", (29, 52)), ("bicgk", (41, 36)),
                    ("gemver", (33, 40)), ("unsharp", (21, 36)), ("diffusion3d", (5, 6, 16))]
# (Harris runs at odd addresses under UBSan below)


def cpu_or_skip() -> None:
    if not CpuBackend.available():
        pytest.skip("no host C++ compiler")


def at_odd_address(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` whose address is one element past a multiple of 16 bytes."""
    item = array.dtype.itemsize
    base = np.empty(array.size + 16, array.dtype)
    start = next(i for i in range(16) if (base.ctypes.data + i * item) % 16 == item)
    view = base[start:start + array.size].reshape(array.shape)
    view[...] = array
    return view


@pytest.fixture
def odd_addresses(monkeypatch):
    """The cpu backend's buffers (inputs, intermediates and outputs) at odd addresses."""
    monkeypatch.setattr(CpuExecutable, "upload",
                        lambda self, array: at_odd_address(np.asarray(array)))
    monkeypatch.setattr(CpuExecutable, "full", lambda self, shape, dtype, value: at_odd_address(
        np.full(shape, value, dtype=numpy_dtype(dtype))))


def app_case(name: str, size=None, boundary="clamp", seed: int = 3):
    app = get_app(name)
    graph = app.build(boundary=None if name in BLAS else boundary).graph()
    arrays, params = app.make_inputs(size or app.test_size, np.random.default_rng(seed),
                                     "float32")
    return app, graph, {**arrays, **params}


def planned(app, graph, given):
    """The plan the GPU runs: a BLAS app's at its benchmark size (map-reduce variants), a
    stencil's default at the arrays' sizes."""
    if app.name in BLAS:
        return app.planner(graph, app.sizes(graph, app.bench_size))
    return default_plan(graph, bind(graph, given).sizes)


def check_outputs(app, graph, given, executable) -> None:
    arrays = {k: v for k, v in given.items() if k in graph.inputs}
    params = {k: v for k, v in given.items() if k in graph.params}
    errors = reference_errors(app, arrays, params, executable.buffers)
    assert max(errors.values()) <= app.tolerance, (app.name, errors)


@pytest.mark.parametrize(("name", "size"), MISALIGNED_CASES, ids=str)
def test_apps_on_arrays_at_odd_addresses_match_the_reference(name, size, odd_addresses):
    cpu_or_skip()
    app, graph, given = app_case(name, size)
    executable = get_backend("cpu").prepare(graph, given, plan=planned(app, graph, given))
    assert executable.array_alignment() == 4
    assert executable.program.array_alignment == 4
    assert executable.program.source.startswith("#define KF_ARRAYS_ALIGNED 4")
    kernels = executable.program.source.split("// Pipeline")[1]
    assert "aligned(" in kernels  # the kernels test their pointers
    executable.launch_all()
    check_outputs(app, graph, given, executable)


@pytest.mark.parametrize(("name", "size"), [("waxpby", (1001,)), ("sgemv", (37, 44)),
                                           ("harris", (19, 44))], ids=str)
def test_no_vector_access_at_an_odd_address(name, size, odd_addresses, ubsan):
    """Under UBSan (x86 forgives a misaligned vector load; the GPU faults): the pointer tests
    keep every vector access off the odd addresses, and a program that assumed them aligned
    (the runtime's check bypassed) is caught, so this test can fail."""
    cpu_or_skip()
    app, graph, given = app_case(name, size)
    plan = planned(app, graph, given)
    executable = get_backend("cpu").prepare(graph, given, plan=plan)
    executable.launch_all()
    check_outputs(app, graph, given, executable)
    assert "runtime error" not in ubsan()
    if name == "waxpby":  # the control: vector loads that the runtime would have refused
        assumed = generate(graph, plan.kernel_groups, array_alignment=VECTOR_ALIGNMENT)
        executable.compile(assumed)
        executable.program = assumed
        executable.launch_all()
        assert "misaligned address" in ubsan()


def test_aligned_arrays_get_a_program_compiled_for_them():
    cpu_or_skip()
    app, graph, given = app_case("vadd", (1003,))
    executable = get_backend("cpu").prepare(graph, given, plan=planned(app, graph, given))
    assert executable.array_alignment() == VECTOR_ALIGNMENT
    assert executable.program.array_alignment == VECTOR_ALIGNMENT
    assert executable.program.source.startswith(f"#define KF_ARRAYS_ALIGNED {VECTOR_ALIGNMENT}")
    assert "kf_aligned(x, 8)" in executable.program.source  # compiled away: see the prelude
    executable.launch_all()
    check_outputs(app, graph, given, executable)


def test_a_program_for_aligned_arrays_refuses_others(odd_addresses):
    cpu_or_skip()
    _, graph, given = app_case("waxpby", (1001,))
    program = generate(graph, array_alignment=VECTOR_ALIGNMENT)
    with pytest.raises(BindError, match=r"multiples of 16 bytes; 'x', 'y'.* are not"):
        get_backend("cpu").prepare(graph, given, program=program)
    assert not generate(graph).source.startswith("#define KF_ARRAYS_ALIGNED")
    executable = get_backend("cpu").prepare(graph, given, program=generate(graph))
    assert executable.program.array_alignment == 1


def test_a_scalar_at_an_odd_address_keeps_the_vector_accesses(monkeypatch):
    """0-d buffers (AXPYDOT's dot product, the parameters) are accessed one element at a
    time: their addresses do not make the program test its pointers."""
    cpu_or_skip()
    app, graph, given = app_case("axpydot", (1003,))
    full = CpuExecutable.full
    monkeypatch.setattr(CpuExecutable, "full", lambda self, shape, dtype, value: (
        at_odd_address if shape == () else np.asarray)(full(self, shape, dtype, value)))
    executable = get_backend("cpu").prepare(graph, given, plan=planned(app, graph, given))
    scalars = [n for n in graph.buffers if graph.buffers[n].ndim == 0]
    assert scalars and all(executable.address(executable.buffers[n]) % 8 for n in scalars)
    assert executable.program.array_alignment == VECTOR_ALIGNMENT
    executable.launch_all()
    check_outputs(app, graph, given, executable)


@pytest.mark.parametrize("alignment", [0, 12, -16])
def test_array_alignment_must_be_a_power_of_two(alignment):
    _, graph, _ = app_case("vadd", (64,))
    with pytest.raises(CompileError, match="power of two"):
        generate(graph, array_alignment=alignment)
