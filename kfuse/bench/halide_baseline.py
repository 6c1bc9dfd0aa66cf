"""Halide baselines of the pyramid apps: Halide's own algorithm and GPU schedule, and its
autoschedulers, through Halide's Python bindings (the ``halide`` package; optional).

``local_laplacian`` is the algorithm of Halide's ``apps/local_laplacian`` generator (Paris,
Hasinoff and Kautz 2011) written with the Python bindings, with that app's manual GPU schedule
(every pyramid level ``compute_root`` and ``gpu_tile``d, 16 x 8 threads, 2 x 2 above level 3).
Halide clamps the input once and extends every level beyond its edges; kfuse reads each level
through the boundary mode, so the two agree away from the borders: the check compares
points at least :func:`border_margin` from every edge.

``blend`` is Laplacian pyramid blending written in Halide the way kfuse defines it (each
level clamped to its own extent, so the results agree everywhere), with the same kind of
manual schedule.

Autoschedulers (``Li2018``, ``Anderson2021``, ``Mullapudi2016``: Halide's GPU-capable ones)
schedule the same algorithm for the same size; one that fails is reported, not fatal.

Timing: Halide runs in its own CUDA context, so CUDA events of another context do not see its
work. :func:`time_halide` times on the host: a block of back-to-back ``realize`` calls into
device-resident buffers, then one device synchronisation, divided by the block's length; the
call overhead of Halide's JIT entry point is included (as a user calling it from Python pays).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MANUAL = "manual"
AUTOSCHEDULERS = ("Li2018", "Mullapudi2016", "Anderson2021")
# Anderson2021's beam search took 14 minutes to schedule pyramid blending on two cores: it
# runs where $KFUSE_HALIDE_SCHEDULES names it (a comma-separated list of these schedules)
SCHEDULES_VARIABLE = "KFUSE_HALIDE_SCHEDULES"
DEFAULT_SCHEDULES = (MANUAL, "Li2018", "Mullapudi2016")
# the parallelism an autoscheduler is told: the streaming multiprocessors of an H100/H200
GPU_PARALLELISM = 132


def available() -> str | None:
    """Why the Halide baseline cannot run here (None when it can)."""
    try:
        import halide  # noqa: F401
    except ImportError:
        return "the halide package is not installed (pip install halide)"
    return None


def schedules() -> tuple[str, ...]:
    """The schedules the benchmark runs: ``$KFUSE_HALIDE_SCHEDULES`` or the defaults."""
    named = os.environ.get(SCHEDULES_VARIABLE, "").strip()
    if not named:
        return DEFAULT_SCHEDULES
    chosen = tuple(part.strip() for part in named.split(",") if part.strip())
    unknown = sorted(set(chosen) - {MANUAL, *AUTOSCHEDULERS})
    if unknown:
        raise ValueError(f"${SCHEDULES_VARIABLE} names {unknown}: the schedules are "
                         f"{', '.join((MANUAL, *AUTOSCHEDULERS))}")
    return chosen


def has_program(app_name: str) -> bool:
    """Whether ``app_name`` has a Halide definition here."""
    return app_name in _BUILDERS


def border_margin(app_name: str) -> int:
    """Points this close to an edge are left out of the check against kfuse (Halide's own
    boundary handling differs there)."""
    return _MARGINS.get(app_name, 0)


@dataclass
class HalideRun:
    """One scheduled, JIT-compiled Halide pipeline with device-resident inputs and output."""

    app: str
    schedule: str
    pipeline: Any
    target: Any
    params: dict[str, Any]                     # ImageParam / Param objects by name
    input_sets: list[dict[str, Any]]           # hl.Buffer per input, per set
    output: Any                                 # hl.Buffer
    compile_seconds: float = 0.0

    def use(self, index: int) -> None:
        """Point the pipeline's inputs at input set ``index``."""
        for name, buffer in self.input_sets[index].items():
            self.params[name].set(buffer)

    def run(self) -> None:
        """One call: realize into the device output (asynchronous on the device)."""
        self.pipeline.realize(self.output, self.target)

    def sync(self) -> None:
        if self.target.has_gpu_feature():
            self.output.device_sync()

    def result(self) -> np.ndarray:
        """The output as a NumPy array in kfuse's axis order (a host copy)."""
        if self.target.has_gpu_feature():
            self.output.copy_to_host()
        return np.array(self.output, copy=True)


