"""The backend interface and the executor shared by the compiled backends (cuda, cpu)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kfuse.codegen.program import LaunchSpec, Program
from kfuse.errors import BindError
from kfuse.fusion.plan import FusionPlan
from kfuse.ir.graph import Graph
from kfuse.runtime.binding import Bound, bind
from kfuse.runtime.launch import BoundLaunch, bind_launches
from kfuse.runtime.streams import StreamSchedule

# The largest vector access of generated kernels, in bytes: a program for arrays whose
# addresses are multiples of it compiles the 1-D map-reduce kernels' pointer tests away
# (measured on an H200: MADD, WAXPBY and AXPYDOT 0.2-0.4% faster; docs/journal/benchmarks.md,
# sessions 15 and 16).
VECTOR_ALIGNMENT = 16

# Programs a backend keeps loaded per process (the least recently used is let go).
LOADED_PROGRAMS = 256

# Value written into fresh buffers so that an element no kernel wrote shows up.
POISON = {"float32": np.nan, "float64": np.nan, "float16": np.nan, "bfloat16": np.nan,
          "int8": -123, "uint8": 0xAB, "int16": -12345,
          "uint16": 0xABCD, "int32": -1234567891, "int64": -1234567891234567891, "bool": True}


class Backend(ABC):
    """Runs a pipeline graph. ``run`` returns every pipeline output by name."""

    name: str = "?"

    @classmethod
    def available(cls) -> bool:
        """Whether the backend can run here."""
        return cls.unavailable_reason() is None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why the backend cannot run here (None: it can)."""
        return None

    def call_arrays(self) -> Any:
        """How calls of a compiled pipeline take, make and launch on this backend's arrays
        (:mod:`kfuse.runtime.compiled`); None where nothing is compiled (numpy)."""
        return None

    @abstractmethod
    def run(self, graph: Graph, given: Mapping[str, Any], *, program: Program | None = None,
            plan: FusionPlan | None = None) -> dict[str, Any]:
        """Outputs by name; ``plan`` picks the kernels (one per operator when left out)."""


class LoadedProgram(ABC):
    """A program compiled and loaded for the current device: a function per kernel, and how
    to launch them on a stream. One per program source and device (:meth:`of`), shared by
    every executable and compiled signature that runs it."""

    _loaded: dict[tuple, LoadedProgram]  # each backend's subclass keeps its own

    def __init__(self, program: Program):
        self.program = program
        self.functions: dict[str, Any] = {}

    @classmethod
    def of(cls, program: Program) -> LoadedProgram:
        """The loaded ``program`` (compiled, or taken from the caches, on first use)."""
        key = (program.source, cls.device_key())
        found = cls._loaded.get(key)
        if found is None:
            found = cls(program)
            if len(cls._loaded) >= LOADED_PROGRAMS:
                cls._loaded.pop(next(iter(cls._loaded)))
            cls._loaded[key] = found
        else:
            cls._loaded[key] = cls._loaded.pop(key)  # the latest used last
        return found

    @classmethod
    def device_key(cls) -> Any:
        """Which device a loaded program belongs to (None: the host)."""
        return None

    def bind(self, sizes: Mapping[str, int]) -> tuple[BoundLaunch, ...]:
        """Every launch of the program bound at ``sizes``."""
        return bind_launches(self.program, sizes, self.handle, self.resident_blocks)

    def handle(self, spec: LaunchSpec) -> Any:
        """What a bound launch of the kernel calls (its compiled function)."""
        return self.functions[spec.symbol]

    def resident_blocks(self, spec: LaunchSpec) -> int | None:
        """How many blocks of the kernel the device holds at once (None: not known)."""
        return None

    # -- what the C call path (kfuse.runtime.native) launches through ----------------------------
    @abstractmethod
    def native_launch(self) -> tuple[int, int | None]:
        """The addresses of a function with ``cuLaunchKernel``'s signature that launches
        this backend's kernels, and of one with ``cuGraphLaunch``'s (None: no graphs)."""

    @abstractmethod
    def native_function(self, launch: BoundLaunch) -> int:
        """The address the native launch function takes for ``launch``'s kernel."""

    @abstractmethod
    def launch_error(self, launch: BoundLaunch | None, status: int) -> Exception:
        """The error for a launch of ``launch`` (None: a CUDA graph's replay) that
        returned ``status``."""

    def enqueue(self, launches: Sequence[BoundLaunch], buffers: Mapping[str, Any],
                stream: Any, schedule: StreamSchedule | None = None, side: Any = None
                ) -> None:
        """Launch ``launches`` (their arguments written) in order on ``stream``, each one's
        reduction outputs first set to their identities (``buffers``: the buffers by name,
        for those). With a ``schedule`` of side streams (:mod:`kfuse.runtime.streams`) and
        ``side``, their streams and events, launches go on their streams, forked from
        ``stream`` and joined back to it."""
        if schedule is None or schedule.side_streams == 0:
            for launch in launches:
                for name, value in launch.fills:
                    self.fill(buffers[name], value, stream)
                self.launch(launch, stream)
            return
        lanes, recorded = [stream, *side.streams], schedule.recorded
        side.fork(stream)
        for index, launch in enumerate(launches):
            lane = lanes[schedule.streams[index]]
            for earlier in schedule.waits[index]:
                side.wait(lane, earlier)
            for name, value in launch.fills:
                self.fill(buffers[name], value, lane)
            self.launch(launch, lane)
            if index in recorded:
                side.record(index, lane)
        side.join(stream)

    @abstractmethod
    def current_stream(self) -> Any:
        """The stream the caller's work goes to now (None on the host)."""

    @abstractmethod
    def launch(self, launch: BoundLaunch, stream: Any) -> None:
        """Enqueue one bound kernel on ``stream``."""

    @abstractmethod
    def fill(self, buffer: Any, value: float, stream: Any) -> None:
        """Set every element of ``buffer`` to ``value``, in order on ``stream``."""


