"""What the kernel experiments in experiments/ share: an app's fused kernel on the GPU, and the
timing of a patched copy of it, checked against the generated result.

Used by experiments/prefetch_experiment.py, experiments/zloop_experiment.py and
experiments/stream_experiment.py (run from the repository root with PYTHONPATH=.).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kfuse.apps import get_app
from kfuse.apps.check import relative_error
from kfuse.bench.floor import dram_floor_bytes
from kfuse.codegen import generate
from kfuse.runtime import get_backend
from kfuse.search import search
from kfuse.tune.calibrate import calibrate
from kfuse.tune.timing import time_gpu


def copy_bandwidth() -> float:
    """The calibrated copy bandwidth (bytes/s), printed: the floor of every line after."""
    bandwidth = calibrate(repeat=20, progress=False).copy_bandwidth_bytes_per_s
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    return bandwidth


@dataclass
class FusedApp:
    """An app's default fused program, run once on random inputs at its benchmark size."""

    name: str
    graph: Any
    program: Any
    given: dict
    executable: Any
    expected: dict
    floor_s: float

    @classmethod
    def prepare(cls, name: str, bandwidth: float) -> FusedApp:
        import cupy

        app = get_app(name)
        graph = app.build().graph()
        arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
        given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
        plan = search(graph, sizes=app.sizes(graph, app.bench_size))
        program = generate(graph, plan.kernel_groups)
        executable = get_backend("cuda").prepare(graph, given, program=program)
        executable.launch_all()
        expected = {k: executable.buffers[k].get() for k in graph.outputs}
        floor_s = dram_floor_bytes(graph, executable.bound.sizes) / bandwidth
        return cls(name, graph, program, given, executable, expected, floor_s)

    def time_generated(self) -> None:
        timing = time_gpu(self.executable.launch_all, warmup=5, repeat=50)
        print(f"{self.name:11s} generated  {timing.median_s * 1e3:.4f} ms  "
              f"{timing.median_s / self.floor_s:.2f}x floor", flush=True)

    def with_source(self, source: str) -> Any:
        """An executable of the same program with another source (same kernels, same names)."""
        return get_backend("cuda").prepare(self.graph, self.given, program=dataclasses.replace(
            self.program, source=source))

    def time_launch(self, label: str, launch: Callable[[], object], interior: int = 0
                    ) -> None:
        """Time ``launch`` (which writes this app's output buffers); print its error against
        the generated result (``interior``: only that many points in from every edge)."""
        for output in self.graph.outputs:
            self.executable.buffers[output].fill(np.nan)
        launch()
        inside = tuple(slice(interior, -interior or None) for _ in range(
            self.expected[self.graph.outputs[0]].ndim))
        error = max(relative_error(self.executable.buffers[k].get()[inside],
                                   self.expected[k][inside]) for k in self.graph.outputs)
        timing = time_gpu(launch, warmup=5, repeat=50)
        print(f"{self.name:11s} {label}  {timing.median_s * 1e3:.4f} ms  "
              f"{timing.median_s / self.floor_s:.2f}x floor  err {error:.1e}", flush=True)

    def time_patched(self, label: str, runner: Any, grid: tuple[int, int, int],
                     block: tuple[int, int, int] | None = None) -> None:
        """Time the single kernel of this app's program on ``runner`` with ``grid`` (and
        ``block``, the generated one when left out)."""
        (spec,) = self.program.launches
        args = [self.executable.argument(spec, param) for param in spec.params]
        self.time_launch(label, lambda: runner.launch(spec, grid, block or spec.block, args))


def hand_kernel_target(name: str) -> tuple[FusedApp, Any, Any]:
    """(app, its one input, its one output): an app with one 2-D input and output whose
    generated fused kernel has just been timed, for a hand-written kernel to be compared."""
    app = FusedApp.prepare(name, copy_bandwidth())
    app.time_generated()
    (image,) = (app.given[buffer] for buffer in app.graph.inputs)
    (output,) = (app.executable.buffers[buffer] for buffer in app.graph.outputs)
    return app, image, output
