"""The DRAM floor: read every external input once, write every output once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile


def buffer_bytes(graph: Graph, name: str, sizes: Mapping[str, int]) -> int:
    """Bytes of one buffer at the given size-symbol bindings (:meth:`Graph.nbytes`)."""
    return int(graph.nbytes(name, sizes))


def dram_floor_bytes(graph: Graph, sizes: Mapping[str, int]) -> int:
    """Bytes a perfect implementation must move: each input read once, each output written once.

    ``sizes`` binds the size symbols (``graph.bind_shapes(shapes)`` or ``Bound.sizes``).
    An output that is itself an input costs nothing extra.
    """
    read = sum(buffer_bytes(graph, name, sizes) for name in graph.inputs)
    written = sum(buffer_bytes(graph, name, sizes) for name in dict.fromkeys(graph.outputs)
                  if name not in graph.inputs)
    return read + written


def traffic_bytes(graph: Graph, reads: Iterable[str], writes: Iterable[str],
                  sizes: Mapping[str, int]) -> int:
    """Bytes of one kernel that reads each of ``reads`` once and writes each of ``writes`` once."""
    return (sum(buffer_bytes(graph, name, sizes) for name in dict.fromkeys(reads))
            + sum(buffer_bytes(graph, name, sizes) for name in dict.fromkeys(writes)))


def launch_bytes(graph: Graph, spec, sizes: Mapping[str, int]) -> int:
    """DRAM bytes of one generated kernel (a ``LaunchSpec``): its reads once + its writes once."""
    reads = [p.ref for p in spec.params if p.role == "input"]
    writes = [p.ref for p in spec.params if p.role == "output"]
    return traffic_bytes(graph, reads, writes, sizes)


def floor_seconds(nbytes: int | float, profile: DeviceProfile) -> float:
    """Time to move ``nbytes`` at the profile's measured copy bandwidth."""
    return float(nbytes) / profile.copy_bandwidth_bytes_per_s
