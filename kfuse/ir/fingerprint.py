"""Structural fingerprints: a digest of what an IR value is, the same in every process.

Persistent caches (generated programs, plans) are keyed by what a pipeline computes, not by
the Python object that describes it: two pipelines built alike, in two processes, share
their cached programs. The digest walks frozen dataclasses field by field (fields that take
no part in equality, such as a load's link back to its DSL pipeline, are left out),
mappings in key order and sequences in order.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any


def canonical(value: Any) -> str:
    """A text that equal values (by dataclass equality) share and unequal ones do not."""
    parts: list[str] = []
    stack: list[Any] = [value]
    while stack:  # iterative: deep expressions do not reach Python's recursion limit
        item = stack.pop()
        if isinstance(item, _Text):
            parts.append(item.text)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            fields = [f for f in dataclasses.fields(item) if f.compare]
            parts.append(f"{type(item).__name__}(")
            stack.append(_Text(")"))
            for field in reversed(fields):
                stack.extend((_Text(","), getattr(item, field.name), _Text(f"{field.name}=")))
        elif isinstance(item, Mapping):
            parts.append("{")
            stack.append(_Text("}"))
            for key in sorted(item, key=repr, reverse=True):
                stack.extend((_Text(","), item[key], _Text(f"{key!r}:")))
        elif isinstance(item, (tuple, list)):
            parts.append("(")
            stack.append(_Text(")"))
            for element in reversed(item):
                stack.extend((_Text(","), element))
        elif isinstance(item, (frozenset, set)):
            parts.append("{" + ",".join(sorted(canonical(e) for e in item)) + "}")
        elif item is None or isinstance(item, (str, int, float, bool, complex)):
            parts.append(f"{type(item).__name__}:{item!r}")
        else:
            raise TypeError(f"no structural fingerprint for {type(item).__name__}")
    return "".join(parts)


def digest(value: Any) -> str:
    """The SHA-256 of :func:`canonical` (hex)."""
    return hashlib.sha256(canonical(value).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class _Text:
    text: str
