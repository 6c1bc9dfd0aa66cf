"""The codeless application format: kernel metadata in YAML or JSON, and its loader.

An application is described without code (Wahib & Maruyama 2014 §IV): kernels in call order, each with
its measured runtime, launch shape, registers, shared memory, FLOPs and the arrays it
reads or writes (with thread load or stencil radius). ``docs/projection.md`` documents
the format; ``schema.json`` (next to this module, :func:`schema`) is its JSON Schema.

Loading checks the file against the schema and then the meaning (unknown arrays,
duplicate names, order cycles). Every problem raises :class:`~kfuse.errors.MetadataError`
naming the file, the kernel or array, and the field.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from kfuse.errors import KfuseError, MetadataError
from kfuse.model.wahib import PRESETS, Architecture, preset

FORMAT = "kfuse-app/1"
ACCESS_MODES = {"read": "read", "r": "read", "write": "write", "w": "write",
                "readwrite": "readwrite", "rw": "readwrite"}
ELEMENT_BYTES = {"float64": 8, "float32": 4, "int32": 4, "int64": 8, "float16": 2}
DEFAULT_ADDRESS_REGISTERS = 4
DEFAULT_REGISTERS = 32


@dataclass(frozen=True)
class ArraySpec:
    """One array in device memory."""

    name: str
    dtype: str = "float64"
    elements: int | None = None
    shape: tuple[int, ...] | None = None
    expandable: bool = True
    output: bool = False

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def ndim(self) -> int:
        return len(self.shape) if self.shape else 2


@dataclass(frozen=True)
class AccessSpec:
    """How one kernel touches one array: mode, thread load, FLOPs that produce it."""

    array: str
    mode: str  # "read", "write" or "readwrite"
    thread_load: float = 1.0
    radius: int | None = None
    flops: float | None = None

    @property
    def reads(self) -> bool:
        return self.mode in ("read", "readwrite")

    @property
    def writes(self) -> bool:
        return self.mode in ("write", "readwrite")


@dataclass(frozen=True)
class KernelSpec:
    """Table III metadata of one original kernel, as given (``None`` = derive it)."""

    name: str
    runtime_s: float
    threads_per_block: int
    blocks: int
    accesses: tuple[AccessSpec, ...]
    registers: int = DEFAULT_REGISTERS
    address_registers: int = DEFAULT_ADDRESS_REGISTERS
    active_threads_per_block: int | None = None
    active_blocks_per_sm: int | None = None
    shared_memory: int | None = None
    flops: float | None = None
    halo: int | None = None
    after: tuple[str, ...] = ()

    @property
    def sites(self) -> int:
        return self.threads_per_block * self.blocks

    def access(self, array: str) -> AccessSpec | None:
        for access in self.accesses:
            if access.array == array:
                return access
        return None


@dataclass(frozen=True)
class CopySpec:
    """A host<->device copy of ``array`` between kernel ``after`` and the next one."""

    array: str
    after: str
    direction: str = "to_host"


@dataclass(frozen=True)
class AppMetadata:
    """A whole codeless application."""

    name: str
    kernels: tuple[KernelSpec, ...]
    arrays: tuple[ArraySpec, ...]
    device: Architecture
    copies: tuple[CopySpec, ...] = ()
    precision: str | None = None
    rename: bool = True
    source: str = "<data>"
    description: str = ""
    synth: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def array_by_name(self) -> dict[str, ArraySpec]:
        return {a.name: a for a in self.arrays}

    @cached_property
    def kernel_by_name(self) -> dict[str, KernelSpec]:
        return {k.name: k for k in self.kernels}

    @property
    def precision_bytes(self) -> int | None:
        return {"double": 8, "single": 4}.get(self.precision or "")

    def array_elements(self, name: str) -> int:
        """Elements of an array: given, else the sites of the first kernel touching it."""
        return self._elements[name]

    @cached_property
    def _elements(self) -> dict[str, int]:
        return {a.name: self._count_elements(a.name) for a in self.arrays}

    def _count_elements(self, name: str) -> int:
        spec = self.array_by_name[name]
        if spec.elements:
            return spec.elements
        if spec.shape:
            return math.prod(spec.shape)
        for kernel in self.kernels:
            if kernel.access(name):
                return kernel.sites
        return 0

    def to_dict(self) -> dict[str, Any]:
        """The application in the file format (a mapping that :func:`parse_app` reads back)."""
        device: Any
        for key, value in PRESETS.items():
            if value == self.device:
                device = key  # type: ignore[assignment]
                break
        else:
            device = {k: v for k, v in self.device.to_dict().items()
                      if k not in ("launch_overhead_s",) and v is not None}
            device["launch_overhead_us"] = self.device.launch_overhead_s * 1e6
        data: dict[str, Any] = {"format": FORMAT, "name": self.name}
        if self.description:
            data["description"] = self.description
        data["device"] = device
        if self.precision:
            data["precision"] = self.precision
        data["rename"] = self.rename
        data["arrays"] = [_array_dict(a) for a in self.arrays]
        if self.copies:
            data["copies"] = [{"array": c.array, "after": c.after, "direction": c.direction}
                              for c in self.copies]
        data["kernels"] = [_kernel_dict(k) for k in self.kernels]
        if self.synth:
            data["synth"] = dict(self.synth)
        return data


def _array_dict(array: ArraySpec) -> dict[str, Any]:
    data: dict[str, Any] = {"name": array.name, "dtype": array.dtype}
    if array.elements:
        data["elements"] = array.elements
    if array.shape:
        data["shape"] = list(array.shape)
    if not array.expandable:
        data["expandable"] = False
    if array.output:
        data["output"] = True
    return data


def _kernel_dict(kernel: KernelSpec) -> dict[str, Any]:
    data: dict[str, Any] = {"name": kernel.name, "runtime_us": round(kernel.runtime_s * 1e6, 6),
                            "threads_per_block": kernel.threads_per_block,
                            "blocks": kernel.blocks, "registers": kernel.registers,
                            "address_registers": kernel.address_registers}
    for key in ("active_threads_per_block", "active_blocks_per_sm", "shared_memory", "flops",
                "halo"):
        value = getattr(kernel, key)
        if value is not None:
            data[key] = value
    if kernel.after:
        data["after"] = list(kernel.after)
    accesses = []
    for access in kernel.accesses:
        item: dict[str, Any] = {"array": access.array, "access": access.mode}
        if access.radius is not None:
            item["radius"] = access.radius
        elif access.reads and access.thread_load != 1:
            item["thread_load"] = access.thread_load
        if access.flops is not None:
            item["flops"] = access.flops
        accesses.append(item)
    data["accesses"] = accesses
    return data


# ---------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The published JSON Schema of the format (``kfuse/project/schema.json``)."""
    text = resources.files("kfuse.project").joinpath("schema.json").read_text()
    return json.loads(text)


