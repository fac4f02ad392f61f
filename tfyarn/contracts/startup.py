"""Can this Python start a tfyarn task? The words of a task that cannot, and the modules it needs.

Why: a task whose Python lacks tfyarn's dependencies (a node's ``/usr/bin/python3``) dies at its first
import, before it can say anything through tfyarn: the exit report needs skein. So this module is
standard library only and runs two ways: imported (the task runtime words an ``ImportError`` the
same way; ``tfyarn validate --probe`` reads :func:`probe`'s report), and as text (``python -c``) by
the YARN container script after a task, or the in-app supervisor, that could not start — also when
``tfyarn`` itself cannot be imported. It then prints one line, :data:`MARK` ``(exit code N): <why>``,
which the gateway finds in the container's log (an app with no end record is diagnosed from them).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import platform
import re
import sys

#: What every tfyarn task and the in-app supervisor import (the ``dependencies`` of pyproject.toml,
#: by import name), tfyarn first.
TFYARN_MODULES = ("tfyarn", "pydantic", "yaml", "skein", "numpy", "fsspec", "hdfs_native", "google_crc32c", "psutil")
#: What a training task imports beyond them.
TRAINING_MODULES = ("tensorflow",)
#: Optional: what some jobs need (Parquet/ORC data, a ``tf_keras`` model); a probe reports them.
OPTIONAL_MODULES = ("pyarrow", "tf_keras")
#: What every diagnosis of a task that could not start says first.
MARK = "cannot start: "
#: The line a container that could not start writes to its log (:func:`log_line`).
_LINE_RE = re.compile(r"^\[tfyarn\] exit code (-?\d+): (" + MARK + r".*)$", re.M)


def interpreter() -> str:
    """``python /usr/bin/python3 3.11.2``: which Python ran, as a diagnosis names it."""
    return f"python {sys.executable} {platform.python_version()}"


def cannot_start(why: str) -> str:
    """``cannot start: No module named 'pydantic' (python /usr/bin/python3 3.11.2)``."""
    return f"{MARK}{why} ({interpreter()})"


def import_error_text(exc: BaseException) -> str:
    """An import failure in a diagnosis: a missing module's own message, else ``Type: message``."""
    if type(exc) is ModuleNotFoundError:
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def first_missing(modules: tuple[str, ...], load: tuple[str, ...] = ()) -> str | None:
    """Why the first of ``modules`` that does not import fails (None: all import). Modules in
    ``load`` are only looked for, not imported (TensorFlow costs 3 s and 600 MB to import)."""
    for name in modules:
        try:
            if name in load:
                if importlib.util.find_spec(name) is None:
                    return f"No module named '{name}'"
            else:
                importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is the answer
            return import_error_text(exc)
    return None


def log_line(code: int, why: str) -> str:
    """``[tfyarn] exit code 1: cannot start: …``: the line a container that could not start writes to its
    log (``why``: :func:`cannot_start`'s words; :func:`parse_log` reads it back)."""
    return f"[tfyarn] exit code {code}: {why}"


def parse_log(text: str) -> tuple[int, str] | None:
    """(exit code, ``cannot start: … (python …)``) of the last :func:`log_line` in a container's log."""
    found = _LINE_RE.findall(text or "")
    if not found:
        return None
    code, why = found[-1]
    return int(code), why.strip()


def probe(training: bool = True) -> dict[str, object]:
    """What this Python can import, for ``tfyarn validate --probe``: each module's version or why
    not, and the first missing module a job needs (``missing``, None when it can start)."""
    modules: dict[str, dict[str, object]] = {}
    wanted = TFYARN_MODULES + (TRAINING_MODULES if training else ())
    missing = None
    for name in wanted + OPTIONAL_MODULES:
        try:
            mod = importlib.import_module(name)
            modules[name] = {"ok": True, "version": str(getattr(mod, "__version__", "") or "")}
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            modules[name] = {"ok": False, "error": import_error_text(exc)}
            if missing is None and name in wanted:
                missing = import_error_text(exc)
    return {
        "python": sys.executable,
        "version": platform.python_version(),
        "modules": modules,
        "missing": cannot_start(missing) if missing else None,
    }


def main(argv: list[str]) -> int:
    """``python -c <this file> CODE [supervisor|probe]``: the container script's check after a
    Python that exited ``CODE``; prints :func:`log_line` when a module is missing (exit 0 either way).
    ``probe``: :func:`probe`'s JSON on one line."""
    if argv[1:2] == ["probe"]:
        print("tfyarn-probe: " + json.dumps(probe(training=argv[2:3] != ["no-tf"])), flush=True)
        return 0
    code = int(argv[1]) if len(argv) > 1 and argv[1].lstrip("-").isdigit() else 1
    training = argv[2:3] != ["supervisor"]
    why = first_missing(TFYARN_MODULES + (TRAINING_MODULES if training else ()), load=TRAINING_MODULES)
    if why is not None:
        print(log_line(code, cannot_start(why)), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
