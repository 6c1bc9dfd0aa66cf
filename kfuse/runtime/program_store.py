"""Generated programs kept on disk, so that a new process skips planning and generation.

A program is stored as JSON under ``<cache>/programs/<key>.json``; the key is a digest of
everything that decides its text: the graph's structural fingerprint, the plan asked for
(its groups, variants and tiles; for ``"auto"`` the device profile the search plans with),
the sizes it is compiled for, the index width, the array alignment, the code-generation
switches, and kfuse's own source (so that a change to kfuse never runs a stale program).
A file that cannot be read back is deleted and the program generated again.
"""

from __future__ import annotations

import json
from typing import Any

from kfuse.cache import cache_dir, code_digest, mark_used, writable_cache_dir, write_atomically
from kfuse.codegen.program import GridAxis, KernelParam, LaunchSpec, Program
from kfuse.errors import CacheError
from kfuse.ir.fingerprint import digest

FORMAT = 2  # the layout of a stored program


def program_key(*parts: Any) -> str:
    """The store's key for a program decided by ``parts`` (canonical values)."""
    return digest((FORMAT, code_digest(), parts))


def _axis_list(axis: GridAxis) -> list[Any]:
    return [list(axis.symbols), axis.per_block, axis.cap, axis.covering, axis.least_per_block,
            axis.fixed_blocks]


def _axis_of(values: list[Any]) -> GridAxis:
    symbols, per_block, cap, covering, least, fixed = values
    return GridAxis(tuple(symbols), per_block, cap, covering, least, fixed)


def program_to_dict(program: Program) -> dict[str, Any]:
    """``program`` as plain JSON values."""
    return {
        "name": program.name, "source": program.source, "wide_index": program.wide_index,
        "fixed_sizes": None if program.fixed_sizes is None else [list(pair) for pair in
                                                                 program.fixed_sizes],
        "array_alignment": program.array_alignment, "last_first": list(program.last_first),
        "launches": [{
            "symbol": spec.symbol, "operators": list(spec.operators),
            "params": [[p.name, p.ctype, p.role, p.ref, p.dtype] for p in spec.params],
            "block": list(spec.block),
            "grid": [_axis_list(axis) for axis in spec.grid],
            "initial_values": [list(pair) for pair in spec.initial_values],
            "dynamic_shared_bytes": spec.dynamic_shared_bytes,
            "size_limits": [list(pair) for pair in spec.size_limits],
            "blocks_walk": spec.blocks_walk,
            "part_grids": [[_axis_list(axis) for axis in grid] for grid in spec.part_grids],
        } for spec in program.launches],
    }


def program_from_dict(data: dict[str, Any]) -> Program:
    """The :class:`Program` that :func:`program_to_dict` wrote."""
    launches = tuple(LaunchSpec(
        spec["symbol"], tuple(spec["operators"]),
        tuple(KernelParam(*param) for param in spec["params"]), tuple(spec["block"]),
        tuple(_axis_of(axis) for axis in spec["grid"]),
        # (as written: an int64 reduction's identity, 2**63 - 1, is no float)
        tuple((name, value if isinstance(value, int) else float(value))
              for name, value in spec["initial_values"]),
        spec["dynamic_shared_bytes"],
        tuple((symbol, int(size)) for symbol, size in spec["size_limits"]),
        spec["blocks_walk"],
        tuple(tuple(_axis_of(axis) for axis in grid) for grid in spec["part_grids"]))
        for spec in data["launches"])
    fixed = data["fixed_sizes"]
    return Program(data["name"], data["source"], launches, data["wide_index"],
                   None if fixed is None else tuple((s, int(n)) for s, n in fixed),
                   data["array_alignment"], tuple(data["last_first"]))


def load_program(key: str) -> Program | None:
    """The program stored under ``key``, or None (never stored, or unreadable: then the
    file is deleted so that it is written again)."""
    path = cache_dir("programs") / f"{key}.json"
    try:
        text = path.read_text()
    except OSError:  # never stored (or a folder in its place): generated again
        return None
    try:
        program = program_from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError, IndexError):
        path.unlink(missing_ok=True)
        return None
    mark_used(path)
    return program


def store_program(key: str, program: Program) -> None:
    """Keep ``program`` under ``key`` (a cache that cannot be written is only not used)."""
    try:
        write_atomically(writable_cache_dir("programs") / f"{key}.json",
                         json.dumps(program_to_dict(program)))
    except (CacheError, OSError):
        pass
