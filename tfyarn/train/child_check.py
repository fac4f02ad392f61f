"""How preflight's checks that need TensorFlow answer the gateway (:mod:`tfyarn.train.keras_check`,
:mod:`tfyarn.train.ps.memory_check`): ``python -m MODULE SPEC_JSON_FILE`` in a child process prints the problems
found, one per line, and exits 2 when there are any; the gateway itself never imports TensorFlow."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


def run(problems: Callable[[str], list[str]], argv: list[str] | None = None) -> int:
    """Check the spec JSON file named by ``argv[1]`` (default: this process's) with ``problems``; the exit code."""
    found = problems(Path((argv or sys.argv)[1]).read_text())
    for p in found:
        print(p)
    return 2 if found else 0
