"""CUDA C code generation: from the IR (and a fusion plan) to readable kernel source."""

from kfuse.codegen.generate import generate, generate_unfused
from kfuse.codegen.program import GridAxis, KernelParam, LaunchSpec, Program

__all__ = ["GridAxis", "KernelParam", "LaunchSpec", "Program", "generate", "generate_unfused"]
