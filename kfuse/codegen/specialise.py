"""Kernels compiled for the sizes they run at: size arguments become constants of the body.

A generated kernel takes every array size as an argument, so one binary serves every size.
Given the sizes (the CUDA backend knows them when it compiles a program for bound arrays),
each size argument is renamed and the size defined as a constant at the top of the body;
the compiler then folds row pitches into address offsets and bounds into comparisons with
constants, as torch.compile does when it compiles for one shape. Measured on an H200
(docs/journal/benchmarks.md, session 7): Unsharp 10%, Enhance 4%, Harris 3%, BiCGK 3%, Shi-Tomasi
and Sobel 1% faster, the GEMV kernels unchanged. The outermost axis of a 3-D iteration
space stays an argument: the 3-D diffusion's 255-register kernel ran 6% slower with every
size constant and 5% faster with all but that one (ptxas schedules it differently).

The launch arguments do not change (a specialised kernel still receives the sizes, and
ignores those it was compiled for), so a program specialised for one set of sizes must
only run at those sizes: the runtime binds a program to its arrays' sizes for that reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from kfuse.codegen.program import KernelSource, LaunchSpec

RUNTIME_SUFFIX = "_argument"  # what a size argument compiled in as a constant is renamed to


def specialise_kernel(kernel: KernelSource, launch: LaunchSpec, domain: Sequence[str],
                      sizes: Mapping[str, int]) -> KernelSource:
    """``kernel`` with its size arguments that ``sizes`` gives made constants of its body
    (all but the outermost axis of a 3-D ``domain``): each such argument renamed, and the
    size defined under its name at the top of the body."""
    runtime = domain[0] if len(domain) >= 3 else None
    fixed = {param.name for param in launch.params
             if param.role == "size" and param.ref != runtime and param.ref in sizes}
    if not fixed:
        return kernel
    params = tuple(replace(param, name=param.name + RUNTIME_SUFFIX) if param.name in fixed
                   else param for param in kernel.params)
    constants = [f"  const int {param.name} = {int(sizes[param.ref])};"
                 for param in launch.params if param.name in fixed]
    note = (f"  // compiled for these sizes: runs at them only (the *{RUNTIME_SUFFIX} "
            "parameters are not read)")
    return replace(kernel, params=params, body=(note, *constants, *kernel.body))
