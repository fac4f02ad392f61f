"""Why the containers of an app that ended without tfyarn's end record could not start, from their logs.

Why: a task (or the in-app supervisor) whose Python lacks tfyarn or its dependencies cannot report
through skein's KV; its container script prints one line instead (:mod:`tfyarn.contracts.startup`),
which only its log keeps (skein drops a container's exit code). ``status`` of such an app reads the
logs once (the aggregated ones, or the NodeManagers' when aggregation is off), names each container by
its task and keeps the result in this machine's record.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from tfyarn.backends.yarn import log_files
from tfyarn.backends.yarn.appspec import SUPERVISOR_SERVICE
from tfyarn.contracts import startup

log = logging.getLogger(__name__)


def in_logs(logs: list[log_files.ContainerLog]) -> dict[str, list[Any]]:
    """Container id → [exit code, ``cannot start: …``] for each container whose log has the line."""
    out: dict[str, list[Any]] = {}
    for cl in logs:
        found = startup.parse_log("\n".join(cl.files.values()))
        if found is not None:
            out[cl.container_id] = [found[0], found[1], cl.task]
    return out


def labels(snapshot: Mapping[str, Any] | None) -> dict[str, str]:
    """YARN container id → task (``worker:0``, ``tfyarn-supervisor``) from a status snapshot: the tasks'
    newest containers (their log links); every other container skein listed by its service, given to
    the service's task when it has one only (``role:?`` otherwise)."""
    snap = snapshot or {}
    tasks = [t["task"] for t in snap.get("tasks") or []]
    out: dict[str, str] = {}
    for skein_id, cid in (snap.get("containers") or {}).items():
        if cid:
            service = skein_id.rpartition("_")[0]
            of_role = [t for t in tasks if t.split(":")[0] == service]
            name = of_role[0] if len(of_role) == 1 else f"{service}:?"
            out[cid] = SUPERVISOR_SERVICE if service == SUPERVISOR_SERVICE else name
    for t in snap.get("tasks") or []:
        m = log_files.NM_LOG_RE.match(t.get("log") or "")
        if m:
            out[m.group(2)] = t["task"]
    return out


def by_task(causes: Mapping[str, list[Any]], snapshot: Mapping[str, Any] | None) -> dict[str, tuple[int, str]]:
    """Task → (exit code, cause) of :func:`in_logs`'s causes (a task's newest container's first); a
    container the snapshot does not name is named from its log's header (its skein service and instance)."""
    names = labels(snapshot)
    out: dict[str, tuple[int, str]] = {}
    for cid, (code, text, header) in sorted(causes.items(), reverse=True):  # newest container first
        task = names.get(cid) or header
        if task.split(":")[0] == SUPERVISOR_SERVICE:
            task = SUPERVISOR_SERVICE
        out.setdefault(task, (int(code), str(text)))
    return out


def diagnosis(causes: Mapping[str, tuple[int, str]], order: list[str]) -> str:
    """One line: the tasks with the same cause together, in ``order`` (then the rest, the supervisor
    last): ``ps:0, chief:0: cannot start: No module named 'pydantic' (python /usr/bin/python3 3.11.2)``."""
    rank = {t: i for i, t in enumerate(order)}
    tasks = sorted(causes, key=lambda t: (t == SUPERVISOR_SERVICE, rank.get(t, len(rank)), t))
    groups: dict[str, list[str]] = {}
    for t in tasks:
        groups.setdefault(causes[t][1], []).append(t)
    return "; ".join(f"{', '.join(ts)}: {text}" for text, ts in groups.items())


def read(
    app_id: str,
    user: str,
    conf: dict[str, str],
    snapshot: Mapping[str, Any] | None,
    wait_s: float,
    ended_at: float | None = None,
) -> dict[str, list[Any]] | None:
    """:func:`in_logs` of an ended app's containers: its aggregated logs once they hold every container
    the snapshot knows (waited for until ``wait_s`` after the app's end, ``ended_at``: the NodeManagers
    upload them as it ends), or its NodeManagers' logs when aggregation is off. None when no log could
    be read (a later ``status`` tries again)."""
    if log_files.aggregation_disabled(conf):
        found = [cl for _, cl in log_files.nm_finished_logs((snapshot or {}).get("tasks") or [])]
        return in_logs(found) if found else None
    want = set(labels(snapshot))
    deadline = time.time() + wait_s if ended_at is None else min(time.time(), ended_at) + wait_s
    logs = None
    while True:
        logs = log_files.read_aggregated_logs(app_id, user, conf) or logs
        have = {cl.container_id for cl in logs or []}
        if (logs and want <= have) or time.time() >= deadline:
            break
        time.sleep(1.0)
    if not logs:
        log.info("no aggregated logs of %s (until %gs after its end): why its tasks failed is unread", app_id, wait_s)
        return None
    return in_logs(logs)
