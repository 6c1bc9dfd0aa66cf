"""kfuse: automatic kernel fusion for memory-bound GPU pipelines."""

from kfuse.errors import (
    BackendUnavailable,
    BindError,
    BoundaryError,
    CacheError,
    CompileError,
    ConfigError,
    CycleError,
    DslError,
    DtypeError,
    FusionError,
    KfuseError,
    LaunchError,
    OutOfMemory,
    ShapeError,
    ValidationError,
)

__version__ = "0.1.0"

from kfuse.log import configure_from_environment  # noqa: E402

configure_from_environment()  # KFUSE_LOG=info prints what kfuse decides and does

__all__ = [
    "BackendUnavailable",
    "BindError",
    "BoundaryError",
    "CacheError",
    "CompileError",
    "ConfigError",
    "CycleError",
    "DslError",
    "DtypeError",
    "FusionError",
    "KfuseError",
    "LaunchError",
    "OutOfMemory",
    "ShapeError",
    "ValidationError",
]

from kfuse.dsl import *  # noqa: E402,F403 - the DSL is kfuse's front door
from kfuse.dsl import __all__ as _dsl_all  # noqa: E402

__all__ += _dsl_all

import kfuse.config  # noqa: E402,F401 - the switches (kfuse.config.configured)
import kfuse.driver  # noqa: E402,F401 - what pipelines call to plan, compile and run
from kfuse.jit import jit  # noqa: E402 - the function front end, on top of the runtime

__all__ += ["jit"]
