"""Pipelines and symbolic arrays: what the user writes.

A :class:`Pipeline` collects named inputs, runtime parameters and operators; each
operator returns a new symbolic :class:`Array`. Sizes are symbols unified as operators
combine arrays and bound when the pipeline is called.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from kfuse.dsl.functions import boundary_of
from kfuse.errors import ChunkingError, DslError, DtypeError, FusionError, ShapeError
from kfuse.ir.expr import (
    HALF_DTYPES,
    INT_DTYPES,
    SMALL_INT_DTYPES,
    Boundary,
    Coord,
    Expr,
    Load,
    Param,
    as_expr,
    is_integer_scalar,
    normalize_dtype,
    register_converter,
    representable,
    resolve_weak_constants,
    transform,
)
from kfuse.ir.fold import fold_reductions
from kfuse.ir.graph import Buffer, Graph, Kernel, Reduction, fixed_size
from kfuse.ir.sizes import base_symbols, derived_size, describe_size, scaled_size
from kfuse.log import LOG
from kfuse.user_line import UserLine, where_of


class Array:
    """A symbolic array of a pipeline: an input or the result of an operator.

    Arithmetic on arrays builds expressions read at the current point; ``x.at(dy, dx)``
    reads at a constant offset (a stencil tap) with an optional boundary mode.
    """

    def __init__(self, pipeline: Pipeline, name: str, dtype: str, shape: tuple[str, ...]):
        self.pipeline = pipeline
        self.name = name
        self.dtype = dtype
        self._shape = shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def shape(self) -> tuple[str, ...]:
        """Size symbols (bound to numbers when the pipeline runs)."""
        return tuple(self.pipeline._find(s) for s in self._shape)

    def at(self, *offsets: int, boundary: object = None, dims: Sequence[int] | None = None,
           down: int | Sequence[int] | None = None, up: int | Sequence[int] | None = None,
           index: Mapping[int, object] | None = None) -> Load:
        """Read at constant integer ``offsets`` from the current point, one per axis.

        ``boundary`` (clamp, mirror, repeat, constant(v)) answers reads outside the array;
        left out, the operator's default applies (clamp for a read at another resolution).
        ``dims`` says which iteration axis indexes each array axis (for broadcast reads);
        left out, the identity. ``down=f`` reads at ``f * p + offset`` (the operator's
        points are a grid ``f`` times coarser: a downsampling read), ``up=f`` at
        ``p // f + offset`` (``f`` times finer: upsampling); one factor for every axis, or
        one per axis (1: that axis at the point's resolution). ``index={axis: value}`` reads
        an axis at a computed integer ``value`` plus its offset (a data-dependent read: a
        lookup table, a level chosen per point), through the boundary mode; the array's
        other axes are the iteration space's, in order (or as ``dims`` says, -1 for each
        computed axis).
        """
        if len(offsets) == 1 and isinstance(offsets[0], (tuple, list)):
            offsets = tuple(offsets[0])
        if len(offsets) != self.ndim:
            raise DslError(f"'{self.name}' is {self.ndim}-D: give {self.ndim} offsets, "
                           f"got {len(offsets)}")
        for offset in offsets:
            if not is_integer_scalar(offset):
                raise DslError(f"offsets must be constant integers, got {offset!r}")
        if dims is None and self.ndim == 0:
            dims = ()
        if dims is not None and len(tuple(dims)) != self.ndim:
            raise DslError(f"'{self.name}' is {self.ndim}-D: dims needs {self.ndim} entries")
        bound = None if boundary is None else boundary_of(boundary)
        indices = _read_indices(self.name, self.ndim, index)
        if dims is not None and not all(is_integer_scalar(d) and (
                d >= 0 or indices is not None and indices[axis] is not None)
                for axis, d in enumerate(dims)):
            raise DslError(f"dims must be axis numbers of the iteration space, got {dims!r}")
        dims = None if dims is None else tuple(int(d) for d in dims)
        if indices is not None:
            following = iter(range(self.ndim))
            dims = tuple(-1 if computed is not None else (next(following) if dims is None
                                                         else dims[axis])
                         for axis, computed in enumerate(indices))
        scales = _read_scales(self.name, self.ndim, down, up)
        if scales is not None and indices is not None and any(
                scale != (1, 1) and computed is not None
                for scale, computed in zip(scales, indices, strict=True)):
            raise DslError(f"'{self.name}': an axis read at a computed index= is not also "
                           "read down= or up=")
        return Load(self.name, self.dtype, tuple(int(o) for o in offsets), dims, bound,
                    self.pipeline, scales, indices)

    def expr(self) -> Load:
        """This array read at the current point."""
        return Load(self.name, self.dtype, (0,) * self.ndim, None if self.ndim else (),
                    None, self.pipeline)

    def __repr__(self) -> str:
        return f"Array({self.name!r}, {self.dtype}, shape={self.shape})"



def _read_scales(name: str, ndim: int, down: object, up: object
                 ) -> tuple[tuple[int, int], ...] | None:
    """Per axis (numerator, denominator) of a read's index from ``x.at``'s ``down`` and
    ``up`` factors (None: not scaled)."""
    def factors(value: object, word: str) -> tuple[int, ...]:
        if value is None:
            return (1,) * ndim
        listed = tuple(value) if isinstance(value, (tuple, list)) else (value,) * ndim
        if len(listed) != ndim or not all(is_integer_scalar(f) and f >= 1 for f in listed):
            raise DslError(f"'{name}' is {ndim}-D: {word}= takes a whole factor >= 1, or one "
                           f"per axis, got {value!r}")
        return tuple(int(f) for f in listed)

    downs, ups = factors(down, "down"), factors(up, "up")
    if any(d > 1 and u > 1 for d, u in zip(downs, ups, strict=True)):
        raise DslError(f"'{name}': an axis is read either down= or up=, not both")
    scales = tuple((d, u) for d, u in zip(downs, ups, strict=True))
    return None if all(scale == (1, 1) for scale in scales) else scales


def _read_indices(name: str, ndim: int, index: object) -> tuple[Expr | None, ...] | None:
    """Per axis the integer expression ``x.at``'s ``index=`` reads it at (None: the
    point's coordinate)."""
    if index is None:
        return None
    if not isinstance(index, Mapping) or not index:
        raise DslError(f"'{name}': index= takes {{axis: integer expression}}, got {index!r}")
    indices: list[Expr | None] = [None] * ndim
    for axis, value in index.items():
        if not is_integer_scalar(axis) or not -ndim <= axis < ndim:
            raise DslError(f"'{name}' is {ndim}-D: index= names axis {axis!r}")
        expr = as_expr(value)
        if expr.dtype not in INT_DTYPES:
            raise DtypeError(f"'{name}': the index of axis {axis} must be an integer "
                             f"expression, got {expr.dtype} (kf.astype(v, 'int32') "
                             "truncates, kf.floor first rounds down)")
        indices[int(axis) % ndim] = expr
    return tuple(indices)


