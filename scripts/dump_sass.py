"""Write each app's default program (compiled for its benchmark size) and its SASS (GPU machine).

For reading the instructions a generated kernel executes: ``$OUT/APP.cu`` and
``$OUT/APP.sass`` (nvcc -arch=sm_90 -cubin, cuobjdump -sass), and a count by opcode.
``sass_of`` and ``opcode_counts`` serve the other experiment scripts.

Usage (device machine, repo root): PYTHONPATH=. python3 scripts/dump_sass.py APP [APP ...]
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

from kfuse.apps import get_app
from kfuse.codegen import generate
from kfuse.search import search


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


def main(names: list[str]) -> None:
    out = os.environ.get("OUT", ".")
    for name in names:
        app = get_app(name)
        graph = app.build().graph()
        sizes = graph.bind_shapes({n: app.bench_size for n in graph.inputs})
        program = generate(graph, search(graph, sizes=sizes).kernel_groups, fixed_sizes=sizes)
        sass = sass_of(program.source)
        if sass is None:
            raise SystemExit("needs nvcc and cuobjdump on PATH")
        for suffix, text in ((".cu", program.source), (".sass", sass)):
            with open(os.path.join(out, name + suffix), "w") as file:
                file.write(text)
        counts = opcode_counts(sass)
        print(name, sum(counts.values()), dict(counts.most_common(25)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
