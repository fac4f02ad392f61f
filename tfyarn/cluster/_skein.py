"""Import skein lazily, on every Python tfyarn supports.

``skein.utils`` does ``from distutils.version import LooseVersion``, and ``distutils`` left the standard library in
Python 3.12. setuptools' shim would provide it, but importing setuptools costs ~0.1 CPU s of every command that talks
to YARN, so :func:`skein` gives skein a stand-in ``distutils.version`` for its import. Backends call it when they
need skein, so ``import tfyarn`` stays cheap.
"""

from __future__ import annotations

import importlib
import re
import sys
from types import ModuleType

#: JVM options for skein's own JVMs (the gateway's driver, each job's application master): the client JIT only.
#: Both do light, I/O-bound work, so C2's compilations were most of their start-up: the driver reached ready with
#: 1.6 CPU s instead of 3.3 (BENCHMARKS.md, "skein's JVMs"). Options given later on a command line win.
JIT_OPTIONS = ("-XX:TieredStopAtLevel=1",)


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


def skein() -> ModuleType:
    """The ``skein`` module. The stand-in ``distutils`` is used only when no ``distutils`` is imported yet, and
    removed afterwards, so a later ``import distutils`` gets the real one."""
    if "distutils" in sys.modules or "skein" in sys.modules:
        return importlib.import_module("skein")
    pkg, ver = ModuleType("distutils"), ModuleType("distutils.version")
    pkg.__path__ = []
    vars(ver).update(LooseVersion=_LooseVersion)  # (typeshed's ModuleType takes no new attributes)
    vars(pkg).update(version=ver)
    sys.modules["distutils"], sys.modules["distutils.version"] = pkg, ver
    try:
        return importlib.import_module("skein")
    finally:
        for name, mod in (("distutils.version", ver), ("distutils", pkg)):
            if sys.modules.get(name) is mod:
                del sys.modules[name]
