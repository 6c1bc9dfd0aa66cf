"""Where kfuse keeps what it builds and measures: ``$KFUSE_CACHE_DIR`` or ``~/.cache/kfuse``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kfuse.errors import CacheError


def cache_dir(kind: str) -> Path:
    """The folder for one kind of cached thing (``cpu``, ``cuda``, ``ptxas``, ``devices``).

    Not created here; writers create it with :func:`writable_cache_dir`.
    """
    root = os.environ.get("KFUSE_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "kfuse"
    return base / kind


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
