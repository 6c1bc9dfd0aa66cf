"""Wahib & Maruyama 2014's codeless performance upper-bound projection: equations (2)-(10).

A fused kernel's runtime is projected from the metadata of its original kernels alone
(Table III: threads, blocks, active threads and blocks, registers, FLOPs, thread load per
array, halo) and the architecture's constants (Table IV), without generating code. The
readings follow ``notes/wahib-fusion-search.md`` §4 and §6: ``H_TH = ceil(Hal/Thr)``;
``|ShrLst|`` (a count) in (8) but ``S_bytes`` (bytes) in (7); the new kernel's active
blocks per SM are derived by lowering ``min BlocksSMX`` until (3), (7) and the hardware
limits hold; its registers are ``max(member RT, floor(R_need)+1)`` rounded up to the
allocation granularity; the halo FLOPs of (10) scale by ``Hal/Thr`` (the literal
``Hal/(B*Thr)`` behind ``literal_halo``) and the base FLOPs of every member count.

``normalized`` is kfuse's variant (note §6.8): ``P = min(1, B_eff*) * OI * BW`` with
``B_eff* = B_Sh * SMX / min(Thr * B, SMX * max threads per SM)``, i.e. the kernel's DRAM
bytes at the bandwidth its shared-memory blocking lets it sustain. The literal model has
no operational intensity and its absolute scale is doubtful on large grids.

The same equations serve codeless applications (:mod:`kfuse.project`) and IR graphs
(:func:`metadata_from_graph`, :func:`graph_group_time`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from kfuse.cuda_limits import MAX_REGISTERS_PER_THREAD
from kfuse.errors import FusionError, KfuseError
from kfuse.model.device import DeviceProfile


@dataclass(frozen=True)
class Architecture:
    """Table IV constants of a GPU, plus the hardware limits the projection needs.

    ``registers_per_sm`` counts 32-bit registers (the paper's "64KB" is 64K registers);
    ``bandwidth_gbps`` is the STREAM-like GMEM bandwidth; ``register_granularity`` the
    per-thread allocation unit; ``bank_padding`` the fraction of used shared memory
    reserved for bank-conflict padding (1/32 on Kepler); ``reg_fac`` the register reuse
    factor of Eq. (4) (0.85 measured on Kepler).
    """

    name: str
    sm_count: int
    shared_memory_per_sm: int
    registers_per_sm: int
    bandwidth_gbps: float
    max_registers_per_thread: int = MAX_REGISTERS_PER_THREAD
    max_blocks_per_sm: int = 16
    max_threads_per_sm: int = 2048
    peak_gflops: float | None = None
    register_granularity: int = 8
    bank_padding: float = 1.0 / 32.0
    reg_fac: float = 0.85
    launch_overhead_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_profile(cls, profile: DeviceProfile) -> Architecture:
        """The constants of a kfuse device profile (measured copy bandwidth, Hopper limits)."""
        try:
            major = int(str(profile.compute_capability).split(".")[0])
        except ValueError:
            major = 9
        return cls(name=profile.name, sm_count=profile.sm_count,
                   shared_memory_per_sm=profile.shared_memory_per_sm,
                   registers_per_sm=profile.registers_per_sm,
                   bandwidth_gbps=profile.copy_bandwidth_bytes_per_s / 1e9,
                   max_blocks_per_sm=32 if major >= 8 else 16,
                   max_threads_per_sm=profile.max_threads_per_sm,
                   peak_gflops=None, bank_padding=0.0,
                   launch_overhead_s=profile.launch_overhead_s)


# Table IV of Wahib & Maruyama 2014 (Kepler K20X, K40, Maxwell GTX 750 Ti) and nominal Hopper figures.
PRESETS: dict[str, Architecture] = {
    "k20x": Architecture("Tesla K20X", 14, 48 * 1024, 65536, 202.0, peak_gflops=1310.0),
    "k40": Architecture("Tesla K40", 15, 48 * 1024, 65536, 214.0, peak_gflops=1430.0),
    "gtx750ti": Architecture("GeForce GTX 750 Ti", 5, 64 * 1024, 65536, 69.0,
                             max_blocks_per_sm=32, peak_gflops=1380.0),
    "h100": Architecture("H100 SXM (nominal)", 132, 228 * 1024, 65536, 2900.0,
                         max_blocks_per_sm=32, peak_gflops=33500.0, bank_padding=0.0,
                         launch_overhead_s=4e-6),
    "h200": Architecture("H200 SXM (nominal)", 132, 228 * 1024, 65536, 4000.0,
                         max_blocks_per_sm=32, peak_gflops=33500.0, bank_padding=0.0,
                         launch_overhead_s=4e-6),
}


def preset(name: str) -> Architecture:
    """A named architecture (``k20x``, ``k40``, ``gtx750ti``, ``h100``, ``h200``, ``current``)."""
    key = name.lower().replace("-", "").replace("_", "").replace(" ", "")
    if key == "current":
        from kfuse.model.device import current_profile
        return Architecture.from_profile(current_profile())
    if key not in PRESETS:
        raise KfuseError(f"unknown device preset {name!r}; choose one of "
                         f"{', '.join([*PRESETS, 'current'])}")
    return PRESETS[key]


@dataclass(frozen=True)
class KernelMetadata:
    """Table III metadata of one original kernel (arrays named by version).

    ``reads`` maps each array read to its thread load ThrLD (1 for a point read);
    ``array_flops`` is Flop(x), the FLOPs that produce array ``x`` (for halo recomputation);
    ``shared_arrays`` the kernel's own ShrLst; ``array_bytes`` the size of each array (only
    the normalized variant needs it); ``runtime_s`` the measured runtime P_i.
    """

    name: str
    threads_per_block: int
    blocks: int
    active_threads_per_block: int
    active_blocks_per_sm: int
    registers: int
    flops: float
    reads: Mapping[str, float] = field(default_factory=dict)
    writes: tuple[str, ...] = ()
    address_registers: int = 4
    halo: int = 0
    array_flops: Mapping[str, float] = field(default_factory=dict)
    shared_arrays: tuple[str, ...] = ()
    element_size: Mapping[str, int] = field(default_factory=dict)
    array_bytes: Mapping[str, float] = field(default_factory=dict)
    runtime_s: float | None = None

    @property
    def arrays(self) -> set[str]:
        return set(self.reads) | set(self.writes)

    @cached_property
    def widest_element(self) -> int:
        """Bytes of the widest element the kernel touches (8 when none is given)."""
        return max((self.element_size.get(a, 8) for a in self.arrays), default=8)

    def flop_of(self, array: str) -> float:
        """Flop(x): given, else the kernel's FLOPs split evenly over what it writes."""
        if array in self.array_flops:
            return float(self.array_flops[array])
        return self.flops / max(1, len(self.writes))

    def bytes_moved(self) -> float:
        """DRAM bytes of the kernel alone: every array it reads and every array it writes."""
        return sum(self.array_bytes.get(x, 0.0) for x in self.reads) + \
            sum(self.array_bytes.get(x, 0.0) for x in self.writes)