# Arithmetic on an array is arithmetic on the array read at the current point.
_ARITHMETIC = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
               "__truediv__", "__rtruediv__", "__pow__", "__rpow__", "__lt__", "__le__",
               "__gt__", "__ge__", "__eq__", "__ne__", "__and__", "__rand__", "__or__",
               "__ror__", "__neg__", "__pos__", "__invert__", "__abs__", "__floordiv__",
               "__rfloordiv__", "__mod__", "__rmod__")


def _forward(method: str):
    def forwarded(self: Any, *args: Any) -> Expr:
        return getattr(self.expr(), method)(*args)
    forwarded.__name__ = method
    return forwarded


def _no_truth_value(self: Any) -> bool:
    raise DslError("a kfuse array has no truth value at trace time")


def forward_arithmetic(cls: type) -> type:
    """Give ``cls`` (anything with ``expr()``: an array, a transposed matrix) kfuse's
    operators on its expression at the current point, ``==`` and ``!=`` included (so it
    hashes by identity), no truth value, and NumPy scalars on the left deferring to them."""
    for method in _ARITHMETIC:
        setattr(cls, method, _forward(method))
    cls.__bool__ = _no_truth_value
    cls.__hash__ = object.__hash__
    cls.__array_ufunc__ = None
    return cls


