"""Halo slices between the GPUs of one host, device to device (CUDA IPC), for Dask workers.

Dask's ``distributed`` moves a CuPy array between worker processes through the host: copied
to host memory, sent over TCP, copied back (dask-cuda's UCX transport goes device to device,
but needs UCX). A stencil pipeline's halo crosses workers at every call: a 1024² face of a
1024³ volume, 4 planes deep, is 16 MB each way. Where every worker runs on one host and
sees every worker's GPU (as dask-cuda's ``LocalCUDACluster`` arranges: each worker's
``CUDA_VISIBLE_DEVICES`` lists its own GPU first, then the others), a halo slice is instead
copied into an allocation of its own and only that allocation's CUDA IPC handle travels;
the receiving worker opens it, copies the halo to its own GPU over NVLink or PCIe, and
closes it. The slice stays alive on its worker until every task that reads it is done
(Dask keeps a task's result until its dependents finish), so the handle never outlives it.

:func:`links_of` asks the workers once per cluster whether this holds; otherwise halos
travel as Dask moves any array, as they do everywhere with ``KFUSE_DEVICE_HALOS=0``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

# cudaMemcpyDefault: the direction from the pointers (unified addressing)
_COPY_DEFAULT = 4
# cudaIpcMemLazyEnablePeerAccess
_LAZY_PEER_ACCESS = 1

_LINKS: dict[tuple[int, tuple[str, ...]], bool] = {}


class DeviceHalo:
    """A halo slice of a CuPy chunk in an allocation of its own, sent to another worker as
    its CUDA IPC handle (:meth:`__reduce__`); :func:`opened` there makes the local copy."""

    def __init__(self, values: Any):
        import cupy
        self.memory = cupy.cuda.Memory(max(values.nbytes, 1))  # its own cudaMalloc: a base
        self.array = cupy.ndarray(values.shape, values.dtype,
                                  cupy.cuda.MemoryPointer(self.memory, 0))
        self.array[...] = values

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        import cupy
        cupy.cuda.get_current_stream().synchronize()  # the copy done before it is read
        handle = cupy.cuda.runtime.ipcGetMemHandle(self.memory.ptr)
        return opened, (handle, self.array.nbytes, self.array.shape, self.array.dtype.str)


def opened(handle: bytes, nbytes: int, shape: tuple[int, ...], dtype: str) -> Any:
    """The halo a :class:`DeviceHalo` sent, copied to this worker's GPU (the handle is
    opened, read once and closed)."""
    import cupy
    runtime = cupy.cuda.runtime
    local = cupy.empty(shape, dtype=dtype)
    source = runtime.ipcOpenMemHandle(handle, _LAZY_PEER_ACCESS)
    try:
        runtime.memcpy(local.data.ptr, source, nbytes, _COPY_DEFAULT)
        runtime.deviceSynchronize()  # read before the mapping closes
    finally:
        runtime.ipcCloseMemHandle(source)
    return local


def plain(piece: Any) -> Any:
    """The array a piece holds (a :class:`DeviceHalo` read on its own worker)."""
    return piece.array if isinstance(piece, DeviceHalo) else piece


def _worker_devices() -> tuple[str, str, tuple[str, ...]]:
    """(host name, this worker's GPU, every GPU it sees), GPUs by PCI bus id."""
    import socket

    import cupy
    runtime = cupy.cuda.runtime
    seen = tuple(runtime.deviceGetPCIBusId(index) for index in range(runtime.getDeviceCount()))
    return socket.gethostname(), seen[cupy.cuda.Device().id], seen


def links_of(client: Any, workers: Iterable[str]) -> bool:
    """Whether halos between ``workers`` of ``client`` go device to device: all on one host,
    with CuPy, each seeing the GPU of every other (asked once per set of workers)."""
    if os.environ.get("KFUSE_DEVICE_HALOS", "1") == "0":
        return False
    key = (id(client), tuple(sorted(set(workers))))
    if key not in _LINKS:
        try:
            found = client.run(_worker_devices, workers=list(key[1]))
        except Exception:  # no CuPy or no GPU on a worker: halos travel as Dask moves them
            found = None
        _LINKS[key] = bool(found) and len({host for host, _, _ in found.values()}) == 1 and all(
            own in seen for _, own, _ in found.values() for _, _, seen in found.values())
    return _LINKS[key]
