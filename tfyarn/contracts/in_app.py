"""A YARN job's further attempts inside its own application: which attempt runs, which containers are
its, which KV keys are its, and whether a failed attempt's end may be handed to the in-app supervisor.

Why: a job submitted without a gateway that follows it (a bare ``submit``, ``wait`` from another machine,
Airflow's deferrable trigger) gets its attempts from the in-app supervisor
(:mod:`tfyarn.runner.yarn_app.supervise`), which kills every task container of the failed attempt and
starts them again in the same application. The tasks, their container scripts' exit reports and the
supervisor must agree on these rules; pure functions of KV values, so each side imports them from here.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Mapping

from tfyarn.contracts import kv_keys as K
from tfyarn.contracts.triage import FREE_ATTEMPTS, AttemptBudget, RetryDecision, should_retry

#: What one attempt's tasks write and the next must not see: cleared between in-app attempts. Kept: the
#: spec, the supervisor's and followers' heartbeats, ``taskmap/`` (logs of earlier containers), ``index/``
#: (namespaced by attempt), ``attempts/`` (the history), ``control/attempt`` (replaced), ``page/url``.
ATTEMPT_SCOPED_PREFIXES: tuple[str, ...] = (
    K.ADDR_PREFIX, K.PROGRESS_PREFIX, K.FAILURE_PREFIX, K.EXIT_PREFIX, K.PHASE_PREFIX, K.STACKS_PREFIX,
    K.REJOIN_PREFIX, K.SLOT_PREFIX, K.SLOT_DONE_PREFIX, K.RESOURCES_PREFIX,
)  # fmt: skip
ATTEMPT_SCOPED_KEYS: tuple[str, ...] = (
    K.DONE_KEY, K.ABORT_KEY, K.STEPS_ALIGNED_KEY, K.DUMP_REQUEST_KEY, K.ALL_DONE_KEY, K.END_KEY, K.SUMMARY_KEY,
    K.TOTAL_STEPS_KEY, K.EVAL_KEY, K.TENSORBOARD_URL_KEY, K.ATTEMPT_END_KEY,
)  # fmt: skip


#: A supervisor whose heartbeat (``control/supervisor``) is this fresh is alive (task.yarn.app_end's bound too).
SUPERVISOR_FRESH_S = 10.0


def heartbeat_fresh(value: str | None, now: float, fresh_s: float = SUPERVISOR_FRESH_S) -> bool:
    """Is a heartbeat's wall time (a KV value) at most ``fresh_s`` old?"""
    try:
        return value is not None and now - float(value) <= fresh_s
    except ValueError:
        return False


def attempt_scoped(key: str) -> bool:
    """Is ``key`` one attempt's, to be cleared before the next in-app attempt starts?"""
    return key in ATTEMPT_SCOPED_KEYS or key.startswith(ATTEMPT_SCOPED_PREFIXES)


def parse_attempt(value: str | bytes | None) -> dict[str, Any] | None:
    """``control/attempt``'s JSON ({attempt, first, time}); None when absent or unreadable."""
    if value is None:
        return None
    try:
        rec = json.loads(value)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("attempt"), int) else None


def attempt_number(rec: Mapping[str, Any] | None, env_attempt: int) -> int:
    """The attempt a task of this app runs: ``control/attempt``'s, else the app's own (``TFYARN_ATTEMPT``)."""
    return int(rec["attempt"]) if rec else env_attempt


def instance_of(container_id: str) -> tuple[str, int] | None:
    """``'worker_3'`` → ``('worker', 3)``; None for anything else."""
    service, sep, n = container_id.rpartition("_")
    return (service, int(n)) if sep and service and n.isdigit() else None


def in_attempt(container_id: str, rec: Mapping[str, Any] | None) -> bool:
    """Is the skein container ``container_id`` one of the running attempt's? skein numbers a service's
    containers in order, so the attempt's are those at or past ``first[service]`` (no record: all are)."""
    parsed = instance_of(container_id)
    if rec is None or parsed is None:
        return True
    return parsed[1] >= int((rec.get("first") or {}).get(parsed[0], 0))


def ended_diagnoses(items: Mapping[str, str]) -> list[str]:
    """The diagnoses of the ended in-app attempts, in order, from the ``attempts/<n>`` items."""
    recs = []
    for v in items.values():
        try:
            rec = json.loads(v)
            recs.append((int(rec["attempt"]), str(rec.get("diagnosis") or "")))
        except (ValueError, KeyError, TypeError):
            continue
    return [d for _, d in sorted(recs)]


def budget_after(max_attempts: int, diagnoses: Iterable[str], free_max: int = FREE_ATTEMPTS) -> AttemptBudget:
    """The attempt budget (:class:`~tfyarn.contracts.triage.AttemptBudget`, the runner's) after the
    ended attempts with these diagnoses, replayed in order (``free_max``: ``retry.cluster_faults``)."""
    budget = AttemptBudget(max_attempts, free_max)
    for d in diagnoses:
        budget.next(d)
    return budget


def hand_over(
    diagnosis: str, max_attempts: int, ended: Iterable[str], supervisor_alive: bool, free_max: int = FREE_ATTEMPTS
) -> RetryDecision:
    """May a failed task hand its attempt's end to the in-app supervisor (True) instead of ending the
    app FAILED? Only with a live supervisor, when triage retries the failure (never the user's code)
    and the budget has an attempt left. The supervisor decides again (the deadline too)."""
    decision = should_retry(diagnosis)
    if not supervisor_alive:
        return RetryDecision(False, "no in-app supervisor alive", decision.cause)
    if not decision:
        return decision
    if not budget_after(max_attempts, ended, free_max).next(diagnosis):
        return RetryDecision(False, f"no attempt left (retry.max_attempts {max_attempts})", decision.cause)
    return decision


def handover_record(by: str, diagnosis: str, now: float) -> str:
    """``control/attempt_end``'s value."""
    return json.dumps({"by": by, "diagnosis": diagnosis, "time": round(now, 3)})


def clear_attempt(items: Iterable[str], delete: Callable[[str], Any]) -> list[str]:
    """Delete every attempt-scoped key of ``items`` (:func:`attempt_scoped`); the keys deleted."""
    gone = [k for k in items if attempt_scoped(k)]
    for k in gone:
        delete(k)
    return gone


def no_more_attempts_note(spec: Any, attempt: int, diagnosis: str = "") -> str:
    """What a failed app of a job with attempts left says: its supervisor did not run the next one in it and
    nobody submitted one (or, when the user's code failed, that no attempt would: contracts.triage.should_retry)."""
    if attempt + 1 >= spec.retry.max_attempts:
        return ""
    decision = should_retry(diagnosis)
    if not decision:
        return decision.reason
    return (
        f"attempt {attempt + 1} of {spec.retry.max_attempts} (retry.max_attempts): the app's in-app supervisor "
        f"runs further attempts after a task's failure, a stall or an allocation timeout (not past the deadline, "
        f"nor once it or the application master is gone), and a new YARN application is submitted only by a "
        f"gateway that follows the job "
        f"(`tfyarn run`); none was"
    )
