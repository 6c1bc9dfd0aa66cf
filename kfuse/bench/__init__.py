"""Benchmarks: device-event timing, calibration, the DRAM floor, PyTorch baselines, reports.

Nothing here imports CuPy or PyTorch until a function needs it.
"""

from kfuse.bench.floor import (
    buffer_bytes,
    dram_floor_bytes,
    floor_seconds,
    launch_bytes,
    traffic_bytes,
)
from kfuse.bench.harness import (
    ERROR_TOLERANCE,
    BenchRow,
    KernelRow,
    bench_apps,
    device_inputs,
    max_relative_error,
)
from kfuse.bench.report import (
    from_json,
    plot,
    print_report,
    print_table,
    to_json,
    to_markdown,
)
from kfuse.bench.torch_baseline import (
    COMPILE_MODE,
    TorchFunction,
    TorchProgram,
    baselines,
    compile_core,
    torch_function,
    translate,
)
from kfuse.tune.calibrate import calibrate, device_properties, measure_copy, measure_launch
from kfuse.tune.timing import Timing, format_seconds, input_sets_needed, time_gpu, time_host

__all__ = [
    "COMPILE_MODE", "ERROR_TOLERANCE", "BenchRow", "KernelRow", "Timing", "TorchFunction",
    "TorchProgram", "baselines", "bench_apps", "buffer_bytes", "calibrate", "compile_core",
    "device_inputs",
    "device_properties", "dram_floor_bytes", "floor_seconds", "format_seconds", "from_json",
    "input_sets_needed", "launch_bytes", "max_relative_error", "measure_copy",
    "measure_launch", "plot", "print_report", "print_table", "time_gpu", "time_host",
    "to_json", "to_markdown", "torch_function", "traffic_bytes", "translate",
]
