"""Pipelines from the literature, each with an independent float64 NumPy reference.

``list_apps()`` gives every :class:`App`; ``get_app(name)`` one of them. Each app module
(``harris``, ``shi_tomasi``, ``sobel``, ``unsharp``, ``enhance``, ``night``,
``diffusion3d``) defines ``build``, ``reference``, ``make_inputs`` and its ``APP`` entry.
"""

from __future__ import annotations

from kfuse.apps import diffusion3d, enhance, harris, night, shi_tomasi, sobel, unsharp
from kfuse.apps.base import App
from kfuse.apps.check import relative_error
from kfuse.errors import DslError

_APPS: dict[str, App] = {
    module.APP.name: module.APP
    for module in (harris, shi_tomasi, sobel, unsharp, enhance, night, diffusion3d)
}


def list_apps() -> list[App]:
    """Every registered app, in a fixed order (Hipacc's six, then diffusion3d)."""
    return list(_APPS.values())


def get_app(name: str) -> App:
    """The app called ``name``; a :class:`~kfuse.errors.DslError` naming the choices if none."""
    try:
        return _APPS[name]
    except (KeyError, TypeError):
        raise DslError(f"unknown app {name!r}; choose one of {', '.join(_APPS)}") from None


__all__ = ["App", "get_app", "list_apps", "relative_error"]
