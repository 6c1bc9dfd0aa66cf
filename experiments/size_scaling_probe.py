"""Start and tail costs: an app's planned program beside a copy of the same bytes, at several
sizes (GPU experiment, timing only).

The DRAM floor divides an app's bytes (external inputs read once, outputs written once) by
the copy bandwidth ``kfuse calibrate`` measures on a 1 GiB copy, whose start (the first
loads' latency) and tail (the last blocks' ramp-down) are spread over 2 GiB. Here, for each
app and square size, the planned program's median time is printed beside the float4 copy
kernel's time for the same bytes: if the app's ratio to its floor falls with the size while
its ratio to the same-bytes copy stays, the gap at the benchmark size is partly fixed cost.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/size_scaling_probe.py [app ...] [--sizes 4096,8192,16384]
"""

from __future__ import annotations

import argparse

from kfuse.bench.experiment import device_case
from kfuse.bench.floor import dram_floor_bytes, floor_seconds
from kfuse.runtime import get_backend
from kfuse.tune.calibrate import calibrate, measure_copy
from kfuse.tune.timing import time_gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=["shi_tomasi", "harris"])
    parser.add_argument("--sizes", default="4096,8192,16384")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    profile = calibrate(progress=False)
    print(f"copy bandwidth (1 GiB): {profile.copy_bandwidth_bytes_per_s / 1e9:.0f} GB/s",
          flush=True)
    backend = get_backend("cuda")
    print("| app | size | ms | floor ms | x floor | same-bytes copy ms | x copy |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.apps:
        for side in (int(s) for s in args.sizes.split(",")):
            case = device_case(name, size=(side, side))
            nbytes = dram_floor_bytes(case.graph, case.sizes)
            executable = backend.prepare(case.graph, case.given, plan=case.plan)
            app_s = time_gpu(executable.launch_all, repeat=args.runs).median_s
            copy_s = measure_copy(nbytes // 2, repeat=args.runs)["kernel"].median_s
            floor_s = floor_seconds(nbytes, profile)
            print(f"| {name} | {side}² | {app_s * 1e3:.4f} | {floor_s * 1e3:.4f} | "
                  f"{app_s / floor_s:.3f} | {copy_s * 1e3:.4f} | {app_s / copy_s:.3f} |",
                  flush=True)
            del executable, case


if __name__ == "__main__":
    main()
