"""The horizontal-fusion model (kfuse.model.horizontal) against a run of
benchmarks/hfuse_bench.py: per pair, each candidate's predicted and measured time, and
whether the prediction's choice (fuse or not) is the measured one.

    PYTHONPATH=. python3 experiments/hfuse_model_check.py docs/journal/bench/...-hfuse_bench.json
"""

from __future__ import annotations

import json
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
from hfuse_bench import apart_plan  # noqa: E402

from kfuse.apps.pairs import PAIRS
from kfuse.model.device import default_profile, h200_like_profile
from kfuse.model.horizontal import predict
from kfuse.search.hfuse import best_side_by_side, candidates, part_shape

MEASURED_MARGIN = 0.02  # side by side pays where measured this much faster than apart (the
# noise of alternating rounds; benchmarks/hfuse_bench.py's measured_pays)


def main() -> int:
    measured = {row["pair"]: row for row in json.load(open(sys.argv[1]))["rows"] if "pair" in row}
    device = json.load(open(sys.argv[1]))["device"]
    profile = h200_like_profile() if "H200" in device else default_profile()
    right = 0
    for pair in PAIRS:
        row = measured.get(pair.name)
        if row is None:
            continue
        pipeline = pair.build()
        graph = pipeline.graph()
        sizes = row["sizes"]
        parts = [g.schedule for g in apart_plan(pipeline, sizes).groups]
        shapes = [part_shape(graph, part, sizes, profile) for part in parts]
        ms = row["ms"]
        apart = min(ms["one after another"], ms["two streams"])
        print(f"== {pair.name}: measured one after another {ms['one after another']:.4f}, "
              f"two streams {ms['two streams']:.4f}")
        for candidate in candidates(graph, parts, shapes, profile):
            label = "side by side " + "/".join(
                str(t or s.threads) for t, s in zip(candidate.threads, shapes, strict=True)) + (
                f" cap{candidate.least_blocks}" if candidate.least_blocks else "")
            resized = [s if t is None else part_shape(graph, p, sizes, profile, t)
                       for p, s, t in zip(parts, shapes, candidate.threads, strict=True)]
            p = predict(resized, profile, candidate.least_blocks)
            print(f"  {label:28s} measured {ms.get(label, float('nan')):.4f} predicted "
                  f"{p.fused_s * 1e3:.4f} (apart {p.sequential_s * 1e3:.4f} / "
                  f"{p.streams_s * 1e3:.4f})")
        best = best_side_by_side(graph, parts, sizes, profile)
        fused = min(v for k, v in ms.items() if k.startswith("side by side") and "cap" not in k)
        measured_pays = fused < apart * (1 - MEASURED_MARGIN)
        predicted_pays = bool(best and best[1].pays)
        right += measured_pays == predicted_pays
        print(f"  measured pays {measured_pays} ({apart / fused:.3f}x); predicted pays "
              f"{predicted_pays}" + (f": {best[1].reason}" if best else ""))
    print(f"right on {right} of {len(measured)}")
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    sys.exit(main())
