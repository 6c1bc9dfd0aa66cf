"""Fixtures shared by several test files, and the kinds of test.

Every test is of one kind, which ``-m`` selects:

- ``gpu``: needs a CUDA GPU (marked by hand; skipped where there is none);
- ``integration``: runs generated CUDA C through the ``cpu`` backend (found here: the test
  names the ``cpu`` backend in its code or its parameters, or uses the ``ubsan`` fixture);
- unit: everything else (``-m "not gpu and not integration"``, a few seconds a file).
"""

from __future__ import annotations

import os
import types

import pytest

# The cpu backend compiles the suite's kernels at -O0: they run on a few points, and the
# compiler's optimiser takes half of the suite's time. The results are the same (IEEE
# arithmetic, no fast-math, no contraction in ISO C++). The fuzzer's CI slice and the apps'
# reference tests compile at the default -O2 (the ``default_optimisation`` fixture), where
# an optimiser's bug would show (GCC's SLP vectorizer was found so, kfuse.runtime.host_compiler).
os.environ.setdefault("KFUSE_CPU_OPT", "-O0")
# Planning does not ask nvcc for registers (a fifth of the suite's time went to it); the
# tests of the compiled checks ask for it (the ``nvcc_figures`` fixture).
os.environ.setdefault("KFUSE_NVCC", "0")


@pytest.fixture
def nvcc_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvcc's figures (registers, spills) for this test, where nvcc is on PATH."""
    monkeypatch.delenv("KFUSE_NVCC", raising=False)


@pytest.fixture
def default_optimisation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cpu backend at its default optimisation level (-O2) for this test."""
    monkeypatch.delenv("KFUSE_CPU_OPT", raising=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers",
                            "integration: runs generated CUDA C through the cpu backend")


def _names_cpu(code: types.CodeType, scope: dict, seen: set) -> bool:
    """Whether ``code`` holds the constant "cpu", in itself, a function or class defined in
    it, or a function of the test module it calls (``scope``: the module's globals)."""
    if code in seen:
        return False
    seen.add(code)
    for const in code.co_consts:
        if const == "cpu" or isinstance(const, types.CodeType) and _names_cpu(const, scope,
                                                                              seen):
            return True
    return any(isinstance(scope.get(name), types.FunctionType)
               and scope[name].__module__ == scope.get("__name__")
               and _names_cpu(scope[name].__code__, scope, seen) for name in code.co_names)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_usable: list[bool] = []
    for item in items:
        if item.get_closest_marker("gpu"):
            if not gpu_usable:
                from kfuse.runtime.cuda_backend import CudaBackend
                gpu_usable.append(CudaBackend.available())
            if not gpu_usable[0]:
                item.add_marker(pytest.mark.skip(reason="no usable CUDA GPU"))
            continue
        function = getattr(item, "function", None)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (function is not None and _names_cpu(function.__code__, function.__globals__, set())
                or "cpu" in params.values() or "ubsan" in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)

# The undefined behaviour the generated C must not have, found by the host compiler's
# sanitizer: a vector load at an address its type cannot be at (x86 forgives it, the GPU
# faults), and a signed overflow (NumPy's int32 arithmetic wraps around).
UBSAN_FLAGS = ("-fsanitize=alignment,signed-integer-overflow", "-fsanitize-recover=all", "-g")


@pytest.fixture
def ubsan(monkeypatch, capfd):
    """The cpu backend's libraries built with UBSan; call the fixture's value to get what the
    sanitizer reported since (its runtime errors go to the process's stderr)."""
    from kfuse.errors import CompileError
    from kfuse.runtime import host_compiler
    from kfuse.runtime.cpu_backend import CpuLoadedProgram

    try:
        probe = host_compiler.compile_host_library(
            "extern \"C\" int kf_ubsan_probe(int a) { return a + 1; }",
            name_hint="ubsan-probe", extra_flags=UBSAN_FLAGS)
        host_compiler.load_host_library(probe)
    except (CompileError, OSError) as error:
        pytest.skip(f"the host compiler has no UBSan here: {error}")

    original = host_compiler.compile_host_library

    def sanitized(source, **options):
        flags = (*options.pop("extra_flags", ()), *UBSAN_FLAGS)
        return original(source, extra_flags=flags, **options)

    monkeypatch.setattr(host_compiler, "compile_host_library", sanitized)
    # programs loaded before were built without the sanitizer: load them again, built with
    monkeypatch.setattr(CpuLoadedProgram, "_loaded", {})
    capfd.readouterr()
    return lambda: capfd.readouterr().err


@pytest.fixture
def rng(request):
    """Random numbers of a seed of the test's own (its name's hash)."""
    import numpy as np
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


@pytest.fixture
def configure():
    """``configure(**switches)``: set :mod:`kfuse.config` switches for the rest of the test
    (the previous configuration comes back after it)."""
    import contextlib

    from kfuse.config import configured

    with contextlib.ExitStack() as scopes:
        yield lambda **changes: scopes.enter_context(configured(**changes))


@pytest.fixture
def rows_beside_a_stencil():
    """``build(mode, below=1)``: a row reduction read back beside a stencil across the rows
    (``below`` rows down), a value per row and a gain per column, with a result per row:
    what chunks and slabs must keep whole, grow and cut at once."""
    import kfuse.dsl as kf

    def build(mode: object = "clamp", below: int = 1) -> kf.Pipeline:
        p = kf.Pipeline("scaled_rows")
        x = p.input("x", 2)
        scale = p.input("scale", shape=(x.shape[0],))
        gain = p.input("gain", shape=(x.shape[1],))
        squares = kf.reduce_sum(x * x, axis=1, name="squares")
        smooth = kf.local((x.at(-1, 0) + x + x.at(below, 0)) / 3.0, boundary=mode,
                          name="smooth")
        p.output(kf.point(smooth * scale.at(0, dims=(0,)) * gain.at(0, dims=(1,))
                          / kf.sqrt(squares.at(0, dims=(0,)) + 1.0), name="y"),
                 kf.point(squares * scale, name="per_row"))
        return p
    return build
