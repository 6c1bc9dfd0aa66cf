"""Streaming along the outermost axis: a thread walks down a strip of rows (planes in 3-D)
a few at a time and carries, in registers, every value one step computed that the next
step needs again (the input rows, derivatives and products that neighbouring windows
share), instead of recomputing the halo of each register tile.

The code of one step is a register tile's straight-line code. A value of the step is
carried when the same step also computes it one step further down: the statement whose
text is this value's text with every row moved down by the step. The next step then takes
the value from the carry register, and statements only carried values needed are dropped.
Only strips whose rows, halos included, lie inside the array stream; the others take the
register-tile path, which applies the boundary modes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Shifts a streaming step may take along the outer axis without a boundary mode (the
# strip's guard checks that the shifts actually used stay inside the array).
INSIDE = 1 << 20

_STATEMENT = re.compile(r"^const (\w+) (\w+) = (.*);$")
_IDENTIFIER = re.compile(r"(?<![.\w])[A-Za-z_]\w*")
_SCALAR_TYPES = frozenset({"float", "double", "int", "bool"})


@dataclass(frozen=True)
class Stream:
    """The code of a streamed strip: carried registers, the first step, any later step."""

    declarations: list[str]
    first: list[str]
    later: list[str]
    reach: tuple[int, int]  # lowest and highest outer shift a step reads
    carried: int


def _row_name(outer: str, total: int) -> str:
    """The index variable kfuse.codegen.cexpr names for row ``outer + total``."""
    if total == 0:
        return outer
    return f"{outer}_{'p' if total > 0 else 'm'}{abs(total)}"


def _row_shifts(outer: str, names: set[str]) -> dict[str, int]:
    """Index variables of the outer axis among ``names`` (and the axis itself): shifts."""
    pattern = re.compile(rf"^{outer}(?:_([pm])(\d+))?$")
    shifts = {}
    for name in names | {outer}:
        if match := pattern.match(name):
            sign, amount = match.groups()
            shifts[name] = 0 if sign is None else int(amount) * (1 if sign == "p" else -1)
    return shifts


def stream_steps(step_lines: list[str], outer: str, step: int, prefetch: bool = False
                 ) -> Stream:
    """Code for a strip walked ``step`` rows of the outer axis at a time.

    ``step_lines`` computes the points of one step (rows ``outer .. outer + step - 1``):
    ``const`` statements, then stores; rows are named as kfuse.codegen.cexpr names them.
    With ``prefetch`` each step also loads the rows of memory the next step reads first
    (they are in flight while this step computes), one step further than it computes.
    """
    statements: list[tuple[str, str, str]] = []  # (C type, name, text)
    stores: list[str] = []
    for line in step_lines:
        if match := _STATEMENT.match(line):
            statements.append(match.groups())  # type: ignore[arg-type]
        else:
            stores.append(line)
    defined = {name for _, name, _ in statements}
    rows = _row_shifts(outer, defined)
    # moved[name]: the statement computing the same value `step` rows further down
    moved: dict[str, str] = {name: _row_name(outer, shift + step) for name, shift in rows.items()}
    by_text = {(ctype, text): name for ctype, name, text in statements}
    for ctype, name, text in statements:
        if name in rows:
            continue
        tokens = _IDENTIFIER.findall(text)
        if any(token in defined and token not in moved for token in tokens):
            continue  # depends on a value with no counterpart further down
        shifted = _IDENTIFIER.sub(lambda m: moved.get(m.group(0), m.group(0)), text)
        if (ctype, shifted) in by_text:
            moved[name] = by_text[(ctype, shifted)]
    carried = {name: moved[name] for ctype, name, _ in statements
               if name in moved and name not in rows and ctype in _SCALAR_TYPES}
    # a later step: carried values from the registers, then what is still needed; a value
    # carried but not needed any more is not carried (until nothing changes)
    while True:
        later = [(ctype, name, f"kf_carry_{name}" if name in carried else text)
                 for ctype, name, text in statements]
        needed = set(_IDENTIFIER.findall("\n".join(stores))) | set(carried.values())
        kept = []
        for ctype, name, text in reversed(later):
            if name in needed:
                kept.append((ctype, name, text))
                needed |= set(_IDENTIFIER.findall(text))
        kept.reverse()
        still = {name: value for name, value in carried.items() if name in needed}
        if len(still) == len(carried):
            break
        carried = still
    types = {name: ctype for ctype, name, _ in statements}
    later_lines = [f"const {ctype} {name} = {text};" for ctype, name, text in kept]
    first_ahead: list[str] = []
    ahead_shifts: list[str] = []
    if prefetch:
        later_lines, first_ahead, ahead_shifts = _prefetched(statements, kept, rows, outer,
                                                             step)
    by_type: dict[str, list[str]] = {}
    for name in carried:
        by_type.setdefault(types[name], []).append(f"kf_carry_{name}")
    for line in ahead_shifts:
        name = line.split(" = ")[0].removeprefix("kf_next_")
        by_type.setdefault(types[name], []).append(f"kf_next_{name}")
    declarations = [f"{ctype} {', '.join(names)};" for ctype, names in by_type.items()]
    comment = [f"// {len(carried)} values carried to the next step"] if carried else []
    if ahead_shifts:
        comment.append(f"// {len(ahead_shifts)} loads of the next step issued in this one")
    shifts = [f"kf_carry_{name} = {value};" for name, value in carried.items()]
    reach = [shift for name, shift in rows.items() if name != outer] + [0, step - 1]
    for sign, amount in re.findall(rf"\({outer} ([+-]) (\d+)\)", "\n".join(step_lines)):
        reach.append(int(amount) * (1 if sign == "+" else -1))  # a coordinate's value
    return Stream(declarations, [*step_lines, *first_ahead, *comment, *shifts],
                  later_lines + stores + comment + shifts + ahead_shifts,
                  (min(reach), max(reach) + (step if ahead_shifts else 0)), len(carried))


_LOAD = re.compile(r"^(\*reinterpret_cast<const \w+\*>\(&\w+\[.*\]\)|\w+\[[^?]*\])$")


def _prefetched(statements: list[tuple[str, str, str]], kept: list[tuple[str, str, str]],
                rows: dict[str, int], outer: str, step: int
                ) -> tuple[list[str], list[str], list[str]]:
    """(a later step's statements with its memory loads issued one step ahead, the first
    step's loads for the second, the hand-over of the loads at the end of a step)."""
    varying = set(rows)  # values that change from one step to the next
    for _, name, text in statements:
        if any(token in varying for token in _IDENTIFIER.findall(text)):
            varying.add(name)
    all_names = {name for _, name, _ in statements}

    def ahead_text(text: str) -> str:  # rows one step further down
        return _IDENTIFIER.sub(lambda m: f"({outer} + {rows[m.group(0)] + step})"
                               if m.group(0) in rows else m.group(0), text)

    later, first, shifts = [], [], []
    for ctype, name, text in kept:
        loads = _LOAD.match(text) and not text.startswith("kf_carry_")
        tokens = [t for t in _IDENTIFIER.findall(text) if t in all_names]
        if not loads or any(t in varying and t not in rows for t in tokens):
            later.append(f"const {ctype} {name} = {text};")
            continue
        later.append(f"const {ctype} {name} = kf_next_{name};")
        later.append(f"const {ctype} kf_ahead_{name} = {ahead_text(text)};")
        first.append(f"kf_next_{name} = {ahead_text(text)};")
        shifts.append(f"kf_next_{name} = kf_ahead_{name};")
    return later, first, shifts
