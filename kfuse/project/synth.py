"""Synthetic applications after Wahib & Maruyama 2014's CloverLeaf test suite (Table V).

The six attributes of Table V are the generator's parameters: number of kernels, number
of arrays, number of host<->device data copies, sharing-set size, average thread load
and kinship. The papers give the attributes but not the construction; kfuse's reading
(``notes/wahib-fusion-search.md`` §6.17):

- kernels are split, in call order, into ``kinship + 1`` bands; each array belongs to a
  pair of adjacent bands (round robin) and its sharing set, of about ``sharing``
  kernels, is drawn from that window. Sharing edges therefore only join kernels of the
  same or adjacent bands, so the first and the last band are ``kinship`` sharing steps
  apart; extra reads of read-only arrays then connect the sharing graph and shorten
  longer chains until the largest degree of kinship (the sharing graph's diameter)
  equals ``kinship`` (the value reached is recorded in ``synth.achieved``);
- the first kernel of a sharing set writes the array with probability 0.3, the others
  read it; a kernel left writing nothing writes one of its arrays (read-write in place
  when others touched it first, which makes the array expandable);
- reads get CloverLeaf-like stencils, thread load 1 (point), 5 (5-point, r=1), 9 (r=2
  star) or 13 (r=3 star), mixed so that the mean over all reads equals ``thread_load``;
- each data copy is a transfer of a random array between two random consecutive kernels
  that both sides touch (an ordering barrier, note §2.2);
- every array is a 962x962 double-precision field (CloverLeaf's standard size); a launch
  is 64 blocks of 128 threads walking the grid, as in Wahib & Maruyama 2014. No GPU runs here, so the
  "measured" runtime of a kernel is its traffic at 60-85% of the device's bandwidth plus
  launch overhead, and its FLOPs are set so that it measures 1.5-3x its Eq. (10) upper
  bound (the bound is optimistic: Wahib & Maruyama 2014's worked example projects 75% of the roofline,
  and real kernels reach a fraction of it). With a tighter ratio the literal model finds
  no fusion profitable and every instance is trivial.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

import networkx as nx
import numpy as np

from kfuse.errors import KfuseError
from kfuse.model.wahib import project_group
from kfuse.project.metadata import (
    AccessSpec,
    AppMetadata,
    ArraySpec,
    CopySpec,
    KernelSpec,
)

THREAD_LOADS = (1, 5, 9, 13)
RADIUS = {1: 0, 5: 1, 9: 2, 13: 3}
GRID = (962, 962)
THREADS_PER_BLOCK = 128
BLOCKS = 64
WRITE_PROBABILITY = 0.3
MEASURED_OVER_BOUND = (1.5, 3.0)  # a kernel's measured time over its Eq. (10) bound


@dataclass(frozen=True)
class SynthSpec:
    """The Table V attributes of one instance (and the seed that makes it repeatable)."""

    kernels: int = 20
    arrays: int = 40
    copies: int = 2
    sharing: int = 4
    thread_load: float = 8.0
    kinship: int = 3
    seed: int = 0
    device: str = "k20x"

    def check(self) -> None:
        """Reject attribute values the construction cannot honour, saying which and why."""
        if self.kernels < 2:
            raise KfuseError("synth: --kernels must be at least 2")
        if self.arrays < 1:
            raise KfuseError("synth: --arrays must be at least 1")
        if self.sharing < 2:
            raise KfuseError("synth: --sharing (sharing-set size) must be at least 2")
        if self.kinship < 1:
            raise KfuseError("synth: --kinship must be at least 1")
        if self.kinship + 1 > self.kernels:
            raise KfuseError(f"synth: kinship {self.kinship} needs at least "
                             f"{self.kinship + 1} kernels (one band per step)")
        if self.arrays < self.kinship:
            raise KfuseError(f"synth: kinship {self.kinship} needs at least {self.kinship} "
                             "arrays (one per pair of neighbouring bands, or a band's kernels "
                             "would touch none)")
        if self.copies < 0:
            raise KfuseError("synth: --copies must not be negative")
        if not 1 <= self.thread_load <= 13:
            raise KfuseError("synth: --thread-load must be between 1 and 13 "
                             "(CloverLeaf stencils: 1, 5, 9, 13 points)")

    @property
    def name(self) -> str:
        load = f"{self.thread_load:g}"
        return (f"synth-k{self.kernels}-a{self.arrays}-c{self.copies}-s{self.sharing}"
                f"-t{load}-kin{self.kinship}-seed{self.seed}")


def _bands(n: int, count: int) -> list[int]:
    """Band index of each kernel: ``count`` contiguous bands in call order."""
    return [i * count // n for i in range(n)]


def _mix(levels: int, target: float, rng: random.Random) -> list[int]:
    """``levels`` thread loads from THREAD_LOADS whose mean is ``target`` (to rounding)."""
    if levels == 0:
        return []
    lo = max(v for v in THREAD_LOADS if v <= target)
    hi = min((v for v in THREAD_LOADS if v >= target), default=lo)
    if hi == lo:
        return [lo] * levels
    high = round((target - lo) / (hi - lo) * levels)
    loads = [hi] * high + [lo] * (levels - high)
    rng.shuffle(loads)
    return loads


class ReadPieces(NamedTuple):
    """Who may add a read of an array, by the version the read would see (bitmasks)."""

    readers: list[int]  # the kernels that would see one version
    touchers: list[int]  # the kernels touching that version
    anyone: int  # all of the readers
    touched: int  # all of the touchers


class _Draft:
    """The mutable instance under construction: who touches which array, and how."""

    def __init__(self, spec: SynthSpec, rng: random.Random):
        self.spec = spec
        self.rng = rng
        n = spec.kernels
        self.band = _bands(n, spec.kinship + 1)
        self.home = [j % spec.kinship for j in range(spec.arrays)]  # band pair (b, b+1)
        self.members: list[list[int]] = []
        self.mode: dict[tuple[int, int], str] = {}  # (kernel, array) -> read/write/readwrite
        self.touched: list[set[int]] = [set() for _ in range(n)]  # kernel -> its arrays
        self._windows: dict[int, tuple[list[int], frozenset[int]]] = {}
        # array -> _version_masks(array), until the array's members change
        self._toucher_masks: dict[int, tuple[list[int], list[int] | None]] = {}
        self._readable: dict[int, list[int]] = {}  # kernel -> readable(kernel)
        self._pieces: dict[int, ReadPieces] = {}  # array -> read_pieces(array)

    def window(self, array: int) -> list[int]:
        """The kernels of the two bands an array may be shared across, in order."""
        return self._window(array)[0]

    def in_window(self, kernel: int, array: int) -> bool:
        return kernel in self._window(array)[1]

    def _window(self, array: int) -> tuple[list[int], frozenset[int]]:
        b = self.home[array]
        if b not in self._windows:
            kernels = [k for k in range(self.spec.kernels) if self.band[k] in (b, b + 1)]
            self._windows[b] = (kernels, frozenset(kernels))
        return self._windows[b]

    def arrays_of(self, kernel: int) -> list[int]:
        return sorted(self.touched[kernel])

    def set_members(self, array: int, members: list[int]) -> None:
        """Make ``members`` the kernels touching ``array`` (kept sorted, indexed by kernel)."""
        if array < len(self.members):
            for kernel in self.members[array]:
                self.touched[kernel].discard(array)
                self._readable.pop(kernel, None)
            self.members[array] = sorted(members)
        else:
            self.members.append(sorted(members))
        for kernel in members:
            self.touched[kernel].add(array)
            self._readable.pop(kernel, None)
        self._toucher_masks.pop(array, None)
        self._pieces.pop(array, None)

    def readable(self, kernel: int) -> list[int]:
        """The arrays ``kernel`` may add a read of: in its window, not touched yet."""
        if kernel not in self._readable:
            self._readable[kernel] = [a for a in range(self.spec.arrays)
                                      if a not in self.touched[kernel]
                                      and self.in_window(kernel, a)]
        return self._readable[kernel]

    def draw(self) -> None:
        spec, rng = self.spec, self.rng
        for array in range(spec.arrays):
            window = self.window(array)
            size = rng.choice((spec.sharing - 1, spec.sharing, spec.sharing, spec.sharing + 1))
            size = max(2, min(size, len(window)))
            self.set_members(array, rng.sample(window, size))
        for kernel in range(spec.kernels):  # every kernel touches at least two arrays
            while len(self.touched[kernel]) < min(2, spec.arrays):
                options = [a for a in range(spec.arrays)
                           if a not in self.touched[kernel] and self.in_window(kernel, a)]
                if not options:
                    break
                array = rng.choice(options)
                self.set_members(array, self.members[array] + [kernel])
        for array, members in enumerate(self.members):
            for kernel in members:
                self.mode[(kernel, array)] = "read"
            if rng.random() < WRITE_PROBABILITY:
                self.mode[(members[0], array)] = "write"
        for kernel in range(spec.kernels):  # every kernel writes something
            mine = self.arrays_of(kernel)
            if any(self.mode[(kernel, a)] != "read" for a in mine):
                continue
            first = [a for a in mine if self.members[a][0] == kernel]
            if first:
                self.mode[(kernel, rng.choice(first))] = "write"
            else:
                fewest = min(sum(self.mode[(k, a)] != "read" for k in self.members[a])
                             for a in mine)
                choices = [a for a in mine if sum(self.mode[(k, a)] != "read"
                                                  for k in self.members[a]) == fewest]
                self.mode[(kernel, rng.choice(choices))] = "readwrite"

    def writers(self, array: int) -> list[int]:
        return [k for k in self.members[array] if self.mode[(k, array)] != "read"]

    def touchers_mask(self, array: int, kernel: int) -> int | None:
        """The kernels (a bitmask) touching the version of ``array`` that a new read by
        ``kernel`` would see: the writer before ``kernel`` and the readers up to the next.

        ``None`` when adding the read would change how the array is versioned (a
        write-only array with several writers would become expandable and be renamed).
        """
        writers, masks = self._version_masks(array)
        if masks is None:
            return None
        return masks[bisect.bisect_left(writers, kernel) if len(masks) > 1 else 0]

    def _version_masks(self, array: int) -> tuple[list[int], list[int] | None]:
        """(the array's writers, the touchers of each stretch before, between and after
        them: one mask for all where there is at most one writer, None where a read would
        change its versioning); kept until the array's members change."""
        if array not in self._toucher_masks:
            members = self.members[array]
            writers = self.writers(array)
            masks: list[int] | None
            if len(writers) <= 1:
                masks = [_mask(members)]
            elif all(self.mode[(k, array)] == "write" for k in members):
                masks = None
            else:  # (a reader belongs to the stretch after the writers before it)
                masks = [0] * (len(writers) + 1)
                for k in members:
                    if self.mode[(k, array)] != "write":
                        masks[bisect.bisect_left(writers, k)] |= 1 << k
                for index, writer in enumerate(writers):
                    masks[index + 1] |= 1 << writer
            self._toucher_masks[array] = (writers, masks)
        return self._toucher_masks[array]

    def read_pieces(self, array: int) -> ReadPieces:
        """The kernels that may add a read of ``array`` (:meth:`readable`), grouped by the
        kernels that such a read would make their sharing neighbours."""
        if array not in self._pieces:
            writers, masks = self._version_masks(array)
            window = self._window(array)[1]
            eligible = _mask([k for k in window if array not in self.touched[k]])
            if masks is None:
                pieces = []
            elif len(masks) == 1:
                pieces = [(eligible, masks[0])] if eligible and masks[0] else []
            else:  # (a new reader between two writers sees the version of the first)
                bounds = [-1, *writers, len(self.touched) - 1]
                stretches = [eligible & ((1 << high + 1) - 1) & ~((1 << low + 1) - 1)
                             for low, high in zip(bounds, bounds[1:], strict=False)]
                pieces = [(readers, touchers) for readers, touchers
                          in zip(stretches, masks, strict=True) if readers and touchers]
            readers = [r for r, _ in pieces]
            touchers = [t for _, t in pieces]
            self._pieces[array] = ReadPieces(readers, touchers,
                                             functools.reduce(operator.or_, readers, 0),
                                             functools.reduce(operator.or_, touchers, 0))
        return self._pieces[array]

    def add_read(self, kernel: int, array: int) -> None:
        self.set_members(array, self.members[array] + [kernel])
        self.mode[(kernel, array)] = "read"


