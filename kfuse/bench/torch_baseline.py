"""PyTorch baselines: a kfuse IR graph translated into the PyTorch code one would write by hand.

The translation generates Python source (see ``TorchProgram.source``) of straight-line
PyTorch code: each (array, boundary mode, radius) is padded once (``F.pad`` replicate /
circular / constant, or ``torch.cat`` of flipped edges for mirror), every stencil tap is a
shifted slice of the padded tensor (which ``torch.compile`` fuses far better than
``conv2d``), point operators map to elementwise ops, reductions to ``sum``/``amin``/``amax``.
Subexpressions are computed once per kernel and temporaries are freed after their last use.
Scalar subexpressions of runtime parameters are evaluated with NumPy outside the traced
function, exactly as kfuse's NumPy backend does.
"""

from __future__ import annotations

import itertools
import linecache
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kfuse.ir.expr import (
    Binary,
    Boundary,
    Cast,
    Const,
    Coord,
    Expr,
    Load,
    Param,
    Select,
    Unary,
)
from kfuse.ir.graph import Graph, Kernel
from kfuse.ir.sizes import derived_size, fixed_size
from kfuse.runtime.numpy_backend import BINARY_FUNCTIONS, UNARY_FUNCTIONS

# torch.compile mode of the baseline (reported with every row). Measured on an H200 at
# 8192^2: in the default mode inductor's untuned 2-D tiles run the fused replicate-pad
# stencils 10x slower (sobel 2.12 ms, unsharp 6.40 ms) than with pointwise autotuning
# (0.21 ms, 0.42 ms); CUDA graphs stay off, as kfuse launches without them too.
COMPILE_MODE = "max-autotune-no-cudagraphs"

_TORCH_UNARY = {
    "neg": "torch.neg", "not": "torch.logical_not", "sqrt": "torch.sqrt",
    "rsqrt": "torch.rsqrt", "exp": "torch.exp", "log": "torch.log", "sin": "torch.sin",
    "cos": "torch.cos", "tanh": "torch.tanh", "abs": "torch.abs", "floor": "torch.floor",
    "ceil": "torch.ceil", "round": "torch.round", "trunc": "torch.trunc", "exp2": "torch.exp2",
    "log2": "torch.log2", "expm1": "torch.expm1", "log1p": "torch.log1p", "erf": "torch.erf",
    "tan": "torch.tan", "atan": "torch.atan",
}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">",
          "ge": ">=", "eq": "==", "ne": "!=", "and": "&", "or": "|"}
_TORCH_DTYPE = {"float32": "torch.float32", "float64": "torch.float64", "int32": "torch.int32",
                "bool": "torch.bool", "uint8": "torch.uint8", "int8": "torch.int8",
                "int16": "torch.int16", "uint16": "torch.uint16", "float16": "torch.float16",
                "bfloat16": "torch.bfloat16"}
_REDUCE = {"sum": "torch.sum", "min": "torch.amin", "max": "torch.amax"}


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(np.bool_ if name == "bool" else name)


def _literal(value: Any, dtype: str) -> str:
    """Python source of a scalar constant already rounded to ``dtype``."""
    if dtype == "bool":
        return "True" if bool(value) else "False"
    if dtype == "int32":
        return str(int(value))
    number = float(value)
    if math.isnan(number):
        return "math.nan"
    if math.isinf(number):
        return "math.inf" if number > 0 else "-math.inf"
    return repr(number)


def eval_scalar(node: Expr, params: Mapping[str, Any], memo: dict[int, np.ndarray] | None = None
                ) -> np.ndarray:
    """Evaluate a tree of constants and parameters with NumPy (as the NumPy backend does)."""
    memo = {} if memo is None else memo
    for current in node.walk():
        key = id(current)
        if key in memo:
            continue
        dtype = _np_dtype(current.dtype)
        if isinstance(current, Const):
            value = np.asarray(current.value, dtype=dtype)
        elif isinstance(current, Param):
            value = np.asarray(params[current.name], dtype=dtype)
        else:
            args = [memo[id(child)] for child in current.children()]
            with np.errstate(all="ignore"):
                if isinstance(current, Unary):
                    value = np.asarray(UNARY_FUNCTIONS[current.op](args[0])).astype(dtype)
                elif isinstance(current, Binary):
                    value = np.asarray(BINARY_FUNCTIONS[current.op](args[0], args[1])).astype(dtype)
                elif isinstance(current, Select):
                    value = np.asarray(np.where(args[0], args[1], args[2])).astype(dtype)
                elif isinstance(current, Cast):
                    value = np.asarray(args[0]).astype(dtype)
                else:
                    raise TypeError(f"{type(current).__name__} is not a scalar expression")
        memo[key] = value
    return memo[id(node)]


