"""Where a YARN job's wall time goes, phase by phase: from ``tfyarn run`` to the application's end.

Why: a 2-second training took 30 s from start to exit, and only a per-phase breakdown shows what to cut and what is
a floor (N TensorFlow imports at once on 2 cores). Three wall clocks: the gateway (run start, submit), the
ResourceManager (the app's start, the AM launch, the end) and the tasks (``phase/<task>``, their first and last
step, ``control/all_done``).
"""

from __future__ import annotations

import json
from typing import Any

from tfyarn.contracts.kv_keys import ALL_DONE_KEY, PHASE_PREFIX

#: (name, from, to) of each phase, in order; every mark is a wall time (epoch seconds) in :func:`marks`.
PHASES = (
    ("preflight+env", "run_started", "env_ready"),
    ("driver wait", "env_ready", "submit_call"),
    ("submit", "submit_call", "submitted"),
    ("AM start", "submitted", "am_launched"),
    ("containers start", "am_launched", "containers_started"),
    ("python start", "containers_started", "python_started"),
    ("TF import", "python_started", "imported"),
    ("to first step", "imported", "first_step"),
    ("training", "first_step", "last_step"),
    ("end of work", "last_step", "all_done"),
    ("app end", "all_done", "app_end"),
    ("CLI exit", "app_end", "cli_exit"),
)


def task_phases(kv: dict[str, str], progress: dict[str, str]) -> dict[str, Any]:
    """The phase records in an app's KV (``phase/<task>``, ``control/all_done``) and each training task's first and
    last step times (its ``progress/<task>``): what the follower keeps in its snapshot."""
    tasks: dict[str, dict[str, float]] = {}
    for key, raw in kv.items():
        if key.startswith(PHASE_PREFIX):
            tasks.setdefault(key[len(PHASE_PREFIX) :], {}).update(_json(raw))
    for key, raw in progress.items():
        rec = _json(raw)
        for f in ("first_step_at", "last_step_at"):
            if isinstance(rec.get(f), (int, float)):
                tasks.setdefault(key.split("/", 1)[1], {})[f] = rec[f]
    out: dict[str, Any] = {"tasks": tasks}
    done = _json(kv.get(ALL_DONE_KEY) or "")
    if isinstance(done.get("time"), (int, float)):
        out["all_done"] = done["time"]
    return out


def _json(raw: str) -> dict[str, Any]:
    try:
        v = json.loads(raw)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def _agg(tasks: dict[str, dict[str, float]], field: str, fn: Any) -> float | None:
    vals = [t[field] for t in tasks.values() if isinstance(t.get(field), (int, float))]
    return fn(vals) if vals else None


def marks(gateway: dict[str, Any], rm: dict[str, Any], recorded: dict[str, Any]) -> dict[str, float | None]:
    """Wall time of each phase boundary. ``gateway``: run_started, env_ready (preflight done, env staged),
    submit_call (the driver ready), submitted, cli_exit (any may be missing: a bare ``wait`` saw no submit).
    ``rm``: started, launched, finished (the RM's report).
    ``recorded``: :func:`task_phases`. A phase ends when its *last* task got there (the job waits for all)."""
    tasks = recorded.get("tasks") or {}
    done = recorded.get("all_done") or _agg(tasks, "done", max)
    return {
        "run_started": gateway.get("run_started"),
        "env_ready": gateway.get("env_ready"),
        "submit_call": gateway.get("submit_call"),
        "submitted": rm.get("started") or gateway.get("submitted"),
        "am_launched": rm.get("launched"),
        "containers_started": _agg(tasks, "start", max),
        "python_started": _agg(tasks, "main", max),
        "imported": _agg(tasks, "imported", max),
        "first_step": _agg(tasks, "first_step_at", min),
        "last_step": _agg(tasks, "last_step_at", max),
        "all_done": done,
        "app_end": rm.get("finished"),
        "cli_exit": gateway.get("cli_exit"),
    }


#: (name, from, to) of the totals :func:`durations` adds.
TOTALS = (
    ("start → app end", "run_started", "app_end"),
    ("start → exit", "run_started", "cli_exit"),
    ("submit → app end", "submitted", "app_end"),
)


def durations(m: dict[str, float | None]) -> dict[str, float | None]:
    """Seconds of each phase of :data:`PHASES`, then of the :data:`TOTALS` (None when either end is unknown)."""

    def span(a: str, b: str) -> float | None:
        start, end = m.get(a), m.get(b)
        return round(end - start, 3) if start is not None and end is not None else None

    return {name: span(a, b) for name, a, b in PHASES + TOTALS}


def text(d: dict[str, float | None]) -> str:
    """One line: ``submit 1.2s · AM start 2.0s · …`` (unknown phases left out)."""
    return " · ".join(f"{k} {v:.2f}s" for k, v in d.items() if v is not None)
