"""An ended app's state and diagnosis from its end record (KV ``control/end``,
:mod:`tfyarn.contracts.job_end`).

Why: the ender decided the state and wrote it down before the shutdown, so ``status`` takes it from
there instead of rebuilding it from YARN's diagnostics text (``timed out``, the done text), which
stays the fallback for apps without a record. The record is read from the status snapshot that holds
it (the live KV, this machine's saved snapshot, the in-app supervisor's staging-dir record); it is
trusted only when YARN's final status agrees with it.
"""

from __future__ import annotations

from typing import Any, Mapping

from tfyarn.backends.yarn.states import failure_diagnosis
from tfyarn.contracts import job_end
from tfyarn.contracts.status import AppState

_ENDED = ("FINISHED", "FAILED", "KILLED")


def ended_by(snapshot: Mapping[str, Any] | None, in_diagnostics: job_end.JobEnd | None) -> job_end.JobEnd | None:
    """The app's end record: the KV's (in the snapshot), else its diagnostics' line."""
    return job_end.recorded(snapshot) or in_diagnostics


def from_record(
    yarn_state: Any,
    final_status: Any,
    snapshot: Mapping[str, Any] | None,
    events: dict[str, list[str]] | None = None,
    in_diagnostics: job_end.JobEnd | None = None,
) -> tuple[AppState, str] | None:
    """(state, diagnosis) of an ended app from the record in ``snapshot``, else the one its final
    diagnostics carried (``in_diagnostics``: :func:`~tfyarn.contracts.job_end.from_diagnostics`);
    None while it runs, when it has no record, or when YARN ended it otherwise (a kill from outside
    after the record, a failed shutdown). ``events``: containers YARN took (cluster_events), said
    first in a failure."""
    end = ended_by(snapshot, in_diagnostics)
    if end is None or str(yarn_state).upper() not in _ENDED:
        return None
    fs = str(final_status).upper()
    if fs != end.final_status and not (fs == "KILLED" and end.state in ("KILLED", "TIMED_OUT")):
        return None  # a follower's verdict or stop is a kill: KILLED to YARN
    state = AppState(end.state)
    if state is AppState.SUCCEEDED:
        return state, ""
    if end.by.startswith(job_end.FOLLOWER):
        return state, end.reason  # the follower's own words (its verdict, the stop)
    snap = snapshot or {}
    return state, failure_diagnosis(end.reason, snap.get("failures") or {}, snap.get("exits") or {}, events)


#: What the diagnosis of an ended app without an end record says (issue 41: YARN's SUCCEEDED is not a job's).
NO_RECORD = "the application ended without tfyarn's end record"


def verdict(state: AppState, diagnosis: str, end: job_end.JobEnd | None, causes: str = "") -> tuple[AppState, str]:
    """The job's verdict on an app whose state ``from_record`` could not take from its end record (none, or
    one YARN's final status disagrees with): SUCCEEDED only when its record says so — YARN ends an app
    SUCCEEDED whenever its containers have exited and none of its services may fail it, trained or not —
    else FAILED, naming what YARN said; a failure (or timeout) keeps its state. ``causes``: why its tasks
    could not start (their logs: start_causes), said first."""
    if state is AppState.SUCCEEDED and (end is None or end.state != AppState.SUCCEEDED.value):
        said = diagnosis.strip() or "SUCCEEDED"
        state, diagnosis = AppState.FAILED, f"{NO_RECORD} (YARN: {said})"
    if state in (AppState.FAILED, AppState.TIMED_OUT) and causes and causes not in diagnosis:
        diagnosis = f"{causes}\n{diagnosis}".strip()
    return state, diagnosis