class Executable(ABC):
    """A program bound to concrete buffers, ready to launch again and again.

    Made in steps: bound to arrays, buffers allocated, then a program loaded (checked against
    the sizes and array addresses it was compiled for, and compiled).
    """

    def __init__(self, graph: Graph, bound: Bound):
        self.graph = graph
        self.bound = bound
        self.buffers: dict[str, Any] = {}
        self.program: Program | None = None

    def load(self, program: Program) -> None:
        """Take ``program`` to launch on the buffers (refused where it was compiled for other
        sizes or for aligned arrays that these are not) and compile it."""
        if program.fixed_sizes is not None:
            differ = {symbol: (size, self.bound.sizes.get(symbol))
                      for symbol, size in program.fixed_sizes
                      if self.bound.sizes.get(symbol) != size}
            if differ:
                text = ", ".join(f"'{symbol}' {size} (arrays: {given})"
                                 for symbol, (size, given) in differ.items())
                raise BindError(f"program '{program.name}' was compiled for other sizes: "
                                f"{text}; generate it for these arrays' sizes")
        self.check_alignment(self.buffers, program)
        self.program = program
        self.compile(program)

    def check_alignment(self, buffers: Mapping[str, Any], program: Program | None = None
                        ) -> None:
        """Refuse ``buffers`` (by name) that ``program`` (default: the loaded one) may not
        run on: their addresses are not multiples of the alignment it was compiled for."""
        program = program or self.program
        misaligned = [name for name, buffer in self._vector_accessed(buffers).items()
                      if self.address(buffer) % program.array_alignment]
        if misaligned:
            raise BindError(f"program '{program.name}' was compiled for arrays at addresses "
                            f"that are multiples of {program.array_alignment} bytes; "
                            f"{', '.join(repr(n) for n in misaligned)} "
                            f"{'is' if len(misaligned) == 1 else 'are'} not (a view that "
                            "starts inside another array?): generate it with "
                            "array_alignment=1, or pass aligned arrays")

    def array_alignment(self) -> int:
        """The largest vector size (at most :data:`VECTOR_ALIGNMENT` bytes) that every
        buffer's address is a multiple of: what programs for these buffers may assume."""
        alignment = VECTOR_ALIGNMENT
        for buffer in self._vector_accessed(self.buffers).values():
            address = self.address(buffer)
            while address % alignment:
                alignment //= 2
        return alignment

    def _vector_accessed(self, buffers: Mapping[str, Any]) -> dict[str, Any]:
        """``buffers`` (by name) whose alignment counts: all but scalars (0-d buffers), which
        are read and written one element at a time."""
        return {name: buffer for name, buffer in buffers.items()
                if self.graph.buffers[name].ndim > 0}

    def allocate(self) -> None:
        for name, buffer in self.graph.buffers.items():
            if name in self.graph.inputs:
                self.buffers[name] = self.upload(self.bound.arrays[name])
            else:
                shape = self.graph.shape_of(name, self.bound.sizes)
                self.buffers[name] = self.full(shape, buffer.dtype, POISON[buffer.dtype])

    def launch_all(self) -> None:
        """Enqueue every kernel of the program in order (initialising reduction outputs)."""
        self.enqueue(self.launches)

    def launch_one(self, spec: LaunchSpec) -> None:
        """Enqueue one kernel of the program (its reduction outputs initialised first)."""
        self.enqueue([launch for launch in self.launches if launch.spec == spec])

    def enqueue(self, launches: Sequence[BoundLaunch]) -> None:
        """Launch ``launches`` on this executable's buffers, on the caller's stream."""
        addresses = {name: self.address(buffer) for name, buffer in self.buffers.items()}
        for launch in launches:
            launch.arguments.write(addresses, self.bound.params)
        self.loaded.enqueue(launches, self.buffers, self.loaded.current_stream())

    def argument(self, spec: LaunchSpec, param) -> Any:
        """The value passed for one kernel parameter: a buffer, a size or a scalar."""
        if param.role in ("input", "output"):
            return self.buffers[param.ref]
        if param.role == "size":
            return np.int32(self.bound.sizes[param.ref])
        if param.role == "blocks":
            part, axis = map(int, param.ref.split("."))
            return np.uint32(spec.part_blocks(self.bound.sizes)[part][axis])
        value = self.bound.params[param.ref]
        return np.dtype(param.dtype if param.dtype != "bool" else np.bool_).type(value)

    @property
    def functions(self) -> dict[str, Any]:
        """The compiled function of each kernel, by its symbol."""
        return self.loaded.functions

    def results(self) -> dict[str, Any]:
        return {name: self.download(self.buffers[name]) for name in self.graph.outputs}

    # -- what each compiled backend supplies ---------------------------------------------------
    loaded_class: type[LoadedProgram]

    def compile(self, program: Program) -> None:
        """Make ``program`` launchable (compile it, or take it from the cache) and bind its
        launches at the bound sizes."""
        self.loaded = self.loaded_class.of(program)
        self.launches = self.loaded.bind(self.bound.sizes)

    @abstractmethod
    def address(self, buffer: Any) -> int:
        """Where ``buffer``'s first element is in memory."""

    @abstractmethod
    def upload(self, array: Any) -> Any: ...

    @abstractmethod
    def full(self, shape: tuple[int, ...], dtype: str, value: float) -> Any: ...

    @abstractmethod
    def download(self, buffer: Any) -> Any: ...


