"""kfuse's switches: one scoped configuration object instead of module flags.

The defaults are what measurements chose (``docs/journal/benchmarks.md``); tests and experiments
change a switch for a scope::

    with kfuse.config.configured(window_sums=False):
        program = generate(graph)

:func:`current` is what code generation reads. A configuration is frozen; ``configured``
sets a changed copy for the ``with`` block of the current thread (or asyncio task) and puts
the previous one back after it. Every switch is part of the key under which generated
programs are stored on disk, so changing one never reads a program made under another.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields, replace

from kfuse.errors import ConfigError


@dataclass(frozen=True)
class Config:
    """How code generation writes kernels."""

    # Whether 3-D recompute groups have their threads march along z: None decides per
    # device (the cuda backend asks kfuse.schedule.marching.pays_on; programs generated
    # without a device keep the register tiles); True or False forces it everywhere.
    march: bool | None = None
    # A marching kernel computes an intermediate on its newest plane only and carries the
    # planes below (False: recomputes them, the form measured against it).
    march_newest_planes_only: bool = True
    # Planes per marching block where the device's resident blocks are not known (the cpu
    # backend), and the fewest a block takes on the GPU (H200, 512^3: one wave of 256-plane
    # chunks 0.341-0.345 ms against 0.350 for 128 and 0.379 for 64 planes; session 14).
    march_planes: int = 256
    march_least_planes: int = 16
    # Bytes of staged planes a marching block may hold in shared memory (two blocks per SM).
    march_shared_bytes: int = 96 * 1024
    # Rows of threads in a marching block (32 threads each), and the input planes a marching
    # block copies ahead of the plane it computes.
    march_block_rows: int = 4
    march_prefetch: int = 2
    # A kernel that reads a large array the kernel before it streamed visits its blocks
    # last-first (kfuse.codegen.block_order; False: every kernel first-to-last).
    serpentine_blocks: bool = True
    # 3-tap windows are summed so that neighbouring points share a pair.
    window_sums: bool = True
    # A streamed step whose weights are an outer product is summed down its columns first
    # (kfuse.ir.separable), so that a thread's columns share the sums (False: as written).
    separable_sums: bool = True
    # A constant-mode read that may fall outside loads from its clamped index
    # unconditionally and selects the constant after (False: the load inside the
    # conditional; diffusion3d's register tiles 2.3x slower on an H200).
    unconditional_border_loads: bool = True
    # The register tile of every tiled kernel of an operator alone or of a recomputing
    # chain, (rows, columns) in 2-D or (rows, middle, columns) in 3-D, where a form names
    # none (None: the measured defaults of kfuse.schedule.tiles, per kind of group).
    register_tile: tuple[int, ...] | None = None
    # Threads per block (x, y) of every tiled and staged kernel, and the blocks per SM
    # they ask the compiler to fit (0: no request), where a form names none (None: the
    # measured defaults of kfuse.schedule.tiles).
    tile_block: tuple[int, int, int] | None = None
    # Points per thread of flat kernels with special functions (pow, exp, division...),
    # which keep a thread busy after its loads return: more points keep more in flight.
    items_per_thread_special: int = 16
    # The cpu backend runs every kernel on copies of its arrays between guard zones and
    # raises a LaunchError naming the operator where a kernel writes outside an array or
    # into one it does not write (a user kernel's declarations); slow, for tests.
    check_writes: bool = False

    def key(self) -> tuple[tuple[str, object], ...]:
        """Every switch and its value: part of a stored program's key."""
        return tuple(sorted(asdict(self).items()))


_CURRENT: ContextVar[Config] = ContextVar("kfuse_config", default=Config())  # noqa: B039 - frozen


def current() -> Config:
    """The configuration in force here (the defaults unless :func:`configured` changed it)."""
    return _CURRENT.get()


def checked(config: Config, **changes: object) -> Config:
    """``config`` with ``changes``; a :class:`~kfuse.errors.ConfigError` naming a switch
    that does not exist or a value of the wrong kind."""
    kinds = {field.name: field.type for field in fields(Config)}
    for name, value in changes.items():
        if name not in kinds:
            raise ConfigError(f"kfuse.config has no switch {name!r}; the switches are "
                              f"{', '.join(kinds)}")
        if kinds[name] == "bool":
            ok = isinstance(value, bool)
        elif kinds[name] == "bool | None":
            ok = value is None or isinstance(value, bool)
        elif kinds[name].startswith("tuple["):
            counts = {"tuple[int, ...] | None": (2, 3), "tuple[int, int, int] | None": (3,)}
            ok = value is None or (
                isinstance(value, tuple) and len(value) in counts[kinds[name]]
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                and all(v > 0 for v in value[:2]) and min(value) >= 0)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        if not ok:
            kind = {"int": "a positive int",
                    "tuple[int, ...] | None": "None or a tuple of 2 or 3 positive ints",
                    "tuple[int, int, int] | None": "None or (threads x, threads y, blocks "
                    "per SM)"}.get(kinds[name], kinds[name])
            raise ConfigError(f"kfuse.config switch {name!r} takes {kind}, got {value!r}")
    return replace(config, **changes)


@contextmanager
def configured(**changes: object) -> Iterator[Config]:
    """Run the ``with`` block under the current configuration with ``changes``."""
    token = _CURRENT.set(checked(current(), **changes))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


__all__ = ["Config", "checked", "configured", "current"]