# ---------------------------------------------------------------------------------------------
# Runtime helpers used by the generated code
# ---------------------------------------------------------------------------------------------

def runtime_helpers(torch: Any, F: Any) -> dict[str, Callable]:
    """The helpers the generated code calls, closed over the ``torch`` modules."""

    def _pad(x, pads: tuple[tuple[int, int], ...], mode: str, value: float = 0.0):
        """Pad ``x`` by ``(lo, hi)`` per axis as kfuse's boundary ``mode`` reads outside it."""
        flat: list[int] = []
        for lo, hi in reversed(pads):
            flat += [lo, hi]
        if mode == "constant":
            if x.dtype == torch.bool:
                fill: Any = bool(value)
            elif x.is_floating_point():
                fill = float(value)
            else:
                fill = int(value)
            return F.pad(x, flat, mode="constant", value=fill)
        if mode in ("clamp", "repeat") and x.is_floating_point() and 1 <= x.dim() <= 3:
            torch_mode = "replicate" if mode == "clamp" else "circular"
            return F.pad(x[None, None], flat, mode=torch_mode)[0, 0]
        for axis, (lo, hi) in enumerate(pads):
            if lo == 0 and hi == 0:
                continue
            n = x.shape[axis]
            parts = []
            if lo:
                parts.append(_edge(x, axis, lo, mode, 0, n))
            parts.append(x)
            if hi:
                parts.append(_edge(x, axis, hi, mode, 1, n))
            x = torch.cat(parts, dim=axis)
        return x

    def _edge(x, axis: int, width: int, mode: str, side: int, n: int):
        """The ``width`` elements padding ``x`` along ``axis`` on the left (0) or right (1)."""
        if mode == "clamp":
            shape = list(x.shape)
            shape[axis] = width
            return x.narrow(axis, 0 if side == 0 else n - 1, 1).expand(shape)
        if mode == "repeat":
            return x.narrow(axis, n - width, width) if side == 0 else x.narrow(axis, 0, width)
        if mode == "mirror":  # the edge element repeated (-1 -> 0, n -> n-1): numpy 'symmetric'
            start = 0 if side == 0 else n - width
            return x.narrow(axis, start, width).flip(axis)
        raise ValueError(f"unknown boundary mode {mode!r}")

    def _scalar_tensor(value, dtype, device):
        return torch.full((), value, dtype=dtype, device=device)

    def _read_at(x, axes: tuple[tuple[int, int, int, int], ...], mode: str, value: float):
        """``x`` read at ``floor(p * num / den) + offset`` along each axis (``axes``: per axis
        (num, den, offset, points)) as kfuse's boundary ``mode`` reads outside it."""
        for axis, (numerator, denominator, offset, points) in enumerate(axes):
            index = torch.arange(points, device=x.device) * numerator // denominator + offset
            size = x.shape[axis]
            read = x.index_select(axis, _remapped(index, size, mode))
            if mode == "constant":
                shape = [1] * x.dim()
                shape[axis] = points
                inside = ((index >= 0) & (index < size)).view(shape)
                read = torch.where(inside, read, torch.tensor(value, dtype=x.dtype,
                                                              device=x.device))
            x = read
        return x

    def _remapped(index, size: int, mode: str):
        if mode == "mirror":
            folded = torch.remainder(index, 2 * size)
            return torch.where(folded < size, folded, 2 * size - 1 - folded)
        if mode == "repeat":
            return torch.remainder(index, size)
        return index.clamp(0, size - 1)

    def _gather_read(x, parts: tuple, rank: int, mode: str, value: float):
        """``x`` read at per-axis index tensors broadcast over a domain of ``rank`` axes:
        ``('at', values, offset)`` a computed index, ``('axis', num, den, offset, points,
        dim)`` the point's coordinate along ``dim`` (scaled)."""
        indices, inside = [], None
        for axis, part in enumerate(parts):
            if part[0] == "at":
                raw = torch.as_tensor(part[1], device=x.device).long() + part[2]
                raw = raw.reshape(raw.shape + (1,) * (rank - raw.dim())) if raw.dim() else \
                    raw.reshape((1,) * rank)
            else:
                _, numerator, denominator, offset, points, dim = part
                shape = [1] * rank
                shape[dim] = points
                raw = (torch.arange(points, device=x.device) * numerator // denominator
                       + offset).reshape(shape)
            size = x.shape[axis]
            within = (raw >= 0) & (raw < size)
            inside = within if inside is None else inside & within
            indices.append(_remapped(raw, size, mode))
        stored = x.dtype
        if stored in (torch.uint16, torch.uint32, torch.uint64):  # (no CUDA indexing kernels)
            x = x.to(torch.int64)
        read = x[tuple(indices)]
        if mode == "constant":
            read = torch.where(inside, read, torch.tensor(value, dtype=x.dtype,
                                                          device=x.device))
        return read.to(stored)

    return {"_pad": _pad, "_scalar_tensor": _scalar_tensor, "_read_at": _read_at,
            "_gather_read": _gather_read}


