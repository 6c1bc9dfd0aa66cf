"""Hashes of the CUDA C kfuse generates for every app, to show that a refactoring changed
no kernel (issue 27: behaviour unchanged).

For each app, at its test size and its benchmark size, with the plan ``auto`` (the default
search, on the stored device profile) and ``unfused``: the program as the cpu backend
generates it (sizes as arguments) and as the GPU path does (sizes compiled in, arrays
aligned; 3-D apps with and without marching). Each source is hashed as it is and after
normalising whitespace and comments, so that a change of formatting shows apart from a
change of code, and its kernels alone (after the prelude), so that a change of the prelude
shows apart from a change of the kernels.

    PYTHONPATH=. python3 tools/source_hashes.py --write tools/source_hashes.json
    PYTHONPATH=. python3 tools/source_hashes.py --check tools/source_hashes.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from math import prod


def normalised(source: str) -> str:
    """``source`` without comments, with runs of whitespace as one space."""
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    source = re.sub(r"//[^\n]*", " ", source)
    return " ".join(source.split())


def kernels_of(source: str) -> str:
    """``source`` after the prelude (the kernels alone)."""
    marker = "===== end of kfuse prelude ====="
    return source.split(marker, 1)[-1]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sources() -> dict[str, str]:
    """Every generated source by a name saying app, size, plan and path."""
    from kfuse.apps import list_apps
    from kfuse.codegen import generate
    from kfuse.runtime import planned

    found = {}
    for app in list_apps("all"):
        graph = app.build().graph()
        for size in (app.test_size, app.bench_size):
            sizes = app.sizes(graph, size)
            wide = any(prod(graph.shape_of(name, sizes)) > 2**31 - 1 for name in graph.buffers)
            for plan in ("auto", "unfused"):
                groups = None
                if plan == "auto":
                    groups = planned(graph, sizes, "auto", "cpu").kernel_groups
                label = f"{app.name} {'x'.join(map(str, size))} {plan}"
                found[f"{label} cpu"] = generate(graph, groups, wide_index=wide,
                                                 array_alignment=16).source
                for march in ((False, True) if len(size) == 3 else (False,)):
                    found[f"{label} gpu{' march' if march else ''}"] = generate(
                        graph, groups, wide_index=wide, fixed_sizes=sizes, march=march,
                        array_alignment=16).source
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", help="write the hashes to this JSON file")
    action.add_argument("--check", help="compare with the hashes in this JSON file")
    parser.add_argument("--dump", help="also write each source into this folder")
    options = parser.parse_args()
    found = sources()
    hashes = {name: {"exact": digest(text), "normalised": digest(normalised(text)),
                     "kernels": digest(normalised(kernels_of(text)))}
              for name, text in found.items()}
    if options.dump:
        from pathlib import Path
        folder = Path(options.dump)
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in found.items():
            (folder / (name.replace(" ", "_") + ".cu")).write_text(text)
    if options.write:
        with open(options.write, "w") as file:
            json.dump(hashes, file, indent=1, sort_keys=True)
        print(f"{len(hashes)} sources hashed into {options.write}")
        return 0
    with open(options.check) as file:
        recorded = json.load(file)
    differ = 0
    for name in sorted(set(recorded) | set(hashes)):
        old, new = recorded.get(name), hashes.get(name)
        if old == new:
            continue
        differ += 1
        if old is None or new is None:
            print(f"{name}: {'new' if old is None else 'gone'}")
        elif old["normalised"] == new["normalised"]:
            print(f"{name}: formatting only")
        elif old.get("kernels") == new["kernels"]:
            print(f"{name}: prelude only")
        else:
            print(f"{name}: CODE CHANGED")
    print(f"{len(hashes)} sources, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