forward_arithmetic(Array)

register_converter(lambda value: value.expr() if isinstance(value, Array) else None)


def _check_border_value(boundary: Boundary, load: Load, operator: str,
                        where: str | None) -> None:
    """Refuse a constant border that the array's dtype cannot hold (1e10 or inf for int32):
    the reference would overflow where the generated code wraps around."""
    if boundary.mode == "constant" and not representable(boundary.value, load.dtype):
        raise DtypeError(f"the constant border {boundary.value:g} of '{load.buffer}' is not "
                         f"representable in {load.dtype}", operator=operator, where=where)


def _size_symbol(name: str, axis: int, size: object) -> str:
    """The size symbol of one axis of a declared input: a name, or a fixed size as digits."""
    if is_integer_scalar(size) or isinstance(size, str) and re.fullmatch(r"\s*[+-]?\d+\s*",
                                                                          size):
        number = int(size)
        if number <= 0:
            raise ShapeError(f"input '{name}': axis {axis} must have a positive size, got "
                             f"{number}")
        return str(number)
    if not isinstance(size, str) or not re.fullmatch(r"[^\W\d][\w.]*", size):
        raise DslError(f"input '{name}': axis {axis} needs a size symbol (a name) or a "
                       f"positive integer, got {size!r}")
    return size


COMPILED_RUNS = 16  # compiled pipelines run() keeps per pipeline (backends x plans)
# axes an array may have: the numpy backend runs any of them; compiled kernels take up to
# three, after adjacent axes every operator reads at its own point are merged
# (kfuse.ir.collapse: an NCHW activation's (H, W) are one axis of pixels)
MAX_AXES = 6

# The stages after the DSL (fusing, planning, compiling, running) as a Pipeline calls them:
# kfuse.driver installs itself here when kfuse is imported, so that the DSL imports none of
# them (it builds graphs; dependencies run one way).
_DRIVERS: list[Any] = []


def install_driver(driver: Any) -> None:
    """Make ``driver`` (a module with ``fuse``, ``plan`` and ``compile``) what pipelines
    call to fuse, plan, compile and run (:mod:`kfuse.driver`)."""
    _DRIVERS[:] = [driver]


def _driver() -> Any:
    return _DRIVERS[0]



def is_dask_array(value: Any) -> bool:
    """Whether ``value`` is a :class:`dask.array.Array` (without importing Dask)."""
    return type(value).__module__.startswith("dask.") and hasattr(value, "chunks")

