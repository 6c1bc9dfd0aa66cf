"""Where kfuse keeps what it builds and measures: ``$KFUSE_CACHE_DIR`` or ``~/.cache/kfuse``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    """The folder for one kind of cached thing (``cpu``, ``cuda``, ``ptxas``, ``devices``).

    Not created here; writers create it when they first store something.
    """
    root = os.environ.get("KFUSE_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "kfuse"
    return base / kind
