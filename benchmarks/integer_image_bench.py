"""Harris of an 8-bit (or 16-bit) image on the GPU, against the DRAM floor that counts the
image's own bytes (issue 28's target: uint8 at 8192^2 within 1.3x of it), beside
torch.compile, with the usual `kfuse bench` table.

    PYTHONPATH=. python3 benchmarks/integer_image_bench.py [--dtype uint8] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import numpy as np

from kfuse.apps import harris
from kfuse.apps.base import App
from kfuse.bench import bench_apps, print_report, to_json


def integer_harris(dtype: str) -> App:
    """The Harris app on an image of ``dtype`` (values over its whole range, k = 0.04)."""
    top = int(np.iinfo(dtype).max)

    def make_inputs(size, rng, _dtype="float32"):
        return {"img": rng.integers(0, top, size=size, endpoint=True).astype(dtype)}, \
            {"k": 0.04}

    return dataclasses.replace(harris.APP, name=f"harris_{dtype}",
                               build=functools.partial(harris.build, image_dtype=dtype),
                               make_inputs=make_inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="uint8")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = bench_apps([integer_harris(args.dtype), "harris"], progress=False)
    print_report(rows)
    if args.json:
        to_json(rows, args.json)


if __name__ == "__main__":
    main()
