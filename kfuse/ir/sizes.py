"""Size symbols derived from others: the sizes of the levels of a pyramid.

An axis read at ``factor * p`` (a downsampling read) spans ``ceil(n / factor)`` points of an
axis of ``n``; one read at ``p // factor`` (upsampling) spans ``n * factor``. Such a size is
the symbol ``"n/2"`` or ``"n*2"`` (nested: ``"n/2/2"``), bound from ``n`` wherever sizes are
bound, so a pipeline's pyramid levels need no input of their own. User-given symbols are
names (no ``/`` or ``*``), and a derived size of a fixed size is that number.
"""

from __future__ import annotations

import re

_DERIVED = re.compile(r"(.+)([/*])(\d+)")


def fixed_size(symbol: str) -> int | None:
    """The size a symbol stands for when it is a number (``"9"``: an axis of exactly 9
    elements, from ``shape=(9, ...)``), else None (a size bound when the pipeline runs)."""
    return int(symbol) if symbol.isdecimal() else None


def derived_size(symbol: str) -> tuple[str, str, int] | None:
    """(base symbol, ``"/"`` for ceil(base / factor) or ``"*"`` for base * factor, factor)
    of a derived size symbol, or None for a plain one."""
    match = _DERIVED.fullmatch(symbol)
    if match is None:
        return None
    return match.group(1), match.group(2), int(match.group(3))


def scaled_size(base: str, operation: str, factor: int) -> str:
    """The symbol of ``ceil(base / factor)`` (``operation`` ``"/"``) or ``base * factor``
    (``"*"``); a number where ``base`` is one; ``base`` itself for a factor of 1."""
    if factor == 1:
        return base
    fixed = fixed_size(base)
    if fixed is not None:
        return str(size_of_derived(fixed, operation, factor))
    return f"{base}{operation}{factor}"


def size_of_derived(base: int, operation: str, factor: int) -> int:
    """The size ``operation`` (``/``: ceiling division, ``*``: product) gives ``base``."""
    return -(-base // factor) if operation == "/" else base * factor


def base_symbols(symbol: str) -> list[str]:
    """``symbol`` and every symbol it is derived from, outermost first (``n/2/2``, ``n/2``,
    ``n``)."""
    chain = [symbol]
    while (derived := derived_size(chain[-1])) is not None:
        chain.append(derived[0])
    return chain


def describe_size(symbol: str) -> str:
    """A size symbol as a user reads it: ``ceil(ceil(n/2)/2)``, ``n*2``."""
    derived = derived_size(symbol)
    if derived is None:
        return symbol
    base, operation, factor = derived
    inner = describe_size(base)
    return f"ceil({inner}/{factor})" if operation == "/" else f"{inner}*{factor}"


def bind_derived(symbols: list[str] | tuple[str, ...], sizes: dict[str, int]
                 ) -> list[tuple[str, int, int]]:
    """Bind every derived symbol of ``symbols`` whose bases are bound, in ``sizes`` (in
    place); return (symbol, bound before, derived) for each that was bound before to another
    size (an input of a pyramid level given at a size its level does not have)."""
    conflicts = []
    for symbol in sorted(symbols, key=lambda s: len(base_symbols(s))):
        chain = base_symbols(symbol)
        for outer in reversed(chain[:-1]):  # innermost derived first
            base, operation, factor = derived_size(outer)  # type: ignore[misc]
            if base not in sizes:
                break
            value = size_of_derived(sizes[base], operation, factor)
            if sizes.setdefault(outer, value) != value:
                conflicts.append((outer, sizes[outer], value))
    return conflicts