def schema_path() -> Path:
    """Where the schema file lies (for tools that want the file itself)."""
    return Path(str(resources.files("kfuse.project").joinpath("schema.json")))


def _where(data: Any, path: Sequence[Any]) -> str:
    """Describe a JSON path in the user's words: kernel 'k2', access to 'u', field 'x'."""
    parts: list[str] = []
    node = data
    last_field = None
    for index, step in enumerate(path):
        child = None
        if isinstance(node, Mapping):
            child = node.get(step)
        elif isinstance(node, list) and isinstance(step, int) and step < len(node):
            child = node[step]
        if isinstance(step, int):
            container = path[index - 1] if index else ""
            label = {"kernels": "kernel", "arrays": "array", "copies": "copy",
                     "accesses": "access", "after": "entry"}.get(str(container), "item")
            name = None
            if isinstance(child, Mapping):
                name = child.get("name") if label != "access" else child.get("array")
            if label == "access":
                parts.append(f"access to '{name}'" if name else f"access #{step + 1}")
            elif name:
                parts.append(f"{label} '{name}' ({container}[{step}])")
            else:
                parts.append(f"{container}[{step}]")
        else:
            last_field = step
            if index + 1 < len(path) and isinstance(path[index + 1], int):
                pass  # the list's items are described by the next step
            elif index + 1 < len(path):
                parts.append(f"'{step}'")
        node = child
    if last_field is not None and (not path or not isinstance(path[-1], int)):
        parts.append(f"field '{last_field}'")
    return ", ".join(parts) if parts else "top level"


