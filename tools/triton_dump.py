"""What torch.compile generates for kfuse apps: inductor's output code, the autotuned
configurations it kept, and each Triton kernel's PTX and SASS, in one text file per app.

Usage on the device machine (repo root; fresh caches so that only these apps' kernels are
found)::

    PYTHONPATH=. python3 tools/triton_dump.py sgemv gesummv ... --out $OUT/triton [--size MxN]

Writes ``APP-SIZE.txt`` under ``--out``: the output code of the compiled graph (kernel sources
with their launch grids), every ``.best_config`` inductor wrote, and for each compiled
kernel variant its metadata (warps, stages, shared memory) and ``cuobjdump -sass``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np


def dump(name: str, out: Path, size: tuple[int, ...] | None = None) -> None:
    cache = Path(tempfile.mkdtemp(prefix=f"kfuse_triton_{name}_"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(cache / "triton")
    import cupy
    import torch

    from kfuse.apps import get_app
    from kfuse.bench.torch_baseline import compile_core, translate

    torch._dynamo.reset()
    app = get_app(name)
    size = size or app.bench_size
    graph = app.build().graph()
    arrays, params = app.make_inputs(size, np.random.default_rng(0), "float32")
    program = translate(graph)
    compiled = program.function(compile_core(program))
    compiled(**{k: torch.as_tensor(cupy.asarray(v), device="cuda") for k, v in arrays.items()},
             **params)
    torch.cuda.synchronize()
    lines = [f"# torch.compile of kfuse app {name} at {size}"]
    for path in sorted((cache / "inductor").rglob("*.py")):
        text = path.read_text(errors="replace")
        if "def call(" in text:
            lines += [f"\n## output code {path.name}\n", text]
    for path in sorted((cache / "inductor").rglob("*.best_config")):
        lines += [f"\n## best config {path.name}: {path.read_text()}"]
    for path in sorted((cache / "triton").rglob("*.cubin")):
        meta_path = path.with_suffix(".json")
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        keep = {k: meta.get(k) for k in ("name", "num_warps", "num_stages", "shared")}
        sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True,
                              text=True).stdout
        lines += [f"\n## kernel {path.parent.name[:10]} {keep}\n", sass]
    (out / f"{name}-{'x'.join(map(str, size))}.txt").write_text("\n".join(lines))
    shutil.rmtree(cache, ignore_errors=True)
    print(f"{name}: {len(lines)} sections", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="+")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--size", help="MxN (default: each app's benchmark size)")
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.split("x")) if args.size else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.apps:
        dump(name, out, size)


if __name__ == "__main__":
    main()