def prepare(app_name: str, arrays: Sequence[Mapping[str, np.ndarray]],
            scalars: Mapping[str, float], schedule: str = MANUAL,
            target: Any = None) -> HalideRun:
    """The Halide program of ``app_name`` scheduled by ``schedule`` (:data:`MANUAL` or one of
    :data:`AUTOSCHEDULERS`), compiled for ``target`` (default :func:`gpu_target`), its
    inputs (one dict of host arrays per input set, kfuse's axis order) copied to the
    device."""
    import halide as hl

    target = target or gpu_target()
    on_gpu = target.has_gpu_feature()
    definition = _BUILDERS[app_name](hl, arrays[0], scalars)
    start = time.perf_counter()
    if schedule == MANUAL:
        definition.manual_schedule(on_gpu)
        pipeline = hl.Pipeline(definition.output)
    else:
        pipeline = _autoscheduled(hl, definition, schedule, target)
    pipeline.compile_jit(target)
    compiled = time.perf_counter() - start
    input_sets = []
    for one in arrays:
        buffers = {}
        for name in definition.images:
            buffer = hl.Buffer(np.ascontiguousarray(one[name]))
            if on_gpu:
                buffer.set_host_dirty(True)
                buffer.copy_to_device(hl.DeviceAPI.CUDA, target)
            buffers[name] = buffer
        input_sets.append(buffers)
    output = hl.Buffer(definition.output_type, list(reversed(definition.output_shape)))
    run = HalideRun(app_name, schedule, pipeline, target, definition.params, input_sets,
                    output, compile_seconds=compiled)
    run.use(0)
    run.run()  # the first call allocates and uploads
    run.sync()
    return run


def gpu_target() -> Any:
    """The host target with CUDA (compute capability 8.0 code, which Hopper runs)."""
    import halide as hl
    return (hl.get_host_target().with_feature(hl.TargetFeature.CUDA)
            .with_feature(hl.TargetFeature.CUDACapability80))


