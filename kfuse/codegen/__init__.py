"""CUDA C code generation: from the IR (and a fusion plan) to readable kernel source."""

from kfuse.codegen.generate import generate, generate_unfused
from kfuse.codegen.lowering import CodegenLowering
from kfuse.codegen.program import GridAxis, KernelParam, LaunchSpec, Program
from kfuse.schedule.lowering import install_lowering

install_lowering(CodegenLowering())  # what planning asks of code generation

__all__ = ["GridAxis", "KernelParam", "LaunchSpec", "Program", "generate", "generate_unfused"]