# ---------------------------------------------------------------------------------------------
# Translation
# ---------------------------------------------------------------------------------------------

@dataclass
class _Line:
    text: str
    defines: str | None
    uses: tuple[str, ...]


@dataclass
class _Value:
    """What a node turned into: a literal, a scalar argument or a tensor variable."""

    kind: str  # "const" | "scalar" | "tensor"
    text: str = ""
    value: Any = None  # numpy value of a const
    axes: frozenset[int] = frozenset()  # iteration axes a tensor spans (others broadcast)
    node: Expr | None = None


@dataclass
class TorchProgram:
    """A graph translated to PyTorch: ``core(*arrays, *scalars) -> tuple of outputs``."""

    name: str
    source: str
    core: Callable[..., tuple]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    scalar_nodes: tuple[Expr, ...] = ()
    notes: dict = field(default_factory=dict)

    def scalar_values(self, params: Mapping[str, Any]) -> list[Any]:
        """The parameter-dependent scalars the core takes, as Python numbers."""
        memo: dict[int, np.ndarray] = {}
        return [eval_scalar(node, params, memo).item() for node in self.scalar_nodes]

    def function(self, core: Callable[..., tuple] | None = None) -> TorchFunction:
        """A callable ``f(**inputs, **params) -> {output: tensor}`` around ``core``."""
        return TorchFunction(self, core or self.core)

    def __call__(self, **given: Any) -> dict[str, Any]:
        return self.function()(**given)


class TorchFunction:
    """``f(**inputs, **params) -> dict of outputs`` over a (possibly compiled) core."""

    def __init__(self, program: TorchProgram, core: Callable[..., tuple]):
        self.program = program
        self.core = core

    def __call__(self, **given: Any) -> dict[str, Any]:
        arrays = [given[name] for name in self.program.inputs]
        scalars = self.program.scalar_values(given)
        result = self.core(*arrays, *scalars)
        return dict(zip(self.program.outputs, result, strict=True))

    def __repr__(self) -> str:
        return f"TorchFunction({self.program.name!r})"


