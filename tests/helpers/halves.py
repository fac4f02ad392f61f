"""Split a suite into N parts of about equal time, a test module never cut (its module-scoped fixtures, often a
whole training job, would run in both parts). .ci/run runs the YARN suite as two such parts on two clusters.

Times come from a JSON map of test node id to seconds (pytest-split's ``.test_durations`` format: refresh it with
``pip install pytest-split`` and ``scripts/test-yarn --store-durations --durations-path
tests/cluster/yarn-durations.json``); a test it does not know counts as the median of those it does."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def parse_part(text: str) -> tuple[int, int]:
    """``"K/N"`` (1 <= K <= N) as (K, N)."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise ValueError(f"--part takes K/N with 1 <= K <= N, not {text!r}")
    return int(k), int(n)


def split(items: list[Any], durations: dict[str, float], parts: int) -> list[list[Any]]:
    """``items`` (pytest items: ``nodeid``) in ``parts`` lists, whole modules each, the longest module first to the
    part with the least time so far; every part keeps the items' order."""
    guess = statistics.median(durations.values()) if durations else 1.0
    modules: dict[str, float] = defaultdict(float)
    for item in items:
        modules[item.nodeid.split("::")[0]] += durations.get(item.nodeid, guess)
    load, home = [0.0] * parts, {}
    for module, seconds in sorted(modules.items(), key=lambda m: (-m[1], m[0])):
        home[module] = part = load.index(min(load))
        load[part] += seconds
    out: list[list[Any]] = [[] for _ in range(parts)]
    for item in items:
        out[home[item.nodeid.split("::")[0]]].append(item)
    return out


def load_durations(path: str | Path) -> dict[str, float]:
    return {str(k): float(v) for k, v in json.loads(Path(path).read_text()).items()}