def _mask(kernels: Sequence[int]) -> int:
    """The bitmask of ``kernels``."""
    mask = 0
    for kernel in kernels:
        mask |= 1 << kernel
    return mask


def _adjacency(graph: nx.Graph) -> tuple[list[str], list[int]]:
    names = sorted(graph.nodes, key=lambda k: int(k[1:]))
    index = {name: i for i, name in enumerate(names)}
    adjacency = [0] * len(names)
    for a, b in graph.edges:
        adjacency[index[a]] |= 1 << index[b]
        adjacency[index[b]] |= 1 << index[a]
    return names, adjacency


def _ball(adjacency: Sequence[int], source: int, radius: int | None = None) -> tuple[int, int]:
    """(kernels within ``radius`` sharing steps of ``source`` as a bitmask, eccentricity)."""
    reached = frontier = 1 << source
    steps = 0
    while frontier and (radius is None or steps < radius):
        new = 0
        bits = frontier
        while bits:
            low = bits & -bits
            new |= adjacency[low.bit_length() - 1]
            bits ^= low
        new &= ~reached
        if not new:
            break
        reached |= new
        frontier = new
        steps += 1
    return reached, steps


def _one_step_further(balls: Sequence[int], adjacency: Sequence[int]) -> list[int]:
    """Each ball grown by one sharing step (a product of 0/1 matrices, exact in float32:
    a million bitset unions a pass in Python took seconds)."""
    count = len(balls)
    if count == 0:
        return []
    width = (count + 7) // 8

    def matrix(masks: Sequence[int]) -> np.ndarray:
        rows = np.frombuffer(b"".join(m.to_bytes(width, "little") for m in masks),
                             dtype=np.uint8).reshape(count, width)
        return np.unpackbits(rows, axis=1, count=count, bitorder="little").astype(np.float32)

    step = matrix(adjacency)
    step[np.diag_indices(count)] = 1.0
    grown = np.packbits(matrix(balls) @ step > 0, axis=1, bitorder="little")
    return [int.from_bytes(row.tobytes(), "little") for row in grown]


