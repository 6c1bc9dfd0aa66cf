"""kfuse: automatic kernel fusion for memory-bound GPU pipelines."""

from kfuse.errors import (
    BackendUnavailable,
    BindError,
    BoundaryError,
    CacheError,
    CompileError,
    CycleError,
    DslError,
    DtypeError,
    FusionError,
    KfuseError,
    LaunchError,
    ShapeError,
    ValidationError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "BindError",
    "BoundaryError",
    "CacheError",
    "CompileError",
    "CycleError",
    "DslError",
    "DtypeError",
    "FusionError",
    "KfuseError",
    "LaunchError",
    "ShapeError",
    "ValidationError",
]

from kfuse.dsl import *  # noqa: E402,F403 - the DSL is kfuse's front door
from kfuse.dsl import __all__ as _dsl_all  # noqa: E402

__all__ += _dsl_all

from kfuse.jit import jit  # noqa: E402 - the function front end, on top of the runtime

__all__ += ["jit"]
