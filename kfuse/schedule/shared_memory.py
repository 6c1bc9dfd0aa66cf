"""Elements of a kernel's one shared-memory array (Filipovič et al. 2015, §3.4: offsets by
lifetime), as the map-reduce forms lay them out and barrier placement reads them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SharedElement:
    """An on-chip element in the kernel's one shared array: its byte range."""

    name: str
    offset: int
    size: int

    def overlaps(self, other: SharedElement) -> bool:
        return self.offset < other.offset + other.size and other.offset < self.offset + self.size