def _components(adjacency: Sequence[int]) -> list[list[int]]:
    """The connected components of a bitset graph, each sorted, ordered by first kernel."""
    seen = 0
    components = []
    for source in range(len(adjacency)):
        if seen >> source & 1:
            continue
        reached = _ball(adjacency, source)[0]
        seen |= reached
        components.append([i for i in range(len(adjacency)) if reached >> i & 1])
    return components


def max_kinship(graph: nx.Graph) -> int:
    """The largest degree of kinship: the longest shortest sharing chain in any component."""
    return _largest_kinship(_adjacency(graph)[1])


def _largest_kinship(adjacency: Sequence[int]) -> int:
    """:func:`max_kinship` of a sharing graph as bitsets."""
    return max((_ball(adjacency, i)[1] for i in range(len(adjacency))), default=0)


def _repair(draft: _Draft, build: Any, limit: int = 200,
            progress: Callable[[str], None] | None = None) -> None:
    """Connect the sharing graph, then shorten chains longer than the kinship attribute.

    Each fix adds one read, by a kernel of a band the array's window covers (so the band
    bound stays intact), of the version the kernel would see; the version's kernels
    become its sharing neighbours. Reads that would change versioning are not added.
    Adding reads only shortens chains, so one pass applies a fix per far pair.
    """
    from kfuse.project.problem import sharing_adjacency

    kinship = draft.spec.kinship
    settled = 0  # kernels within kinship of every later one
    for number in range(limit):
        if progress is not None:
            progress(f"repair pass {number + 1}: connecting the sharing graph and shortening "
                     f"chains longer than kinship {kinship}")
        adjacency = sharing_adjacency(build())
        components = _components(adjacency)
        if len(components) > 1:
            if not _join(draft, [{f"k{i}" for i in component} for component in components]):
                return
            continue
        names = [f"k{i}" for i in range(len(adjacency))]
        near = [_ball(adjacency, i, kinship - 1)[0] for i in range(len(names))]
        within = _one_step_further(near, adjacency)  # (the balls of radius kinship)
        fixed = 0
        changed = 0  # kernels whose distances moved this pass: their pairs wait for the next
        for a in range(len(names)):
            if changed >> a & 1 or settled >> a & 1:
                continue
            far = ~within[a] & ((1 << len(names)) - 1)
            far &= ~((2 << a) - 1)  # each pair once (b > a)
            if not far:  # (chains only shorten: a stays settled)
                settled |= 1 << a
                continue
            far &= ~changed
            if not far:
                continue
            # the first far kernel b that can read a version touched near a, or near which
            # lies a kernel of a version a can read (near is symmetric) is fixed
            # (C-speed loops: 10^7 pieces over a run; only arrays a far kernel may read)
            b_reads = 0
            for array in range(draft.spec.arrays):
                readers, touchers, anyone, touched = draft.read_pieces(array)
                if anyone & far and touched & near[a]:
                    b_reads |= functools.reduce(operator.or_, itertools.compress(
                        readers, map(near[a].__and__, touchers)), 0)
            first = far & b_reads
            scan = far & ((first & -first) - 1) if first else far  # (the far b before it)
            a_reads = 0
            for array in range(draft.spec.arrays) if scan else ():
                readers, touchers, anyone, _ = draft.read_pieces(array)
                if anyone >> a & 1:
                    a_reads |= functools.reduce(operator.or_, itertools.compress(
                        touchers, map((1 << a).__and__, readers)), 0)
            b = (first & -first).bit_length() - 1
            while scan:
                low = scan & -scan
                scan ^= low
                if near[low.bit_length() - 1] & a_reads:
                    b = low.bit_length() - 1
                    break
            if b >= 0:
                done = _shorten(draft, a, b, near) if b_reads >> b & 1 else \
                    _shorten(draft, b, a, near)
                assert done, (a, b)
                fixed += 1
                changed |= (1 << a) | (1 << b)
        if not fixed:
            return


