"""A pipeline compiled once per call signature and called in microseconds.

:class:`CompiledPipeline` is what ``Pipeline.compile()`` returns and what ``Pipeline.run``
calls through. For each new *signature* (per input: the kind of array, dtype, shape,
whether it is contiguous, the alignment of its address and its device; per parameter: the
type of its value; per ``out=`` array: its alignment) it plans, generates, compiles and
binds the program once and keeps it (an LRU of ``max_signatures``); a later call with
the same signature only checks the arguments, takes its outputs from the caller's
allocator and launches on the caller's stream. :attr:`CompiledPipeline.stats` says what
happened (hits, misses, plans, programs generated or read from the disk cache, compiler
runs, CUDA graphs captured and replayed).

Intermediate buffers are allocated once per signature and per stream (a *workspace*), so
a call allocates nothing but its outputs; two threads calling at once each get a
workspace of their own. On the GPU a program of several launches is captured into a CUDA
graph once it is called a second time on the same arrays and parameter values, and
replayed from then on (Qiao 2021, chapter 4: one launch instead of one per kernel).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from kfuse import config
from kfuse.errors import BindError, DtypeError, KfuseError, OutOfMemory, ShapeError
from kfuse.fusion.plan import FusionPlan
from kfuse.ir.expr import FLOAT32_ROUNDS_TO_INFINITY
from kfuse.ir.graph import Graph
from kfuse.log import LOG
from kfuse.runtime.backend import VECTOR_ALIGNMENT, CompiledBackend, LoadedProgram
from kfuse.runtime.binding import Bound, bind, dtype_name, param_value
from kfuse.runtime.launch import BoundLaunch, bound_launches_copy, call_slots
from kfuse.runtime.streams import StreamSchedule

DEFAULT_SIGNATURES = 64  # compiled signatures a pipeline keeps (least recently used go)
WORKSPACES_PER_SIGNATURE = 8  # streams (or concurrent host threads) with buffers kept
GRAPHS_PER_WORKSPACE = 4  # CUDA graphs kept per workspace (for as many sets of arrays)


@dataclass
class CacheStats:
    """What a compiled pipeline did: calls, and what its cache found or had to build."""

    calls: int = 0
    hits: int = 0  # calls whose signature was compiled already
    misses: int = 0  # calls that compiled a new signature
    plans: int = 0  # fusion plans searched
    generated: int = 0  # programs generated (code generation ran)
    stored: int = 0  # programs read from the disk cache instead
    compiles: int = 0  # compiler runs (NVRTC, the host C++ compiler); disk hits excluded
    evicted: int = 0  # signatures let go (least recently used)
    graph_captures: int = 0  # CUDA graphs captured
    graph_replays: int = 0  # calls that replayed a CUDA graph
    native: int = 0  # calls that took the C call path (kfuse.runtime.native)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __str__(self) -> str:
        return ", ".join(f"{name} {value}" for name, value in self.as_dict().items())


# -- arrays of the caller ------------------------------------------------------------------

class ArrayFacts:
    """What a call's array is: its family (``numpy``, ``cupy``, ``torch``), dtype name,
    shape, whether it is C-contiguous, its address and device (None: host memory), from
    its signature ``key`` (what :func:`describe` returns) and its address."""

    __slots__ = ("family", "dtype", "shape", "contiguous", "address", "device", "key")

    def __init__(self, key: tuple, address: int):
        self.family, self.dtype, self.shape, self.contiguous, _, self.device = key
        self.address = address
        self.key = key

    @property
    def alignment(self) -> int:
        """The largest power of two, at most :data:`VECTOR_ALIGNMENT`, dividing the address."""
        low = self.address & (VECTOR_ALIGNMENT - 1)
        return VECTOR_ALIGNMENT if low == 0 else low & -low


# An array's part of a call signature: (family, dtype name, shape, C-contiguous,
# _alignment_bit of its address, device). Describers return it with the address; a call makes one per array, so they are
# plain functions reading the library's cheapest attributes.
_LOW_BITS = VECTOR_ALIGNMENT - 1
_DTYPE_NAMES: dict[Any, str] = {}


def _dtype(dtype: Any, array: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES.setdefault(dtype, dtype_name(array))
    return name


def _alignment_bit(address: int, shape: tuple) -> int:
    """The lowest set bit of ``address`` below VECTOR_ALIGNMENT (0: aligned; scalars, read
    one element at a time, count as aligned)."""
    low = address & _LOW_BITS if shape else 0
    return low & -low


def _torch_key(array: Any) -> tuple[tuple, int]:
    device = array.device
    address = array.data_ptr()
    shape = tuple(array.shape)
    return ("torch", _dtype(array.dtype, array), shape, array.is_contiguous(),
            _alignment_bit(address, shape), device.index if device.type == "cuda" else None
            ), address


def _cupy_key(array: Any) -> tuple[tuple, int]:
    """(CuPy's own contiguity flag: reading ``flags`` makes an object per call.)"""
    data = array.data
    address = data.ptr
    shape = array.shape
    return ("cupy", _dtype(array.dtype, array), shape, array._c_contiguous,
            _alignment_bit(address, shape), data.device_id), address


def _numpy_key(array: Any) -> tuple[tuple, int]:
    address = array.__array_interface__["data"][0]
    shape = array.shape
    return ("numpy", _dtype(array.dtype, array), shape, array.flags.c_contiguous,
            _alignment_bit(address, shape), None), address


_DESCRIBERS: dict[type, Callable[[Any], tuple[tuple, int]]] = {}


def describer(array: Any) -> Callable[[Any], tuple[tuple, int]]:
    """The function giving the signature key and address of arrays of ``array``'s type
    (NumPy and CuPy arrays, PyTorch tensors), or a :class:`BindError`."""
    describe = _DESCRIBERS.get(type(array))
    if describe is None:
        module = type(array).__module__
        if module.startswith("torch") and hasattr(array, "data_ptr"):
            describe = _torch_key
        elif module.startswith("cupy") and hasattr(array, "data"):
            describe = _cupy_key
        elif isinstance(array, np.ndarray):
            describe = _numpy_key
        else:
            raise BindError(f"expected an array (NumPy, CuPy or PyTorch), got "
                            f"{type(array).__name__}")
        _DESCRIBERS[type(array)] = describe
        _NATIVE_KINDS[type(array)] = _DESCRIBER_KINDS[describe]  # (the C path's name for it)
    return describe


def facts_of(array: Any) -> ArrayFacts:
    """The :class:`ArrayFacts` of a NumPy or CuPy array or a PyTorch tensor."""
    return ArrayFacts(*describer(array)(array))


# -- one compiled signature ------------------------------------------------------------------

class Workspace:
    """The intermediate buffers and argument blocks of one signature on one stream: the
    blocks point at the buffers once; a call writes only its arrays' addresses and its
    parameter values (:func:`~kfuse.runtime.launch.call_slots`)."""

    def __init__(self, signature: Signature):
        allocate = signature.allocate
        made = {name: allocate(shape, dtype) for name, shape, dtype in signature.intermediates}
        self.buffers = {name: array for name, (array, _) in made.items()}
        self.launches = bound_launches_copy(signature.launches, signature.sizes)
        self.array_slots, self.param_slots = call_slots(
            self.launches, {name: address for name, (_, address) in made.items()},
            signature.external, signature.params)
        self.graphs: OrderedDict[tuple, Any] = OrderedDict()  # arrays and params -> graph
        self.sightings: OrderedDict[tuple, int] = OrderedDict()
        self.capture_stream: Any = None
        self.side: Any = None  # side streams and events, where the schedule has any


class Signature:
    """A program compiled and bound for one call signature: runs it on a call's arrays."""

    def __init__(self, owner: CompiledPipeline, bound: Bound, facts: dict[str, ArrayFacts],
                 loaded: LoadedProgram, launches: tuple[BoundLaunch, ...], family: str,
                 device: int | None, schedule: StreamSchedule | None = None):
        graph = owner.graph
        self.owner = owner
        self.arrays = owner.arrays
        self.schedule = schedule
        self.shapes = {name: fact.shape for name, fact in facts.items()}
        self.loaded = loaded
        self.launches = launches
        self.family = family  # of the outputs: "numpy" (on the GPU: copied back), "cupy", "torch"
        self.device = device
        self.sizes = bound.sizes
        copied = owner.copied(facts)
        self.copied = tuple((name, index) for index, name in enumerate(graph.inputs)
                            if name in copied)
        self.outputs = tuple((name, graph.shape_of(name, bound.sizes), graph.buffers[name].dtype)
                             for name in graph.outputs)
        self.allocate = owner.arrays.allocator(family, device)  # (shape, dtype) -> array, address
        self.current_stream = owner.arrays.stream_function(family, device)  # None: the host
        # (only what a launch reads, writes or fills: an operator fused into a kernel has
        # no buffer; Harris in one kernel would otherwise hold eight unused images a stream)
        used = {name for launch in launches for _, name in launch.arguments.buffer_slots} \
            | {name for launch in launches for name, _ in launch.fills}
        self.intermediates = tuple(
            (name, graph.shape_of(name, bound.sizes), buffer.dtype)
            for name, buffer in graph.buffers.items()
            if name in used and name not in graph.inputs and name not in graph.outputs)
        self.external = (*graph.inputs, *graph.outputs)  # a call's arrays, in this order
        self.params = tuple(graph.params)
        self.fills = any(launch.fills for launch in launches)
        self.spare: dict[Any, list[Workspace]] = {}  # stream -> free workspaces
        self.lock = threading.Lock()
        self.capturable = owner.graphs and owner.arrays.captures and (
            len(launches) + sum(len(launch.fills) for launch in launches) > 1)
        # The C call path takes this signature's calls where nothing is copied in or back.
        self.native_ready = not self.copied and not (owner.arrays.captures
                                                     and family == "numpy")
        self.native_workspaces: dict[Any, Any] = {}  # stream -> the C path's Workspace
        self.native_keys: list[tuple] = []  # its keys in the C path's table

    # -- workspaces ----------------------------------------------------------------------------
    def _acquire(self, stream: Any) -> Workspace:
        free = self.spare.get(stream)
        if free:
            try:
                return free.pop()  # atomic: two threads never take the same one
            except IndexError:
                pass
        workspace = Workspace(self)
        if self.schedule is not None and self.schedule.side_streams:
            workspace.side = self.arrays.side_streams(self.schedule.side_streams,
                                                      len(self.launches))
        return workspace

    def _release(self, stream: Any, workspace: Workspace) -> None:
        free = self.spare.get(stream)
        if free is None:
            with self.lock:
                free = self.spare.setdefault(stream, [])
                while len(self.spare) > WORKSPACES_PER_SIGNATURE:  # the oldest streams go
                    del self.spare[next(iter(self.spare))]
        free.append(workspace)

    # -- a call --------------------------------------------------------------------------------
    def __call__(self, given: Mapping[str, Any], addresses: list[int], params: tuple,
                 out: Mapping[str, Any], out_facts: Mapping[str, ArrayFacts]
                 ) -> dict[str, Any]:
        """Run on ``given``'s arrays, whose ``addresses`` (in the order of the pipeline's
        inputs) the call appends its outputs' to; ``params`` in the pipeline's order."""
        arrays = self.arrays
        if self.device is not None and arrays.current_device() != self.device:
            with arrays.on_device(self.device):
                return self(given, addresses, params, out, out_facts)
        copies = {}  # kept until the launches are enqueued
        for name, index in self.copied:  # not contiguous, or host memory for the GPU
            copy = arrays.contiguous(given[name], self.device)
            copies[name] = copy
            addresses[index] = arrays.address(copy)
        results = {}
        for name, shape, dtype in self.outputs:
            array = out.get(name) if out else None
            if array is None:
                array, address = self.allocate(shape, dtype)
            else:
                self._check_out(name, out_facts[name], shape, dtype)
                address = out_facts[name].address
            results[name] = array
            addresses.append(address)
        stream = self.current_stream() if self.current_stream is not None else None
        workspace = self._acquire(stream)
        try:
            self.native_launch(workspace, results, addresses, params, stream,
                               {**workspace.buffers, **given, **copies, **results}
                               if config.current().check_writes else None)
        finally:
            self._release(stream, workspace)
        if self.family == "numpy" and arrays.captures:  # computed on the GPU: copied back
            return {name: arrays.to_host(array) for name, array in results.items()}
        return results

    def native_launch(self, workspace: Workspace, results: dict[str, Any], addresses: list[int],
                      params: tuple, stream: Any, buffers: Mapping[str, Any] | None = None
                      ) -> None:
        """Launch on ``workspace`` (held by this call): write the call's addresses and
        parameters into its argument blocks, then replay a CUDA graph or launch (the C
        call path's calls come here for what it leaves to Python). ``buffers``: every
        array the kernels get, by name (checked launches: :mod:`kfuse.config`'s
        ``check_writes``)."""
        for slot, index in workspace.array_slots:
            slot.value = addresses[index]
        for slot, index in workspace.param_slots:
            slot.value = params[index]
        if buffers is not None:
            self.loaded.enqueue(workspace.launches, buffers, stream, self.schedule,
                                workspace.side)
        elif not (self.capturable and self._replayed(workspace, results, addresses, params,
                                                      stream)):
            self.loaded.enqueue(workspace.launches, self._fill_buffers(workspace, results),
                                stream, self.schedule, workspace.side)

    def launch_aside(self, results: dict[str, Any], addresses: list[int], params: tuple,
                     stream: Any) -> None:
        """Launch a call of the C path whose workspace another thread's call holds, on a
        workspace of its own."""
        workspace = self._acquire(stream)
        try:
            self.native_launch(workspace, results, addresses, params, stream)
        finally:
            self._release(stream, workspace)

    def native_workspace(self, stream: Any) -> Any:
        """The C call path's workspace for ``stream`` (made at its first call there)."""
        from kfuse.runtime import native

        workspace = self._acquire(stream)  # its own: never given back to Python's calls
        launch, graph_launch = self.loaded.native_launch()
        loaded = self.loaded
        made = native.module().Workspace(
            workspace, workspace.graphs,
            not self.fills and (self.schedule is None or self.schedule.side_streams == 0),
            launch, graph_launch,
            [(loaded.native_function(bound), *bound.shape, bound.arguments.address)
             for bound in workspace.launches],
            [(ctypes.addressof(slot), index) for slot, index in workspace.array_slots],
            [(ctypes.addressof(slot), index, _SLOT_KINDS.get(type(slot), "x"))
             for slot, index in workspace.param_slots])
        self.native_workspaces[stream] = made
        while len(self.native_workspaces) > WORKSPACES_PER_SIGNATURE:  # the oldest go
            del self.native_workspaces[next(iter(self.native_workspaces))]
        return made

    def launch_failed(self, index: int, status: int) -> None:
        """Raise the error of the C call path's launch ``index`` (-1: a graph's replay)."""
        raise self.loaded.launch_error(self.launches[index] if index >= 0 else None, status)

    def _fill_buffers(self, workspace: Workspace, results: dict[str, Any]) -> Mapping[str, Any]:
        """The buffers by name that launches set to a value first (none: an empty dict)."""
        return {**workspace.buffers, **results} if self.fills else {}

    def _replayed(self, workspace: Workspace, results: dict[str, Any], addresses: list[int],
                  params: tuple, stream: Any) -> bool:
        """Whether the call ran as a CUDA graph: replayed where one was captured for these
        arrays and parameters, captured (and launched) where they are seen a second time."""
        key = (tuple(addresses), params)
        graph = workspace.graphs.get(key)
        stats = self.owner.stats
        if graph is None:
            seen = workspace.sightings.pop(key, 0) + 1
            workspace.sightings[key] = seen
            while len(workspace.sightings) > 4 * GRAPHS_PER_WORKSPACE:
                workspace.sightings.popitem(last=False)
            if seen < 2:
                return False
            buffers = self._fill_buffers(workspace, results)
            graph = self.arrays.capture(
                workspace, lambda capture: self.loaded.enqueue(
                    workspace.launches, buffers, capture, self.schedule, workspace.side))
            workspace.graphs[key] = graph
            while len(workspace.graphs) > GRAPHS_PER_WORKSPACE:
                workspace.graphs.popitem(last=False)
            stats.graph_captures += 1
        else:
            workspace.graphs.move_to_end(key)
        self.arrays.replay(graph, stream)
        stats.graph_replays += 1
        return True

    def _check_out(self, name: str, facts: ArrayFacts, shape: tuple[int, ...], dtype: str
                   ) -> None:
        if tuple(facts.shape) != tuple(shape):
            raise ShapeError(f"out= array for '{name}' has shape {tuple(facts.shape)}; the "
                             f"output has shape {tuple(shape)}")
        if facts.dtype != dtype:
            raise DtypeError(f"out= array for '{name}' is {facts.dtype}; the output is {dtype}")
        self.arrays.check_out(name, facts, self.device)


# -- the compiled pipeline --------------------------------------------------------------------

class CompiledPipeline:
    """A pipeline compiled for one backend and plan: call it with the pipeline's inputs and
    parameters by name (and ``out=``: arrays to write outputs into, by name, or one array
    where the pipeline has one output); it returns the outputs by name.

    ``native``: calls whose signature is compiled take the C call path
    (:mod:`kfuse.runtime.native`) where it is built; False keeps every call in Python."""

    def __init__(self, graph: Graph | Callable[[], Graph], backend: str = "auto",
                 plan: Any = "auto", *, max_signatures: int = DEFAULT_SIGNATURES,
                 graphs: bool = True, streams: bool | str = "auto", native: bool = True):
        from kfuse.runtime import check_plan_argument, get_backend

        check_plan_argument(plan)
        if not isinstance(max_signatures, int) or max_signatures < 1:
            raise BindError(f"max_signatures must be a positive integer, got {max_signatures!r}")
        self._graph_source = graph
        self.backend = get_backend(backend)
        self.plan = plan
        self.max_signatures = max_signatures
        self.graphs = bool(graphs)
        if streams not in (True, False, "auto"):
            raise BindError(f"streams must be 'auto', True or False, got {streams!r}")
        self.streams = streams
        self.stats = CacheStats()
        self._signatures: OrderedDict[tuple, Signature] = OrderedDict()
        self._lock = threading.RLock()
        self.arrays = self.backend.call_arrays()
        self._names: tuple = (None, set(), ())  # (graph, call names, parameters): per graph
        self.native = bool(native) and self.backend.name != "numpy"
        self._dispatch: Any = None  # the C call path's dispatcher, for one graph
        self._dispatch_graph: Graph | None = None
        self._hot: dict[tuple, Any] = {}  # its signatures, by its keys
        self._options = {"max_signatures": max_signatures, "graphs": graphs,
                         "streams": streams, "native": native}
        # (the graph it was worked out for, (the axis collapse, the pipeline it runs) or None)
        self._merge: tuple[Graph | None, Any] = (None, None)

    @property
    def graph(self) -> Graph:
        """The pipeline's IR graph (built again only after the pipeline changed)."""
        source = self._graph_source
        return source if isinstance(source, Graph) else source()

    def cache_info(self) -> dict[str, int]:
        """The cache statistics (:class:`CacheStats`) and how many signatures are kept."""
        merged = self._merged(self.graph)
        kept = len(self._signatures) + (len(merged[1]._signatures) if merged else 0)
        return {**self.stats.as_dict(), "signatures": kept}

    def clear(self) -> None:
        """Forget every compiled signature (the disk caches stay)."""
        with self._lock:
            self._signatures.clear()
            self._hot.clear()
            merged = self._merge[1]
            if merged is not None:
                merged[1].clear()

    def _merged(self, graph: Graph) -> tuple[Any, CompiledPipeline] | None:
        """(the :class:`~kfuse.ir.collapse.AxisCollapse` of the graph, the compiled pipeline
        of its merged graph) where calls run merged: adjacent axes every operator reads at
        its own point are one (a normalisation over (batch, seq, hidden) is a matrix
        pipeline) and the plan is the search's or was made for the merged graph; else None
        (worked out once per graph)."""
        if self._merge[0] is graph:
            return self._merge[1]
        from kfuse.ir.collapse import axis_collapse

        merged = None
        collapse = axis_collapse(graph) if self.backend.name != "numpy" else None
        if collapse is not None and (isinstance(self.plan, str) or
                                     self.plan.graph.fingerprint == collapse.graph.fingerprint):
            inner = CompiledPipeline(collapse.graph, self.backend.name, self.plan,
                                     **self._options)
            inner.stats = self.stats  # (one count of what calls built and reused)
            merged = (collapse, inner)
        self._merge = (graph, merged)
        return merged

    def __repr__(self) -> str:
        return (f"CompiledPipeline({self.graph.name!r}, backend={self.backend.name!r}, "
                f"signatures={len(self._signatures)}, {self.stats})")

    def __call__(self, out: Any = None, **given: Any) -> dict[str, Any]:
        try:
            if out is None and self._dispatch is not None \
                    and not config.current().check_writes:
                done = self._dispatch(given)  # None: the C path leaves the call to Python
                if done is not None:
                    return done
            return self._call(out, given)
        except MemoryError as error:  # the host's, or CuPy's OutOfMemoryError (a subclass)
            raise out_of_memory(self.graph, given, error) from None

    def _merged_call(self, merged: tuple[Any, CompiledPipeline], out: Any,
                     given: dict[str, Any]) -> dict[str, Any] | None:
        """The call on the merged graph (inputs reshaped, outputs reshaped back), or None
        where it runs unmerged: an ``out=`` array that a reshape would copy, or arguments
        the unmerged call rejects by name (its errors name the pipeline's own axes)."""
        collapse, inner = merged
        outputs = collapse.original.outputs
        outs = None
        if out is not None:
            outs = out if isinstance(out, Mapping) else \
                ({outputs[0]: out} if len(outputs) == 1 else None)
            if outs is None or not set(outs) <= set(outputs):
                return None
            outs = dict(outs)
        try:
            arguments = collapse.inputs(given)
            reshaped = None if outs is None else collapse.out_arrays(outs)
            if outs is not None and reshaped is None:
                return None
            results = inner(out=reshaped, **arguments)
        except (KeyError, AttributeError, TypeError, ValueError, KfuseError):
            bind(collapse.original, given)  # (raises what the pipeline's own axes say)
            raise
        shaped = collapse.outputs(results, given)
        if outs:
            shaped.update(outs)  # (the caller's own arrays)
        return shaped

    def _call(self, out: Any, given: dict[str, Any]) -> dict[str, Any]:
        graph = self.graph
        # (the C path above never reaches here for a signature it holds; a merged graph's
        # calls come here and go on to its own compiled pipeline, and its C path)
        merged = self._merged(graph)
        if merged is not None:
            done = self._merged_call(merged, out, given)
            if done is not None:
                return done
        self.stats.calls += 1
        if self.backend.name == "numpy":  # the reference interprets the IR: nothing to keep
            if out is not None:
                raise BindError("out= needs a compiled backend (cuda or cpu), not numpy")
            return self.backend.run(graph, given, plan=None)
        if self._names[0] is not graph:
            self._names = (graph, {*graph.inputs, *graph.params}, tuple(graph.params.items()),
                           graph.inputs, graph.fingerprint)
        _, names, declared, inputs, fingerprint = self._names
        if given.keys() != names:
            bind(graph, given)  # raises the error that names what is missing or unknown
        keys: list[Any] = [fingerprint]
        addresses: list[int] = []
        for name in inputs:
            value = given[name]
            describe = _DESCRIBERS.get(type(value))
            if describe is None:
                try:
                    describe = describer(value)
                except BindError:
                    bind(graph, given)  # names the input
                    raise
            array_key, address = describe(value)
            keys.append(array_key)
            addresses.append(address)
        params = []
        for name, dtype in declared:
            value = given[name]
            params.append(param_value(name, dtype, value))
            keys.append(type(value))
        if out is None:
            out, out_facts = {}, {}
        else:
            out = _out_arrays(graph, out)
            out_facts = {name: facts_of(array) for name, array in out.items()}
            keys.extend((name, fact.alignment) for name, fact in out_facts.items())
        key = tuple(keys)
        signature = self._signatures.get(key)
        if signature is None:
            with self._lock:
                signature = self._signatures.get(key)
                if signature is None:
                    facts = {name: ArrayFacts(array_key, address) for name, array_key, address
                             in zip(inputs, keys[1:len(inputs) + 1], addresses,
                                        strict=True)}
                    started = time.perf_counter()
                    signature = self._compile(graph, given, facts, out_facts)
                    self._signatures[key] = signature
                    self.stats.misses += 1
                    LOG.info("pipeline '%s' on %s: a new signature (%s), %d launches, ready "
                             "in %.3f s (%s)", graph.name, self.backend.name, ", ".join(
                                 f"{name} {fact.dtype}{list(fact.shape)}"
                                 for name, fact in facts.items()), len(signature.launches),
                             time.perf_counter() - started, self.stats)
                    while len(self._signatures) > self.max_signatures:
                        _, evicted = self._signatures.popitem(last=False)
                        for native_key in evicted.native_keys:
                            self._hot.pop(native_key, None)
                        self.stats.evicted += 1
                else:
                    self.stats.hits += 1
        else:
            self.stats.hits += 1
            if len(self._signatures) > 1:
                try:
                    self._signatures.move_to_end(key)
                except KeyError:  # let go by another thread meanwhile: it still runs
                    pass
        results = signature(given, addresses, tuple(params), out, out_facts)
        if self.native and not out and signature.native_ready \
                and not config.current().check_writes:
            self._make_native(graph, given, key, signature)
        return results

    # -- the C call path ---------------------------------------------------------------------
    def _make_native(self, graph: Graph, given: Mapping[str, Any], key: tuple,
                     signature: Signature) -> None:
        """Let the C call path take later calls like this one (of ``signature``)."""
        from kfuse.runtime import native

        built = native.module()
        if built is None:
            self.native = False
            return
        with self._lock:
            dispatch = self._dispatch
            if dispatch is None or self._dispatch_graph is not graph:
                self._hot.clear()
                source = self._graph_source
                dispatch = built.Dispatcher(
                    None if isinstance(source, Graph) else source, graph, tuple(graph.inputs),
                    tuple((name, _PARAM_CHECKS.get(dtype, "x"))
                          for name, dtype in graph.params.items()),
                    _NATIVE_KINDS, self._hot, FLOAT32_ROUNDS_TO_INFINITY)
                self._dispatch, self._dispatch_graph = dispatch, graph
            native_key = dispatch.key(given)
            if native_key is None or native_key in self._hot:
                return
            arrays, device = self.arrays, signature.device
            self._hot[native_key] = built.Hot(
                signature, self.stats, signature.outputs, signature.allocate,
                arrays.current_device if device is not None else None,
                -1 if device is None else device,
                signature.current_stream, signature.native_workspaces,
                self._signatures, key, signature.capturable)
            signature.native_keys.append(native_key)

    # -- a new signature -------------------------------------------------------------------------
    def _compile(self, graph: Graph, given: Mapping[str, Any], facts: dict[str, ArrayFacts],
                 out_facts: Mapping[str, ArrayFacts]) -> Signature:
        from kfuse.cache import compiler_runs

        bound = bind(graph, given)
        family, device = self.arrays.placement(facts)
        runs = compiler_runs()
        with self.arrays.on_device(device):
            copied = self.copied(facts)
            alignment = min([VECTOR_ALIGNMENT,
                             *(fact.alignment for name, fact in facts.items()
                               if graph.buffers[name].ndim and name not in copied),
                             *(fact.alignment for fact in out_facts.values())])
            program = self._program(graph, bound, alignment)
            loaded = self.backend.executable_class.loaded_class.of(program)
            launches = loaded.bind(bound.sizes)
            schedule = self._schedule(graph, bound, program, loaded, launches)
        self.stats.compiles += compiler_runs() - runs
        return Signature(self, bound, facts, loaded, launches, family, device, schedule)

    def _schedule(self, graph: Graph, bound: Bound, program: Any, loaded: Any,
                  launches: tuple[BoundLaunch, ...]) -> StreamSchedule | None:
        """The streams of the program's launches on the GPU (the wave model's choice for
        kernels with no path between them), None on the host."""
        if not self.arrays.captures or len(launches) < 2:  # the host has no streams
            return None
        from kfuse.model.device import current_profile
        from kfuse.runtime.streams import kernel_shape, one_stream, schedule

        if self.streams is False:
            return one_stream(program)
        profile = current_profile()

        def shape_of(index: int, spec: Any) -> Any:
            function = loaded.functions[spec.symbol]
            return kernel_shape(graph, spec, bound.sizes, profile, launches[index].grid,
                                function.num_regs, function.shared_size_bytes)
        return schedule(program, shape_of, profile, always=self.streams is True)

    def explain(self) -> str:
        """For each compiled signature: its input shapes and on which streams its kernels
        run, and why (the wave model, :mod:`kfuse.model.waves`)."""
        lines = []
        merged = self._merge[1]
        if merged is not None:
            collapse, inner = merged
            lines.append("axes merged (every operator reads them at its own point): " + ", ".join(
                " x ".join(run) for run in collapse.merged))
            lines += inner.explain().splitlines()
        for signature in list(self._signatures.values()):
            shapes = ", ".join(f"{name} {'x'.join(map(str, shape)) or 'scalar'}"
                               for name, shape in signature.shapes.items())
            lines.append(f"{shapes}: {len(signature.launches)} launch(es)")
            if signature.schedule is not None:
                lines += ["  " + line for line in signature.schedule.explain().splitlines()]
        return "\n".join(lines) or "nothing compiled yet"

    def copied(self, facts: Mapping[str, ArrayFacts]) -> list[str]:
        """The inputs a call copies: not contiguous, or in host memory for the GPU."""
        return [name for name, fact in facts.items()
                if not fact.contiguous or self.arrays.copies_in(fact)]

    def _program(self, graph: Graph, bound: Bound, alignment: int) -> Any:
        """The program for ``bound``'s sizes and ``alignment``: from the disk cache, or
        planned and generated (and stored there)."""
        from kfuse.codegen import generate
        from kfuse.codegen.generate import generation_switches
        from kfuse.runtime import planned
        from kfuse.runtime.program_store import load_program, program_key, store_program

        backend: CompiledBackend = self.backend  # type: ignore[assignment]
        fixed = backend.fixed_sizes(bound)
        march = backend.marches_along_z(graph, bound.sizes)
        wide = bound.wide_index(graph)
        plan = self.plan
        if isinstance(plan, FusionPlan):
            plan = planned(graph, bound.sizes, plan, backend.name)
            asked: Any = ("plan", plan.kernel_groups)
        elif plan == "auto":
            from kfuse.model.device import current_profile
            asked = ("auto", tuple(sorted(bound.sizes.items())), current_profile())
        else:
            asked = ("unfused",)
        key = program_key(backend.name, graph.fingerprint, asked, fixed, wide, alignment,
                          march, generation_switches())
        program = load_program(key)
        if program is not None:
            self.stats.stored += 1
            return program
        if plan == "auto":
            plan = planned(graph, bound.sizes, "auto", backend.name,
                           on_search=self._count_plan)
        groups = plan.kernel_groups if isinstance(plan, FusionPlan) else None
        program = generate(graph, groups, wide_index=wide, fixed_sizes=fixed, march=march,
                           array_alignment=alignment)
        self.stats.generated += 1
        store_program(key, program)
        return program

    def _count_plan(self) -> None:
        self.stats.plans += 1


def out_of_memory(graph: Graph, given: Mapping[str, Any], error: BaseException) -> OutOfMemory:
    """The named error for a call whose arrays or copies did not fit in memory: the bytes
    of its inputs as C-order arrays, and the inputs that are views with a stride of 0
    (broadcast), which a copy makes whole."""
    total, views = 0, []
    for name in graph.inputs:
        array = given.get(name)
        shape, itemsize = getattr(array, "shape", None), getattr(
            getattr(array, "dtype", None), "itemsize", None)
        if shape is None or not isinstance(itemsize, int):
            continue
        total += int(np.prod(shape, dtype=np.float64)) * itemsize
        strides = getattr(array, "strides", None)
        if callable(strides):  # a PyTorch tensor's stride()
            strides = getattr(array, "stride", lambda: None)()
        if strides and 0 in tuple(strides) and len(shape) and int(np.prod(shape)) > 1:
            views.append(f"'{name}' (shape {tuple(shape)}, strides {tuple(strides)})")
    hint = (f"; {', '.join(views)} {'is a view' if len(views) == 1 else 'are views'} with a "
            "stride of 0 (np.broadcast_to), which kfuse copies into a whole C-order array: "
            "pass the array before broadcasting and broadcast inside the pipeline "
            "(x.at(..., dims=...))") if views else ""
    return OutOfMemory(f"pipeline '{graph.name}': its arrays do not fit in memory (the inputs "
                       f"alone are {total / 2**30:.1f} GiB as C-order arrays, outputs besides)"
                       f"{hint} ({type(error).__name__}: {str(error)[:120]})")


def _out_arrays(graph: Graph, out: Any) -> dict[str, Any]:
    """``out=`` as arrays by output name (one array: the pipeline's one output)."""
    if out is None:
        return {}
    if not isinstance(out, Mapping):
        if len(graph.outputs) != 1:
            raise BindError(f"out= takes a dict of arrays by output name: pipeline "
                            f"'{graph.name}' has outputs {', '.join(graph.outputs)}")
        return {graph.outputs[0]: out}
    unknown = sorted(set(out) - set(graph.outputs))
    if unknown:
        raise BindError(f"out= names {', '.join(repr(u) for u in unknown)}, not an output of "
                        f"pipeline '{graph.name}' (outputs: {', '.join(graph.outputs)})")
    return dict(out)


# The C call path's tables: how a runtime parameter of each dtype is checked, the kind of
# each array type (see dispatch.cpp), the C type of each argument slot.
_PARAM_CHECKS = {"float32": "f", "float64": "d", "int32": "i", "int64": "q", "bool": "?"}
_DESCRIBER_KINDS = {_cupy_key: 1, _numpy_key: 2, _torch_key: 3}
_NATIVE_KINDS: dict[type, int] = {}
_SLOT_KINDS = {ctypes.c_float: "f", ctypes.c_double: "d", ctypes.c_int32: "i",
               ctypes.c_int64: "q", ctypes.c_bool: "?"}

__all__ = ["ArrayFacts", "CacheStats", "CompiledPipeline", "facts_of"]
