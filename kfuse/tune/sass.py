"""The machine code (SASS) of a CUDA source, for reading what a generated kernel executes:
compiled with nvcc for sm_90 and disassembled with cuobjdump (both on the GPU machine)."""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile


def sass_of(source: str) -> str | None:
    """The SASS of CUDA ``source`` for sm_90, or None without nvcc and cuobjdump."""
    if not (shutil.which("nvcc") and shutil.which("cuobjdump")):
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cu")
        with open(path, "w") as file:
            file.write(source)
        subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-o", path + ".cubin", path],
                       check=True, capture_output=True)
        return subprocess.run(["cuobjdump", "-sass", path + ".cubin"], check=True,
                              capture_output=True, text=True).stdout


def opcode_counts(sass: str) -> collections.Counter[str]:
    """Instructions by opcode (modifiers included: ``LDG.E.128.CONSTANT``)."""
    return collections.Counter(re.findall(
        r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass))


__all__ = ["opcode_counts", "sass_of"]
