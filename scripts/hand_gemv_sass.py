"""SASS of a block-row GEMV: the hand-written one of block_row_gemv_experiment, or an app's
row-streaming group generated under a variant (GPU machine: nvcc and cuobjdump).

Usage: PYTHONPATH=. python3 scripts/hand_gemv_sass.py hand THREADS WIDTH
       PYTHONPATH=. python3 scripts/hand_gemv_sass.py APP VARIANT   (e.g. sgemv 512x1:r1:i1:w8:stream:u16)
"""

import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from dump_sass import sass_of  # noqa: E402

if sys.argv[1] == "hand":
    spec = importlib.util.spec_from_file_location(
        "block_row", os.path.join(os.path.dirname(__file__), "block_row_gemv_experiment.py"))
    block_row = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(block_row)
    threads, width = (int(n) for n in sys.argv[2:4])
    source = block_row.PRELUDE.format(cols=16384, threads=threads, width=width, hints=0,
                                      vec=f"float{width}") + block_row.SGEMV
else:
    from kfuse.apps import get_app
    from kfuse.codegen import generate
    from kfuse.runtime import _auto_plan
    app = get_app(sys.argv[1])
    graph = app.build().graph()
    sizes = app.sizes(graph, (16384, 16384))
    plan = app.planner(graph, sizes)
    groups = [(tuple(g.members), tuple(g.outputs),
               "mapreduce:" + sys.argv[2] if ":stream" in g.variant else g.variant)
              for g in plan.groups]
    source = generate(graph, groups, fixed_sizes=sizes).source
    del _auto_plan
print(sass_of(source))