@dataclass(frozen=True)
class WahibOptions:
    """Switches between the literal equations and kfuse's readings (note §6.7, §6.8)."""

    literal_halo: bool = False
    normalized: bool = False
    precision_bytes: int | None = None  # 8 (double) or 4 (single) for Eq. 9; None: from arrays


# ---------------------------------------------------------------------------------------------
# The equations, one function each
# ---------------------------------------------------------------------------------------------

def halo_per_thread(halo: float, threads_per_block: int) -> int:
    """H_TH = ceil(Hal / Thr): halo sites each thread loads (ceiling fixed by the example)."""
    return math.ceil(halo / threads_per_block) if halo > 0 else 0


def registers_needed(max_thread_load: float, complex_fusion: bool, h_th: int,
                     address_registers: int, reg_fac: float = 0.85) -> float:
    """R_need of Eq. (6): R_fetch (5) + RegFac*max ThrLD + c*H_TH + RAdr + 1."""
    c = 1 if complex_fusion else 0
    fetch = 1 + c * h_th
    return fetch + reg_fac * max_thread_load + c * h_th + address_registers + 1


def shared_bytes_used(active_threads: int, blocks_per_sm: int, complex_fusion: bool, h_th: int,
                      shared_bytes_per_site: int, bank_padding: float) -> int:
    """Left side of Eq. (7): (1 + c*H_TH)*TB*BlocksSMX*S_bytes + B_conf, in bytes per SM."""
    c = 1 if complex_fusion else 0
    used = (1 + c * h_th) * active_threads * blocks_per_sm * shared_bytes_per_site
    return used + math.ceil(used * bank_padding)


