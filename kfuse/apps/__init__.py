"""Pipelines from the literature, each with an independent float64 NumPy reference.

``list_apps()`` gives every :class:`App`; ``get_app(name)`` one of them. Each app module
(``harris``, ``shi_tomasi``, ``sobel``, ``unsharp``, ``enhance``, ``night``,
``diffusion3d``, ``levels``) defines ``build``, ``reference``, ``make_inputs`` and its ``APP`` entry.
The eleven BLAS-1/2 sequences of Filipovič et al. 2015 (``kfuse.apps.blas``) form a second family:
``list_apps("blas")``; normalisations, reductions read back across their axis
(``kfuse.apps.normalise``), a third: ``list_apps("norm")``; time-stepped stencils
(``kfuse.apps.timesteps``) a fourth: ``list_apps("steps")``; multiresolution pipelines
(``kfuse.apps.pyramids``) a fifth: ``list_apps("pyramid")``. ``list_apps("all")`` gives every
app and ``get_app`` finds apps of every family.
"""

from __future__ import annotations

from kfuse.apps import diffusion3d, enhance, harris, levels, night, shi_tomasi, sobel, unsharp
from kfuse.apps.base import App
from kfuse.apps.blas import BLAS_APPS, BlasApp
from kfuse.apps.check import relative_error
from kfuse.apps.normalise import NORM_APPS, NormApp
from kfuse.apps.pyramids import PYRAMID_APPS
from kfuse.apps.timesteps import STEP_APPS
from kfuse.errors import DslError

_APPS: dict[str, App] = {
    module.APP.name: module.APP
    for module in (harris, shi_tomasi, sobel, unsharp, enhance, night, diffusion3d, levels)
}


_BLAS_APPS: dict[str, App] = {app.name: app for app in BLAS_APPS}
_NORM_APPS: dict[str, App] = {app.name: app for app in NORM_APPS}
_STEP_APPS: dict[str, App] = {app.name: app for app in STEP_APPS}
_PYRAMID_APPS: dict[str, App] = {app.name: app for app in PYRAMID_APPS}
FAMILIES = ("image", "blas", "norm", "steps", "pyramid", "all")


def list_apps(family: str = "image") -> list[App]:
    """Registered apps in a fixed order: ``image`` (Hipacc's six, then diffusion3d and
    levels; the default), ``blas`` (Filipovič et al. 2015's eleven sequences), ``norm``
    (normalisations), ``steps`` (time-stepped stencils), ``pyramid`` (multiresolution
    pipelines) or ``all`` (every one)."""
    if family not in FAMILIES:
        raise DslError(f"unknown app family {family!r}; choose one of {', '.join(FAMILIES)}")
    chosen = {"image": [_APPS], "blas": [_BLAS_APPS], "norm": [_NORM_APPS],
              "steps": [_STEP_APPS], "pyramid": [_PYRAMID_APPS],
              "all": [_APPS, _BLAS_APPS, _NORM_APPS, _STEP_APPS, _PYRAMID_APPS]}[family]
    return [app for registry in chosen for app in registry.values()]


def get_app(name: str) -> App:
    """The app called ``name``; a :class:`~kfuse.errors.DslError` naming the choices if none."""
    for registry in (_APPS, _BLAS_APPS, _NORM_APPS, _STEP_APPS, _PYRAMID_APPS):
        try:
            return registry[name]
        except (KeyError, TypeError):
            continue
    names = ", ".join([*_APPS, *_BLAS_APPS, *_NORM_APPS, *_STEP_APPS, *_PYRAMID_APPS])
    raise DslError(f"unknown app {name!r}; choose one of {names}") from None


__all__ = ["App", "BlasApp", "FAMILIES", "NormApp", "get_app", "list_apps", "relative_error"]
