"""Write each app's default program (compiled for its benchmark size) and its SASS (GPU machine).

For reading the instructions a generated kernel executes: ``$OUT/APP.cu`` and
``$OUT/APP.sass`` (nvcc -arch=sm_90 -cubin, cuobjdump -sass), and a count by opcode.
``sass_of`` and ``opcode_counts`` serve the other experiment scripts.

Usage (device machine, repo root)::

    PYTHONPATH=. python3 scripts/dump_sass.py APP [APP ...] [--variant 512x1:r1:i1:w8:stream:u16]

``--variant`` runs the app's row-streaming map-reduce group (else its first map-reduce group)
under that variant instead of the planned one.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile

from kfuse.apps import get_app
from kfuse.bench.harness import app_plan
from kfuse.codegen import generate
from kfuse.codegen.mapreduce import is_variant_text


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


def main(names: list[str], variant: str | None = None) -> None:
    out = os.environ.get("OUT", ".")
    for name in names:
        app = get_app(name)
        graph = app.build().graph()
        sizes = app.sizes(graph, app.bench_size)
        groups = [(tuple(g.members), tuple(g.outputs), g.variant)
                  for g in app_plan(app, graph, sizes).groups]
        if variant:  # the map-reduce group that streams rows (else the first) runs it
            index = studied_group(groups)
            groups[index] = (*groups[index][:2], "mapreduce:" + variant)
        program = generate(graph, groups, fixed_sizes=sizes)
        sass = sass_of(program.source)
        if sass is None:
            raise SystemExit("needs nvcc and cuobjdump on PATH")
        for suffix, text in ((".cu", program.source), (".sass", sass)):
            with open(os.path.join(out, name + suffix), "w") as file:
                file.write(text)
        counts = opcode_counts(sass)
        print(name, sum(counts.values()), dict(counts.most_common(25)), flush=True)


def studied_group(groups: list[tuple]) -> int:
    """Index of the group (members, outputs, variant) that runs a stream variant (else the
    first map-reduce one, else the first)."""
    indices = [i for i, group in enumerate(groups) if is_variant_text(group[2])]
    streams = [i for i in indices if ":stream" in groups[i][2]]
    return (streams or indices or [0])[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="+")
    parser.add_argument("--variant", default=None,
                        help="run the app's row-streaming group under this map-reduce "
                        "variant (without the 'mapreduce:' prefix)")
    arguments = parser.parse_args()
    main(arguments.apps, arguments.variant)
