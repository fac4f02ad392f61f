"""How a task gets TensorFlow: without its eager Keras import; the forkserver adds Keras when the job's code uses it.

Why: ``import tensorflow`` (TF 2.21) ends by importing ``keras.src.optimizers`` — all of Keras 3, ~0.9 s of the ~3 s
import — inside ``try/except ImportError``, only to register Keras optimizers for SavedModel loading; TF works
without it (``tf.keras`` stays lazy) and tfyarn's own training code never touches Keras. So every task skips that one
import (:func:`import_tensorflow`); a model that uses Keras imports it itself (loading a SavedModel holding Keras
optimizer state needs ``import keras`` first). The forkserver reads the job's model code without running it (its
import-time side effects stay out of the process every task is forked from) and imports Keras when that code refers
to it (:func:`code_uses_keras`: ``import keras``/``tf_keras``, ``from tensorflow import keras``, ``<x>.keras``);
code that reaches Keras another way (``importlib``, ``getattr``) still works, importing it on first use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import re
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, cast

log = logging.getLogger(__name__)

#: What TF 2.21's ``__init__`` imports eagerly (which one depends on ``TF_USE_LEGACY_KERAS``, as in TF).
KERAS_EAGER_IMPORTS = ("keras.src.optimizers", "tf_keras.src.optimizers")
#: Bounds on the static read: a job's code larger than this is not walked further (its tasks import Keras
#: themselves if it needs it: slower, never wrong).
MAX_FILES = 500
MAX_FILE_BYTES = 2 << 20


class _NoPlotsForKeras(importlib.abc.MetaPathFinder):
    """Refuses ``import matplotlib`` (ImportError, which Keras catches) to a Keras module's top-level code: Keras 3
    imports ``matplotlib.pyplot`` at import time when it is installed, for plotting helpers no task uses (~0.3 s, and
    ~1 s more on a machine's first run: its font cache). The job's code, and a Keras function that plots, still can.
    """

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] != "matplotlib" or "matplotlib" in sys.modules:
            return None
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame = frame.f_back  # the import machinery: find the importer
        if (
            frame is not None
            and frame.f_code.co_name == "<module>"
            and str(frame.f_globals.get("__name__", "")).startswith(("keras.", "tf_keras."))
        ):
            raise ModuleNotFoundError(
                f"matplotlib is not imported for {frame.f_globals['__name__']} in a tfyarn "
                f"task (nothing is plotted there)",
                name=name,
            )
        return None


def keep_matplotlib_out_of_keras() -> None:
    """Install :class:`_NoPlotsForKeras` in this process (idempotent). Tasks call it before TensorFlow is imported."""
    if not any(isinstance(f, _NoPlotsForKeras) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPlotsForKeras())


def import_tensorflow() -> bool:
    """``import tensorflow`` without its eager Keras import, Keras kept from importing matplotlib; False when TF is
    not installed. ``sys.modules[name] = None`` makes ``import name`` raise ImportError at once, which TF's
    ``__init__`` catches; the entries are removed right after, so a later ``import keras`` works as usual.
    """
    keep_matplotlib_out_of_keras()
    if "tensorflow" in sys.modules:
        return True
    if importlib.util.find_spec("tensorflow") is None:
        return False
    blocked = [name for name in KERAS_EAGER_IMPORTS if name not in sys.modules]
    # None blocks an import (typeshed's type for sys.modules leaves it out)
    modules = cast("dict[str, ModuleType | None]", sys.modules)
    for name in blocked:
        modules[name] = None
    try:
        importlib.import_module("tensorflow")
    finally:
        for name in blocked:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
    return True


def import_keras() -> None:
    """Import what TF's ``__init__`` would have (Keras and its optimizers' SavedModel registrations): tf_keras when
    TF uses it for ``tf.keras`` (the test of TF's ``__init__``)."""
    legacy = os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")
    importlib.import_module("tf_keras.src.optimizers" if legacy else "keras.src.optimizers")


# --------------------------------------------------------------------------------------------------- static read

#: ``import a.b, c as d`` / ``from .a import (b, c)``: what a module imports (a text scan, not a parse: parsing and
#: walking the syntax trees of a job's modules took ~0.3 s, on the path from launch to the first step).
_IMPORT_RE = re.compile(
    rb"^[ \t]*(?:import[ \t]+([\w. \t,]+)"
    rb"|from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]+))",
    re.MULTILINE,
)
#: A reference to Keras: ``import keras``, ``from tf_keras import …``, ``from tensorflow import keras``,
#: ``tf.keras.layers``. A mention in a comment or string counts too (it only means Keras is imported ahead of use).
_KERAS_RE = re.compile(rb"\b(?:tf_keras|import[ \t]+keras|from[ \t]+keras)\b|\.keras\b|import[^\n]*\bkeras\b")


def find_module(name: str, path: list[str]) -> importlib.machinery.ModuleSpec | None:
    """Where module ``name`` is on ``path`` (parents included), found without importing anything; None if absent.
    A top-level package only a meta-path finder knows (an editable install) is asked of every finder."""
    search: list[str] | None = path
    spec = None
    parts = name.split(".")
    for i in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), search)
        if spec is None and i == 0:
            spec = importlib.util.find_spec(parts[0])
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
        if i + 1 < len(parts) and not search:
            return None  # a plain module cannot have submodules
    return spec


