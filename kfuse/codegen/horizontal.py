"""Kernels side by side in one block: horizontal fusion (Li et al. 2022, HFuse).

Each part is lowered as it would be alone (a generated group or a user kernel) and written
as a device function; the fused kernel's block is 1-D, part k takes the next ``threads_k``
of its threads. Around each part's function the words a kernel reads its place by are
redefined (the preprocessor, not a parser: the part's code is the same text it is alone):
``threadIdx`` is its thread in its own block shape (``kf_part_thread``), ``blockDim`` that
shape, ``blockIdx`` and ``gridDim`` its block and grid (the fused kernel's thread 0 writes
them to shared memory: a part's grid may be smaller than the launch's, whose extra blocks
skip it whole), ``__syncthreads()`` a named barrier over its threads only (PTX ``bar.sync
k+1, threads_k``), dynamic shared memory starts at its own offset, and the prelude's block
helpers are defined again for it. Parts are whole warps, so a warp's shuffles stay in one part.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from math import prod

from kfuse.codegen.program import GridAxis, KernelParam, KernelSource, LaunchSpec, launch_bounds
from kfuse.cuda_limits import MAX_BLOCK_THREADS, WARP
from kfuse.errors import CompileError
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import GroupSchedule, HorizontalSchedule

SHARED_ALIGNMENT = 16  # bytes: each part's dynamic shared memory starts on such a boundary
# the words redefined around each part's function: none is a macro outside it but
# KF_DYNAMIC_SHARED, which is defined again after it (from byte 0 on: the same memory)
REDEFINED = ("threadIdx", "blockIdx", "blockDim", "gridDim", "__syncthreads",
             "KF_DYNAMIC_SHARED", "kf_reversed_block", "kf_block_reduce")

# a part's kernel and launch as it would run alone, in blocks of so many threads (None: its own)
Lower = Callable[[GroupSchedule, int | None], tuple[KernelSource, LaunchSpec]]


def horizontal_kernel(graph: Graph, schedule: HorizontalSchedule, lower: Lower
                      ) -> tuple[KernelSource, LaunchSpec]:
    """The one kernel that runs ``schedule``'s parts side by side (``lower``: a part's
    kernel and launch as it would run alone), and its launch."""
    reason = schedule.why_not(graph)
    if reason:
        raise CompileError(f"horizontal fusion of {[list(p.members) for p in schedule.parts]}: "
                           f"{reason}")
    lowered = [_lowered_part(graph, part, schedule.part_threads(index), lower)
               for index, part in enumerate(schedule.parts)]
    symbol = "hfuse_" + "_".join(launch.symbol for _, launch in lowered)
    preamble: list[str] = []
    offsets, shared_offsets = [], []
    threads_before = shared_before = 0
    for _, launch in lowered:
        offsets.append(threads_before)
        shared_offsets.append(shared_before)
        threads_before += prod(launch.block)
        shared_before += -(-launch.dynamic_shared_bytes // SHARED_ALIGNMENT) * SHARED_ALIGNMENT
    if threads_before > MAX_BLOCK_THREADS:
        raise CompileError(f"horizontal fusion into '{symbol}': the parts take "
                           f"{threads_before} threads; a block holds at most "
                           f"{MAX_BLOCK_THREADS}")
    context = f"kf_{symbol}_place"
    described = ", ".join(
        f"[{offsets[k]}, {offsets[k] + prod(launch.block)}) run '{launch.symbol}' "
        f"(block {'x'.join(str(b) for b in launch.block if b > 1) or '1'})"
        for k, (_, launch) in enumerate(lowered))
    preamble += [
        "// Kernels side by side in one block (horizontal fusion, Li et al. 2022): threads",
        f"// {described}. Each part sees its own threadIdx, blockIdx, blockDim and gridDim",
        "// and synchronises on a barrier of its own threads.",
        f"__shared__ uint3 {context}[{2 * len(lowered)}];  // per part: its block, its grid",
    ]
    params: list[KernelParam] = []
    names: dict[str, KernelParam] = {}
    calls = []
    for index, (kernel, launch) in enumerate(lowered):
        preamble += _part_function(kernel, launch, index, offsets[index],
                                   shared_offsets[index], context)
        arguments = []
        for param in launch.params:
            shared = names.get(param.name)
            if shared is None:
                names[param.name] = param
                params.append(param)
                arguments.append(param.name)
            elif shared == param:
                arguments.append(param.name)
            else:  # the same name for another argument: this part's is renamed
                renamed = replace(param, name=f"{param.name}_part{index}")
                names[renamed.name] = renamed
                params.append(renamed)
                arguments.append(renamed.name)
        calls.append(f"{_part_symbol(launch, index)}({', '.join(arguments)})")
    params += [KernelParam(f"kf_part{index}_blocks_{axis}", "const unsigned", "blocks",
                           f"{index}.{number}", "uint32")
               for index in range(len(lowered)) for number, axis in enumerate("xyz")]
    body = ["  if (threadIdx.x == 0) {  // each part's block number in its own grid"]
    for index in range(len(lowered)):
        x, y, z = (f"kf_part{index}_blocks_{axis}" for axis in "xyz")
        body += [f"    {context}[{2 * index}] = uint3{{blockIdx.x % {x}, blockIdx.x / {x} % {y}, "
                 f"blockIdx.x / ({x} * {y})}};",
                 f"    {context}[{2 * index + 1}] = uint3{{{x}, {y}, {z}}};"]
    body += ["  }", "  __syncthreads();"]
    for index, (_, launch) in enumerate(lowered):
        x, y, z = (f"kf_part{index}_blocks_{axis}" for axis in "xyz")
        end = offsets[index] + prod(launch.block)
        test = f"threadIdx.x < {end}" if index < len(lowered) - 1 else ""
        keyword = "if" if index == 0 else "} else if" if test else "} else"
        body += [f"  {keyword}{f' ({test})' if test else ''} {{",
                 f"    if (blockIdx.x < {x} * {y} * {z}) {calls[index]};"]
    body.append("  }")
    threads = threads_before
    source = KernelSource(tuple(preamble), symbol,
                          launch_bounds(threads, schedule.least_blocks), tuple(params),
                          tuple(body))
    launch = LaunchSpec(
        symbol, tuple(op for _, part in lowered for op in part.operators), tuple(params),
        (threads, 1, 1), (GridAxis(), GridAxis(), GridAxis()),
        tuple(value for _, part in lowered for value in part.initial_values),
        shared_before,
        tuple(limit for _, part in lowered for limit in part.size_limits),
        True, tuple(part.grid for _, part in lowered))
    return source, launch


def _lowered_part(graph: Graph, part: GroupSchedule, threads: int | None, lower: Lower
                  ) -> tuple[KernelSource, LaunchSpec]:
    """A part's kernel and launch alone, resized to ``threads`` where asked."""
    kernel, launch = lower(part, threads)
    if threads is not None and prod(launch.block) != threads:
        raise CompileError(f"part {list(part.members)} takes blocks of {launch.block}, "
                           f"not {threads} threads")
    why = _why_not_part(launch)
    if why:
        raise CompileError(f"part {list(part.members)} cannot run beside another: {why}")
    return kernel, launch


