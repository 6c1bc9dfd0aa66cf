"""The kfuse DSL: pipelines of point, local (stencil) and reduce operators, and BLAS-1/2."""

from kfuse.dsl.blas import (
    Transposed,
    along,
    asum,
    axpby,
    axpy,
    dot,
    geam,
    gemv,
    ger,
    matvec,
    matvec_t,
    nrm2,
    outer,
    scal,
)
from kfuse.dsl.functions import (
    abs,
    astype,
    atan,
    ceil,
    clamp,
    constant,
    coord,
    cos,
    eq,
    erf,
    exp,
    exp2,
    expm1,
    floor,
    log,
    log1p,
    log2,
    max,
    maximum,
    min,
    minimum,
    mirror,
    ne,
    pow,
    repeat,
    round,
    rsqrt,
    sigmoid,
    sign,
    sin,
    sqrt,
    tan,
    tanh,
    trunc,
    where,
)
from kfuse.dsl.ops import (
    convolve,
    local,
    lookup,
    point,
    reduce,
    reduce_max,
    reduce_min,
    reduce_sum,
)
from kfuse.dsl.pipeline import Array, Pipeline
from kfuse.dsl.pyramid import (
    collapse,
    downsample,
    downsampled,
    gaussian_pyramid,
    laplacian_pyramid,
    upsample,
    upsampled,
)
from kfuse.dsl.user import read, size, user_kernel, written

__all__ = [
    "Array", "Pipeline", "abs", "astype", "ceil", "clamp", "constant", "convolve", "coord",
    "cos", "eq", "exp", "floor", "local", "log", "lookup", "max", "maximum", "min", "minimum",
    "mirror",
    "ne", "point", "pow", "reduce", "reduce_max", "reduce_min", "reduce_sum", "repeat",
    "rsqrt", "sin", "sqrt", "tanh", "where", "atan", "erf", "exp2", "expm1", "log1p", "log2",
    "round", "sigmoid", "sign", "tan", "trunc",
    # BLAS-1/2 (kfuse.dsl.blas)
    "Transposed", "along", "asum", "axpby", "axpy", "dot", "geam", "gemv", "ger", "matvec",
    "matvec_t", "nrm2", "outer", "scal",
    # pyramids (kfuse.dsl.pyramid)
    "collapse", "downsample", "downsampled", "gaussian_pyramid", "laplacian_pyramid",
    "upsample", "upsampled",
    # user CUDA kernels (kfuse.dsl.user)
    "read", "size", "user_kernel", "written",
]
