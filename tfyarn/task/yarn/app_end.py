"""The end of a YARN job: the application is shut down as soon as every task has reported done.

Why: skein's application master ends the app only once YARN has told it that every container exited (NodeManager and
AM heartbeats: 5.5 s after the last task's work). Every task marks ``slot-done/<task>`` when its role returned; the
one that finds every task done puts :data:`ALL_DONE_KEY`, and the app is shut down SUCCEEDED
(the end recorded first: :func:`tfyarn.contracts.job_end.end_job`) by a live follower
(:data:`FOLLOWER_KEY` fresh: it reads the KV one last time, then writes the report after the end), else by the
in-app supervisor (:data:`SUPERVISOR_KEY` fresh: it writes the run report first), else, or after their grace, by that
task. A side task (tensorboard) that failed counts as done; its container's exit report makes the same check
(:func:`finish_if_last`), so one failing *after* every other task reported done ends the job SUCCEEDED too. A job
with a failure record or a task that never reports done ends as skein decides, from the containers' exits.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Iterable, Mapping

from tfyarn.cluster._skein import skein
from tfyarn.contracts import job_end
from tfyarn.contracts.in_app import heartbeat_fresh
from tfyarn.contracts.kv_keys import (
    ALL_DONE_KEY,
    EXIT_PREFIX,
    FAILURE_PREFIX,
    FOLLOWER_KEY,
    PHASE_PREFIX,
    SLOT_DONE_PREFIX,
    SUPERVISOR_KEY,
)
from tfyarn.spec import SIDECAR_ROLES
from tfyarn.tasklib.kv import KV, KVUnavailable

log = logging.getLogger(__name__)

#: A follower whose last poll (KV ``control/follower``) is this fresh shuts the app down itself after reading the KV.
FOLLOWER_FRESH_S = 10.0
FOLLOWER_GRACE_S = 2.0
#: How long a fresh in-app supervisor (KV ``control/supervisor``) is left the job's end.
SUPERVISOR_GRACE_S = 20.0
#: The application's diagnostics when it is ended this way (status shows none for a SUCCEEDED app that says this).
DONE_DIAGNOSTICS = "tfyarn: every task reported done; application ended"


def record_phase(kv: KV, task: str, **times: float) -> None:
    """Merge ``times`` into ``phase/<task>``; advisory (a KV that does not answer loses the record, not the task)."""
    try:
        old = kv.get(PHASE_PREFIX + task)
        rec = json.loads(old) if old else {}
        rec.update({k: round(v, 3) for k, v in times.items()})
        kv.put(PHASE_PREFIX + task, json.dumps(rec, separators=(",", ":")))
    except (KVUnavailable, ValueError) as exc:
        log.debug("%s: phase record not written: %s", task, exc)


def all_done(kv: KV, tasks: Iterable[str]) -> bool:
    """:func:`done_in` over the app's KV records."""
    return done_in({**kv.items(SLOT_DONE_PREFIX), **kv.items(FAILURE_PREFIX), **kv.items(EXIT_PREFIX)}, tasks)


def side_task(task: str) -> bool:
    """Is ``task`` (``role:index``) of a side role (tensorboard), whose failure is allowed?"""
    return task.split(":", 1)[0] in SIDECAR_ROLES


def done_in(items: Mapping[str, Any], tasks: Iterable[str], gone: Iterable[str] = ()) -> bool:
    """The job's rule, over KV ``items``: every task has reported done and no task has a failure record; a side
    task that failed (its failure record, or its container's exit record: a kill writes no failure; or in ``gone``:
    its container ended without a report) counts as done: its failure is allowed (the job trains on without it,
    and its status says so)."""
    gone = set(gone)

    def ended(task: str) -> bool:
        return f"{SLOT_DONE_PREFIX}{task}" in items or (
            side_task(task) and (f"{FAILURE_PREFIX}{task}" in items or f"{EXIT_PREFIX}{task}" in items or task in gone)
        )

    if any(k.startswith(FAILURE_PREFIX) and not side_task(k[len(FAILURE_PREFIX) :]) for k in items):
        return False
    return all(ended(t) for t in tasks)


def follower_alive(kv: KV, now: float, key: str = FOLLOWER_KEY) -> bool:
    """Is the heartbeat at ``key`` (a follower's by default) at most :data:`FOLLOWER_FRESH_S` old?"""
    return heartbeat_fresh(kv.get(key), now, FOLLOWER_FRESH_S)


def finish_if_last(
    kv: KV,
    tasks: list[str],
    task: str,
    shutdown: Callable[[str], Any],
    grace_s: float = FOLLOWER_GRACE_S,
    poll_s: float = 0.1,
    supervisor_grace_s: float = SUPERVISOR_GRACE_S,
) -> bool:
    """Called by each task after its ``slot-done``, and by a failed task's exit report when its failure ends
    nothing (a side task's): when every task is done, end the application now (see the module docstring):
    ``shutdown(diagnostics)``, whose diagnostics carry the end record (the KV that holds it dies with the app).
    Returns True when this task found the job done. Never raises (the task has ended already)."""
    try:
        if not all_done(kv, tasks):
            return False
        now = time.time()
        kv.put(ALL_DONE_KEY, json.dumps({"time": round(now, 3), "by": task}))
        by = f"{job_end.TASK}:{task}"
        other = job_end.leave_to(by, follower_alive(kv, now, SUPERVISOR_KEY), follower_alive(kv, now))
        if other is not None:
            wait_s = supervisor_grace_s if other == job_end.SUPERVISOR else grace_s
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:  # the supervisor/follower shuts it down: the AM stops answering
                time.sleep(poll_s)
                kv.get(ALL_DONE_KEY)
            log.info("%s: the %s did not end the application within %gs; ending it", task, other, wait_s)
        log.info("%s: every task is done: shutting the application down", task)
        job_end.end_job(kv, job_end.decide(by, done=True), lambda _status, diag: shutdown(diag), DONE_DIAGNOSTICS)
    except KVUnavailable:
        return True  # the application master has gone: it ended
    except Exception as exc:  # noqa: BLE001 - skein ends the app anyway once the containers exit
        log.warning("%s: could not end the application early (%s); YARN ends it as the containers exit", task, exc)
    return True


def finish_yarn_task(kv: KV, spec: Any, task: str) -> bool:
    """:func:`finish_if_last` with this container's skein application client."""

    def shutdown(diagnostics: str) -> None:

        skein().ApplicationClient.from_current().shutdown("SUCCEEDED", diagnostics)

    return finish_if_last(kv, spec.tasks(), task, shutdown)
