"""Import skein lazily and on every Python tfyarn supports.

Why a helper: ``skein.utils`` does ``from distutils.version import LooseVersion``; ``distutils`` left the standard
library in Python 3.12. setuptools (a tfyarn dependency) ships a ``distutils`` shim that its
``distutils-precedence.pth`` activates at interpreter start-up, which covers the normal case. It does not when ``.pth``
files are skipped (``python -S``, some embedded or zipapp launches); importing ``setuptools`` first installs the same
shim explicitly, so we retry once after that. Verified on CPython 3.12.1 with skein 0.8.2 + setuptools.

Nothing here runs at import time: backends call :func:`skein` when they need it, so ``import tfyarn`` stays cheap.
"""
from __future__ import annotations

import importlib
import logging
import re
import sys
from types import ModuleType

log = logging.getLogger(__name__)


class _LooseVersion:
    """What skein uses ``distutils.version.LooseVersion`` for: one comparison of grpc's version with a string."""

    def __init__(self, v: str):
        self.parts = tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+-]", str(v)))

    def _key(self, other: object) -> tuple:
        o = other if isinstance(other, _LooseVersion) else _LooseVersion(str(other))
        return tuple(str(p).zfill(8) for p in self.parts), tuple(str(p).zfill(8) for p in o.parts)

    def __lt__(self, other: object) -> bool:
        a, b = self._key(other)
        return a < b

    def __ge__(self, other: object) -> bool:
        return not self < other


def _import_with_version_shim() -> ModuleType:
    """Import skein with a stand-in ``distutils.version`` when distutils is not imported yet: setuptools' shim
    imports setuptools itself (~0.1 CPU s of every command that talks to YARN). The stand-in is removed afterwards,
    so a later ``import distutils`` gets the real one."""
    if "distutils" in sys.modules or "skein" in sys.modules:
        return importlib.import_module("skein")
    pkg, ver = ModuleType("distutils"), ModuleType("distutils.version")
    pkg.__path__ = []                                  # type: ignore[attr-defined]
    ver.LooseVersion = _LooseVersion                   # type: ignore[attr-defined]
    pkg.version = ver                                  # type: ignore[attr-defined]
    sys.modules["distutils"], sys.modules["distutils.version"] = pkg, ver
    try:
        return importlib.import_module("skein")
    finally:
        for name, mod in (("distutils.version", ver), ("distutils", pkg)):
            if sys.modules.get(name) is mod:
                del sys.modules[name]


def skein() -> ModuleType:
    """The ``skein`` module, importing setuptools' distutils shim first when the interpreter lacks ``distutils``."""
    try:
        return _import_with_version_shim()
    except ModuleNotFoundError as exc:
        if exc.name != "distutils":
            raise
        log.debug("distutils missing (Python >= 3.12 without the setuptools .pth shim); importing setuptools first")
    try:
        importlib.import_module("setuptools")      # installs setuptools' ``distutils`` shim (``_distutils_hack``)
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "skein needs 'distutils', which Python >= 3.12 no longer ships; install setuptools "
            "(a tfyarn dependency: pip install setuptools)") from None
    return importlib.import_module("skein")
