"""Halo slices between the GPUs of one host, device to device (CUDA IPC), for Dask workers.

Dask's ``distributed`` moves a CuPy array between worker processes through the host: copied
to host memory, sent over TCP, copied back (dask-cuda's UCX transport goes device to device,
but needs UCX). A stencil pipeline's halo crosses workers at every call: a 1024² face of a
1024³ volume, 4 planes deep, is 16 MB each way. Where every worker runs on one host and
sees every worker's GPU (as dask-cuda's ``LocalCUDACluster`` arranges: each worker's
``CUDA_VISIBLE_DEVICES`` lists its own GPU first, then the others), a halo slice is instead
copied into an allocation of its own and only that allocation's CUDA IPC handle travels;
the receiving worker opens it (once: the allocations are reused and stay open), copies the
halo to its own GPU over NVLink or PCIe and waits for the copy. The slice stays alive on its
worker until every task that reads it is done (Dask keeps a task's result until its
dependents finish), so its allocation is reused only once every reader has its copy.

:func:`links_of` asks the workers once per cluster whether this holds; otherwise halos
travel as Dask moves any array, as they do everywhere with ``KFUSE_DEVICE_HALOS=0``.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterable
from typing import Any

# cudaMemcpyDefault: the direction from the pointers (unified addressing)
_COPY_DEFAULT = 4
# cudaIpcMemLazyEnablePeerAccess
_LAZY_PEER_ACCESS = 1

_LINKS: dict[tuple[int, tuple[str, ...]], bool] = {}

# On the sending worker: allocations whose halo every reader has copied, by size, for the
# next halos (each new allocation costs a cudaMalloc there and a cudaIpcOpenMemHandle, of
# the order of a millisecond, on every worker that reads it).
_FREE: dict[int, list[tuple[Any, int]]] = {}
_SERIALS = itertools.count()
_PROCESS = uuid.uuid4().hex  # (a process id that is never reused)
# On a reading worker: the other workers' allocations opened so far, by (process, serial),
# kept open (the sender reuses its allocations: each is opened once per reader).
_OPENED: dict[tuple[str, int], int] = {}


class DeviceHalo:
    """A halo slice of a CuPy chunk in an allocation of its own, sent to another worker as
    its CUDA IPC handle (:meth:`__reduce__`); :func:`opened` there makes the local copy.
    Once Dask releases it (every task reading it done, so every copy of it made), its
    allocation goes back to this worker's free list for a later halo of the same size."""

    def __init__(self, values: Any):
        import cupy
        nbytes = max(values.nbytes, 1)
        free = _FREE.get(nbytes)
        # (its own cudaMalloc: a base address, as IPC needs)
        self.memory, self.serial = free.pop() if free else (cupy.cuda.Memory(nbytes),
                                                            next(_SERIALS))
        self.array = cupy.ndarray(values.shape, values.dtype,
                                  cupy.cuda.MemoryPointer(self.memory, 0))
        self.array[...] = values

    def __del__(self) -> None:
        if hasattr(self, "serial"):  # (not where the allocation itself failed)
            _FREE.setdefault(self.memory.size, []).append((self.memory, self.serial))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        import cupy
        cupy.cuda.get_current_stream().synchronize()  # the copy done before it is read
        handle = cupy.cuda.runtime.ipcGetMemHandle(self.memory.ptr)
        return opened, (handle, (_PROCESS, self.serial), self.array.nbytes,
                        self.array.shape, self.array.dtype.str)


def opened(handle: bytes, allocation: tuple[str, int], nbytes: int, shape: tuple[int, ...],
           dtype: str) -> Any:
    """The halo a :class:`DeviceHalo` sent, copied to this worker's GPU (the sender's
    allocation opened at its first halo and kept open)."""
    import cupy
    source = _OPENED.get(allocation)
    if source is None:
        source = _OPENED[allocation] = cupy.cuda.runtime.ipcOpenMemHandle(
            handle, _LAZY_PEER_ACCESS)
    local = cupy.empty(shape, dtype=dtype)
    stream = cupy.cuda.get_current_stream()
    cupy.cuda.runtime.memcpyAsync(local.data.ptr, source, nbytes, _COPY_DEFAULT, stream.ptr)
    stream.synchronize()  # copied before the sender may reuse its allocation
    return local


def plain(piece: Any) -> Any:
    """The array a piece holds (a :class:`DeviceHalo` read on its own worker: a copy, as
    its allocation is reused once it is released)."""
    return piece.array.copy() if isinstance(piece, DeviceHalo) else piece


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