def time_halide(run: Callable[[], object], *, warmup: int = 5, repeat: int = 50,
                rotate: Sequence[Callable[[], object]] | None = None,
                max_seconds: float | None = 30.0, sync: Callable[[], None] | None = None
                ) -> Any:
    """Host wall-clock per call of ``run``: blocks of back-to-back calls, one per input set
    (``rotate``), ended by ``sync`` (the device's work done), each block's time over its
    length (:func:`kfuse.tune.timing.time_host` times the blocks)."""
    from kfuse.tune.timing import Timing, time_host

    setters = list(rotate or []) or [lambda: None]

    def block() -> None:
        for choose in setters:
            choose()
            run()
        if sync is not None:
            sync()

    blocks = time_host(block, warmup=max(1, warmup // len(setters)),
                       repeat=max(3, repeat // len(setters)), max_seconds=max_seconds)
    count = len(setters)
    return Timing(blocks.median_s / count, blocks.min_s / count, blocks.p10 / count,
                  blocks.p90 / count, blocks.runs * count)


def _autoscheduled(hl: Any, definition: _Definition, name: str, target: Any) -> Any:
    """The definition's pipeline scheduled by autoscheduler ``name`` (its plugin ships in
    the halide package's lib64) for ``target``, from the definition's estimates."""
    library = Path(hl.__file__).parent / "lib64" / f"libautoschedule_{name.lower()}.so"
    hl.load_plugin(str(library))
    definition.estimates()
    pipeline = hl.Pipeline(definition.output)
    pipeline.apply_autoscheduler(target, hl.AutoschedulerParams(
        name, _autoscheduler_options(name)))
    return pipeline


def _autoscheduler_options(name: str) -> dict[str, str]:
    if name == "Mullapudi2016":
        return {"parallelism": str(GPU_PARALLELISM), "last_level_cache_size": str(50 << 20)}
    return {"parallelism": str(GPU_PARALLELISM)}


@dataclass
class _Definition:
    """An algorithm in Halide: its output Func, its inputs and what schedules it."""

    output: Any
    output_type: Any
    output_shape: tuple[int, ...]              # kfuse's axis order
    images: tuple[str, ...]
    params: dict[str, Any]
    manual_schedule: Callable[[bool], None]  # (on the GPU?)
    estimates: Callable[[], None]


def _downsample(hl: Any, f: Any, x: Any, y: Any, rest: list[Any]) -> Any:
    """The next Gaussian level: taps 1 3 3 1 / 8 at 2p - 1 .. 2p + 2 on x, then on y."""
    downx, downy = hl.Func(f"{f.name()}_dx"), hl.Func(f"{f.name()}_dy")
    downx[[x, y, *rest]] = (f[[2 * x - 1, y, *rest]] + 3.0 * (
        f[[2 * x, y, *rest]] + f[[2 * x + 1, y, *rest]]) + f[[2 * x + 2, y, *rest]]) / 8.0
    downy[[x, y, *rest]] = (downx[[x, 2 * y - 1, *rest]] + 3.0 * (
        downx[[x, 2 * y, *rest]] + downx[[x, 2 * y + 1, *rest]])
        + downx[[x, 2 * y + 2, *rest]]) / 8.0
    return downy


def _upsample(hl: Any, f: Any, x: Any, y: Any, rest: list[Any]) -> Any:
    """Linear interpolation with half-pixel centres: 0.75 of p // 2, 0.25 of its neighbour."""
    upx, upy = hl.Func(f"{f.name()}_ux"), hl.Func(f"{f.name()}_uy")
    upx[[x, y, *rest]] = (0.25 * f[[(x // 2) - 1 + 2 * (x % 2), y, *rest]]
                          + 0.75 * f[[x // 2, y, *rest]])
    upy[[x, y, *rest]] = (0.25 * upx[[x, (y // 2) - 1 + 2 * (y % 2), *rest]]
                          + 0.75 * upx[[x, y // 2, *rest]])
    return upy


def _local_laplacian(hl: Any, arrays: Mapping[str, np.ndarray],
                     scalars: Mapping[str, float]) -> _Definition:
    """Halide's apps/local_laplacian generator (pyramid_levels = 8), in Python."""
    from kfuse.apps.pyramids import COLOR_EPS, GRAY_WEIGHTS, INTENSITY_LEVELS, LAPLACIAN_LEVELS

    x, y, c, k = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("k")
    channels, height, width = arrays["image"].shape
    image = hl.ImageParam(hl.UInt(16), 3, "image")
    levels = hl.Param(hl.Int(32), "levels", INTENSITY_LEVELS)
    alpha = hl.Param(hl.Float(32), "alpha", float(scalars["alpha"]))
    beta = hl.Param(hl.Float(32), "beta", float(scalars["beta"]))
    J = LAPLACIAN_LEVELS  # noqa: N806 (the paper's and Halide's name)

    remap = hl.Func("remap")
    fx = hl.f32(x) / 256.0
    remap[x] = alpha * fx * hl.exp(-fx * fx / 2.0)
    clamped = hl.BoundaryConditions.repeat_edge(image)
    floating = hl.Func("floating")
    floating[x, y, c] = clamped[x, y, c] / 65535.0
    gray = hl.Func("gray")
    gray[x, y] = sum(hl.f32(w) * floating[x, y, i] for i, w in enumerate(GRAY_WEIGHTS))

    g_pyramid = [hl.Func(f"gPyramid{j}") for j in range(J)]
    level = k * (1.0 / (levels - 1))
    idx = hl.clamp(hl.i32(gray[x, y] * hl.f32(levels - 1) * 256.0), 0, (levels - 1) * 256)
    g_pyramid[0][x, y, k] = beta * (gray[x, y] - level) + level + remap[idx - 256 * k]
    for j in range(1, J):
        g_pyramid[j][x, y, k] = _downsample(hl, g_pyramid[j - 1], x, y, [k])[x, y, k]
    l_pyramid = [hl.Func(f"lPyramid{j}") for j in range(J)]
    l_pyramid[J - 1][x, y, k] = g_pyramid[J - 1][x, y, k]
    for j in range(J - 2, -1, -1):
        l_pyramid[j][x, y, k] = (g_pyramid[j][x, y, k]
                                 - _upsample(hl, g_pyramid[j + 1], x, y, [k])[x, y, k])
    in_g_pyramid = [hl.Func(f"inGPyramid{j}") for j in range(J)]
    in_g_pyramid[0][x, y] = gray[x, y]
    for j in range(1, J):
        in_g_pyramid[j][x, y] = _downsample(hl, in_g_pyramid[j - 1], x, y, [])[x, y]
    out_l_pyramid = [hl.Func(f"outLPyramid{j}") for j in range(J)]
    for j in range(J):
        value = in_g_pyramid[j][x, y] * hl.f32(levels - 1)
        li = hl.clamp(hl.i32(value), 0, levels - 2)
        lf = value - hl.f32(li)
        out_l_pyramid[j][x, y] = ((1.0 - lf) * l_pyramid[j][x, y, li]
                                  + lf * l_pyramid[j][x, y, li + 1])
    out_g_pyramid = [hl.Func(f"outGPyramid{j}") for j in range(J)]
    out_g_pyramid[J - 1][x, y] = out_l_pyramid[J - 1][x, y]
    for j in range(J - 2, -1, -1):
        out_g_pyramid[j][x, y] = (_upsample(hl, out_g_pyramid[j + 1], x, y, [])[x, y]
                                  + out_l_pyramid[j][x, y])
    color = hl.Func("color")
    eps = hl.f32(COLOR_EPS)
    color[x, y, c] = out_g_pyramid[0][x, y] * (floating[x, y, c] + eps) / (gray[x, y] + eps)
    output = hl.Func("output")
    output[x, y, c] = hl.u16(hl.clamp(color[x, y, c], 0.0, 1.0) * 65535.0)
    output.bound(x, 0, width).bound(y, 0, height).bound(c, 0, channels)

    def manual(gpu: bool) -> None:  # the app's GPU schedule (on the CPU: the same roots)
        xi, yi = hl.Var("xi"), hl.Var("yi")
        remap.compute_root()
        output.compute_root()
        tiles = [(output, 16, 8)]
        for j in range(J):
            block_w, block_h = (2, 2) if j > 3 else (16, 8)
            if j > 0:
                in_g_pyramid[j].compute_root()
                g_pyramid[j].compute_root().reorder(k, x, y)
                tiles += [(in_g_pyramid[j], block_w, block_h), (g_pyramid[j], block_w, block_h)]
            out_g_pyramid[j].compute_root()
            tiles.append((out_g_pyramid[j], block_w, block_h))
        for func, block_w, block_h in tiles if gpu else ():
            func.gpu_tile(x, y, xi, yi, block_w, block_h)

    def estimates() -> None:
        image.set_estimates([(0, width), (0, height), (0, channels)])
        levels.set_estimate(INTENSITY_LEVELS)
        alpha.set_estimate(float(scalars["alpha"]))
        beta.set_estimate(float(scalars["beta"]))
        output.set_estimates([(0, width), (0, height), (0, channels)])

    return _Definition(output, hl.UInt(16), (channels, height, width), ("image",),
                       {"image": image}, manual, estimates)


def _blend(hl: Any, arrays: Mapping[str, np.ndarray], scalars: Mapping[str, float]
           ) -> _Definition:
    """Laplacian pyramid blending as :mod:`kfuse.apps.pyramids` defines it: every level read
    through clamp-to-edge at its own extent (ceil halves)."""
    from kfuse.apps.pyramids import BLEND_LEVELS

    x, y = hl.Var("x"), hl.Var("y")
    height, width = arrays["a"].shape
    images = {name: hl.ImageParam(hl.Float(32), 2, name) for name in ("a", "b", "mask")}
    extents = [(width, height)]
    for _ in range(BLEND_LEVELS - 1):
        extents.append((-(-extents[-1][0] // 2), -(-extents[-1][1] // 2)))
    stored: list[Any] = []  # every level that is compute_root under the manual schedule

    def clamp(f: Any, level: int) -> Any:
        w, h = extents[level]
        return hl.BoundaryConditions.repeat_edge(f, [(0, w), (0, h)])

    def gaussian(name: str) -> list[Any]:
        levels = [clamp(images[name], 0)]
        for level in range(1, BLEND_LEVELS):
            down = _downsample(hl, levels[-1], x, y, [])
            stored.append(down)
            levels.append(clamp(down, level))
        return levels

    def laplacian(name: str) -> list[Any]:
        g = gaussian(name)
        result = []
        for level in range(BLEND_LEVELS - 1):
            lap = hl.Func(f"{name}_lap{level}")
            lap[x, y] = g[level][x, y] - _upsample(hl, g[level + 1], x, y, [])[x, y]
            result.append(lap)
        return result + [g[-1]]

    la, lb, gm = laplacian("a"), laplacian("b"), gaussian("mask")
    mixed = []
    for level in range(BLEND_LEVELS):
        mix = hl.Func(f"mixed{level}")
        mix[x, y] = gm[level][x, y] * (la[level][x, y] - lb[level][x, y]) + lb[level][x, y]
        mixed.append(mix)
    image = mixed[-1]
    for level in range(BLEND_LEVELS - 2, -1, -1):
        collapsed = hl.Func(f"collapsed{level}")
        collapsed[x, y] = (mixed[level][x, y]
                           + _upsample(hl, clamp(image, level + 1), x, y, [])[x, y])
        stored.append(collapsed)
        image = collapsed
    output = hl.Func("blended")
    output[x, y] = image[x, y]
    output.bound(x, 0, width).bound(y, 0, height)

    def manual(gpu: bool) -> None:  # every level root, tiled as the local Laplacian app tiles
        xi, yi = hl.Var("xi"), hl.Var("yi")
        for func in (output, *stored):
            func.compute_root()
            if gpu:
                func.gpu_tile(x, y, xi, yi, 16, 8)

    def estimates() -> None:
        for param in images.values():
            param.set_estimates([(0, width), (0, height)])
        output.set_estimates([(0, width), (0, height)])

    return _Definition(output, hl.Float(32), (height, width), ("a", "b", "mask"),
                       images, manual, estimates)


_BUILDERS: dict[str, Callable[..., _Definition]] = {
    "local_laplacian": _local_laplacian, "blend": _blend}
# Halide's local Laplacian extends every level beyond its edges (kfuse clamps each level):
# differences reach about three coarsest-level points (2^(J-1) fine points each) inward
_MARGINS = {"local_laplacian": 3 * 2 ** 7}
