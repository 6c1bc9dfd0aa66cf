"""Errors raised by kfuse.

Every error a user can cause is a :class:`KfuseError`; each kind of mistake has its own
subclass so callers can catch precisely. Errors that concern one operator name it and,
when known, the line of the user's code that created it; others the user's line that was
running (none when kfuse runs from its command line).
"""

from __future__ import annotations

from kfuse.user_line import user_where


class KfuseError(Exception):
    """Base class of every error kfuse raises on purpose."""

    def __init__(self, message: str, *, operator: str | None = None, where: str | None = None):
        if where is None:  # the user's line running kfuse now, where there is one
            where = user_where()
        self.operator = operator
        self.where = where
        self.detail = message  # the message without the operator and the line
        parts = []
        if operator:
            parts.append(f"operator '{operator}'")
        if where:
            parts.append(f"at {where}")
        prefix = (", ".join(parts) + ": ") if parts else ""
        super().__init__(prefix + message)


class DslError(KfuseError):
    """A pipeline was written wrongly (bad argument, unknown function, misuse of an operator)."""


class DtypeError(KfuseError):
    """Element types do not fit (unsupported dtype, mixing that has no meaning)."""


class ShapeError(KfuseError):
    """Array shapes do not fit (inconsistent bound sizes, offsets larger than the array)."""


class BoundaryError(KfuseError):
    """A boundary mode is unknown or used where it cannot apply."""


class ValidationError(KfuseError):
    """The pipeline graph is malformed: cycles, undefined or unused inputs, missing outputs."""


class CycleError(ValidationError):
    """The pipeline's data dependencies form a cycle."""


class BindError(KfuseError):
    """Arrays or parameters given at call time do not match the pipeline's declaration."""


class OutOfMemory(KfuseError):
    """A call's arrays, or the copies kfuse makes of them, do not fit in memory."""


class FusionError(KfuseError):
    """A requested fusion is illegal; the message names the rule that failed."""


class CompileError(KfuseError):
    """Generated code failed to compile; the message carries the compiler log."""


class BackendUnavailable(KfuseError):
    """A backend was requested that cannot run here (no GPU, no CuPy, no C++ compiler)."""


class LaunchError(KfuseError):
    """A generated kernel failed while running."""


class CacheError(KfuseError):
    """kfuse's cache folder (``$KFUSE_CACHE_DIR`` or ``~/.cache/kfuse``) cannot be written."""


class ConfigError(KfuseError):
    """A switch of :mod:`kfuse.config` that does not exist, or a value of the wrong kind."""


class MetadataError(KfuseError):
    """A codeless application description (YAML/JSON kernel metadata) is malformed.

    The message names the file, the kernel or array, and the field at fault.
    """


class ChunkingError(KfuseError):
    """A pipeline (or its arguments) cannot run chunk by chunk on Dask arrays
    (:mod:`kfuse.scaleout`)."""