class Pipeline:
    """A named pipeline of operators with named inputs, parameters and outputs."""

    def __init__(self, name: str, *, names_from_source: bool = True):
        """``names_from_source``: an operator without ``name=`` is named after the variable
        its line assigns (``dx = kf.local(...)`` gives ``dx``); False names it by its kind
        alone (``point``, ``point_2``), the same whether or not Python can read the source
        (``python -c``, ``exec``, a traced function)."""
        if not isinstance(name, str) or not name.isidentifier():
            raise DslError(f"pipeline name must be an identifier, got {name!r}")
        self.name = name
        self.names_from_source = names_from_source
        self._inputs: dict[str, Array] = {}
        self._params: dict[str, str] = {}
        self._arrays: dict[str, Array] = {}
        self._kernels: list[Kernel] = []
        self._outputs: list[str] = []
        self._parent: dict[str, str] = {}
        self._built: tuple[tuple, Graph] | None = None  # (version, graph)
        self._runs: dict[tuple, tuple[Any, Any]] = {}  # (backend, plan) -> (plan, compiled)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its compiled runs (they hold handles that do not pickle; a
        process that unpickles the pipeline compiles again, as Dask's workers do)."""
        return {**self.__dict__, "_runs": {}}

    # -- declarations ----------------------------------------------------------------------
    def input(self, name: str, ndim: int | None = None, dtype: object = "float32",
              shape: Sequence[str | int] | None = None) -> Array:
        """Declare an input array of ``ndim`` dimensions, or of ``shape``: per axis a named
        size symbol (shared by the arrays that must agree in it) or a fixed positive size,
        which the array given at run time must have."""
        self._check_new_name(name)
        if shape is None:
            if not isinstance(ndim, numbers.Integral) or isinstance(ndim, bool) \
                    or not 0 <= ndim <= MAX_AXES:
                raise DslError(f"input '{name}': give ndim (an integer, 0 to {MAX_AXES}) or "
                               f"shape, got ndim={ndim!r}")
            shape = tuple(f"{name}.{axis}" for axis in range(int(ndim)))  # kfuse's own
        elif isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise DslError(f"input '{name}': shape must be a tuple of sizes, got {shape!r}")
        else:
            shape = tuple(_size_symbol(name, axis, size) for axis, size in enumerate(shape))
        if ndim is not None and len(shape) != ndim:
            raise DslError(f"input '{name}': ndim={ndim} but shape has {len(shape)} sizes")
        if len(shape) > MAX_AXES:
            raise DslError(f"input '{name}': at most {MAX_AXES} dimensions are supported")
        array = Array(self, name, normalize_dtype(dtype), shape)
        self._inputs[name] = array
        self._arrays[name] = array
        return array

    def param(self, name: str, dtype: object = "float32") -> Param:
        """Declare a runtime scalar parameter, given by name when the pipeline runs."""
        self._check_new_name(name)
        self._params[name] = normalize_dtype(dtype)
        return Param(name, self._params[name])

    def output(self, *arrays: Array) -> None:
        """Mark arrays as outputs of the pipeline (returned by name when it runs)."""
        for array in arrays:
            if not isinstance(array, Array) or array.pipeline is not self:
                raise DslError("output() takes arrays of this pipeline")
            if array.name in self._inputs:
                raise DslError(f"'{array.name}' is an input: an output must be computed by an "
                               f"operator (kf.point({array.name}) copies it)")
            if array.name not in self._outputs:
                self._outputs.append(array.name)

    def _check_new_name(self, name: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise DslError(f"names must be identifiers, got {name!r}")
        if name in self._arrays or name in self._params:
            raise DslError(f"the name '{name}' is already used in pipeline '{self.name}'")

    # -- size symbols (union-find) -----------------------------------------------------------
    def _find(self, symbol: str) -> str:
        derived = derived_size(symbol)
        if derived is not None:  # a pyramid level's size: that of its base's root
            base, operation, factor = derived
            symbol = scaled_size(self._find(base), operation, factor)
        root = symbol
        while self._parent.get(root, root) != root:
            root = self._parent[root]
        return root

    def _unify(self, a: str, b: str, operator: str, where: str | None) -> None:
        """Make two size symbols one; a fixed size (a number) stays the name of the two, and
        so does a size derived from another (a pyramid level's, ``n/2``)."""
        root_a, root_b = self._find(a), self._find(b)
        if root_a == root_b:
            return
        derived_a, derived_b = derived_size(root_a), derived_size(root_b)
        if derived_a or derived_b:
            plain = root_b if derived_a else root_a
            level = root_a if derived_a else root_b
            if (derived_a and derived_b) or fixed_size(plain) is not None \
                    or plain in base_symbols(level):
                raise ShapeError(
                    f"combines axes of sizes {describe_size(root_a)} and "
                    f"{describe_size(root_b)}, which kfuse cannot prove equal (arrays of "
                    "different pyramid levels, or levels of unrelated arrays: declare those "
                    "inputs with the same size names, shape=(...))",
                    operator=operator, where=where)
            self._parent[plain] = level
            return
        fixed_a, fixed_b = fixed_size(root_a), fixed_size(root_b)
        if fixed_a is not None and fixed_b is not None:
            raise ShapeError(f"combines axes of fixed sizes {fixed_a} and {fixed_b}",
                             operator=operator, where=where)
        if fixed_a is not None or fixed_b is not None:
            keep, drop = (root_a, root_b) if fixed_a is not None else (root_b, root_a)
        else:
            keep, drop = sorted((root_a, root_b))
        self._parent[drop] = keep

    def _sizes_by_root(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """``sizes`` keyed by the symbols the graph names (a name unified into another, as
        ``"n"`` with ``"x.1"``, counts as that one); two names of one size must agree."""
        result: dict[str, int] = {}
        for symbol, size in sizes.items():
            root = self._find(symbol) if isinstance(symbol, str) else symbol
            if result.setdefault(root, size) != size:
                raise ShapeError(f"sizes gives {result[root]} and {size} for '{root}' "
                                 f"(also named '{symbol}')")
        return result

    # -- operators -------------------------------------------------------------------------
    def add_kernel(self, kind: str, body: object, *, name: str | None, line: UserLine | None,
                   reduction_op: str | None = None, reduce_axes: Sequence[int] | None = None,
                   shape: Sequence[str] | None = None, default_boundary: Boundary | None = None,
                   dtype: object = None) -> Array:
        """Record one operator and return the array it produces (used by kfuse.dsl.ops).
        An operator refused with an error leaves the pipeline as it was."""
        with self.all_or_nothing():
            return self._add_kernel(kind, body, name=name, line=line, reduction_op=reduction_op,
                                    reduce_axes=reduce_axes, shape=shape,
                                    default_boundary=default_boundary, dtype=dtype)

    @contextmanager
    def all_or_nothing(self) -> Iterator[None]:
        """Operators recorded inside stay only if nothing raises: an error leaves the pipeline
        as it was (its operators, arrays and size unifications), so that a refused operator
        made of several kernels (``kf.gemv`` with ``y``, ``kf.nrm2``) leaves none behind."""
        parent, kernels, arrays = dict(self._parent), len(self._kernels), dict(self._arrays)
        try:
            yield
        except BaseException:
            self._parent.clear()
            self._parent.update(parent)
            del self._kernels[kernels:]
            self._arrays.clear()
            self._arrays.update(arrays)
            raise

    def _add_kernel(self, kind: str, body: object, *, name: str | None, line: UserLine | None,
                    reduction_op: str | None, reduce_axes: Sequence[int] | None,
                    shape: Sequence[str] | None, default_boundary: Boundary | None,
                    dtype: object) -> Array:
        where = where_of(line)
        name = self._operator_name(name, kind, line)
        body = as_expr(body)
        body = transform(body, lambda n: self._own_load(n, name, where, default_boundary))
        if dtype is None and reduction_op is not None and body.dtype == "bool":
            dtype = "int32"  # a condition folds as int32 0/1 (its sum counts, as NumPy's)
        if dtype is None and reduction_op is not None and body.dtype in HALF_DTYPES:
            dtype = "float32"  # accumulated and returned in float32 (NumPy's is float16)
        if dtype is None and reduction_op is not None and body.dtype in SMALL_INT_DTYPES:
            # a sum of small integers is int64, as NumPy's (uint: uint64); their minimum and
            # maximum are int32 (the same values as NumPy's int8 ones: no atomic of a byte)
            dtype = "int64" if reduction_op == "sum" else "int32"
        if dtype is not None:
            from kfuse.ir.expr import cast
            body = cast(body, dtype)
        body, domain = self._infer_domain(body, name, where, shape)
        for node in body.walk():
            if isinstance(node, Coord) and node.axis >= len(domain):
                raise DslError(f"coord({node.axis}) names no axis of its {len(domain)}-D "
                               "iteration space", operator=name, where=where)
        body = resolve_weak_constants(body, "float32")
        reduction = None
        out_shape = domain
        if reduction_op is not None:
            axes = tuple(range(len(domain))) if reduce_axes is None else tuple(reduce_axes)
            if any(not -len(domain) <= a < len(domain) for a in axes):
                raise DslError(f"axis {axes} is out of range for a {len(domain)}-D operand",
                               operator=name, where=where)
            axes = tuple(sorted(a % len(domain) for a in axes))
            reduction = Reduction(reduction_op, axes)
            out_shape = tuple(s for axis, s in enumerate(domain) if axis not in axes)
        kernel = Kernel(name, kind, domain, body, (name,), reduction, None, where)
        self._kernels.append(kernel)
        array = Array(self, name, body.dtype, out_shape)
        self._arrays[name] = array
        return array

    def _operator_name(self, name: str | None, kind: str, line: UserLine | None) -> str:
        if name is not None:
            self._check_new_name(name)
            return name
        base = (line.assigned_name if line and self.names_from_source else None) or kind
        candidate, counter = base, 2
        while candidate in self._arrays or candidate in self._params:
            candidate, counter = f"{base}_{counter}", counter + 1
        return candidate

    def _own_load(self, node: Expr, operator: str, where: str | None,
                  default: Boundary | None) -> Expr | None:
        if isinstance(node, Param):
            if node.name not in self._params:
                raise DslError(f"parameter '{node.name}' belongs to another pipeline",
                               operator=operator, where=where)
            return None
        if not isinstance(node, Load):
            return None
        if node.origin is not self or node.buffer not in self._arrays:
            raise DslError(f"array '{node.buffer}' does not belong to pipeline '{self.name}'",
                           operator=operator, where=where)
        if node.boundary is None and node.is_remapped and default is None:
            default = Boundary("clamp")  # a level's reads at its far edge (odd sizes)
        if node.boundary is None and not node.is_centered:
            if default is None:
                raise DslError(f"reads '{node.buffer}' at offsets {node.offsets}: "
                               "use kfuse.local() for stencils", operator=operator, where=where)
            _check_border_value(default, node, operator, where)
            return replace(node, boundary=default)
        if node.boundary is not None:
            _check_border_value(node.boundary, node, operator, where)
        return None

    def _infer_domain(self, body: Expr, operator: str, where: str | None,
                      shape: Sequence[str] | None) -> tuple[Expr, tuple[str, ...]]:
        """The iteration space of an operator; reads without explicit ``dims`` get identity."""
        from kfuse.ir.expr import loads
        reads = loads(body)
        implicit = [ld for ld in reads if ld.dims is None]
        if shape is not None:
            domain = tuple(str(s) for s in shape)
        elif implicit:
            # the widest array read, unscaled where one is read so: a level's point is that
            # of the arrays read at its own resolution
            widest = max(implicit, key=lambda ld: (self._arrays[ld.buffer].ndim,
                                                   not ld.is_scaled))
            domain = tuple(
                scaled_size(self._find(size), "/" if numerator > 1 else "*",
                            max(numerator, denominator))
                for axis, size in enumerate(self._arrays[widest.buffer]._shape)
                for numerator, denominator in (widest.scale(axis),))
        elif any(ld.dims and list(ld.dims) != sorted(ld.dims) for ld in reads):
            raise DslError("cannot tell the iteration space: a transposed matrix (A.T) takes "
                           "its axes from an array read as it is; combine it with one "
                           "(B + A.T), or use A.T @ y, kf.gemv or kf.geam",
                           operator=operator, where=where)
        else:
            raise DslError("cannot tell the iteration space: every read names its dims "
                           "(x.at(..., dims=...)) or there is no read; read one array as it "
                           "is (plain x), whose axes then are the operator's",
                           operator=operator, where=where)
        for load in implicit:
            array = self._arrays[load.buffer]
            if array.ndim != len(domain):
                raise ShapeError(f"mixes a {len(domain)}-D iteration space with {array.ndim}-D "
                                 f"array '{array.name}'; read it with .at(..., dims=...) to "
                                 "broadcast", operator=operator, where=where)
        body = transform(body, lambda n: replace(n, dims=tuple(range(len(n.offsets))))
                         if isinstance(n, Load) and n.dims is None else None)
        for load in loads(body):
            array = self._arrays[load.buffer]
            for axis, dim in enumerate(load.dims):
                if load.indices is not None and load.indices[axis] is not None:
                    continue  # a computed index: any size
                if not 0 <= dim < len(domain):
                    raise ShapeError(f"dims of '{array.name}' name axis {dim} of a "
                                     f"{len(domain)}-D iteration space", operator=operator,
                                     where=where)
                numerator, denominator = load.scale(axis)
                if denominator > 1 or numerator > 1 and shape is not None:
                    continue  # read through its boundary mode at any size (a given shape)
                level = scaled_size(array._shape[axis], "/", numerator)
                self._unify(level, domain[dim], operator, where)
        return body, tuple(self._find(s) for s in domain)

    # -- the IR ----------------------------------------------------------------------------
    def graph(self) -> Graph:
        """The validated IR graph of this pipeline (built again only after a change).

        Reusing the same graph lets a plan made earlier run without being checked again.
        """
        version = (len(self._kernels), len(self._inputs), len(self._params),
                   tuple(self._outputs), len(self._parent))
        if self._built is None or self._built[0] != version:
            self._built = (version, self._build_graph())
        return self._built[1]

    def _build_graph(self) -> Graph:
        buffers = {name: Buffer(name, array.dtype, array.shape)
                   for name, array in self._arrays.items()}
        kernels = tuple(
            Kernel(k.name, k.kind, tuple(self._find(s) for s in k.domain), k.body, k.writes,
                   k.reduction, k.opaque and k.opaque.with_sizes_named(self._find), k.where)
            for k in self._kernels
        )
        graph = Graph(self.name, buffers, kernels, tuple(self._inputs), tuple(self._outputs),
                      dict(self._params))
        # (reductions over axes that do not merge: one axis at a time, kfuse.ir.fold)
        return fold_reductions(graph.validate())

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self._inputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self._outputs)

    @property
    def params(self) -> Mapping[str, str]:
        return dict(self._params)

    def run(self, backend: str = "auto", plan: Any = "auto", out: Any = None,
            **arrays_and_params: Any) -> dict[str, Any]:
        r"""Run on the given inputs and parameters; return outputs by name.

        ``plan``: ``"auto"`` (fused by the default search), ``"unfused"`` (one kernel per
        operator) or a plan from :meth:`fuse` / :meth:`plan`. ``out``: arrays to write the
        outputs into (by name; one array for a pipeline of one output). Calls go through
        the pipeline's :meth:`compile`\ d form for ``backend`` and ``plan``: a second call
        with arrays like the first plans, generates and compiles nothing.

        Inputs given as :class:`dask.array.Array` give lazy Dask arrays, computed chunk by
        chunk (:mod:`kfuse.scaleout.dask_arrays`: halos from the pipeline, boundary modes
        exact at the array's edges). NumPy inputs on the GPU whose arrays would not fit in
        its free memory stream through it in slabs (:mod:`kfuse.scaleout.host_slabs`).
        """
        if any(is_dask_array(value) for value in arrays_and_params.values()):
            if out is not None:
                raise ChunkingError("out= does not apply to Dask arrays: the outputs are "
                                    "new lazy arrays (store them with dask.array.store)")
            return _driver().run_on_dask_arrays(self, backend, plan, arrays_and_params)
        reason = _driver().slab_reason(self.graph(), backend, arrays_and_params)
        if reason is not None:
            LOG.info("pipeline '%s': %s", self.name, reason)
            if out is not None and not isinstance(out, Mapping):
                out = {self.outputs[0]: out}
            return _driver().run_in_slabs(self, backend, plan, out, arrays_and_params)
        return self.compiled_run(backend, plan)(out=out, **arrays_and_params)

    def compiled_run(self, backend: str = "auto", plan: Any = "auto") -> Any:
        """The compiled pipeline :meth:`run` calls for ``backend`` and ``plan`` (made at the
        first run, kept with the pipeline: its ``stats`` say what runs built and reused)."""
        key = (backend, plan if plan is None or isinstance(plan, str) else id(plan))
        found = self._runs.get(key)
        if found is None:
            found = (plan, _driver().compile(self.graph, backend, plan))  # (the plan kept:
            self._runs[key] = found                                      # its id stays its own)
            while len(self._runs) > COMPILED_RUNS:
                self._runs.pop(next(iter(self._runs)))
        return found[1]

    def compile(self, backend: str = "auto", plan: Any = "auto", *,
                max_signatures: int = 64, graphs: bool = True, streams: bool | str = "auto",
                native: bool = True) -> Any:
        """This pipeline compiled for ``backend`` and ``plan``: a callable
        (:class:`~kfuse.runtime.compiled.CompiledPipeline`) taking the inputs and
        parameters by name, and ``out=``, and returning the outputs by name.

        It plans, generates, compiles and binds once per call signature (shapes, dtypes,
        contiguity, alignment and device of the arrays, types of the parameters), keeping
        the ``max_signatures`` used last; ``graphs``: on the GPU, replay a program of
        several launches as a CUDA graph when it is called again on the same arrays;
        ``streams``: on the GPU, run kernels with no path between them on separate streams
        where the wave model predicts it pays (``"auto"``; ``.explain()`` says where and
        why), always (True) or never (False).
        ``native``: a call whose signature is compiled runs through kfuse's C call path
        (:mod:`kfuse.runtime.native`) where it could be built; False keeps calls in Python.
        ``.stats`` counts hits, misses, plans and compiles.
        """
        return _driver().compile(self.graph, backend, plan, max_signatures=max_signatures,
                                 graphs=graphs, streams=streams, native=native)

    def fuse(self, groups: Sequence[Sequence[str]], forms: Sequence[Any] | None = None,
             side_by_side: Sequence[Sequence[str]] = ()) -> Any:
        """A fusion plan with the given groups of operator names (others stay alone).

        ``side_by_side``: sets of operators whose groups (one operator of each) run side by
        side in one kernel (horizontal fusion; ``plan.run_side_by_side`` sets their threads).

        ``forms``: per group, how its kernel is written (a form of
        :mod:`kfuse.schedule.forms`, such as ``Staged()`` or ``Recompute(tile=(8, 4))``, its
        name, or None for the default). Raises :class:`~kfuse.errors.FusionError` naming the
        rule an illegal group breaks, or why a form cannot implement its group.
        """
        usage = ("fuse() takes a list of groups, each a list of operator names, e.g. "
                 f"[{[k.name for k in self._kernels[:2]]}]")
        if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
            raise FusionError(f"{usage}; got {groups!r}")
        for group in groups:
            if isinstance(group, str):
                raise DslError(usage)
            if not isinstance(group, Sequence) or not all(isinstance(n, str) for n in group):
                raise FusionError(f"{usage}; got the group {group!r}")
            if not group:
                raise FusionError(f"{usage}; got an empty group")
        if forms is not None and (isinstance(forms, (str, bytes)) or not isinstance(
                forms, Sequence) or len(forms) != len(groups)):
            raise FusionError(f"fuse(): forms= gives one form (or None) per group: "
                              f"{len(groups)} groups, got {forms!r}")
        plan = _driver().fuse(self.graph(), groups, forms)
        if isinstance(side_by_side, (str, bytes)) or not isinstance(side_by_side, Sequence):
            raise FusionError(f"side_by_side= lists sets of operator names, got {side_by_side!r}")
        for operators in side_by_side:
            if isinstance(operators, str) or not all(isinstance(n, str) for n in operators):
                raise FusionError("side_by_side= lists sets of operator names, e.g. "
                                  f"[('blur', 'hash')]; got {operators!r}")
            plan = plan.run_side_by_side(*operators)
        return plan

    def plan(self, strategy: str = "auto", model: str = "roofline",
             sizes: Mapping[str, int] | None = None) -> Any:
        """The fusion plan the search finds (``sizes`` binds size symbols for the model).

        ``"auto"`` is what ``run`` uses (:func:`kfuse.search.default_plan`): Filipovič et al. 2015's
        implementation space for map/reduce pipelines, the greedy search otherwise.
        """
        graph = self.graph()
        if sizes is not None:
            if not isinstance(sizes, Mapping):
                raise ShapeError("sizes must map size symbols to integers, e.g. "
                                 f"{dict.fromkeys(graph.size_symbols, 1024)}")
            sizes = graph.check_sizes(self._sizes_by_root(sizes))
        from kfuse.ir.collapse import axis_collapse

        collapse = axis_collapse(graph)
        if collapse is not None and strategy == "auto":  # (as run plans it: axes merged)
            graph = collapse.graph
            sizes = None if sizes is None else collapse.sizes(sizes)
        return _driver().plan(graph, strategy, model, sizes)

    def __repr__(self) -> str:
        return (f"Pipeline({self.name!r}, inputs={list(self._inputs)}, "
                f"operators={[k.name for k in self._kernels]}, outputs={self._outputs})")
