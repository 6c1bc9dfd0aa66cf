"""Write each app's default program (compiled for its benchmark size) and its SASS (GPU machine).

For reading the instructions a generated kernel executes: ``$OUT/APP.cu`` and
``$OUT/APP.sass`` (nvcc -arch=sm_90 -cubin, cuobjdump -sass), and a count by opcode.

Usage (device machine, repo root): PYTHONPATH=. python3 scripts/dump_sass.py APP [APP ...]
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys

from kfuse.apps import get_app
from kfuse.codegen import generate
from kfuse.search import search


def main(names: list[str]) -> None:
    out = os.environ.get("OUT", ".")
    for name in names:
        app = get_app(name)
        graph = app.build().graph()
        sizes = graph.bind_shapes({n: app.bench_size for n in graph.inputs})
        program = generate(graph, search(graph, sizes=sizes).kernel_groups, fixed_sizes=sizes)
        source = os.path.join(out, f"{name}.cu")
        with open(source, "w") as file:
            file.write(program.source)
        cubin = source + "bin"
        subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-o", cubin, source], check=True)
        sass = subprocess.run(["cuobjdump", "-sass", cubin], check=True, capture_output=True,
                              text=True).stdout
        os.remove(cubin)
        with open(os.path.join(out, f"{name}.sass"), "w") as file:
            file.write(sass)
        counts = collections.Counter(re.findall(
            r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass))
        print(name, sum(counts.values()), dict(counts.most_common(25)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
