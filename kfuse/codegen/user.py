"""A user's CUDA kernel in a generated program.

The user's source is written as given, inside a namespace of its operator, with its
``__global__`` functions compiled as device functions (``__global__`` and
``__launch_bounds__`` redefined around it); a generated ``__global__`` kernel calls the
entry with the operator's arrays, sizes and parameters. So the user's code is the body of a
kernel of ours: it launches like any generated kernel on both backends, and a horizontally
fused kernel (:mod:`kfuse.codegen.horizontal`) can call it on its part of the block, where
``threadIdx``, ``blockIdx``, ``blockDim``, ``gridDim`` and ``__syncthreads`` mean that part.
"""

from __future__ import annotations

from dataclasses import replace

from kfuse.codegen.cexpr import comment_text, param_var, size_var
from kfuse.codegen.program import GridAxis, KernelParam, KernelSource, LaunchSpec, launch_bounds
from kfuse.errors import CompileError
from kfuse.ir.cnames import c_name
from kfuse.ir.expr import C_TYPES, INT_RANGES, STORAGE_TYPES
from kfuse.ir.graph import Graph, Kernel, UserArgument


def namespace_of(kernel: Kernel) -> str:
    """The C++ namespace the user's source of ``kernel`` is written in."""
    return f"kf_user_{c_name(kernel.name)}"


def user_kernel(graph: Graph, kernel: Kernel, threads: int | None = None
                ) -> tuple[KernelSource, LaunchSpec]:
    """The generated kernel that runs user kernel ``kernel``, and its launch; ``threads``:
    in 1-D blocks of so many threads (a kernel declared ``any_block``), the items each
    block covers along x scaled with them."""
    spec = kernel.opaque
    if spec is None:
        raise CompileError(f"operator '{kernel.name}' is not a user kernel")
    if threads is not None and threads != spec.threads:
        if not spec.any_block:
            raise CompileError(f"user kernel '{kernel.name}' runs in blocks of {spec.block} "
                               "(declare any_block=True where any 1-D block will do)")
        x = spec.grid[0]
        per_block = x.per_block * threads // spec.threads if not x.blocks else x.per_block
        if not x.blocks and per_block * spec.threads != x.per_block * threads:
            raise CompileError(f"user kernel '{kernel.name}': {threads} threads do not cover a "
                               f"whole number of its {x.per_block} items per {spec.threads}")
        spec = replace(spec, block=(threads, 1, 1),
                       grid=(replace(x, per_block=per_block), *spec.grid[1:]))
    params: list[KernelParam] = []
    seen: set[tuple[str, str]] = set()

    def add(param: KernelParam) -> None:
        if (param.role, param.ref) not in seen:
            seen.add((param.role, param.ref))
            params.append(param)

    call = []
    for argument in spec.arguments:
        call.append(_call_argument(graph, argument, add))
    namespace = namespace_of(kernel)
    where = f", from {comment_text(kernel.where)}" if kernel.where else ""
    preamble = (
        f"// User kernel '{spec.entry}' (operator '{kernel.name}'{where}): the user's source as "
        "given, its",
        "// __global__ functions compiled as device functions that the kernel below calls.",
        "#undef __global__",
        "#undef __launch_bounds__",
        "#define __global__ __device__ __forceinline__",
        "#define __launch_bounds__(...)",
        f"namespace {namespace} {{",
        *spec.source.strip("\n").splitlines(),
        f"}}  // namespace {namespace}",
        "#undef __global__",
        "#undef __launch_bounds__",
        "#define __global__ KF_GLOBAL_SPELLING",
        "#define __launch_bounds__(...) KF_LAUNCH_BOUNDS_SPELLING(__VA_ARGS__)",
    )
    body = (f"  {namespace}::{spec.entry}({', '.join(call)});",)
    symbol = f"user_{c_name(kernel.name)}"
    source = KernelSource(preamble, symbol, launch_bounds(spec.threads), tuple(params), body)
    grid = tuple(GridAxis(axis.symbols, axis.per_block, fixed_blocks=axis.blocks)
                 for axis in spec.grid)
    initial = tuple((access.buffer, int(access.initial) if graph.buffers[access.buffer].dtype
                     in INT_RANGES else access.initial)
                    for access in spec.writes if access.initial is not None)
    launch = LaunchSpec(symbol, (kernel.name,), tuple(params), spec.block,
                        grid, initial, dynamic_shared_bytes=spec.dynamic_shared_bytes,
                        blocks_walk=True)  # (in an order of its own: never reversed)
    return source, launch


def _call_argument(graph: Graph, argument: UserArgument, add) -> str:
    """The C expression passed for one argument of the user's function (declaring the
    generated kernel's parameters it needs through ``add``)."""
    if argument.role in ("input", "output"):
        name = c_name(argument.ref)
        const = "const " if argument.role == "input" else ""
        add(KernelParam(name, f"{const}{STORAGE_TYPES[argument.dtype]}*", argument.role,
                        argument.ref, argument.dtype))
        return f"kf_any_pointer{{(void*){name}}}"
    if argument.role == "size":
        if argument.ref == "1":
            return "1"
        factors = []
        for symbol in argument.ref.split("*"):
            add(KernelParam(size_var(symbol), "const int", "size", symbol, "int32"))
            factors.append(size_var(symbol))
        return factors[0] if len(factors) == 1 else f"({' * '.join(factors)})"
    if argument.role == "param":
        add(KernelParam(param_var(argument.ref), f"const {C_TYPES[argument.dtype]}", "param",
                        argument.ref, argument.dtype))
        return param_var(argument.ref)
    # a constant: its Python literal is a C literal (True / False excepted)
    return {"True": "true", "False": "false"}.get(argument.ref, argument.ref)