def _describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _schema_message(error: Any, data: Any) -> str:
    """One schema violation as a sentence naming the kernel/array and the field."""
    path = list(error.absolute_path)
    where = _where(data, path)
    validator = error.validator
    custom = error.schema.get("x-error") if isinstance(error.schema, Mapping) else None
    if validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return f"{where}: missing required field '{missing}'"
    if validator == "additionalProperties":
        allowed = list(error.schema.get("properties", {}))
        extras = [k for k in error.instance if k not in allowed] \
            if isinstance(error.instance, Mapping) else []
        hints = []
        for extra in extras:
            close = difflib.get_close_matches(extra, allowed, n=1)
            hints.append(f"'{extra}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        return f"{where}: unknown field {', '.join(hints)}; allowed: {', '.join(allowed)}"
    if validator in ("oneOf", "anyOf", "pattern") and custom:
        return f"{where}: {custom}"
    if validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        article = "an" if str(expected)[:1] in "aeiou" else "a"
        return f"{where}: expected {article} {expected}, got {_describe(error.instance)}"
    if validator in ("enum", "const"):
        choices = error.validator_value if validator == "enum" else [error.validator_value]
        return (f"{where}: {_describe(error.instance)} is not one of "
                f"{', '.join(map(str, choices))}")
    if validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        words = {"minimum": "at least", "exclusiveMinimum": "more than",
                 "maximum": "at most", "exclusiveMaximum": "less than"}[validator]
        return f"{where}: must be {words} {error.validator_value}, got {_describe(error.instance)}"
    if validator in ("minItems", "minLength"):
        return f"{where}: must not be empty"
    return f"{where}: {custom or error.message}"


def validate_schema(data: Any, source: str = "<data>") -> None:
    """Check ``data`` against the JSON Schema; raise one MetadataError listing the problems."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)),
                                                                  e.validator))
    if not errors:
        return
    messages = []
    for error in errors:
        # oneOf/anyOf report their branches' failures too; the custom sentence says it all.
        message = _schema_message(error, data)
        if message not in messages:
            messages.append(message)
    _raise(source, messages)


def _raise(source: str, messages: Sequence[str]) -> None:
    shown = list(messages[:10])
    more = len(messages) - len(shown)
    if len(shown) == 1:
        text = f"{source}: {shown[0]}"
    else:
        text = f"{source}: {len(messages)} problems:\n  " + "\n  ".join(shown)
        if more:
            text += f"\n  ... and {more} more"
    raise MetadataError(text)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

# YAML 1.1 reads 1e6 and 1.4e6 as strings (it wants 1.4e+6); metadata is full of such numbers.
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


@lru_cache(maxsize=1)
def _yaml_loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader that also reads ``1e6`` and ``1.4e6`` as numbers, and refuses aliases
        (``*name``): an application description needs none, and nested aliases expand to
        billions of nodes for whoever walks the result."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"an alias (*{event.anchor}): kfuse application descriptions "
                    "take no anchors and aliases; write the values out", event.start_mark)
            return super().compose_node(parent, index)

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    return Loader


def read_file(path: str | Path) -> Any:
    """Parse a YAML (``.yaml``/``.yml``) or JSON file; errors name the file and line."""
    import yaml

    path = Path(path)
    if not path.exists():
        raise MetadataError(f"{path}: no such file")
    if not path.is_file():
        raise MetadataError(f"{path}: not a file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise MetadataError(f"{path}: cannot be read: {error}") from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise MetadataError(f"{path}: not valid JSON (line {error.lineno}, column "
                                f"{error.colno}): {error.msg}") from None
    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise MetadataError(f"{path}: not valid YAML{where}: {problem}") from None


def load_app(path: str | Path) -> AppMetadata:
    """Read, check and build a codeless application from a YAML or JSON file."""
    return parse_app(read_file(path), source=str(path))


def parse_app(data: Any, source: str = "<data>") -> AppMetadata:
    """Check a parsed mapping against the schema and its meaning; build the application."""
    if not isinstance(data, Mapping):
        raise MetadataError(f"{source}: the file must hold a mapping with 'name' and 'kernels', "
                            f"got {type(data).__name__}")
    _check_finite(data, source)
    validate_schema(data, source)
    problems: list[str] = []
    device = _device(data.get("device", "current"), source)
    launch = data.get("launch", {})
    arrays = [ArraySpec(name=a["name"], dtype=a.get("dtype", "float64"),
                        elements=a.get("elements"),
                        shape=tuple(a["shape"]) if a.get("shape") else None,
                        expandable=a.get("expandable", True), output=a.get("output", False))
              for a in data.get("arrays", [])]
    seen: set[str] = set()
    for array in arrays:
        if array.name in seen:
            problems.append(f"array '{array.name}' is declared twice")
        seen.add(array.name)
        if array.elements and array.shape and math.prod(array.shape) != array.elements:
            problems.append(f"array '{array.name}': elements {array.elements} does not match "
                            f"shape {list(array.shape)}")
    known_arrays = {a.name for a in arrays}
    kernels: list[KernelSpec] = []
    names: set[str] = set()
    for index, raw in enumerate(data["kernels"]):
        name = raw["name"]
        label = f"kernel '{name}' (kernels[{index}])"
        if name in names:
            problems.append(f"{label}: another kernel has the same name (a kernel launched "
                            "twice needs two names)")
        names.add(name)
        kernels.append(_kernel(raw, launch, label, known_arrays, arrays, device, problems))
    kernel_names = [k.name for k in kernels]
    for kernel in kernels:
        for other in kernel.after:
            if other == kernel.name:
                problems.append(f"kernel '{kernel.name}', field 'after': a kernel cannot come "
                                "after itself")
            elif other not in names:
                problems.append(f"kernel '{kernel.name}', field 'after': unknown kernel "
                                f"'{other}'{_suggest(other, kernel_names)}")
    copies = []
    for index, raw in enumerate(data.get("copies", [])):
        if raw["array"] not in known_arrays:
            problems.append(f"copy #{index + 1}, field 'array': unknown array "
                            f"'{raw['array']}'{_suggest(raw['array'], known_arrays)}")
        if raw["after"] not in names:
            problems.append(f"copy #{index + 1}, field 'after': unknown kernel "
                            f"'{raw['after']}'{_suggest(raw['after'], kernel_names)}")
        copies.append(CopySpec(raw["array"], raw["after"], raw.get("direction", "to_host")))
    if problems:
        _raise(source, problems)
    app = AppMetadata(name=data["name"], kernels=tuple(kernels), arrays=tuple(arrays),
                      device=device, copies=tuple(copies), precision=data.get("precision"),
                      rename=data.get("rename", True), source=source,
                      description=data.get("description", ""),
                      synth=dict(data.get("synth", {})))
    _check_order(app)
    return app


def _check_finite(data: Any, source: str) -> None:
    """Every number is finite: a ``.nan`` or ``.inf`` runtime, size or thread load has no
    meaning (and would give NaN predictions or an overflow)."""
    pending: list[tuple[Any, str]] = [(data, "")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise MetadataError(f"{source}: field '{path.lstrip('.')}': {value} is not a "
                                "finite number")
        if isinstance(value, Mapping):
            pending.extend((item, f"{path}.{key}") for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((item, f"{path}[{index}]") for index, item in enumerate(value))


def _suggest(name: str, choices: Any) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _device(value: Any, source: str) -> Architecture:
    try:
        if isinstance(value, str):
            return preset(value)
        values = dict(value)
        base = preset(values.pop("preset")) if "preset" in values else None
        if "launch_overhead_us" in values:
            values["launch_overhead_s"] = values.pop("launch_overhead_us") * 1e-6
        if base is None:
            missing = [k for k in ("sm_count", "shared_memory_per_sm", "registers_per_sm",
                                   "bandwidth_gbps") if k not in values]
            if missing:
                raise MetadataError(f"{source}: field 'device': missing {', '.join(missing)} "
                                    "(or give 'preset' to start from)")
            values.setdefault("name", "custom device")
            return Architecture(**values)
        fields = base.to_dict() | values
        return Architecture(**fields)
    except MetadataError:
        raise
    except KfuseError as error:
        raise MetadataError(f"{source}: field 'device': {error.detail}") from None


def _thread_load(raw: Mapping[str, Any], array: ArraySpec | None, label: str,
                 problems: list[str]) -> tuple[float, int | None]:
    if "thread_load" in raw and "radius" in raw:
        problems.append(f"{label}: give thread_load or radius, not both")
    if "radius" in raw:
        radius = int(raw["radius"])
        ndim = array.ndim if array else 2
        if raw.get("stencil", "star") == "box":
            return float((2 * radius + 1) ** ndim), radius
        return float(2 * ndim * radius + 1), radius
    return float(raw.get("thread_load", 1.0)), None


def _kernel(raw: Mapping[str, Any], launch: Mapping[str, Any], label: str,
            known_arrays: set[str], arrays: Sequence[ArraySpec], device: Architecture,
            problems: list[str]) -> KernelSpec:
    by_name = {a.name: a for a in arrays}
    runtime = raw.get("runtime_s") or (raw.get("runtime_ms", 0) * 1e-3) or \
        (raw.get("runtime_us", 0) * 1e-6)
    values: dict[str, Any] = {}
    for key in ("threads_per_block", "blocks", "registers", "address_registers"):
        if key in raw:
            values[key] = raw[key]
        elif key in launch:
            values[key] = launch[key]
    for key in ("threads_per_block", "blocks"):
        if key not in values:
            problems.append(f"{label}: missing field '{key}' (give it on the kernel or under "
                            "'launch')")
            values[key] = 1
    thr = values["threads_per_block"]
    if thr > device.max_threads_per_sm:
        problems.append(f"{label}, field 'threads_per_block': {thr} threads per block exceed "
                        f"the device's {device.max_threads_per_sm} threads per SM")
    active = raw.get("active_threads_per_block")
    if active is not None and active > thr:
        problems.append(f"{label}, field 'active_threads_per_block': {active} is more than "
                        f"threads_per_block {thr}")
    accesses = []
    touched: set[str] = set()
    for index, item in enumerate(raw["accesses"]):
        array = item["array"]
        where = f"{label}, access #{index + 1} to '{array}'"
        if array not in known_arrays:
            problems.append(f"{label}, access #{index + 1}, field 'array': unknown array "
                            f"'{array}'{_suggest(array, known_arrays)}; declare it under "
                            "'arrays'")
        if array in touched:
            problems.append(f"{where}: the array is listed twice (use access: readwrite)")
        touched.add(array)
        mode = ACCESS_MODES[str(item["access"]).lower()]
        load, radius = _thread_load(item, by_name.get(array), where, problems)
        if mode == "write" and ("thread_load" in item or "radius" in item) and load != 1:
            problems.append(f"{where}, field 'thread_load': a write-only access has no thread "
                            "load (it reads nothing)")
        accesses.append(AccessSpec(array, mode, load, radius, item.get("flops")))
    return KernelSpec(name=raw["name"], runtime_s=float(runtime), threads_per_block=thr,
                      blocks=values["blocks"], accesses=tuple(accesses),
                      registers=values.get("registers", DEFAULT_REGISTERS),
                      address_registers=values.get("address_registers",
                                                   DEFAULT_ADDRESS_REGISTERS),
                      active_threads_per_block=active,
                      active_blocks_per_sm=raw.get("active_blocks_per_sm"),
                      shared_memory=raw.get("shared_memory"), flops=raw.get("flops"),
                      halo=raw.get("halo"), after=tuple(raw.get("after", ())))


def _check_order(app: AppMetadata) -> None:
    """The order-of-execution graph must be acyclic (``after`` can contradict the data)."""
    import networkx as nx

    from kfuse.project.problem import order_graph

    dag = order_graph(app)
    try:
        cycle = nx.find_cycle(dag)
    except nx.NetworkXNoCycle:
        return
    path = " -> ".join([edge[0] for edge in cycle] + [cycle[0][0]])
    why = []
    for source, target, *_ in cycle:
        data = dag.edges[source, target]
        why.append(f"{source} -> {target} ({', '.join(sorted(data.get('why', [])))})")
    raise MetadataError(f"{app.source}: cyclic dependencies between kernels: {path}; "
                        f"edges: {'; '.join(why)}")


def app_yaml(app: AppMetadata | Mapping[str, Any]) -> str:
    """An application as YAML text (with libyaml's emitter where present: 10x faster)."""
    import yaml

    data = app.to_dict() if isinstance(app, AppMetadata) else dict(app)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=None, width=100)


def dump_app(app: AppMetadata | Mapping[str, Any], path: str | Path) -> Path:
    """Write an application as YAML (``.yaml``/``.yml``) or JSON (anything else)."""
    data = app.to_dict() if isinstance(app, AppMetadata) else dict(app)
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        text = app_yaml(data)
    else:
        text = json.dumps(data, indent=2) + "\n"
    path.write_text(text)
    return path


__all__ = ["AccessSpec", "AppMetadata", "ArraySpec", "CopySpec", "FORMAT", "KernelSpec",
           "app_yaml", "dump_app", "load_app", "parse_app", "read_file", "schema", "schema_path",
           "validate_schema"]
