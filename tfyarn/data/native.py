"""The input path's optional C loops (``tfyarn/data/_records.c``): TFRecord framing, CRC32C, Example parsing.

``records`` is the extension module, or None when the package was installed without a C compiler (the build treats
the extension as optional) or when ``TFYARN_NATIVE=0`` asks for the Python/numpy/TensorFlow loops (A/B benchmarks,
and to rule the extension out when debugging). Callers look ``records`` up at call time, so tests can switch it.
"""
from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("TFYARN_NATIVE", "1") == "0":
        return None
    try:
        from tfyarn.data import _records
    except ImportError:
        return None
    return _records


records: ModuleType | None = _load()
