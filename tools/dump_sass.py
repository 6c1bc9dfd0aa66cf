"""Write each app's default program (compiled for its benchmark size) and its SASS (GPU machine).

For reading the instructions a generated kernel executes: ``$OUT/APP.cu`` and
``$OUT/APP.sass`` (nvcc -arch=sm_90 -cubin, cuobjdump -sass), and a count by opcode.
(``kfuse.tune.sass``: ``sass_of``, ``opcode_counts``.)

Usage (device machine, repo root)::

    PYTHONPATH=. python3 tools/dump_sass.py APP [APP ...] [--variant 512x1:r1:i1:w8:stream:u16]

``--variant`` runs the app's row-streaming map-reduce group (else its first map-reduce group)
under that variant instead of the planned one.
"""

from __future__ import annotations

import argparse
import os

from kfuse.apps import get_app
from kfuse.bench.experiment import studied_group
from kfuse.bench.harness import app_plan
from kfuse.codegen import generate
from kfuse.tune.sass import opcode_counts, sass_of


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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="+")
    parser.add_argument("--variant", default=None,
                        help="run the app's row-streaming group under this map-reduce "
                        "variant (without the 'mapreduce:' prefix)")
    arguments = parser.parse_args()
    main(arguments.apps, arguments.variant)