def _imported_names(source: bytes, module: str, is_package: bool) -> set[str]:
    """Names of the modules ``source`` imports (relative imports resolved against ``module``); for
    ``from a import b`` both ``a`` and ``a.b`` (b may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for plain, base, what in _IMPORT_RE.findall(source):
        if plain:
            names.update(part.split()[0] for part in plain.decode().split(",") if part.split())
            continue
        base_s = base.decode()
        if base_s.startswith("."):
            try:
                base_s = importlib.util.resolve_name(base_s, package)
            except ImportError:  # above the top-level package: not a module of the job's code
                continue
        if not base_s:
            continue
        names.add(base_s)
        for part in what.decode().strip("() \t\n").split(","):
            words = part.split()
            if words and words[0].isidentifier():
                names.add(f"{base_s}.{words[0]}")
    return names


def code_uses_keras(module: str, code_dir: str | None = None) -> bool:
    """Does model module ``module`` (or any module of the job's own code it imports: under the model's top-level
    package or in ``code_dir``, the spec's ``code:``) refer to Keras? Nothing is imported."""
    return code_refers(module, _KERAS_RE, code_dir) is not None


def code_refers(module: str, pattern: re.Pattern[bytes], code_dir: str | None = None) -> str | None:
    """The first file of the job's own code that matches ``pattern``: module ``module`` (or a script, a path ending
    in ``.py``) and every module of the job's code it imports (under its top-level package or in ``code_dir``);
    None when none does. Nothing is imported (preflight: the gateway must not run the job's code)."""
    path = ([code_dir] if code_dir else []) + [p for p in sys.path if p != code_dir]
    script = Path(module) if module.endswith(".py") else None
    if script is not None:
        module = "__main__"
    own_tops = {module.split(".")[0]}
    if code_dir and os.path.isdir(code_dir):
        own_tops |= {
            Path(n).stem for n in os.listdir(code_dir) if n.endswith(".py") or os.path.isdir(os.path.join(code_dir, n))
        }
    # each module's source file (None for namespace packages, extension modules, bytecode only)
    files: dict[str, Path | None] = {module: script.resolve()} if script is not None else {}
    seen: set[Path] = set()
    todo = [module]
    while todo and len(seen) < MAX_FILES:
        name = todo.pop()
        if name not in files:
            spec = find_module(name, path)
            origin = spec.origin if spec else None
            files[name] = Path(origin).resolve() if origin and origin.endswith(".py") else None
        file = files[name]
        if file is None or file in seen:
            continue
        seen.add(file)
        try:
            if file.stat().st_size > MAX_FILE_BYTES:
                continue
            source = file.read_bytes()
        except OSError as exc:
            log.debug("not reading %s: %s", file, exc)
            continue
        if pattern.search(source):
            log.debug("%s (%s) matches %s", name, file, pattern.pattern)
            return str(file)
        for dep in _imported_names(source, name, file.name == "__init__.py"):
            parts = dep.split(".")
            if parts[0] in own_tops:
                todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # a.b.c runs a/ and a/b/ too
    return None


def model_module(spec_file: str | None) -> str | None:
    """The module part of the job's ``model: module:callable``, read from the resolved spec file (None if unknown)."""
    if not spec_file:
        return None

    try:
        ref = json.loads(Path(spec_file).read_text()).get("model") or ""
    except (OSError, ValueError, AttributeError):
        return None
    return ref.partition(":")[0] or None
