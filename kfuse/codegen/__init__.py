"""CUDA C code generation: from the IR (and a fusion plan) to readable kernel source."""

from kfuse.codegen.program import GridAxis, KernelParam, LaunchSpec, Program
from kfuse.codegen.unfused import generate_unfused

__all__ = ["GridAxis", "KernelParam", "LaunchSpec", "Program", "generate_unfused"]