class CompiledBackend(Backend):
    """A backend that runs generated CUDA C (on the GPU or through the CPU shim)."""

    executable_class: type[Executable]
    arrays_class: type  # the call_arrays() of compiled pipelines
    # Whether programs this backend generates are compiled for the bound sizes
    # (kfuse.codegen.specialise): on the GPU, yes; the host compiler builds one library per
    # program, so the cpu backend keeps sizes as arguments (tests run specialised programs
    # through it explicitly).
    specialises_sizes: bool = False

    @classmethod
    def compiles_for_sizes(cls) -> bool:
        """Whether generated programs are compiled for the bound sizes here
        (``KFUSE_SPECIALISE_SIZES=0`` turns it off)."""
        return cls.specialises_sizes and os.environ.get("KFUSE_SPECIALISE_SIZES") != "0"

    def call_arrays(self) -> Any:
        return self.arrays_class()

    def fixed_sizes(self, bound: Bound) -> dict[str, int] | None:
        """The sizes this backend's generated programs are compiled for (None: any)."""
        return dict(bound.sizes) if self.compiles_for_sizes() else None

    def marches_along_z(self, graph: Graph, sizes: Mapping[str, int]) -> bool:
        """Whether 3-D stencil chains get kernels whose threads march along z here
        (:mod:`kfuse.codegen.marching`): where the device's bandwidth makes it pay and the
        volumes of ``graph`` at ``sizes`` fill the device in long chunks."""
        return False

    def prepare(self, graph: Graph, given: Mapping[str, Any], *,
                program: Program | None = None, plan: FusionPlan | None = None,
                buffers_of: Executable | None = None) -> Executable:
        """Bind arguments, allocate buffers, generate (or take) the program for their sizes and
        alignment, check it against them and compile it.

        ``buffers_of``: an executable of ``graph`` prepared on the same ``given``, whose
        arguments and buffers this one shares instead (programs compared on the very same
        memory, as the autotuner does)."""
        if buffers_of is not None:
            if buffers_of.graph is not graph:
                raise ValueError("buffers_of must be an executable of the same graph")
            executable = self.executable_class(graph, buffers_of.bound)
            executable.buffers = dict(buffers_of.buffers)
        else:
            executable = self.executable_class(graph, bind(graph, given))
            executable.allocate()
        bound = executable.bound
        if program is None:
            from kfuse.codegen import generate
            groups = plan.kernel_groups if plan is not None else None
            program = generate(graph, groups, wide_index=bound.wide_index(graph),
                               fixed_sizes=self.fixed_sizes(bound),
                               march=self.marches_along_z(graph, bound.sizes),
                               array_alignment=executable.array_alignment())
        executable.load(program)
        return executable

    def run(self, graph: Graph, given: Mapping[str, Any], *, program: Program | None = None,
            plan: FusionPlan | None = None) -> dict[str, Any]:
        executable = self.prepare(graph, given, program=program, plan=plan)
        executable.launch_all()
        return executable.results()
