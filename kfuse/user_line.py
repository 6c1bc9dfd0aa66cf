"""Find the user's own line of code, for error messages and default operator names."""

from __future__ import annotations

import functools
import itertools
import linecache
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

_PACKAGE_DIR = str(Path(__file__).resolve().parent)
_APPS_DIR = os.path.join(_PACKAGE_DIR, "apps") + os.sep
_CLI_DIR = os.path.join(_PACKAGE_DIR, "cli") + os.sep
# The apps' own modules are the user's code for their lines; these files of the apps
# package are kfuse's (the registry, the base class, the reference check)
_APPS_MACHINERY = ("__init__.py", "base.py", "check.py")
_ASSIGNMENT = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")


@dataclass(frozen=True)
class UserLine:
    """A location in the user's code: ``file:line`` and the text of the line; ``column``:
    where on it the call running now starts (None where Python does not say: before 3.11)."""

    filename: str
    lineno: int
    text: str
    column: int | None = None

    def __str__(self) -> str:
        place = f"{Path(self.filename).name}:{self.lineno}"
        return f"{place}: {self.text.strip()}" if self.text.strip() else place

    @property
    def assigned_name(self) -> str | None:
        """The variable the line assigns to (``dx = ...`` gives ``dx``), if any, and only to
        the call that makes the assigned value: in ``q = kf.point(x - kf.reduce_max(x))`` the
        reduction, called first, is not ``q``."""
        match = _ASSIGNMENT.match(self.text)
        if not match:
            return None
        if self.column is not None and self.text[match.end():self.column].strip(" (") != "":
            return None  # a call nested inside the assigned expression
        return match.group(1)


def where_of(line: UserLine | None) -> str | None:
    """A user's line as text for an error message (None when there is none)."""
    return str(line) if line else None


def user_where() -> str | None:
    """The user's line calling kfuse now, as text for an error message."""
    return where_of(user_line())


def user_line() -> UserLine | None:
    """The innermost stack frame outside the kfuse package (the apps count as the user's);
    None under kfuse's command line, whose errors need no line."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        place = _place(filename)
        if filename.startswith("<") and str(frame.f_globals.get("__name__", "")).startswith(
                "kfuse."):  # code kfuse made at run time (a dataclass's __init__)
            place = "kfuse"
        if place == "command line":
            return None
        if place == "user":
            text = linecache.getline(filename, frame.f_lineno)
            return UserLine(filename, frame.f_lineno, text, _call_column(frame))
        frame = frame.f_back
    return None


@functools.lru_cache(maxsize=1024)
def _place(filename: str) -> str:
    """Whose code a file is: ``"user"``, ``"kfuse"`` or kfuse's ``"command line"``."""
    resolved = str(Path(filename).resolve()) if not filename.startswith("<") else filename
    if not resolved.startswith(_PACKAGE_DIR + os.sep) or (resolved.startswith(_APPS_DIR) and Path(
            resolved).name not in _APPS_MACHINERY):
        return "user"
    return "command line" if resolved.startswith(_CLI_DIR) else "kfuse"


def _call_column(frame: FrameType) -> int | None:
    """Where on its line the instruction ``frame`` runs now starts (Python 3.11+)."""
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is None or frame.f_lasti < 0:
        return None
    found = next(itertools.islice(positions(), frame.f_lasti // 2, None), None)
    if found is None or found[0] != frame.f_lineno:
        return None
    return found[2]
