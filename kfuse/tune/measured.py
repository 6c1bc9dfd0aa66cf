"""The ``measured`` model: compile a candidate group and time it on the GPU.

A :class:`GroupTimer` binds one pipeline at one size to random inputs on the device, runs
the unfused program once (so every intermediate holds data), and then times any group
of operators alone: the group is generated as its own kernel, launched on the same
buffers, and timed with CUDA events (:func:`kfuse.tune.timing.time_gpu`). Times are
cached per group. Without a usable GPU every entry point raises
:class:`~kfuse.errors.BackendUnavailable` saying that measuring needs the ``cuda`` backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kfuse.errors import BackendUnavailable, KfuseError
from kfuse.model.device import DeviceProfile


def cuda_backend() -> Any:
    """The cuda backend, or BackendUnavailable explaining that measuring needs it."""
    from kfuse.runtime import get_backend
    try:
        return get_backend("cuda")
    except BackendUnavailable as error:
        raise BackendUnavailable(f"measuring needs the cuda backend: {error}") from None


def random_inputs(graph, sizes: Mapping[str, int], seed: int = 0) -> dict[str, Any]:
    """Positive random arrays for every pipeline input and 0.5 for every parameter."""
    rng = np.random.default_rng(seed)
    given: dict[str, Any] = {}
    for name in graph.inputs:
        buffer = graph.buffers[name]
        shape = graph.shape_of(name, sizes)
        dtype = buffer.dtype if buffer.dtype != "bool" else "bool"
        given[name] = rng.uniform(0.1, 1.1, size=shape).astype(dtype)
    for name, dtype in graph.params.items():
        given[name] = np.dtype(dtype if dtype != "bool" else np.bool_).type(0.5)
    return given


class GroupTimer:
    """Times groups of one pipeline at one size on the GPU (results cached per group).

    ``backend="cpu"`` runs the same generated code through the host shim with wall-clock
    timing: meaningless as a time, but it exercises the machinery without a GPU.
    """

    def __init__(self, graph, sizes: Mapping[str, int] | None = None,
                 given: Mapping[str, Any] | None = None, *, warmup: int = 3,
                 repeat: int = 20, seed: int = 0, backend: str = "cuda"):
        if backend == "cuda":
            self.backend = cuda_backend()
        else:
            from kfuse.runtime import get_backend
            self.backend = get_backend(backend)
        self.graph = graph
        if given is None:
            if sizes is None:
                raise KfuseError("GroupTimer needs sizes or input arrays")
            given = random_inputs(graph, sizes, seed)
        self.base = self.backend.prepare(graph, dict(given))
        self.base.launch_all()
        self.warmup = warmup
        self.repeat = repeat
        self._times: dict[tuple[str, ...], float] = {}

    def time(self, members: Sequence[str]) -> float:
        """Median seconds of the kernel that computes ``members`` (plan order) alone."""
        from kfuse.codegen import generate
        from kfuse.schedule.forms import default_form, group_outputs
        from kfuse.tune.timing import time_gpu, time_host

        key = tuple(members)
        if key not in self._times:
            graph = self.graph
            outputs = group_outputs(graph, key) if len(key) > 1 else \
                (graph.kernel_by_name[key[0]].output,)
            program = generate(graph, [(key, outputs, default_form(graph, key))],
                               wide_index=self.base.bound.wide_index(graph),
                               fixed_sizes=self.backend.fixed_sizes(self.base.bound),
                               array_alignment=self.base.array_alignment())
            executable = self.backend.prepare(graph, {}, program=program,
                                              buffers_of=self.base)  # the same buffers
            (spec,) = program.launches
            timer = time_gpu if self.backend.name == "cuda" else time_host
            timing = timer(lambda: executable.launch_one(spec), warmup=self.warmup,
                           repeat=self.repeat)
            self._times[key] = timing.median_s
        return self._times[key]

    def unfused(self, members: Sequence[str]) -> float:
        """Summed median seconds of the members as separate kernels."""
        return sum(self.time((m,)) for m in members)


_TIMERS: dict[tuple[int, tuple[tuple[str, int], ...]], GroupTimer] = {}


def timer_for(graph, sizes: Mapping[str, int]) -> GroupTimer:
    """A cached :class:`GroupTimer` for this graph object and these sizes."""
    key = (id(graph), tuple(sorted(sizes.items())))
    if key not in _TIMERS:
        _TIMERS[key] = GroupTimer(graph, sizes)
    return _TIMERS[key]


def graph_group_time(graph, members: Sequence[str], outputs: Sequence[str],
                     sizes: Mapping[str, int], profile: DeviceProfile) -> float:
    """``measured`` for IR graphs (the GRAPH_MODELS signature): the group timed on the GPU."""
    del outputs, profile  # the generated kernel decides what it writes; the GPU is the device
    return timer_for(graph, sizes).time(members)


__all__ = ["GroupTimer", "cuda_backend", "graph_group_time", "random_inputs", "timer_for"]


# ---------------------------------------------------------------------------------------------
# Model check: predicted against measured, per fused group
# ---------------------------------------------------------------------------------------------

CHECK_MODELS = ("roofline", "wahib", "wahib-norm", "qiao")


def predict_all(graph, members: Sequence[str], sizes: Mapping[str, int],
                profile: DeviceProfile) -> dict[str, dict[str, Any]]:
    """Per model: the group's predicted seconds, its members' unfused sum, and the speedup.

    A model that cannot run the group (wahib's constraints 1.6/1.7) gives ``None`` and the
    reason under ``note``.
    """
    from kfuse.errors import FusionError
    from kfuse.fusion.plan import group_outputs
    from kfuse.search.problem import GRAPH_MODELS

    outputs = group_outputs(graph, members)
    result: dict[str, dict[str, Any]] = {}
    for model in CHECK_MODELS:
        predict = GRAPH_MODELS[model]
        unfused = sum(predict(graph, (m,), (graph.kernel_by_name[m].output,), sizes, profile)
                      for m in members)
        try:
            fused: float | None = float(predict(graph, tuple(members), outputs, sizes, profile))
            note = None
        except FusionError as error:
            fused, note = None, str(error)
        result[model] = {"fused_s": fused, "unfused_s": unfused,
                         "speedup": unfused / fused if fused else None, "note": note}
    return result


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None with fewer than 3 pairs."""
    if len(a) != len(b) or len(a) < 3:
        return None

    def ranks(values: Sequence[float]) -> np.ndarray:
        order = np.argsort(values, kind="mergesort")
        result = np.empty(len(values))
        sorted_values = np.asarray(values)[order]
        start = 0
        while start < len(values):
            end = start
            while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
                end += 1
            result[order[start:end + 1]] = (start + end) / 2.0
            start = end + 1
        return result

    ra, rb = ranks(a), ranks(b)
    if np.std(ra) == 0 or np.std(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model over measured rows: median |pred - meas| / meas of the fused time, and the
    Spearman correlation between predicted and measured fusion speedups."""
    summary: dict[str, dict[str, Any]] = {}
    measured_rows = [r for r in rows if r.get("measured")]
    for model in CHECK_MODELS:
        errors, predicted, observed = [], [], []
        for row in measured_rows:
            entry = row["predicted"][model]
            if entry["fused_s"] is None:
                continue
            meas = row["measured"]
            errors.append(abs(entry["fused_s"] - meas["fused_s"]) / meas["fused_s"])
            predicted.append(entry["speedup"])
            observed.append(meas["speedup"])
        summary[model] = {"groups": len(errors),
                          "median_rel_error": float(np.median(errors)) if errors else None,
                          "spearman_speedup": spearman(predicted, observed)}
    return summary


def check_groups(graph, groups: Sequence[Sequence[str]], sizes: Mapping[str, int],
                 profile: DeviceProfile, timer: GroupTimer | None = None
                 ) -> list[dict[str, Any]]:
    """One row per group: its predictions under every model and, with a timer, the measured
    fused time, the measured sum of its members alone and the measured speedup."""
    rows = []
    for members in groups:
        row: dict[str, Any] = {"group": list(members),
                               "predicted": predict_all(graph, members, sizes, profile),
                               "measured": None}
        if timer is not None:
            fused = timer.time(members)
            unfused = timer.unfused(members)
            row["measured"] = {"fused_s": fused, "unfused_s": unfused,
                               "speedup": unfused / fused}
        rows.append(row)
    return rows


__all__ += ["CHECK_MODELS", "check_groups", "predict_all", "spearman", "summarize"]


def register() -> None:
    """Make ``measured`` plannable for IR graphs (one of ``GRAPH_MODELS``)."""
    from kfuse.search.problem import GRAPH_MODELS
    GRAPH_MODELS.setdefault("measured", graph_group_time)


__all__ += ["register"]
