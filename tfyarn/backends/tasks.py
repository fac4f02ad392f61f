"""What every backend's status and logs say of an app's tasks: how they ended, which a selection names.

Why here: ``status`` and ``logs`` of each backend shape the same :class:`~tfyarn.contracts.status.AppStatus`
and take the same task selections; none of it decides about the job (that is :mod:`tfyarn.runner`'s).
"""

from __future__ import annotations

from typing import Iterable

from tfyarn.contracts.job_end import JobEnd
from tfyarn.contracts.status import AppState, AppStatus
from tfyarn.errors import AppNotFound
from tfyarn.task.yarn.exit_report import exit_codes_in


def settle(st: AppStatus, note: str = "", end: JobEnd | None = None) -> AppStatus:
    """The tasks of an ended app as they ended (the last snapshot may predate the end): a task the app's end
    record (``end``: :mod:`tfyarn.contracts.job_end`) gives an exit code — without a record, the diagnosis
    (``worker:1: exit code 137``) — FAILED with it; a RUNNING or PENDING one SUCCEEDED (exit 0) when the
    app succeeded, else KILLED (with ``note`` as its diagnosis when it has none). A running app is unchanged."""
    if not st.state.is_terminal:
        return st
    codes = dict(end.exit_codes) if end is not None else exit_codes_in(st.diagnostics)
    for t in st.tasks:
        if t.task in codes and t.state != "SUCCEEDED":
            t.state = "FAILED"  # the snapshot may say KILLED: the shutdown it caused killed its container
            t.exit_code = codes[t.task] if t.exit_code is None else t.exit_code
        elif t.state in ("RUNNING", "PENDING"):
            t.state = "SUCCEEDED" if st.state is AppState.SUCCEEDED else "KILLED"
            t.exit_code = 0 if t.state == "SUCCEEDED" else None
            if t.state == "KILLED" and note and not t.diagnostics:
                t.diagnostics = note
    return st


def task_matches(task: str | None, label: str, container_id: str | None = None) -> bool:
    """Does the selection ``task`` (None = all, ``worker:1``, a role ``worker``, a YARN container id) take the task
    ``label``?"""
    return task is None or task in (label, container_id, label.split(":")[0])


def select_tasks(names: Iterable[str], task: str | None, app_id: str) -> list[str]:
    """The tasks of ``names`` that ``task`` selects (None: all; ``worker:1``; a role ``worker``: its tasks); an
    unknown one is :class:`AppNotFound` naming the app's tasks."""
    names = list(names)
    chosen = [n for n in names if task_matches(task, n)]
    if not chosen:
        raise AppNotFound(f"app {app_id} has no task {task!r} (tasks: {', '.join(names)})")
    return chosen
