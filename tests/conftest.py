"""Fixtures shared by several test files."""

from __future__ import annotations

import pytest

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
def configure():
    """``configure(**switches)``: set :mod:`kfuse.config` switches for the rest of the test
    (the previous configuration comes back after it)."""
    import contextlib

    from kfuse.config import configured

    with contextlib.ExitStack() as scopes:
        yield lambda **changes: scopes.enter_context(configured(**changes))
