"""The intermediate representation: kernels, buffers, accesses and derived graph views."""

from kfuse.ir.expr import (
    Binary,
    Boundary,
    Cast,
    Const,
    Coord,
    Expr,
    Load,
    Param,
    Select,
    Unary,
)
from kfuse.ir.graph import (
    Access,
    Buffer,
    Graph,
    Kernel,
    OpaqueSpec,
    Reduction,
    UserAccess,
    UserArgument,
    UserGridAxis,
)

__all__ = [
    "Access", "Binary", "Boundary", "Buffer", "Cast", "Const", "Coord", "Expr", "Graph",
    "Kernel", "Load", "OpaqueSpec", "Param", "Reduction", "Select", "Unary", "UserAccess",
    "UserArgument", "UserGridAxis",
]
