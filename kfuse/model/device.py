"""Device profiles: what a GPU offers and what it measurably delivers.

A profile is measured once per GPU by ``kfuse calibrate`` (:func:`kfuse.tune.calibrate`)
and stored as JSON in ``$KFUSE_CACHE_DIR/devices/`` (default ``~/.cache/kfuse/devices/``),
one file per device name plus ``latest.json``. Cost models read it; on a GPU nobody
calibrated they use its profile estimated from its properties (multiprocessors, L2, copy
bandwidth from the DRAM peak), and with no GPU :func:`default_profile` (nominal H100 SXM
figures). The nominal profile on an H200 planned SGEMV's rows 0.9% slower than
torch.compile, where the H200's own figures plan them 0.1% faster (session 16).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kfuse.cache import cache_dir, writable_cache_dir, write_atomically
from kfuse.errors import CacheError
from kfuse.log import LOG

LATEST = "latest.json"


def devices_dir() -> Path:
    """The folder that holds the stored profiles (not created here)."""
    return cache_dir("devices")


def profile_filename(name: str) -> str:
    """A safe file name for a device name (``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-...``)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"{slug or 'device'}.json"


@dataclass(frozen=True)
class DeviceProfile:
    """Properties and measured figures of one GPU.

    ``copy_bandwidth_bytes_per_s`` counts bytes read plus bytes written per second of a
    device-to-device copy; ``launch_overhead_s`` is the median time of one empty kernel
    launch. ``measured_at`` is the ISO date of the measurement, ``None`` for nominal figures.
    ``map_block_threads`` is the block of threads with which an elementwise kernel streamed
    fastest here (``kfuse calibrate`` times a few; None where nothing was timed): the model
    predicts every block equal, and which is fastest differs between devices.
    ``row_block_forms``: ``(matrices a row reads, threads, access bytes, accesses per row,
    thread and step)`` of the block-row GEMV form that streamed fastest here, one per number
    of matrices measured (``kfuse calibrate``; the model predicts them alike).
    """

    name: str
    compute_capability: str
    sm_count: int
    shared_memory_per_block: int
    shared_memory_per_sm: int
    registers_per_sm: int
    max_threads_per_sm: int
    l2_bytes: int
    copy_bandwidth_bytes_per_s: float
    launch_overhead_s: float
    measured_at: str | None = None
    shared_memory_per_block_optin: int | None = None
    peak_bandwidth_bytes_per_s: float | None = None
    global_memory_bytes: int | None = None
    map_block_threads: int | None = None
    row_block_forms: tuple[tuple[int, int, int, int], ...] | None = None
    notes: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def measured(self) -> bool:
        return self.measured_at is not None

    @property
    def arch(self) -> str:
        """NVRTC architecture name, e.g. ``sm_90``."""
        return "sm_" + self.compute_capability.replace(".", "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceProfile:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["compute_capability"] = str(values.get("compute_capability", "?"))
        if values.get("row_block_forms") is not None:  # (JSON keeps them as lists)
            values["row_block_forms"] = tuple(tuple(form) for form in values["row_block_forms"])
        return cls(**values)

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the profile as JSON; without ``path``, into the devices folder (+ latest)."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            return target
        folder = writable_cache_dir("devices")
        target = folder / profile_filename(self.name)
        for destination in (target, folder / LATEST):
            write_atomically(destination, text)
        return target

    @classmethod
    def load(cls, name: str | os.PathLike | None = None) -> DeviceProfile:
        """Read a stored profile: by device name, by path, or (``None``) the latest one.

        Raises :class:`FileNotFoundError` when there is none.
        """
        if name is None:
            path = devices_dir() / LATEST
        elif str(name).endswith(".json") or os.sep in str(name):
            path = Path(name)
        else:
            path = devices_dir() / profile_filename(str(name))
        if not path.exists():
            raise FileNotFoundError(f"no device profile at {path}; run 'kfuse calibrate'")
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            profile = cls.from_dict(data)
            problem = profile.implausible()
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as error:
            problem = f"{type(error).__name__}: {error}"
        if problem:
            raise CacheError(f"{path} is not a usable device profile ({problem}); run 'kfuse "
                             "calibrate' to measure the GPU again, or delete the file")
        return profile

    def implausible(self) -> str | None:
        """What makes these figures unusable for a model (None: they are usable): counts
        that must be positive, rates that must be positive and finite."""
        for name in ("sm_count", "shared_memory_per_block", "shared_memory_per_sm",
                     "registers_per_sm", "max_threads_per_sm", "l2_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                return f"{name} is {value!r}, not a positive integer"
        for name in ("copy_bandwidth_bytes_per_s", "launch_overhead_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value < 0 or (
                        value == 0 and name == "copy_bandwidth_bytes_per_s"):
                return f"{name} is {value!r}"
        return None

    def summary(self) -> str:
        """One line: name, SMs, L2, copy bandwidth, launch overhead, when measured."""
        when = self.measured_at or "nominal, not measured"
        return (f"{self.name} (cc {self.compute_capability}, {self.sm_count} SMs, "
                f"L2 {self.l2_bytes / 2**20:.0f} MiB): copy {self.copy_bandwidth_bytes_per_s / 1e9:.0f}"
                f" GB/s, launch {self.launch_overhead_s * 1e6:.1f} us [{when}]")

    def __str__(self) -> str:
        return self.summary()


def default_profile() -> DeviceProfile:
    """Nominal H100 SXM5 80 GB figures, used when no GPU was calibrated (``measured_at=None``).

    Copy bandwidth is a typical measured device-to-device copy (read + write), below the
    3.35 TB/s HBM3 peak; launch overhead a typical CuPy launch from Python.
    """
    return DeviceProfile(
        name="NVIDIA H100 80GB HBM3 (nominal)",
        compute_capability="9.0",
        sm_count=132,
        shared_memory_per_block=48 * 1024,
        shared_memory_per_sm=228 * 1024,
        registers_per_sm=65536,
        max_threads_per_sm=2048,
        l2_bytes=50 * 2**20,
        copy_bandwidth_bytes_per_s=2.9e12,
        launch_overhead_s=4.0e-6,
        measured_at=None,
        shared_memory_per_block_optin=227 * 1024,
        peak_bandwidth_bytes_per_s=3.35e12,
        global_memory_bytes=80 * 2**30,
        notes={"source": "nominal H100 SXM5 figures; run 'kfuse calibrate' to measure"},
    )


def h200_like_profile() -> DeviceProfile:
    """The nominal profile with an H200's memory as measured here (copy 4275 GB/s, HBM3e
    peak 4.8 TB/s, 60 MiB L2): for planning and tests at the sizes benchmarked on an H200
    when no H200 is at hand."""
    return replace(default_profile(), name="NVIDIA H200 (like: copy as measured)",
                   copy_bandwidth_bytes_per_s=4.275e12, peak_bandwidth_bytes_per_s=4.8e12,
                   l2_bytes=60 * 2**20, global_memory_bytes=141 * 2**30,
                   notes={"source": "nominal H100 figures with an H200's measured memory"})


def current_profile(name: str | None = None) -> DeviceProfile:
    """The profile to plan with: the stored one for ``name``; without a name, the visible
    GPU's stored profile, or where it was never calibrated its profile estimated from its
    properties (:func:`kfuse.tune.calibrate.visible_gpu_profile`); with no GPU, the latest
    stored profile; else :func:`default_profile`."""
    estimated = _visible_gpu_profile() if name is None else None
    if estimated is not None:
        try:
            return DeviceProfile.load(estimated.name)
        except FileNotFoundError:
            return estimated
        except CacheError as error:
            LOG.warning("%s; planning with the figures estimated from the GPU's properties",
                        error.detail)
            return estimated
    try:
        return DeviceProfile.load(name)
    except FileNotFoundError as error:
        if name is not None:
            raise CacheError(str(error)) from None
    except CacheError as error:
        if name is not None:
            raise
        LOG.warning("%s; planning with a nominal H100's figures", error.detail)
        return default_profile()
    if not _SAID_NOMINAL:
        _SAID_NOMINAL.append(True)
        LOG.info("no GPU is visible and none was calibrated: planning with a nominal H100's "
                 "figures (kfuse calibrate on a GPU stores its own)")
    return default_profile()


_SAID_NOMINAL: list[bool] = []  # (said once a process)


# Where the visible GPU's profile comes from: set by kfuse.tune, which measures the device
# (planning reads profiles; it never asks a GPU itself). None: no GPU is consulted.
_VISIBLE_GPU_SOURCE: list[Callable[[], DeviceProfile | None]] = []


def use_visible_gpu(source: Callable[[], DeviceProfile | None]) -> None:
    """Plan for the GPU that ``source()`` describes (its estimated profile, or None where no
    GPU is visible) when no profile is named: :func:`current_profile`."""
    _VISIBLE_GPU_SOURCE[:] = [source]


def _visible_gpu_profile() -> DeviceProfile | None:
    return _VISIBLE_GPU_SOURCE[0]() if _VISIBLE_GPU_SOURCE else None
