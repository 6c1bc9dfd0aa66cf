"""Command-line pieces shared by the ``kfuse`` command and the experiment scripts: argparse
``type``s for numbers with a lower bound, refused as usage errors (exit code 2) before any
work, and the experiments' ``[app ...] [--rounds R] [--runs N]`` command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any


def number_at_least(kind: type, minimum: float, what: str) -> Callable[[str], Any]:
    """An argparse ``type``: a ``kind`` no smaller than ``minimum``, so that a negative seed
    or a zero count is refused as a usage error before any work (NumPy refuses negative
    seeds with a traceback; a count of 0 gives an empty table)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value >= minimum:  # (NaN too)
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


NON_NEGATIVE_INT = number_at_least(int, 0, "a non-negative integer")
POSITIVE_INT = number_at_least(int, 1, "a positive integer")
NON_NEGATIVE_NUMBER = number_at_least(float, 0.0, "a non-negative number")

def alternating_main(description: str, compare: Callable[[str, int, int], None],
                     apps: Sequence[str], rounds: int = 3, runs: int = 30) -> None:
    """Command line of the alternating-rounds experiment scripts: ``[app ...] [--rounds R]
    [--runs N]``, then ``compare(app, rounds, runs)`` for each app."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("apps", nargs="*", default=list(apps))
    parser.add_argument("--rounds", type=POSITIVE_INT, default=rounds)
    parser.add_argument("--runs", type=POSITIVE_INT, default=runs)
    args = parser.parse_args()
    for name in args.apps:
        compare(name, args.rounds, args.runs)


__all__ = ["NON_NEGATIVE_INT", "NON_NEGATIVE_NUMBER", "POSITIVE_INT", "alternating_main",
           "number_at_least"]
