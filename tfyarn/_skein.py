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
from types import ModuleType

log = logging.getLogger(__name__)


def skein() -> ModuleType:
    """The ``skein`` module, importing setuptools' distutils shim first when the interpreter lacks ``distutils``."""
    try:
        return importlib.import_module("skein")
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