class _Translator:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.lines: list[_Line] = []
        self.counter = itertools.count()
        self.buffer_vars: dict[str, str] = {}
        self.size_vars: dict[str, str] = {}
        self.size_texts: dict[str, str] = {}  # symbol -> how the prologue computes it
        self.pads: dict[tuple, str] = {}
        self.scalar_args: dict[int, str] = {}
        self.scalar_nodes: list[Expr] = []

    def fresh(self, prefix: str = "t") -> str:
        return f"{prefix}{next(self.counter)}"

    def emit(self, text: str, defines: str | None, uses: tuple[str, ...] = ()) -> None:
        self.lines.append(_Line(text, defines, uses))

    # -- program ----------------------------------------------------------------------------
    def translate(self) -> TorchProgram:
        graph = self.graph
        array_args = [f"a{i}" for i in range(len(graph.inputs))]
        for name, var in zip(graph.inputs, array_args, strict=True):
            self.buffer_vars[name] = var
        holders: dict[str, tuple[str, int]] = {}
        for name, var in zip(graph.inputs, array_args, strict=True):
            for axis, symbol in enumerate(graph.buffers[name].shape):
                holders.setdefault(symbol, (var, axis))
        self.holders = holders
        self.device = array_args[0] if array_args else None
        for kernel in graph.topological_kernels():
            self.kernel(kernel)
        outputs = []
        for name in graph.outputs:
            var = self.buffer_vars[name]
            if name in graph.inputs:
                outputs.append(var)
                continue
            final = self.fresh("out")
            self.emit(f"{final} = {var}.contiguous()", final, (var,))
            outputs.append(final)
        scalar_args = [self.scalar_args[id(node)] for node in self.scalar_nodes]
        body = self._with_deletes(outputs)
        header = [f"def kfuse_torch_{graph.name}({', '.join(array_args + scalar_args)}):",
                  f'    """kfuse pipeline {graph.name!r} written in PyTorch by kfuse.bench."""']
        prologue = [f"    {var} = {self.size_texts[symbol]}"
                    for symbol, var in self.size_vars.items()]
        if self.device is not None:
            prologue.insert(0, f"    device = {self.device}.device")
        closing = f"    return ({', '.join(outputs)}{',' if len(outputs) == 1 else ''})"
        source = "\n".join(header + prologue + ["    " + line for line in body] + [closing]) + "\n"
        core = _compile_source(source, f"kfuse_torch_{graph.name}")
        return TorchProgram(graph.name, source, core, tuple(graph.inputs), tuple(graph.outputs),
                            tuple(self.scalar_nodes))

    def _with_deletes(self, keep: list[str]) -> list[str]:
        """The lines, each temporary deleted after its last use (inputs and outputs kept)."""
        last: dict[str, int] = {}
        for index, line in enumerate(self.lines):
            for name in line.uses:
                last[name] = index
        protected = set(keep) | set(self.buffer_vars[n] for n in self.graph.inputs)
        text = []
        for index, line in enumerate(self.lines):
            text.append(line.text)
            dead = sorted({name for name in line.uses
                           if last.get(name) == index and name not in protected})
            if line.defines and line.defines not in last and line.defines not in protected:
                dead.append(line.defines)
            if dead:
                text.append(f"del {', '.join(dead)}")
        return text

    def size(self, symbol: str) -> str:
        if symbol not in self.size_vars:
            derived, fixed = derived_size(symbol), fixed_size(symbol)
            if fixed is not None:  # a size written as a number
                text = str(fixed)
            elif symbol in self.holders:
                holder, axis = self.holders[symbol]
                text = f"{holder}.shape[{axis}]"
            elif derived is not None:  # a pyramid level's: from its base's
                base, operation, factor = derived
                base_var = self.size(base)
                text = f"-(-{base_var} // {factor})" if operation == "/" else \
                    f"{base_var} * {factor}"
            else:
                raise ValueError(f"size '{symbol}' is not given by any input array")
            self.size_vars[symbol] = f"n{len(self.size_vars)}"
            self.size_texts[symbol] = text
        return self.size_vars[symbol]

    # -- kernels ----------------------------------------------------------------------------
    def kernel(self, kernel: Kernel) -> None:
        if kernel.body is None:
            raise NotImplementedError(f"operator '{kernel.name}' is an opaque CUDA kernel; "
                                      "it has no PyTorch translation")
        self.radii = self._pad_extents(kernel)
        self.domain = kernel.domain
        memo: dict[int, _Value] = {}
        self.load_memo: dict[tuple, _Value] = {}
        for node in kernel.body.walk():
            memo[id(node)] = self.node(node, memo)
        result = memo[id(kernel.body)]
        shape = "(" + "".join(f"{self.size(s)}, " for s in kernel.domain) + ")"
        dtype = _TORCH_DTYPE[kernel.body.dtype]
        full_axes = frozenset(range(kernel.ndim))
        if result.kind != "tensor":
            text = self.operand(result)
            var = self.fresh()
            self.emit(f"{var} = torch.full({shape}, {text}, dtype={dtype}, device=device)", var,
                      self._uses(result))
            result = _Value("tensor", var, axes=full_axes)
        out = self.fresh("b")
        if kernel.reduction is None:
            if result.axes != full_axes:
                self.emit(f"{out} = {result.text}.expand({shape}).contiguous()", out,
                          (result.text,))
            else:
                self.emit(f"{out} = {result.text}", out, (result.text,))
        else:
            source = result.text
            if result.axes != full_axes:
                source = f"{result.text}.expand({shape})"
            axes = tuple(kernel.reduction.axes)
            fold = _REDUCE[kernel.reduction.op]
            if kernel.body.dtype == "bool" and kernel.reduction.op != "sum":
                source = f"{source}.to(torch.uint8)"
            self.emit(f"{out} = {fold}({source}, dim={axes!r}).to({dtype})", out, (result.text,))
        self.buffer_vars[kernel.output] = out

    def _pad_extents(self, kernel: Kernel) -> dict[tuple, tuple[tuple[int, int], ...]]:
        """(buffer, boundary) -> (lo, hi) per array axis over all of the kernel's taps."""
        extents: dict[tuple, list[list[int]]] = {}
        assert kernel.body is not None
        for node in kernel.body.walk():
            if not isinstance(node, Load) or not node.offsets or node.is_centered \
                    or node.is_scaled:
                continue
            key = (node.buffer, node.boundary or Boundary("clamp"))
            current = extents.setdefault(key, [[0, 0] for _ in node.offsets])
            for axis, offset in enumerate(node.offsets):
                current[axis][0] = max(current[axis][0], -offset)
                current[axis][1] = max(current[axis][1], offset)
        return {key: tuple((lo, hi) for lo, hi in value) for key, value in extents.items()}

    # -- nodes ------------------------------------------------------------------------------
    def operand(self, value: _Value) -> str:
        if value.kind == "scalar" and not value.text:
            node = value.node
            assert node is not None
            if id(node) not in self.scalar_args:
                self.scalar_args[id(node)] = f"s{len(self.scalar_args)}"
                self.scalar_nodes.append(node)
            value.text = self.scalar_args[id(node)]
        return value.text

    def _uses(self, *values: _Value) -> tuple[str, ...]:
        return tuple(v.text for v in values if v.kind == "tensor")

    def tensor(self, expression: str, axes: frozenset[int], *operands: _Value) -> _Value:
        var = self.fresh()
        self.emit(f"{var} = {expression}", var, self._uses(*operands))
        return _Value("tensor", var, axes=axes)

    def node(self, node: Expr, memo: dict[int, _Value]) -> _Value:
        if isinstance(node, Const):
            value = np.asarray(node.value, dtype=_np_dtype(node.dtype))
            return _Value("const", _literal(value.item(), node.dtype), value, node=node)
        if isinstance(node, Param):
            return _Value("scalar", node=node)
        if isinstance(node, Coord):
            n = self.size(self.domain[node.axis])
            index = self._broadcast_index((node.axis,))
            return self.tensor(f"torch.arange({n}, dtype=torch.int32, device=device){index}",
                               frozenset((node.axis,)))
        if isinstance(node, Load):
            if node.is_gathered:
                return self.gathered(node, [memo[id(child)] for child in node.children()])
            return self.load(node)
        children = [memo[id(child)] for child in node.children()]
        if all(child.kind == "const" for child in children):
            folded = eval_scalar(node, {}, {id(c.node): c.value for c in children
                                            if c.node is not None})
            return _Value("const", _literal(folded.item(), node.dtype), folded, node=node)
        if all(child.kind != "tensor" for child in children):
            return _Value("scalar", node=node)
        axes = frozenset().union(*(c.axes for c in children if c.kind == "tensor"))
        dtype = _TORCH_DTYPE[node.dtype]
        if isinstance(node, Unary):
            return self.tensor(f"{_TORCH_UNARY[node.op]}({children[0].text})", axes, *children)
        if isinstance(node, Cast):
            return self.tensor(f"{children[0].text}.to({dtype})", axes, *children)
        if isinstance(node, Binary):
            return self.binary(node.op, children, axes)
        if isinstance(node, Select):
            cond, a, b = children
            if cond.kind != "tensor":
                cond_text = f"_scalar_tensor({self.operand(cond)}, torch.bool, device)"
            else:
                cond_text = cond.text
            branches = [self.operand(v) if v.kind == "tensor" or a.kind == "tensor"
                        or b.kind == "tensor" else
                        f"_scalar_tensor({self.operand(v)}, {dtype}, device)" for v in (a, b)]
            return self.tensor(f"torch.where({cond_text}, {branches[0]}, {branches[1]})"
                               f".to({dtype})", axes, *children)
        raise TypeError(f"unknown expression node {type(node).__name__}")

    def binary(self, op: str, children: list[_Value], axes: frozenset[int]) -> _Value:
        a, b = children
        left, right = self.operand(a), self.operand(b)
        if op in _INFIX:
            return self.tensor(f"({left} {_INFIX[op]} {right})", axes, a, b)
        if op in ("min", "max"):
            if a.kind == "tensor" and b.kind == "tensor":
                function = "torch.minimum" if op == "min" else "torch.maximum"
                return self.tensor(f"{function}({left}, {right})", axes, a, b)
            tensor, scalar = (left, right) if a.kind == "tensor" else (right, left)
            bound = "max" if op == "min" else "min"
            return self.tensor(f"torch.clamp({tensor}, {bound}={scalar})", axes, a, b)
        if op == "pow":
            return self.tensor(f"torch.pow({left}, {right})", axes, a, b)
        if op == "floordiv":
            return self.tensor(f"torch.div({left}, {right}, rounding_mode='floor')", axes, a, b)
        if op == "mod":
            return self.tensor(f"torch.remainder({left}, {right})", axes, a, b)
        raise TypeError(f"unknown binary operator {op!r}")

    def _broadcast_index(self, dims: tuple[int, ...]) -> str:
        """``[:, None]``-style index placing sorted ``dims`` among the domain's axes."""
        if len(dims) == len(self.domain):
            return ""
        parts = [":" if axis in dims else "None" for axis in range(len(self.domain))]
        return f"[{', '.join(parts)}]"

    def gathered(self, node: Load, values: list[_Value]) -> _Value:
        """A data-dependent read: every axis's index a tensor over the domain (a computed
        axis's from its values), read by advanced indexing."""
        boundary = node.boundary or Boundary("clamp")
        given = iter(values)
        parts = []
        assert node.indices is not None and node.dims is not None
        for axis, (dim, offset, index) in enumerate(zip(node.dims, node.offsets, node.indices,
                                                        strict=True)):
            if index is not None:
                parts.append(f"('at', {self.operand(next(given))}, {offset})")
            else:
                numerator, denominator = node.scale(axis)
                parts.append(f"('axis', {numerator}, {denominator}, {offset}, "
                             f"{self.size(self.domain[dim])}, {dim})")
        source = self.buffer_vars[node.buffer]
        expression = (f"_gather_read({source}, ({', '.join(parts)},), {len(self.domain)}, "
                      f"{boundary.mode!r}, {_literal(boundary.value, 'float64')})")
        var = self.fresh()  # (the source array is used here too: kept alive until then)
        self.emit(f"{var} = {expression}", var, (source, *self._uses(*values)))
        return _Value("tensor", var, axes=frozenset(range(len(self.domain))))

    def load(self, node: Load) -> _Value:
        boundary = node.boundary or Boundary("clamp")
        key = (*node.read_key, boundary)
        if key in self.load_memo:
            return self.load_memo[key]
        source = self.buffer_vars[node.buffer]
        buffer = self.graph.buffers[node.buffer]
        if buffer.ndim == 0:
            value = _Value("tensor", source, axes=frozenset())
            self.load_memo[key] = value
            return value
        expression = source
        if node.is_scaled:  # read at another resolution: index lists per axis
            axes = tuple((*node.scale(axis), offset, self.size(self.domain[dim]))
                         for axis, (dim, offset) in enumerate(zip(node.dims, node.offsets,
                                                                  strict=True)))
            listed = ", ".join(f"({num}, {den}, {offset}, {points})"
                               for num, den, offset, points in axes)
            expression = (f"_read_at({source}, ({listed},), {boundary.mode!r}, "
                          f"{_literal(boundary.value, 'float64')})")
            uses: tuple[str, ...] = (source,)
        elif not node.is_centered:
            extents = self.radii[(node.buffer, boundary)]
            pad_key = (node.buffer, boundary, extents)
            if pad_key not in self.pads:
                padded = self.fresh("p")
                self.emit(f"{padded} = _pad({source}, {extents!r}, {boundary.mode!r}, "
                          f"{_literal(boundary.value, 'float64')})", padded, (source,))
                self.pads[pad_key] = padded
            padded = self.pads[pad_key]
            slices = []
            for axis, (offset, (lo, hi)) in enumerate(zip(node.offsets, extents, strict=True)):
                if lo == 0 and hi == 0:
                    slices.append(":")
                    continue
                n = self.size(buffer.shape[axis])
                start = lo + offset
                slices.append(f"{start}:{start} + {n}" if start else f":{n}")
            expression = f"{padded}[{', '.join(slices)}]"
            uses = (padded,)
        else:
            uses = (source,)
        order = tuple(int(i) for i in np.argsort(node.dims, kind="stable"))
        if order != tuple(range(len(order))):
            expression = f"{expression}.permute{order!r}"
        expression += self._broadcast_index(tuple(sorted(node.dims)))
        if expression == source:
            value = _Value("tensor", source, axes=frozenset(node.dims))
        else:
            var = self.fresh("v")
            self.emit(f"{var} = {expression}", var, uses)
            value = _Value("tensor", var, axes=frozenset(node.dims))
        self.load_memo[key] = value
        return value


