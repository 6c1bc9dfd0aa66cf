"""The layer contract: kfuse's packages depend on each other one way (``DESIGN.md``).

Every ``import`` of a kfuse module, at the top of a file or inside a function, must go to
the importer's own package or to one below it in :data:`LAYERS`. The imports that still run
upward are listed in :data:`UPWARD_DEBT`, each with what removes it; the test fails on any
new one, and on a listed one that is gone (so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kfuse"

# Lowest first. A package may import its own modules and those of packages before it.
LAYERS = (
    ("user_line", "errors", "log", "cache", "cuda_limits", "config"),  # what every layer uses
    ("ir",),
    ("analysis",),  # facts derived from the structure: reachability, convexity
    ("dsl",),  # builds graphs; planning and running reach it through kfuse.driver
    ("schedule",),  # how a group is implemented: typed forms, register tiles, marching
    ("fusion",),
    ("model",),  # device profiles and cost models: read a stored profile, run nothing
    ("search",),
    ("project",),
    ("codegen",),
    ("runtime",),
    ("apps",),  # pipelines from the literature, written with kfuse.dsl
    ("tune",),  # what measures the GPU: timing, calibration, the measured model, autotuning
    ("scaleout",),  # pipelines over chunked Dask arrays (the driver runs them)
    ("driver",),  # what a Pipeline calls to fuse, plan, compile and run
    ("jit",),
    ("__init__",),  # the public API: ``import kfuse``
    ("bench", "fuzz"),
    ("cli",),
    ("__main__",),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}

# (importing module, imported module): imports that still run upward, with what removes
# them: none (the map-reduce group's planning half lives in kfuse.fusion.mapreduce).
UPWARD_DEBT: set[tuple[str, str]] = set()


def layer_of(module: str) -> str:
    """The layer a kfuse module belongs to: its package, or the module at kfuse's top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def is_module(package: str, name: str) -> bool:
    """Whether ``name`` imported from the kfuse package ``package`` is a module of it."""
    folder = PACKAGE.parent.joinpath(*package.split("."))
    return (folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists()


def kfuse_imports() -> set[tuple[str, str]]:
    """Every (importing module, imported module) pair of kfuse modules, at any depth."""
    pairs = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(("kfuse", *path.relative_to(PACKAGE).with_suffix("").parts))
        module = module.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # ``from kfuse import config`` imports the module kfuse.config
                names = [f"{node.module}.{alias.name}" if is_module(node.module, alias.name)
                         else node.module for alias in node.names]
            else:
                continue
            pairs.update((module, name) for name in names
                         if name == "kfuse" or name.startswith("kfuse."))
    return pairs


def upward_imports() -> set[tuple[str, str]]:
    return {(importer, imported) for importer, imported in kfuse_imports()
            if RANK[layer_of(imported)] > RANK[layer_of(importer)]}


def test_every_package_has_a_layer():
    layers = {layer_of(f"kfuse.{'.'.join(path.relative_to(PACKAGE).with_suffix('').parts)}")
              for path in PACKAGE.rglob("*.py")}
    assert layers <= set(RANK), f"packages without a layer: {sorted(layers - set(RANK))}"


def test_no_new_upward_import():
    new = sorted(upward_imports() - UPWARD_DEBT)
    assert not new, "imports against the layers (DESIGN.md): " + ", ".join(
        f"{a} imports {b}" for a, b in new)


def test_the_listed_upward_imports_still_exist():
    gone = sorted(UPWARD_DEBT - upward_imports())
    assert not gone, f"no longer upward (remove from UPWARD_DEBT): {gone}"


# -- the scripts outside the package -----------------------------------------------------------

SCRIPT_FOLDERS = ("benchmarks", "experiments", "tools")

# (script, kfuse module attribute) that scripts still assign: none; a script that studies
# one group passes a form with its own tile and block (kfuse.schedule.forms), and
# everything else goes through kfuse.config (the tile sweep's tiles and blocks too).
REASSIGNED_DEBT: set[tuple[str, str]] = set()


def script_findings() -> set[tuple[str, str]]:
    """(script, what) for every kfuse module attribute a script assigns (``module.NAME =``,
    ``module.TABLE[key] =``) and every private name it imports from kfuse."""
    root = PACKAGE.parent
    found = set()
    for folder in SCRIPT_FOLDERS:
        for path in sorted((root / folder).glob("*.py")):
            script = f"{folder}/{path.name}"
            tree = ast.parse(path.read_text(), str(path))
            modules = {}  # local name -> kfuse module it is bound to
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules.update((alias.asname, alias.name) for alias in node.names
                                   if alias.asname and alias.name.startswith("kfuse."))
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                        "kfuse") and node.level == 0:
                    for alias in node.names:
                        if alias.name.startswith("_"):
                            found.add((script, f"private {node.module}.{alias.name}"))
                        elif is_module(node.module, alias.name):
                            modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign):
                    targets = [t for target in node.targets for t in (
                        target.elts if isinstance(target, ast.Tuple) else [target])]
                elif isinstance(node, ast.AugAssign):
                    targets = [node.target]
                else:
                    continue
                for target in targets:
                    base = target.value if isinstance(target, ast.Subscript) else target
                    if (isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name)
                            and base.value.id in modules):
                        found.add((script, f"{modules[base.value.id]}.{base.attr}"))
    return found


def test_scripts_change_kfuse_only_through_its_configuration():
    new = sorted(script_findings() - REASSIGNED_DEBT)
    assert not new, "scripts that reassign kfuse's globals or import private names " \
        "(use kfuse.config): " + ", ".join(f"{s}: {w}" for s, w in new)


def test_the_listed_reassignments_still_exist():
    gone = sorted(REASSIGNED_DEBT - script_findings())
    assert not gone, f"no longer reassigned (remove from REASSIGNED_DEBT): {gone}"


def test_the_package_imports_no_script():
    folders = {path.stem for folder in SCRIPT_FOLDERS
               for path in (PACKAGE.parent / folder).glob("*.py")}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""])
                assert not {name.split(".")[0] for name in names} & (
                    folders | set(SCRIPT_FOLDERS)), f"{path} imports a script"
