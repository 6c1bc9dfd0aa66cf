"""Where kfuse keeps what it builds and measures: ``$KFUSE_CACHE_DIR``, else
``$XDG_CACHE_HOME/kfuse``, else ``~/.cache/kfuse``.

The folder is bounded: after each write of a built thing (a compiled kernel library, a
generated program, a resource report), the entries used least recently are deleted while
the folder holds more than ``$KFUSE_CACHE_MAX_BYTES`` (default 2 GiB). A read marks an
entry used (:func:`mark_used`); an entry that cannot be read is deleted and built again.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from kfuse.errors import CacheError


def cache_dir(kind: str) -> Path:
    """The folder for one kind of cached thing (``cpu``, ``cuda``, ``ptxas``, ``devices``).

    Not created here; writers create it with :func:`writable_cache_dir`.
    """
    return cache_root() / kind


def cache_root() -> Path:
    """``$KFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kfuse``, else ``~/.cache/kfuse``."""
    root = os.environ.get("KFUSE_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "kfuse"


DEFAULT_MAX_BYTES = 2 * 2**30
_compiler_runs = [0]
_count_lock = threading.Lock()


def count_compiler_run() -> None:
    """Note that a compiler (NVRTC, the host C++ compiler) ran: what cache statistics count
    as a compile (a build taken from the disk cache is not one)."""
    with _count_lock:
        _compiler_runs[0] += 1


def compiler_runs() -> int:
    """How many times a compiler ran in this process."""
    return _compiler_runs[0]


def max_bytes() -> int:
    """The size the cache folder is kept under: ``$KFUSE_CACHE_MAX_BYTES`` (default 2 GiB)."""
    text = os.environ.get("KFUSE_CACHE_MAX_BYTES", "")
    try:
        return int(float(text)) if text else DEFAULT_MAX_BYTES
    except ValueError:
        raise CacheError(f"KFUSE_CACHE_MAX_BYTES must be a number of bytes, got {text!r}"
                         ) from None


def mark_used(path: Path) -> None:
    """Record that a cached entry was used now (its modification time orders eviction)."""
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache: it is only not reordered


def evict(limit: int | None = None) -> int:
    """Delete the least recently used entries until the cache folder holds at most
    ``limit`` bytes (default :func:`max_bytes`); the device profiles are kept. Returns how
    many entries went."""
    limit = max_bytes() if limit is None else limit
    entries = []
    for path in cache_root().glob("*/**/*"):
        if path.is_file() and path.parent.name != "devices" and not path.name.startswith("."):
            try:
                status = path.stat()
            except OSError:
                continue
            entries.append((status.st_mtime, status.st_size, path))
    total = sum(size for _, size, _ in entries)
    removed = 0
    for _, size, path in sorted(entries, key=lambda entry: entry[0]):
        if total <= limit:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        removed += 1
    return removed


def compile_key(source: str | bytes, compiler: Sequence[str], version: str,
                options: Sequence[str], *depends_on: str | bytes) -> str:
    """The one key of everything kfuse compiles and keeps (NVRTC's cubins, ptxas's resource
    reports, the host compiler's libraries and precompiled header): a digest of the source,
    the compiler's command and version, its options and whatever else the output depends
    on (a header it includes), so that a change of any of them compiles again."""
    digest = hashlib.sha256()
    for part in (source, "\0".join(compiler), version, "\0".join(options), *depends_on):
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0\1\0")
    return digest.hexdigest()[:40]


def writable_cache_dir(kind: str) -> Path:
    """:func:`cache_dir`, created; a :class:`~kfuse.errors.CacheError` saying which folder
    and why when it cannot be (``KFUSE_CACHE_DIR`` names a file or a read-only place)."""
    path = cache_dir(kind)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = error.strerror or str(error)
        raise CacheError(f"cannot create the cache folder {path}: {reason} (set "
                         "KFUSE_CACHE_DIR to a writable folder)") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheError(f"the cache folder {path} is not writable (set KFUSE_CACHE_DIR to a "
                         "writable folder)")
    return path


def write_atomically(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename, so that a
    reader (another process: the tests run in several) never sees a half-written file."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data.encode() if isinstance(data, str) else data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _evict_now_and_then()


EVICTION_INTERVAL_S = 60.0
_last_eviction = [float("-inf")]


def _evict_now_and_then() -> None:
    """:func:`evict` after a write, at most once a minute per process (a scan of the folder
    costs milliseconds; builds that write take longer)."""
    import time

    now = time.monotonic()
    if now - _last_eviction[0] >= EVICTION_INTERVAL_S:
        _last_eviction[0] = now
        evict()


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of kfuse's own source files (Python and the CPU shim): part of every key."""
    package = Path(__file__).resolve().parent
    key = hashlib.sha256()
    for path in sorted([*package.rglob("*.py"), *package.rglob("*.h")]):
        key.update(str(path.relative_to(package)).encode())
        key.update(path.read_bytes())
    return key.hexdigest()
