"""The documentation a newcomer reads runs as written: every ``python`` block of the README
and the tutorial, in order (blocks that start with ``# GPU`` need one and are skipped here),
and every error kfuse raises is in the error catalogue."""

from __future__ import annotations

import importlib.util
import inspect
import re
import runpy
from pathlib import Path

import pytest

import kfuse
from kfuse import errors

ROOT = Path(__file__).resolve().parent.parent
RUN_PAGES = ("README.md", "docs/tutorial.md")


def python_blocks(page: str) -> list[str]:
    text = (ROOT / page).read_text()
    return [block for block in re.findall(r"```python\n(.*?)```", text, re.S)
            if not block.startswith("# GPU")]


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_pages_code_runs_as_written(page, tmp_path, monkeypatch):
    """The blocks run as one script written to a file (as a reader would paste them: the
    operators are named from the source lines, which code run by ``exec`` has not)."""
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python block"
    script = tmp_path / (Path(page).stem + "_blocks.py")
    script.write_text("\n".join(blocks))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__docs__")


def test_every_error_is_in_the_catalogue():
    catalogue = (ROOT / "docs" / "errors.md").read_text()
    raised = [name for name, value in inspect.getmembers(errors, inspect.isclass)
              if issubclass(value, kfuse.KfuseError)]
    missing = [name for name in raised if f"`{name}`" not in catalogue]
    assert not missing, f"errors without an entry in docs/errors.md: {missing}"


def test_the_results_page_is_what_its_generator_writes():
    """docs/results.md is generated from the recorded benchmark JSON
    (``tools/results_page.py``): run that after recording a new run."""
    spec = importlib.util.spec_from_file_location("results_page",
                                                  ROOT / "tools" / "results_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "results.md").read_text() == module.page(), \
        "docs/results.md is stale: run tools/results_page.py"
