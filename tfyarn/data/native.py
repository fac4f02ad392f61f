"""The input path's optional C loops (``tfyarn/data/_records.c``): TFRecord framing, CRC32C, Example parsing.

``records`` is the extension module, or None when the package was installed without a C compiler (the build treats
the extension as optional) or when ``TFYARN_NATIVE=0`` asks for the Python/numpy/TensorFlow loops (A/B benchmarks,
and to rule the extension out when debugging). Callers look ``records`` up at call time, so tests can switch it.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)
_why_missing: list[str] = []  # why the import failed (empty: it did not, or TFYARN_NATIVE=0 asked)


def _load() -> ModuleType | None:
    if os.environ.get("TFYARN_NATIVE", "1") == "0":
        return None
    try:  # by name: a `from tfyarn.data import` here would read as an import of the package that imports this module
        _records = importlib.import_module("tfyarn.data._records")
    except ImportError as exc:  # not built, or built for another Python / libc than this one
        _why_missing.append(str(exc))
        return None
    return _records


records: ModuleType | None = _load()


def warn_if_missing() -> None:
    """Once per process, when a Feeder starts without the C loops it was not asked to go without: the input then
    costs ~5x the CPU (BENCHMARKS.md), which a training log should say rather than leave to guesswork."""
    if records is None and _why_missing and _why_missing[0]:
        log.warning(
            "tfyarn's C input loops are not available (%s): records are framed and parsed in Python and "
            "TensorFlow, ~5x the CPU; reinstall tfyarn where a C compiler is available",
            _why_missing[0],
        )
        _why_missing[0] = ""
