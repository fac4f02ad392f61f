"""YARN's view of an application (states, containers) mapped to tfyarn's: :class:`AppState`, one
:class:`TaskStatus` per task. Pure functions of what skein returns, so they are tested without a cluster."""
from __future__ import annotations

import re
from typing import Any

from tfyarn.backends.base import AppState, TaskStatus
from tfyarn.errors import TIMEOUT_MARK
from tfyarn.spec import JobSpec

ALL_CONTAINER_STATES = ("WAITING", "REQUESTED", "RUNNING", "SUCCEEDED", "FAILED", "KILLED")
ACTIVE_APP_STATES = ("SUBMITTED", "ACCEPTED", "RUNNING")
ALL_APP_STATES = ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED", "RUNNING", "FINISHED", "FAILED", "KILLED")


def app_state(yarn_state: Any, final_status: Any, diagnostics: str = "",
              task_states: list[str] | None = None) -> AppState:
    """tfyarn's AppState from YARN's (state, final status), e.g. (FINISHED, SUCCEEDED) → SUCCEEDED.

    A running app is PENDING until all of its tasks' containers run (YARN calls it RUNNING as soon as the AM runs).
    A failure is TIMED_OUT when its diagnostics say a tfyarn deadline ended it.
    """
    st, fs = str(yarn_state).upper(), str(final_status).upper()
    if st in ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED"):
        return AppState.PENDING
    if st == "RUNNING":
        if task_states is not None and (not task_states or any(s in ("WAITING", "REQUESTED", "PENDING")
                                                                for s in task_states)):
            return AppState.PENDING
        return AppState.RUNNING
    if st == "KILLED" or (st == "FINISHED" and fs == "KILLED"):
        return AppState.KILLED
    if st == "FINISHED" and fs == "SUCCEEDED":
        return AppState.SUCCEEDED
    # FAILED, or FINISHED with FAILED/UNDEFINED final status
    return AppState.TIMED_OUT if TIMEOUT_MARK in (diagnostics or "").lower() else AppState.FAILED


def attempt_of(tags: Any) -> int:
    """The job attempt an application runs (its ``tfyarn-attempt:<n>`` tag; none: the first, 0)."""
    from tfyarn.backends.yarn_spec import ATTEMPT_TAG
    for t in tags or ():
        if t.startswith(ATTEMPT_TAG) and t[len(ATTEMPT_TAG):].isdigit():
            return int(t[len(ATTEMPT_TAG):])
    return 0


def timestamp(dt: Any) -> float | None:
    """A skein/YARN datetime as epoch seconds (None stays None)."""
    return dt.timestamp() if dt is not None else None


def _host(nm_http_address: str) -> str | None:
    if not nm_http_address:
        return None
    return nm_http_address.split("://")[-1].rsplit(":", 1)[0] or None


def _exit_code(msg: str) -> int | None:
    m = re.search(r"[Ee]xit (?:code|status):?\s*(-?\d+)", msg or "")
    return int(m.group(1)) if m else None


def tasks_from_containers(containers: list[Any], taskmap: dict[str, str], spec: JobSpec | None,
                          failures: dict[str, str]) -> list[TaskStatus]:
    """One TaskStatus per task (``role:index``) from skein containers: the newest container holding each task;
    ``restarts`` = how many earlier containers held it. Tasks with no container yet are PENDING."""
    by_task: dict[str, list[Any]] = {}
    for c in containers:
        cid = f"{c.service_name}_{c.instance}"
        task = taskmap.get(cid) or f"{c.service_name}:{c.instance}"
        by_task.setdefault(task, []).append(c)
    out = []
    order = spec.tasks() if spec is not None else []
    names = order + sorted(t for t in by_task if t not in order)
    for task in names:
        cs = sorted(by_task.get(task, []),
                    key=lambda c: (c.start_time is None, timestamp(c.start_time) or 0, c.instance))
        role = spec.roles.get(task.split(":")[0]) if spec is not None else None
        memory = role.memory_mib if role is not None else None
        if not cs:
            out.append(TaskStatus(task=task, state="PENDING", diagnostics=failures.get(task, ""), memory_mib=memory))
            continue
        c = cs[-1]
        state = str(c.state)
        state = "PENDING" if state in ("WAITING", "REQUESTED") else state
        diag = failures.get(task) or (c.exit_message if state in ("FAILED", "KILLED") else "")
        out.append(TaskStatus(task=task, state=state, host=_host(c.yarn_node_http_address), restarts=len(cs) - 1,
                              exit_code=_exit_code(c.exit_message) if state in ("FAILED", "KILLED")
                              else (0 if state == "SUCCEEDED" else None),
                              diagnostics=diag, log=c.yarn_container_logs or None, memory_mib=memory))
    return out
