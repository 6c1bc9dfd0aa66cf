"""Registers, shared memory, spills and barriers of generated kernels, as ptxas reports them.

Needs ``nvcc`` on PATH (no GPU): the source is compiled for ``sm_90`` with ``-Xptxas -v``.
Later models use these figures for occupancy; ``kfuse run --resources`` prints them.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kfuse.cache import cache_dir, compile_key, mark_used, writable_cache_dir, write_atomically
from kfuse.errors import BackendUnavailable, CompileError


@dataclass(frozen=True)
class KernelResources:
    """Per-kernel figures from ptxas."""

    symbol: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int
    constant_bytes: int


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\w+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


# $KFUSE_NVCC=0: planning does not ask nvcc for kernels' registers and spills (estimates
# only: planning is faster, its register checks less exact; the test suite's default)
NVCC_VARIABLE = "KFUSE_NVCC"


def nvcc_available() -> bool:
    """Whether nvcc is on PATH and not switched off (``$KFUSE_NVCC=0``)."""
    if os.environ.get(NVCC_VARIABLE, "").strip() == "0":
        return False
    return shutil.which("nvcc") is not None


def parse_ptxas(log: str) -> dict[str, KernelResources]:
    """Read ``-Xptxas -v`` output into one record per kernel."""
    figures: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        if match := _ENTRY.search(line) or _PROPERTIES.search(line):
            current = match.group(1)
            figures.setdefault(current, {})
            continue
        if current is None:
            continue
        record = figures[current]
        if match := _FRAME.search(line):
            record["stack_bytes"], record["spill_store_bytes"], record["spill_load_bytes"] = (
                int(g) for g in match.groups())
        if match := _USED.search(line):
            record["registers"] = int(match.group(1))
            record["shared_bytes"] = int(m.group(1)) if (m := _SMEM.search(line)) else 0
            record["barriers"] = int(m.group(1)) if (m := _BARRIERS.search(line)) else 0
            record["constant_bytes"] = int(m.group(1)) if (m := _CMEM.search(line)) else 0
    return {
        symbol: KernelResources(symbol, r.get("registers", 0), r.get("shared_bytes", 0),
                                r.get("stack_bytes", 0), r.get("spill_store_bytes", 0),
                                r.get("spill_load_bytes", 0), r.get("barriers", 0),
                                r.get("constant_bytes", 0))
        for symbol, r in figures.items()
    }


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    """``nvcc --version``'s last line (part of every resource report's cache key)."""
    done = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else "unknown"


def kernel_resources(source: str, arch: str = "sm_90") -> dict[str, KernelResources]:
    """Compile ``source`` with nvcc and return each kernel's resources (cached by a key of
    the source, the architecture and nvcc's version)."""
    if not nvcc_available():
        raise BackendUnavailable("nvcc is not on PATH; resource figures need it")
    options = (f"-arch={arch}", "-cubin", "-Xptxas", "-v")
    digest = compile_key(source, ("nvcc",), nvcc_version(), options)
    cache = cache_dir("ptxas") / f"{digest}.log"
    if cache.exists():
        mark_used(cache)
        return parse_ptxas(cache.read_text())
    cache = writable_cache_dir("ptxas") / f"{digest}.log"  # before a ptxas run, not after
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "kernels.cu"
        path.write_text(source)
        command = ["nvcc", *options, "-o", str(Path(work) / "kernels.cubin"), str(path)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CompileError("nvcc failed on the generated source:\n"
                           + "\n".join(done.stderr.splitlines()[:60]))
    write_atomically(cache, done.stderr)
    return parse_ptxas(done.stderr)


# The function that measures with the compiler: figures from any other (a stand-in) are not
# stored on disk (kfuse.schedule.lowering: Lowering.measurer).
COMPILER_FIGURES = kernel_resources
