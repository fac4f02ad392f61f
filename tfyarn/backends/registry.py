"""Backends by name (fsspec's ``registry`` style): each name maps to an import path, imported only when asked for, so
``import tfyarn.api`` stays cheap and a backend whose dependency is missing fails with how to install it.

App ids say which backend owns them (``local-…``, ``application_…``): :func:`backend_for_app`.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

from tfyarn.backends.base import Backend
from tfyarn.errors import AppNotFound, ExitCode, TfyarnError


class Known(NamedTuple):
    cls: str  # "package.module.Class"
    app_prefix: str  # the ids of this backend's apps start with it
    install: str  # what to do when importing it fails for a missing module


KNOWN: dict[str, Known] = {
    "local": Known("tfyarn.backends.local.backend.LocalBackend", "local-", "reinstall tfyarn (pip install tfyarn)"),
    "yarn": Known(
        "tfyarn.backends.yarn.backend.YarnBackend",
        "application_",
        "pip install skein setuptools (tfyarn's dependencies; setuptools gives skein distutils on 3.12+)",
    ),
}


class BackendUnavailable(TfyarnError):
    """An unknown backend name, or one whose dependencies are not installed here: a usage problem (exit 2)."""

    exit_code = ExitCode.INVALID


def backend_class(name: str) -> type[Backend]:
    known = KNOWN.get(name)
    if known is None:
        raise BackendUnavailable(f"unknown backend {name!r} (known: {', '.join(KNOWN)})")
    module, _, cls = known.cls.rpartition(".")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "tfyarn":
            raise
        raise BackendUnavailable(
            f"the {name} backend needs the module {exc.name!r}, which is not installed here: {known.install}"
        ) from exc


def get_backend(name: str, **options: Any) -> Backend:
    return backend_class(name)(**options)


def backend_name_for_app(app_id: str) -> str:
    for name, known in KNOWN.items():
        if app_id.startswith(known.app_prefix):
            return name
    ids = " or ".join(f"{k.app_prefix}… ({name})" for name, k in KNOWN.items())
    raise AppNotFound(f"no app {app_id!r}: app ids are {ids}; `tfyarn list` shows them")