def _compile_source(source: str, name: str) -> Callable[..., tuple]:
    import torch
    import torch.nn.functional as F

    filename = f"<kfuse.bench.torch_baseline:{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"torch": torch, "F": F, "math": math,
                                 **runtime_helpers(torch, F)}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    return namespace[name]


def translate(graph: Graph) -> TorchProgram:
    """Translate ``graph`` into PyTorch; ``program(**inputs, **params)`` runs it eagerly."""
    return _Translator(graph).translate()


def torch_function(graph: Graph) -> TorchFunction:
    """``f(**inputs, **params) -> {output: tensor}`` computing what ``graph`` computes."""
    return translate(graph).function()


def compile_core(program: TorchProgram, mode: str | None = None, **options: Any) -> Callable:
    """``torch.compile`` of the program's core: one fixed size (``dynamic=False``)."""
    import torch

    mode = COMPILE_MODE if mode is None else mode
    return torch.compile(program.core, dynamic=False,
                         mode=None if mode == "default" else mode, **options)


def compiled_on(graph: Graph, given: Mapping[str, Any], mode: str | None = None
                ) -> Callable[[], dict[str, Any]]:
    """``torch.compile`` of ``graph`` bound to the arrays in ``given`` (CUDA arrays are shared,
    not copied; Python floats are the parameters), compiled by a first call: a callable of
    no arguments, to time beside kfuse on the very same inputs."""
    import torch

    program = translate(graph)
    compiled = program.function(compile_core(program, mode))
    tensors = {name: torch.as_tensor(value, device="cuda") for name, value in given.items()
               if not isinstance(value, float)}
    params = {name: value for name, value in given.items() if isinstance(value, float)}

    def run() -> dict[str, Any]:
        return compiled(**tensors, **params)

    run()
    return run


def compile_description(mode: str | None = None) -> str:
    """How the torch.compile baseline was made, for reports."""
    return f"torch.compile(mode={COMPILE_MODE if mode is None else mode!r}, dynamic=False)"


def baselines(graph: Graph, *, mode: str | None = None) -> dict[str, TorchFunction]:
    """``{"torch eager": f, "torch.compile": torch.compile(f)}`` for ``graph``.

    ``torch.compile`` uses :data:`COMPILE_MODE` unless ``mode`` is given, with
    ``dynamic=False`` (one fixed size); compilation happens at the first call.
    """
    program = translate(graph)
    return {"torch eager": program.function(),
            "torch.compile": program.function(compile_core(program, mode))}