def _why_not_part(launch: LaunchSpec) -> str | None:
    """Why a lowered kernel cannot be a part (None: it can)."""
    if launch.fills_wave:
        return "its grid is as many blocks as fill the device once, counted for it alone"
    if launch.part_grids:
        return "it is itself a horizontally fused kernel"
    if prod(launch.block) % WARP:
        return f"its block of {prod(launch.block)} threads is not whole warps"
    return None


def _part_symbol(launch: LaunchSpec, index: int) -> str:
    return f"{launch.symbol}_part{index}"


def _part_function(kernel: KernelSource, launch: LaunchSpec, index: int, offset: int,
                   shared_offset: int, context: str) -> list[str]:
    """A part's kernel as a device function, between the redefinitions that make it see
    its own part of the block."""
    x, y, z = launch.block
    threads = x * y * z
    suffix = f"{launch.symbol}_part{index}"
    lines = [f"// part {index}: '{launch.symbol}', threads [{offset}, {offset + threads}) "
             f"as blocks of {x} x {y} x {z}"]
    lines += [f"#undef {word}" for word in REDEFINED]
    lines += [
        f"#define threadIdx kf_part_thread<{offset}, {x}, {y}>()",
        f"#define blockDim dim3({x}, {y}, {z})",
        f"#define blockIdx {context}[{2 * index}]",
        f"#define gridDim {context}[{2 * index + 1}]",
        f"#define __syncthreads() KF_BAR_SYNC({index + 1}, {threads})",
        f"#define KF_DYNAMIC_SHARED(type, name) KF_DYNAMIC_SHARED_AT(type, name, "
        f"{shared_offset})",
        f"KF_BLOCK_HELPERS(kf_reversed_block_{suffix}, kf_block_reduce_{suffix})",
        f"#define kf_reversed_block kf_reversed_block_{suffix}",
        f"#define kf_block_reduce kf_block_reduce_{suffix}",
        *kernel.preamble,
        _device_header(kernel, _part_symbol(launch, index)),
        "{",
        *kernel.body,
        "}",
    ]
    lines += [f"#undef {word}" for word in REDEFINED]  # (NVRTC keeps no pushed macros)
    lines.append("#define KF_DYNAMIC_SHARED(type, name) KF_DYNAMIC_SHARED_AT(type, name, 0)")
    return lines


def _device_header(kernel: KernelSource, symbol: str) -> str:
    parameters = ", ".join(f"{param.ctype} {param.name}" for param in kernel.params)
    return f"KF_DEVICE void {symbol}({parameters})"
