"""kfuse's call path in C: the hit path of a compiled pipeline's call, built at first use.

``dispatch.cpp`` is a CPython extension that does what a call of a compiled pipeline does
when its signature is compiled already (describe the arrays, find the signature, allocate
the outputs, write the kernels' arguments, launch or replay a CUDA graph) without the
interpreter: about 7 microseconds of Python per call become a fraction of one. Anything it
does not handle, it leaves to the Python path before doing anything (see the source).

The extension is compiled by the host C++ compiler against this Python's headers, once per
Python, compiler and source (kept in the cache folder like the cpu backend's libraries).
Where that is not possible (no compiler, no ``Python.h``), or ``KFUSE_NATIVE_CALL=0``, calls
take the Python path, which does the same work; ``KFUSE_LOG=info`` says why.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig
import threading
from functools import cache
from pathlib import Path
from types import ModuleType

from kfuse.errors import KfuseError
from kfuse.log import LOG

MODULE_NAME = "_kfuse_dispatch"
SOURCE = Path(__file__).resolve().parent / "dispatch.cpp"
_lock = threading.Lock()


def enabled() -> bool:
    """Whether calls may take the C path (``KFUSE_NATIVE_CALL=0`` turns it off)."""
    return os.environ.get("KFUSE_NATIVE_CALL", "1").strip().lower() not in ("0", "false", "off",
                                                                               "no")


def module() -> ModuleType | None:
    """The compiled extension (None where it cannot be built or is turned off)."""
    if not enabled():
        return None
    with _lock:
        return _built()


@cache
def _built() -> ModuleType | None:
    from kfuse.runtime.host_compiler import compile_host_library

    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").exists():
        LOG.info("the C call path is off: this Python has no headers (Python.h) to build it "
                 "against; calls take the Python path")
        return None
    try:
        library = compile_host_library(
            SOURCE.read_text(), name_hint=f"{MODULE_NAME}-{sysconfig.get_config_var('SOABI')}",
            extra_flags=(f"-I{include}",), shim=False)
        loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(library))
        spec = importlib.util.spec_from_file_location(MODULE_NAME, library, loader=loader)
        if spec is None:
            raise ImportError(f"cannot load {library}")
        built = importlib.util.module_from_spec(spec)
        loader.exec_module(built)
    except (KfuseError, ImportError, OSError) as error:
        LOG.info("the C call path is off: %s; calls take the Python path",
                 str(error).splitlines()[0])
        return None
    return built


__all__ = ["enabled", "module"]
