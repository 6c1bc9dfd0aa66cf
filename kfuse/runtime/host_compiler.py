"""Compile generated CUDA C with the host C++ compiler against the kfuse CPU shim.

The ``cpu`` backend runs the very CUDA C text that would go to NVRTC: the source includes
``kfuse_cpu_shim.h`` when ``__CUDACC__`` is not defined, and that header runs each CUDA thread
of a block as a fiber of the launching thread (or, with ``KF_SHIM_THREADS=1``, an OS thread).
The source must export ``extern "C"`` launchers that call ``kf_cpu::launch``;
:func:`load_host_library` gives a :class:`ctypes.CDLL` to call them.

Libraries are cached on disk under ``$KFUSE_CACHE_DIR/cpu`` (default ``~/.cache/kfuse/cpu``),
keyed by the SHA-256 of the source, the flags, the shim header and the compiler's version.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from kfuse.cache import cache_dir as kfuse_cache_dir
from kfuse.cache import (
    compile_key,
    count_compiler_run,
    mark_used,
    writable_cache_dir,
    write_atomically,
)
from kfuse.errors import BackendUnavailable, CompileError
from kfuse.log import LOG

__all__ = [
    "BASE_FLAGS",
    "cache_dir",
    "compile_and_load",
    "compile_host_library",
    "find_compiler",
    "load_host_library",
    "shim_include_dir",
]

SHIM_HEADER = "kfuse_cpu_shim.h"
# Programs are compiled linked (KF_SHIM_LINKED) against the shim's runtime library: the shim
# compiled once per compiler and flags (KF_SHIM_RUNTIME) with its launch machinery, pools,
# fibers and waits, which each program compiled for itself before (about half of a program's
# compile at -O0). The library lies beside the programs, which find it by their RPATH.
LINKED_DEFINE = "-DKF_SHIM_LINKED"
RUNTIME_SOURCE = f'#define KF_SHIM_RUNTIME\n#include "{SHIM_HEADER}"\n'
BASE_FLAGS: tuple[str, ...] = ("-std=c++20", "-O2", "-shared", "-fPIC", "-pthread")
# ``$KFUSE_CPU_OPT`` replaces ``-O2`` (``-O0``, ``-O1``, ``-O2``, ``-O3``, ``-Os``): the test
# suite compiles at -O0, half the compile time for kernels it runs on a few points (the
# results are the same: IEEE arithmetic, no fast-math, no contraction in ISO C++)
OPT_LEVEL_VARIABLE = "KFUSE_CPU_OPT"
OPT_LEVELS = ("-O0", "-O1", "-O2", "-O3", "-Os")
# GCC's basic-block (SLP) vectorizer drops float round trips: GCC 12.2 at -O2 compiled
# ``(double)(float)v + v`` over a register tile with 27 of its 41 conversions, and 42 points
# gave ``v + v`` (found by ``kfuse fuzz``, seed 4029). Only GCC gets the flag.
GCC_FLAGS: tuple[str, ...] = ("-fno-tree-slp-vectorize",)
LOG_LINES = 60
COMPILE_TIMEOUT_S = 600

_DEFINE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(=.*)?", re.DOTALL)
_loaded: dict[str, ctypes.CDLL] = {}
_load_lock = threading.Lock()


def shim_include_dir() -> Path:
    """Directory holding ``kfuse_cpu_shim.h`` (pass it to the compiler with ``-I``)."""
    return Path(__file__).resolve().parent / "shim"


def cache_dir() -> Path:
    """Directory of compiled CPU libraries: ``$KFUSE_CACHE_DIR/cpu`` or ``~/.cache/kfuse/cpu``."""
    return kfuse_cache_dir("cpu")


def find_compiler() -> list[str]:
    """The C++ compiler command: ``$CXX`` (may hold arguments), else ``g++``, ``c++``, ``clang++``.

    Raises :class:`~kfuse.errors.BackendUnavailable` if there is none.
    """
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        argv = shlex.split(cxx)
        exe = shutil.which(argv[0])
        if exe is None:
            raise BackendUnavailable(f"$CXX is {cxx!r}, which is not an executable on PATH")
        return [exe, *argv[1:]]
    for name in ("g++", "c++", "clang++"):
        exe = shutil.which(name)
        if exe is not None:
            return [exe]
    raise BackendUnavailable(
        "the cpu backend needs a C++20 compiler: none found (set $CXX, or install g++)"
    )


@cache
def _compiler_version(argv: tuple[str, ...]) -> str:
    try:
        proc = subprocess.run(
            [*argv, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(f"cannot run the C++ compiler {argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        raise BackendUnavailable(f"{shlex.join([*argv, '--version'])} failed: {proc.stderr}")
    return proc.stdout.strip()


def base_flags() -> tuple[str, ...]:
    """:data:`BASE_FLAGS` with the optimisation level ``$KFUSE_CPU_OPT`` names (if set)."""
    level = os.environ.get(OPT_LEVEL_VARIABLE, "").strip()
    if not level:
        return BASE_FLAGS
    if level not in OPT_LEVELS:
        raise BackendUnavailable(f"${OPT_LEVEL_VARIABLE} is {level!r}: the cpu backend takes "
                                 f"one of {', '.join(OPT_LEVELS)}")
    return tuple(level if flag == "-O2" else flag for flag in BASE_FLAGS)


def _is_gcc(version: str) -> bool:
    """Whether the compiler whose ``--version`` printed ``version`` is GCC (not clang)."""
    return "Free Software Foundation" in version and "clang" not in version


def _define_flag(define: str) -> str:
    name = define[2:] if define.startswith("-D") else define
    if not _DEFINE.fullmatch(name):
        raise ValueError(f"not a preprocessor define: {define!r} (want NAME or NAME=VALUE)")
    return "-D" + name


def compile_host_library(
    source: str,
    *,
    defines: Sequence[str] = (),
    name_hint: str = "kfuse",
    extra_flags: Sequence[str] = (),
    shim: bool = True,
) -> Path:
    """Compile CUDA C ``source`` into a shared library for the host and return its path.

    ``defines`` are ``NAME`` or ``NAME=VALUE`` (``-D`` optional), e.g. the shim's fault
    switches ``KF_SHIM_FAULT_BARRIER``; ``extra_flags`` go to the compiler as they are (e.g.
    ``-g``, ``-fsanitize=thread``). ``name_hint`` labels the cached files
    ``<name_hint>-<hash>.{cu,so}``. A library already in the cache is returned without compiling.
    ``shim``: the source includes the CPU shim (False: a source of its own, such as the C
    call path's extension, compiled without the shim's folder or precompiled header).

    Raises :class:`~kfuse.errors.CompileError` (with the compiler's first lines of output and the
    path of the saved source) if compilation fails, and
    :class:`~kfuse.errors.BackendUnavailable` if there is no compiler.
    """
    compiler = find_compiler()
    version = _compiler_version(tuple(compiler))
    include = shim_include_dir()
    flags = [*base_flags(), *(GCC_FLAGS if _is_gcc(version) else ()), *extra_flags,
             *(_define_flag(d) for d in defines)]
    runtime_flags = list(flags)  # (the runtime library's; the program's say it is linked)
    if shim:
        flags.append(LINKED_DEFINE)

    header = (include / SHIM_HEADER).read_bytes() if shim else b""
    digest = compile_key(source, compiler, version, flags, header)

    stem = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name_hint)[:48] or 'kfuse'}-{digest[:40]}"
    lib = cache_dir() / f"{stem}.so"
    # (the shim's runtime library, named for its compiler, flags and header)
    runtime = "libkfuse_shim-" + compile_key(RUNTIME_SOURCE, compiler, version, runtime_flags,
                                             header)[:40] + ".so" if shim else None
    if lib.exists() and (runtime is None or (lib.parent / runtime).exists()):
        mark_used(lib)  # (a read-only cache still serves what it holds)
        return lib
    out_dir = writable_cache_dir("cpu")
    linked = []
    if runtime and not (out_dir / runtime).exists():  # compiled once, beside the programs
        _compile(compiler, [*runtime_flags, f"-I{include}", f"-Wl,-soname,{runtime}"],
                 RUNTIME_SOURCE, out_dir / f"{runtime.removesuffix('.so')}.cpp",
                 out_dir / runtime)
    if runtime:
        linked = [str(out_dir / runtime), "-Wl,-rpath,$ORIGIN"]
    count_compiler_run()
    includes = [f"-I{d}" for d in (_precompiled_shim(compiler, flags, version), include)
                if d] if shim else []
    _compile(compiler, [*flags, *includes], source, out_dir / f"{stem}.cu", lib, linked)
    return lib


def _compile(compiler: list[str], options: list[str], source: str, src: Path, lib: Path,
             after: Sequence[str] = ()) -> None:
    """Save ``source`` as ``src`` and compile it into ``lib`` (written whole or not at all;
    ``after``: what follows the source on the command line, libraries to link)."""
    write_atomically(src, source.encode())
    fd, tmp = tempfile.mkstemp(prefix=f".{lib.stem}.", suffix=".so.tmp", dir=lib.parent)
    os.close(fd)
    cmd = [*compiler, *options, "-x", "c++", str(src), "-x", "none", *after, "-o", tmp]
    started = time.perf_counter()
    try:
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise CompileError(
                f"host C++ compiler timed out after {COMPILE_TIMEOUT_S} s; source saved at {src}"
            ) from exc
        except OSError as exc:
            raise BackendUnavailable(f"cannot run the C++ compiler {compiler[0]}: {exc}") from exc
        if proc.returncode != 0:
            raise _compile_error(proc.stderr or proc.stdout, src, cmd)
        os.replace(tmp, lib)
        LOG.info("compiled %s with %s in %.2f s", lib.name, compiler[0],
                 time.perf_counter() - started)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _precompiled_shim(compiler: list[str], flags: list[str], version: str) -> Path | None:
    """A folder holding the shim and its precompiled header for these flags (built once).

    The shim is most of what every generated source compiles; a precompiled header cuts
    each compile by about a second. Any failure here just means compiling without it.
    """
    header = shim_include_dir() / SHIM_HEADER
    folder = cache_dir() / f"pch-{compile_key(header.read_bytes(), compiler, version, flags)}"
    if (folder / f"{SHIM_HEADER}.gch").exists():
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / SHIM_HEADER, header.read_bytes())
        fd, tmp = tempfile.mkstemp(prefix=".pch.", suffix=".gch.tmp", dir=folder)
        os.close(fd)
        header_flags = [f for f in flags if f != "-shared"]
        done = subprocess.run([*compiler, *header_flags, "-x", "c++-header",
                               str(folder / SHIM_HEADER), "-o", tmp], capture_output=True,
                              timeout=COMPILE_TIMEOUT_S, check=False)
        if done.returncode != 0:
            Path(tmp).unlink(missing_ok=True)
            return None
        os.replace(tmp, folder / f"{SHIM_HEADER}.gch")
    except (OSError, subprocess.SubprocessError):
        return None
    return folder


def _compile_error(log: str, src: Path, cmd: list[str]) -> CompileError:
    lines = log.rstrip().splitlines()
    shown = "\n".join(lines[:LOG_LINES])
    if len(lines) > LOG_LINES:
        shown += f"\n... ({len(lines) - LOG_LINES} more lines)"
    err = CompileError(
        f"host C++ compilation failed (source saved at {src}):\n{shown}\ncommand: {shlex.join(cmd)}"
    )
    err.log = log
    err.source_path = src
    err.command = cmd
    return err


def compile_and_load(source: str, *, name_hint: str = "kfuse") -> ctypes.CDLL:
    """:func:`compile_host_library` then :func:`load_host_library`; a cached library that
    does not load (truncated, empty, corrupt) is deleted and compiled again."""
    path = compile_host_library(source, name_hint=name_hint)
    try:
        return load_host_library(path)
    except BackendUnavailable:
        Path(path).unlink(missing_ok=True)
        return load_host_library(compile_host_library(source, name_hint=name_hint))


def load_host_library(path: str | os.PathLike[str]) -> ctypes.CDLL:
    """Load a library made by :func:`compile_host_library`; one handle per path is kept."""
    key = str(Path(path).resolve())
    with _load_lock:
        lib = _loaded.get(key)
        if lib is None:
            try:
                lib = ctypes.CDLL(key)
            except OSError as exc:
                raise BackendUnavailable(f"cannot load compiled library {key}: {exc}") from exc
            _loaded[key] = lib
        return lib