def _join(draft: _Draft, components: list[set[str]]) -> bool:
    """Add one read linking a later component to another one; False if none can."""
    for component in components[1:]:
        inside = {int(k[1:]) for k in component}
        for kernel in sorted(inside):
            for array in draft.readable(kernel):
                touched = draft.touchers_mask(array, kernel)
                if touched and touched & ~_mask(sorted(inside)):
                    draft.add_read(kernel, array)
                    return True
    return False


def _shorten(draft: _Draft, a: int, b: int, near: Sequence[int]) -> bool:
    """Let ``b`` read a version touched by a kernel within ``kinship - 1`` steps of ``a``."""
    for array in draft.readable(b):
        touched = draft.touchers_mask(array, b)
        if touched and near[a] & touched:
            draft.add_read(b, array)
            return True
    return False


def synthesize(spec: SynthSpec, progress: Callable[[str], None] | None = None) -> AppMetadata:
    """One synthetic application with the given Table V attributes (deterministic by seed);
    ``progress`` hears each step of a long construction."""
    from kfuse.model.wahib import preset

    spec.check()
    rng = random.Random(spec.seed)
    draft = _Draft(spec, rng)
    if progress is not None:
        progress(f"drawing {spec.kernels} kernels over {spec.arrays} arrays")
    draft.draw()
    device = preset(spec.device)
    names = [f"k{i}" for i in range(spec.kernels)]
    elements = math.prod(GRID)
    arrays = tuple(ArraySpec(name=f"a{j}", dtype="float64", shape=GRID)
                   for j in range(spec.arrays))
    loads: dict[tuple[int, int], int] = {}

    def build(with_numbers: bool = False) -> AppMetadata:
        kernels = []
        for kernel in range(spec.kernels):
            accesses = []
            for array in draft.arrays_of(kernel):
                mode = draft.mode[(kernel, array)]
                load = loads.get((kernel, array), 1) if mode == "read" else 1
                accesses.append(AccessSpec(f"a{array}", mode, float(load),
                                           RADIUS[load] if load > 1 else None))
            kernels.append(KernelSpec(name=names[kernel], runtime_s=1e-3,
                                      threads_per_block=THREADS_PER_BLOCK, blocks=BLOCKS,
                                      accesses=tuple(accesses)))
        return AppMetadata(name=spec.name, kernels=tuple(kernels), arrays=arrays,
                           device=device, copies=tuple(copies), precision="double")

    copies: list[CopySpec] = []
    _repair(draft, build, progress=progress)
    reads = sorted(key for key, mode in draft.mode.items() if mode == "read")
    for key, load in zip(reads, _mix(len(reads), spec.thread_load, rng), strict=True):
        loads[key] = load
    for number in range(spec.copies):
        for _ in range(50):
            cut = rng.randrange(spec.kernels - 1)
            candidates = [a for a, members in enumerate(draft.members)
                          if min(members) <= cut < max(members)]
            if candidates:
                copies.append(CopySpec(f"a{rng.choice(candidates)}", names[cut],
                                       "to_host" if number % 2 == 0 else "to_device"))
                break
    app = build()
    kernels = []
    for spec_k in app.kernels:
        nreads = sum(1 for a in spec_k.accesses if a.reads)
        widest = max((a.thread_load for a in spec_k.accesses if a.reads), default=1.0)
        registers = min(64, 8 * math.ceil((20 + 3 * nreads + widest) / 8))
        moved = len(spec_k.accesses) * elements * 8 + sum(
            elements * 8 for a in spec_k.accesses if a.mode == "readwrite")
        measured = moved / (rng.uniform(0.60, 0.85) * device.bandwidth_gbps * 1e9) \
            + device.launch_overhead_s
        kernels.append(replace(spec_k, registers=registers, runtime_s=measured))
    app = replace(app, kernels=tuple(kernels))
    from kfuse.project.problem import AppProblem
    probe = AppProblem(app, "wahib")
    final = []
    for kernel in app.kernels:
        bound = project_group([probe.metadata[kernel.name]], device)
        gflops = bound.gflops if bound.feasible and bound.gflops > 0 else 1.0
        flops = kernel.runtime_s / rng.uniform(*MEASURED_OVER_BOUND) * gflops * 1e9
        final.append(replace(kernel, flops=float(f"{flops:.4g}"),
                             runtime_s=float(f"{kernel.runtime_s:.6g}")))
    app = replace(app, kernels=tuple(final))
    from kfuse.project.problem import sharing_adjacency
    achieved = {"kinship": _largest_kinship(sharing_adjacency(app)),
                "mean_sharing_set": round(sum(len(m) for m in draft.members) / spec.arrays, 3),
                "mean_thread_load": round(sum(loads.values()) / max(1, len(loads)), 3),
                "copies": len(copies)}
    return replace(app, synth={"generator": "kfuse synth", **asdict(spec),
                               "achieved": achieved})


def suite(kernels: Sequence[int], arrays: Sequence[int], instances: int = 10,
          base: SynthSpec | None = None) -> list[SynthSpec]:
    """A grid of specs (each ``(kernels, arrays)`` cell with ``instances`` seeds)."""
    base = base or SynthSpec()
    specs = []
    for k in kernels:
        for a in arrays:
            for seed in range(instances):
                specs.append(replace(base, kernels=k, arrays=a, seed=base.seed + seed,
                                     kinship=min(base.kinship, k - 1)))
    return specs


__all__ = ["SynthSpec", "max_kinship", "suite", "synthesize"]