def shared_memory_blocks(active_threads: int, complex_fusion: bool, h_th: int,
                         shared_bytes_per_site: int, arch: Architecture,
                         unlimited: int) -> int:
    """The most blocks per SM whose shared memory fits Eq. (7) (``unlimited`` when the
    kernel stages nothing). Falls as any argument but ``unlimited`` grows."""
    per_block = (1 + int(complex_fusion) * h_th) * active_threads * shared_bytes_per_site
    if not per_block:
        return unlimited
    blocks = int(arch.shared_memory_per_sm // (per_block * (1 + arch.bank_padding)))
    while shared_bytes_used(active_threads, blocks + 1, complex_fusion, h_th,
                            shared_bytes_per_site, arch.bank_padding) <= arch.shared_memory_per_sm:
        blocks += 1  # the closed form rounds the padding down; step up to the edge
    while blocks > 0 and shared_bytes_used(active_threads, blocks, complex_fusion, h_th,
                                           shared_bytes_per_site,
                                           arch.bank_padding) > arch.shared_memory_per_sm:
        blocks -= 1
    return blocks


def shared_blocking_factor(active_threads: int, blocks_per_sm: int, complex_fusion: bool,
                           h_th: int, shared_arrays: int) -> float:
    """B_Sh of Eq. (8): TB*BlocksSMX / ((1 + c*H_TH) * max(1, |ShrLst|))."""
    c = 1 if complex_fusion else 0
    return active_threads * blocks_per_sm / ((1 + c * h_th) * max(1, shared_arrays))


def effective_blocking(b_sh: float, sm_count: int, threads_per_block: int, blocks: int) -> float:
    """B_eff = B_Sh * SMX / (Thr * B) (may exceed 1, as in the paper's example)."""
    return b_sh * sm_count / (threads_per_block * blocks)


def memory_bound_gflops(b_sh: float, sm_count: int, bandwidth_gbps: float,
                        threads_per_block: int, blocks: int, precision_bytes: int = 8) -> float:
    """P_MemBound of Eq. (9): B_eff * GMEM_BW / 8 GFLOPS (/4 in single precision)."""
    return effective_blocking(b_sh, sm_count, threads_per_block, blocks) * bandwidth_gbps \
        / precision_bytes


def projected_time(flops: float, gflops: float) -> float:
    """T_pro of Eq. (10) in seconds: 1e-9 * FLOPs / P_MemBound."""
    return 1e-9 * flops / gflops


# ---------------------------------------------------------------------------------------------
# A group of kernels
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Projection:
    """The projection of one (possibly fused) kernel and every intermediate quantity.

    ``reason`` (with ``constraint``, e.g. ``"1.6"``) says why the group cannot run; then
    ``time_s`` is ``math.inf``.
    """

    members: tuple[str, ...]
    time_s: float
    original_sum_s: float | None
    reason: str | None
    constraint: str | None
    threads_per_block: int
    blocks: int
    active_threads: int
    blocks_per_sm: int
    registers: int
    registers_needed: float
    halo: int
    halo_per_thread: int
    complex_fusion: bool
    pivot: tuple[str, ...]
    shared_list: tuple[str, ...]
    shared_bytes: int
    b_sh: float
    b_eff: float
    gflops: float
    flops: float
    halo_flops: float
    dram_bytes: float | None  # computed when the normalized variant or a caller needs it
    limited_by: str

    @property
    def feasible(self) -> bool:
        return self.reason is None

    @property
    def breakdown(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in (
            "blocks_per_sm", "registers", "registers_needed", "halo_per_thread",
            "complex_fusion", "shared_bytes", "b_sh", "b_eff", "gflops", "flops", "halo_flops",
            "dram_bytes", "limited_by")} | {"pivot": list(self.pivot),
                                            "shared_list": list(self.shared_list)}


def aggregate(members: Sequence[KernelMetadata]) -> dict[str, Any]:
    """Metadata of the new kernel (note §4.2): pivot, ShrLst, c, halo members and arrays.

    One pass over the members' accesses: an array touched by two members is a pivot; a
    pivot read with thread load > 1 is staged (ShrLst); an array written by one member and
    read with thread load > 1 by a later one needs a halo (complex fusion, c = 1) and its
    writer recomputes it there.
    """
    touched: dict[str, int] = {}
    max_load: dict[str, float] = {}
    first_writer: dict[str, int] = {}
    writers_before: dict[str, list[str]] = {}
    halo_arrays: set[str] = set()
    halo_members: set[str] = set()
    shared: set[str] = set()
    count = touched.get
    for position, kernel in enumerate(members):
        reads = kernel.reads
        for array, load in reads.items():
            touched[array] = count(array, 0) + 1
            if load > 1:
                if load > max_load.get(array, 1.0):
                    max_load[array] = load
                if array in first_writer:  # written by an earlier member (reads come first)
                    halo_arrays.add(array)
                    halo_members.update(w for w in writers_before[array] if w != kernel.name)
        for array in kernel.writes:
            if array not in reads:
                touched[array] = count(array, 0) + 1
            if array not in first_writer:
                first_writer[array] = position
                writers_before[array] = [kernel.name]
            else:
                writers_before[array].append(kernel.name)
        if kernel.shared_arrays:
            shared.update(kernel.shared_arrays)
    pivot = sorted(a for a, n in touched.items() if n >= 2)
    shared.update(a for a in pivot if max_load.get(a, 1.0) > 1)
    return {"pivot": tuple(pivot), "shared_list": tuple(sorted(shared)),
            "complex": bool(halo_arrays), "halo_arrays": halo_arrays,
            "halo_members": halo_members,
            "max_thread_load": max((max_load.get(a, 1.0) for a in pivot), default=1.0)}


def group_dram_bytes(members: Sequence[KernelMetadata],
                     stored: Iterable[str] | None = None) -> float:
    """Bytes the new kernel moves: each array read from outside once, each array written once.

    ``stored`` names the written arrays that must reach memory (read after the group or by
    the host); without it every written array is stored, as Wahib & Maruyama 2014's fusions do.
    """
    written = {a for k in members for a in k.writes}
    sizes: dict[str, float] = {}
    for kernel in members:
        sizes.update(kernel.array_bytes)
    read = {a for k in members for a in k.reads} - written
    kept = written if stored is None else written & set(stored)
    return sum(sizes.get(a, 0.0) for a in read) + sum(sizes.get(a, 0.0) for a in kept)


def project_group(members: Sequence[KernelMetadata], arch: Architecture,
                  options: WahibOptions = WahibOptions(),
                  stored: Iterable[str] | None = None) -> Projection:
    """Project the runtime of the kernel that fuses ``members`` (program order) on ``arch``.

    ``stored`` (the written arrays needed after the group) only matters to the DRAM bytes
    of the normalized variant; see :func:`group_dram_bytes`.
    """
    if not members:
        raise KfuseError("cannot project an empty group")
    names = tuple(k.name for k in members)
    original = None
    if all(k.runtime_s is not None for k in members):
        original = float(sum(k.runtime_s for k in members))  # type: ignore[misc]
    thr = members[0].threads_per_block
    blocks = members[0].blocks
    info = aggregate(members) if len(members) > 1 else {
        "pivot": (), "shared_list": tuple(sorted(members[0].shared_arrays)), "complex": False,
        "halo_arrays": set(), "halo_members": set(),
        "max_thread_load": max(members[0].reads.values(), default=1.0)}
    active = min(k.active_threads_per_block for k in members)
    halo = max(k.halo for k in members)
    h_th = halo_per_thread(halo, thr)
    complex_fusion = info["complex"]
    address = max(k.address_registers for k in members)
    need = registers_needed(info["max_thread_load"], complex_fusion, h_th, address, arch.reg_fac)
    granule = max(1, arch.register_granularity)
    registers = max(max(k.registers for k in members), math.floor(need) + 1)
    registers = -(-registers // granule) * granule
    shared_list = info["shared_list"]
    element: dict[str, int] = {}
    for kernel in members:
        sizes = kernel.element_size
        for array in shared_list:
            if array not in element and array in sizes:
                element[array] = sizes[array]
    site_bytes = sum(element.get(a, 8) for a in shared_list)
    precision = options.precision_bytes or max(k.widest_element for k in members)
    reason = constraint = None
    limited_by = "given"
    if registers > arch.max_registers_per_thread:
        reason = (f"needs {registers} registers per thread (R_need = {need:.1f}, Eq. 6), above "
                  f"R_Max = {arch.max_registers_per_thread}")
        constraint = "1.7"
    start = min(k.active_blocks_per_sm for k in members)
    smem_blocks = shared_memory_blocks(active, complex_fusion, h_th, site_bytes, arch, start)
    limits = {"registers (Eq. 3)": arch.registers_per_sm // (thr * registers),
              "shared memory (Eq. 7)": smem_blocks,
              "blocks per SM": arch.max_blocks_per_sm,
              "threads per SM": arch.max_threads_per_sm // thr}
    chosen = max(0, min(start, *limits.values()))
    if chosen < start:
        limited_by = min(limits, key=limits.__getitem__)
    if reason is None and chosen == 0:
        one = shared_bytes_used(active, 1, complex_fusion, h_th, site_bytes, arch.bank_padding)
        if one > arch.shared_memory_per_sm:
            reason = (f"needs {one} bytes of shared memory per SM for one block (Eq. 7: "
                      f"{len(shared_list)} staged arrays, halo factor {1 + int(complex_fusion) * h_th}"
                      f"), capacity {arch.shared_memory_per_sm}")
            constraint = "1.6"
        else:
            reason = (f"one block of {thr} threads at {registers} registers needs "
                      f"{thr * registers} registers, the SM has {arch.registers_per_sm} (Eq. 3)")
            constraint = "1.7"
    b_sh = shared_blocking_factor(active, chosen, complex_fusion, h_th, len(shared_list))
    b_eff = effective_blocking(b_sh, arch.sm_count, thr, blocks)
    gflops = memory_bound_gflops(b_sh, arch.sm_count, arch.bandwidth_gbps, thr, blocks,
                                 precision)
    base_flops = float(sum(k.flops for k in members))
    scale = halo / (blocks * thr) if options.literal_halo else halo / thr
    halo_flops = sum(k.flop_of(a) * scale for k in members if k.name in info["halo_members"]
                     for a in k.writes if a in info["halo_arrays"])
    flops = base_flops + halo_flops
    dram = group_dram_bytes(members, stored) if options.normalized or stored is not None \
        else None
    if reason is not None:
        time_s = math.inf
    elif options.normalized:
        resident = min(thr * blocks, arch.sm_count * arch.max_threads_per_sm)
        efficiency = min(1.0, b_sh * arch.sm_count / resident)
        if not dram:
            raise KfuseError(f"the normalized wahib model needs array sizes (group {list(names)})")
        time_s = dram / (efficiency * arch.bandwidth_gbps * 1e9)
        if arch.peak_gflops:
            time_s = max(time_s, 1e-9 * flops / arch.peak_gflops)
        time_s += arch.launch_overhead_s
    else:
        time_s = projected_time(flops, gflops) if gflops > 0 else math.inf
    return Projection(names, time_s, original, reason, constraint, thr, blocks, active, chosen,
                      registers, need, halo, h_th, complex_fusion, info["pivot"], shared_list,
                      shared_bytes_used(active, chosen, complex_fusion, h_th, site_bytes,
                                        arch.bank_padding),
                      b_sh, b_eff, gflops, flops, halo_flops, dram, limited_by)


def fusion_efficiency(members: Sequence[KernelMetadata], fused_time_s: float) -> float:
    """FE of Eqs. (11)-(12): traffic ratio rho over time ratio T(F) / sum T(K_i)."""
    unfused_bytes = sum(k.bytes_moved() for k in members)
    original = sum(k.runtime_s or 0.0 for k in members)
    if unfused_bytes <= 0 or original <= 0 or fused_time_s <= 0:
        raise KfuseError("fusion efficiency needs array sizes and measured runtimes")
    rho = group_dram_bytes(members) / unfused_bytes
    return rho / (fused_time_s / original)


# ---------------------------------------------------------------------------------------------
# IR graphs: metadata derived from the kernels
# ---------------------------------------------------------------------------------------------

THREADS_PER_BLOCK = 256
ESTIMATED_REGISTERS = 32
BLOCK_SHAPES = {1: (256,), 2: (16, 16), 3: (4, 8, 8)}


def _halo_sites(radius: Sequence[int], threads: int) -> int:
    shape = BLOCK_SHAPES.get(len(radius), (threads,))
    inner = math.prod(shape)
    outer = math.prod(s + 2 * r for s, r in zip(shape, radius, strict=False))
    return max(0, outer - inner)


def metadata_from_graph(graph, members: Iterable[str], sizes: Mapping[str, int],
                        profile: DeviceProfile) -> list[KernelMetadata]:
    """Table III metadata of IR kernels, derived from the graph (no ptxas, no measurement).

    Thr is 256; B is one resident wave (``SMX * BlocksSMX``): Wahib & Maruyama 2014's kernels loop
    over the remaining sites (its codes loop over the vertical axis), which keeps B_eff a
    blocking efficiency instead of a fraction of a huge grid. Registers are an estimate
    (32); P_i is the roofline prediction of the kernel alone.
    """
    from kfuse.ir.expr import ITEM_SIZE, count_operations
    from kfuse.model.roofline import predict_group

    arch = Architecture.from_profile(profile)
    result = []
    for name in members:
        kernel = graph.kernel_by_name[name]
        points = math.prod(sizes[s] for s in kernel.domain) if kernel.domain else 1
        counts = count_operations(kernel.body) if kernel.body is not None else {"alu": 0,
                                                                                 "sfu": 0}
        flops = float((counts["alu"] + counts["sfu"]) * points)
        reads = {b: float(max(1, kernel.thread_load(b))) for b in kernel.reads}
        radius = [0] * max(1, kernel.ndim)
        for buffer in kernel.reads:
            for axis, r in enumerate(kernel.halo_radius(buffer)):
                if axis < len(radius):
                    radius[axis] = max(radius[axis], abs(r))
        thr = THREADS_PER_BLOCK
        blocks_per_sm = max(1, min(arch.max_blocks_per_sm, arch.max_threads_per_sm // thr,
                                   arch.registers_per_sm // (thr * ESTIMATED_REGISTERS)))
        buffers = set(kernel.reads) | set(kernel.writes)
        element = {b: ITEM_SIZE[graph.buffers[b].dtype] for b in buffers}
        nbytes = {b: float(graph.nbytes(b, sizes)) for b in buffers}
        outputs = (kernel.output,)
        runtime = predict_group(graph, (name,), outputs, sizes, profile).time_s
        result.append(KernelMetadata(
            name=name, threads_per_block=thr,
            blocks=max(1, min(-(-points // thr), arch.sm_count * blocks_per_sm)),
            active_threads_per_block=thr, active_blocks_per_sm=blocks_per_sm,
            registers=ESTIMATED_REGISTERS, flops=flops, reads=reads,
            writes=tuple(kernel.writes), halo=_halo_sites(radius, thr) if any(radius) else 0,
            shared_arrays=tuple(b for b, load in reads.items() if load > 1),
            element_size=element, array_bytes=nbytes, runtime_s=runtime))
    return result


def predict_graph_group(graph, members: Sequence[str], outputs: Sequence[str],
                        sizes: Mapping[str, int], profile: DeviceProfile,
                        options: WahibOptions = WahibOptions()) -> Projection:
    """The projection of an IR group (its members' metadata derived from the graph)."""
    metadata = metadata_from_graph(graph, members, sizes, profile)
    blocks = min(k.blocks for k in metadata)
    metadata = [replace(k, blocks=blocks) for k in metadata]
    return project_group(metadata, Architecture.from_profile(profile), options, outputs)


def _time_or_raise(projection: Projection) -> float:
    if projection.reason is not None:
        raise FusionError(f"({projection.constraint}) {projection.reason}")
    return projection.time_s


def graph_group_time(graph, members: Sequence[str], outputs: Sequence[str],
                     sizes: Mapping[str, int], profile: DeviceProfile) -> float:
    """``wahib`` for IR graphs: P_i (roofline) for one kernel, Eq. (10) for a fused group.

    Raises :class:`~kfuse.errors.FusionError` naming constraint 1.6 or 1.7 when the group
    does not fit the device (the search then treats it as illegal).
    """
    if len(members) == 1:
        return metadata_from_graph(graph, members, sizes, profile)[0].runtime_s or 0.0
    return _time_or_raise(predict_graph_group(graph, members, outputs, sizes, profile))


def graph_group_time_normalized(graph, members: Sequence[str], outputs: Sequence[str],
                                sizes: Mapping[str, int], profile: DeviceProfile) -> float:
    """``wahib-norm`` for IR graphs: DRAM bytes at the blocking-limited bandwidth."""
    if len(members) == 1:
        return metadata_from_graph(graph, members, sizes, profile)[0].runtime_s or 0.0
    return _time_or_raise(predict_graph_group(graph, members, outputs, sizes, profile,
                                              WahibOptions(normalized=True)))


__all__ = ["Architecture", "KernelMetadata", "PRESETS", "Projection",
           "WahibOptions", "aggregate", "effective_blocking", "fusion_efficiency",
           "graph_group_time", "graph_group_time_normalized", "group_dram_bytes",
           "halo_per_thread", "memory_bound_gflops", "metadata_from_graph", "predict_graph_group",
           "preset", "project_group", "projected_time", "registers_needed",
           "shared_blocking_factor", "shared_bytes_used", "shared_memory_blocks"]
