"""One protocol for the end of a YARN job: who ends the app, with what state, and the record that
says so.

Why: four actors in three processes can end a YARN application (the last task done, a task whose
failure fails the app, the in-app supervisor, a live follower). Each of them calls :func:`end_job`,
which decides the end (:func:`decide`), writes it as a structured record in the app's KV
(:data:`END_KEY`, JSON ``{state, reason, exit_codes, by, time}``) and only then shuts the app down.
Readers (``status``, the follower's saved snapshot, the in-app supervisor's staging-dir record) take
the state from that record; matching YARN's diagnostics text is left for apps that have none (ended
by tfyarn before this record existed, or by YARN itself). Who leaves the end to whom is
:func:`leave_to`. Pure apart from the two callables :func:`end_job` is given, so it is tested
without YARN.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Protocol

from tfyarn.contracts.kv_keys import END_KEY
from tfyarn.errors import without_timeout_mark

#: The enders, as the record's ``by`` starts: ``task:chief:0``, ``failed-task:ps:0``,
#: ``supervisor``, ``follower``.
TASK, FAILED_TASK, SUPERVISOR, FOLLOWER = "task", "failed-task", "supervisor", "follower"
ENDERS = (TASK, FAILED_TASK, SUPERVISOR, FOLLOWER)
#: The reason of a job whose tasks all reported done (YARN's diagnostics: ``DONE_DIAGNOSTICS``).
DONE_REASON = "every task reported done"
#: YARN's final status for each state a record can hold (TIMED_OUT is a FAILED app to YARN).
_FINAL_STATUS = {"SUCCEEDED": "SUCCEEDED", "FAILED": "FAILED", "TIMED_OUT": "FAILED", "KILLED": "KILLED"}


class _KV(Protocol):
    def put(self, key: str, value: str) -> None: ...


@dataclass(frozen=True)
class JobEnd:
    """The decided end of one application (the value of KV ``control/end``)."""

    state: str  # an AppState value: SUCCEEDED, FAILED, TIMED_OUT or KILLED
    reason: str  # why: one line, or a diagnosis naming the failed tasks (never "")
    by: str  # who: "follower", "supervisor", "task:worker:0", "failed-task:ps:0"
    exit_codes: dict[str, int] = field(default_factory=dict)  # the tasks that ended badly
    time: float = 0.0

    @property
    def final_status(self) -> str:
        """What the app is shut down with (YARN's final status)."""
        return _FINAL_STATUS[self.state]

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes | None) -> JobEnd | None:
        """The record in ``text``; None for no record or one this version cannot read (a reader
        falls back)."""
        if not text:
            return None
        try:
            d = json.loads(text)
            codes = d.get("exit_codes") or {}
            end = cls(
                state=str(d["state"]),
                reason=str(d.get("reason") or ""),
                by=str(d.get("by") or "?"),
                exit_codes={str(k): int(v) for k, v in codes.items()},
                time=float(d.get("time") or 0.0),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return end if end.state in _FINAL_STATUS else None


def decide(
    by: str,
    *,
    done: bool = False,
    failure: str | None = None,
    verdict: str | None = None,
    stopped: str | None = None,
    exits: Mapping[str, Mapping[str, Any]] | None = None,
    now: float | None = None,
) -> JobEnd:
    """The end an ender found, as a record. Precedence when several hold: a stop asked for by the
    user (``stopped``: KILLED), a task's failure that fails the app (``failure``: the diagnosis
    naming the failed tasks, FAILED), every task done (SUCCEEDED: a job that finished is not failed
    by a deadline reached meanwhile), a verdict of the job's rules (``verdict``: deadline,
    allocation, stall: TIMED_OUT). ``exits``: the tasks' ``exit/`` records, whose codes the record
    keeps."""
    if by.split(":", 1)[0] not in ENDERS:
        raise ValueError(f"unknown ender {by!r}: one of {', '.join(ENDERS)} (a task's adds ':<task>')")
    codes = {t: int(r["code"]) for t, r in (exits or {}).items() if r.get("code") is not None}
    if stopped is not None:
        state, reason = "KILLED", stopped
    elif failure is not None:
        state, reason = "FAILED", failure
    elif done:
        state, reason = "SUCCEEDED", DONE_REASON
    elif verdict is not None:
        state, reason = "TIMED_OUT", without_timeout_mark(verdict)
    else:
        raise ValueError(f"{by}: nothing ends the job (no stop, failure, done or verdict)")
    return JobEnd(
        state=state,
        reason=reason or state.lower(),
        by=by,
        exit_codes=codes,
        time=round(time.time() if now is None else now, 3),
    )


def end_job(kv: _KV, end: JobEnd, shutdown: Callable[[str, str], Any], diagnostics: str) -> JobEnd:
    """Write ``end`` to KV :data:`END_KEY`, then ``shutdown(final status, diagnostics)`` — the one
    way every ender ends a YARN app. The record is put first (one KV call, no wait): once the app is
    down its KV is gone; so the diagnostics YARN keeps carry it too, as their last line
    (:func:`with_record`): an app that nobody read the KV of before its end (a bare ``submit``
    whose last task ended it) still has its record for ``status``."""
    kv.put(END_KEY, end.to_json())
    shutdown(end.final_status, with_record(diagnostics, end))
    return end


#: The prefix of the diagnostics line that holds the end record (:func:`with_record`).
DIAGNOSTICS_MARK = "tfyarn-end: "
#: The longest reason the diagnostics line keeps (the KV's record keeps it whole): the line stays
#: far below the ResourceManager's bound on an attempt's diagnostics
#: (``yarn.app.attempt.diagnostics.limit.kc``, 64 KB by default), which keeps their end.
REASON_MAX = 1000


def with_record(diagnostics: str, end: JobEnd) -> str:
    """``diagnostics`` with ``end`` as one JSON line after them (``tfyarn-end: {...}``; a longer
    reason cut to :data:`REASON_MAX` there). Last: when YARN cuts long diagnostics, it keeps the
    end of them."""
    short = end
    if len(end.reason) > REASON_MAX:
        short = JobEnd(end.state, end.reason[: REASON_MAX - 1] + "…", end.by, end.exit_codes, end.time)
    return f"{diagnostics.rstrip()}\n{DIAGNOSTICS_MARK}{short.to_json()}".lstrip("\n")


def from_diagnostics(text: str | None) -> tuple[JobEnd | None, str]:
    """The end record in an ended app's diagnostics (:func:`with_record`), and the diagnostics
    without its line (for people); (None, text) when they hold none or one this version cannot
    read."""
    text = text or ""
    head, sep, line = text.rpartition(DIAGNOSTICS_MARK)
    if not sep or (head and not head.endswith("\n")):
        return None, text
    record, _, rest = line.partition("\n")
    end = JobEnd.from_json(record)
    if end is None:
        return None, text
    return end, (head + rest).strip()


def leave_to(by: str, supervisor_alive: bool, follower_alive: bool) -> str | None:
    """Whom ``by`` leaves the end of a job whose tasks are all done to (None: it ends the app
    itself). A live follower reads the KV last and ends the app first (it writes the report after
    the end); else the in-app supervisor (it writes the report before); the last task only when
    neither is alive or they did not within their grace."""
    kind = by.split(":", 1)[0]
    if kind == TASK:
        return SUPERVISOR if supervisor_alive else (FOLLOWER if follower_alive else None)
    if kind == SUPERVISOR:
        return FOLLOWER if follower_alive else None
    return None


def recorded(snapshot: Mapping[str, Any] | None) -> JobEnd | None:
    """The end record a status snapshot holds (``snapshot["end"]``, read from the KV), if any."""
    return JobEnd.from_json((snapshot or {}).get("end"))
