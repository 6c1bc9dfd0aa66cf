"""kfuse's log: the ``kfuse`` logger of Python's :mod:`logging`.

kfuse says what it decided and what it did there: plans searched (strategy, groups, time),
programs generated or read from the disk cache, compiler runs with their time, compiled
signatures made, fallbacks (a backend that cannot run, a device profile that cannot be
used). Nothing is printed unless the application configures logging, or the environment
asks for it: ``KFUSE_LOG=info`` (or ``debug``, ``warning``) prints the records of that level
and above to standard error. Warnings reach standard error in any case, as Python prints
them where no handler is configured.
"""

from __future__ import annotations

import logging
import os

LOG = logging.getLogger("kfuse")
ENVIRONMENT = "KFUSE_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def configure_from_environment() -> None:
    """Print the ``kfuse`` records at the level ``$KFUSE_LOG`` names (nothing set: no
    change; an unknown level: a warning naming the levels)."""
    wanted = os.environ.get(ENVIRONMENT, "").strip().lower()
    if not wanted:
        return
    level = LEVELS.get(wanted)
    if level is None:
        LOG.warning("%s=%r is no level; use one of %s", ENVIRONMENT, wanted, ", ".join(LEVELS))
        return
    if not any(getattr(handler, "kfuse_environment", False) for handler in LOG.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("kfuse %(levelname)s: %(message)s"))
        handler.kfuse_environment = True  # type: ignore[attr-defined]
        LOG.addHandler(handler)
    LOG.setLevel(level)
