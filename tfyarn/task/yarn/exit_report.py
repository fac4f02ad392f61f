"""How a YARN task's Python ended, said where people look: its log, the app's KV and the application's diagnostics.

Why: skein keeps no exit status (a container that exits 137 is "Container failed during execution, see logs") and its
application master is gone with the app. So the container script runs Python as a child and, on a non-zero exit, runs
``python -m tfyarn.task.yarn.exit_report CODE DIED_AT`` while the application master still runs: a line in the
container log, ``exit/<task>`` in the KV (read by ``status``), and, when this failure ends the application, a FAILED
shutdown whose diagnosis names every task that ended badly, the first to die first (``ps:0: exit code 137 (killed by
SIGKILL)``), so the ResourceManager's report says it. Never raises and is bounded (:data:`REPORT_TIMEOUT_S`): the
container's exit code stays the task's; its own is :data:`NOT_REPORTED` when it could not report.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tfyarn.cluster._skein import skein
from tfyarn.contracts import in_app, job_end
from tfyarn.contracts.in_app import in_attempt, parse_attempt
from tfyarn.contracts.kv_keys import (
    ATTEMPT_END_KEY,
    ATTEMPT_KEY,
    ATTEMPTS_PREFIX,
    CAUSE_PREFIX,
    EXIT_PREFIX,
    FAILURE_PREFIX,
    SUPERVISOR_KEY,
    TASKMAP_PREFIX,
    cause_key,
    exit_key,
    failure_key,
)
from tfyarn.contracts.triage import FREE_RESTARTS, classify, restarts
from tfyarn.errors import TfyarnError
from tfyarn.spec import SIDECAR_ROLES, load_spec_json
from tfyarn.task.yarn.app_end import finish_if_last
from tfyarn.task.yarn.kv_yarn import SkeinKV, parse_container_id
from tfyarn.tasklib.kv import put_json

REPORT_TIMEOUT_S = 30.0
#: The report's own exit code when it could not report (the container script then runs contracts.startup's check).
NOT_REPORTED = 3
#: A fatal failure waits this long before shutting the app down, so tasks failing from the same cause (a ps killed:
#: the chief's next step fails) are named too.
SETTLE_S = 1.0
_DESCRIBED_RE = re.compile(r"(?:^|; |\n)([\w.-]+:[\w?]+): exit code (-?\d+)")


def exit_text(code: int) -> str:
    """``exit code 137 (killed by SIGKILL)``, ``exit code 1``; a shell reports death by signal N as 128 + N."""
    sig = code - 128 if code > 128 else (-code if code < 0 else 0)
    try:
        name = signal.Signals(sig).name if sig else ""
    except ValueError:
        name = ""
    return f"exit code {code}" + (f" (killed by {name})" if name else "")


def describe(task: str, code: int | None, failure: str | None = None) -> str:
    """``chief:0: exit code 1: ValueError: …`` — one failed task in a diagnosis (no code: still running)."""
    parts = [task, exit_text(code) if code is not None else None, failure]
    return ": ".join(p for p in parts if p)


def exit_codes_in(diagnostics: str) -> dict[str, int]:
    """Task → exit code from a diagnosis made of :func:`describe` parts (the application's, after the end)."""
    return {m.group(1): int(m.group(2)) for m in _DESCRIBED_RE.finditer(diagnostics or "")}


def exit_record(code: int, died_at: float, failure: str | None) -> dict[str, Any]:
    return {
        "code": code,
        "died_at": died_at,
        "container": os.environ.get("CONTAINER_ID"),
        "skein_container": os.environ.get("SKEIN_CONTAINER_ID"),
        "failure": failure,
    }


def diagnosis(records: dict[str, dict[str, Any]]) -> str:
    """Every task that ended badly, the first to die first."""
    order = sorted(records.items(), key=lambda kv: (kv[1].get("died_at") or 0, kv[0]))
    return "; ".join(describe(t, r.get("code"), r.get("failure")) for t, r in order)


def ends_the_app(
    app: Any, role: str, attempt: dict[str, Any] | None = None, free_ids: frozenset[str] = frozenset()
) -> bool:
    """Whether this failure ends the application (or, with an in-app supervisor, the attempt): its role is not a
    side role (whose failures are allowed) and has no restart left. The budget is the spec's (``max_restarts`` x
    instances; skein's, larger by triage.FREE_RESTARTS, when the spec cannot be read), used only by earlier failures
    of this attempt's containers (``attempt``: ``control/attempt``, contracts.in_app) that triage does not call
    free: a container that YARN preempted or lost with its node, or whose report found the cluster's fault
    (``free_ids``: :func:`free_restart`'s), used none of it."""

    svc = app.get_specification().services.get(role)
    r = _spec_role(role)
    # skein's allow_failures is set on every task service of a supervised app (the app's end is tfyarn's)
    sidecar = svc is not None and svc.allow_failures if r is None else role in SIDECAR_ROLES
    if svc is None or sidecar or svc.max_restarts == -1:
        return False
    return _budget_spent(app, role, svc, attempt, free_ids)


def _budget_spent(app: Any, role: str, svc: Any, attempt: dict[str, Any] | None, free_ids: frozenset[str]) -> bool:
    """Has the role used its restart budget (:func:`ends_the_app`'s count) in this attempt?"""
    if svc.max_restarts == -1:
        return False
    budget = _spec_budget(role)
    budget = svc.max_restarts if budget is None else min(budget, svc.max_restarts)
    failed = [
        c
        for c in app.get_containers(services=[role], states=["FAILED"])
        if (attempt is None or in_attempt(f"{c.service_name}_{c.instance}", attempt))
        and not classify(diagnostics=getattr(c, "exit_message", "") or "").free
        and _cid(c) not in free_ids
    ]
    return len(failed) >= budget


def _cid(c: Any) -> str:
    """A skein container's id (``worker_3``)."""
    return f"{getattr(c, 'service_name', '?')}_{getattr(c, 'instance', '?')}"


def _rejoins(doc: dict[str, Any], role: str) -> bool:
    """backends.yarn.appspec.rejoins from the shipped spec: can a replacement of this role's task join the running
    job (skein then has ``retry.cluster_faults`` more restarts per task for it)? Async ps workers and evaluators."""
    return role == "evaluator" or (role == "worker" and doc.get("mode") == "ps" and not doc.get("sync"))


def free_containers(causes: dict[str, str]) -> frozenset[str]:
    """The skein containers (``worker_3``) whose failure these reports found the cluster's fault (``cause/`` items)."""
    out = set()
    for v in causes.values():
        try:
            rec = json.loads(v)
        except ValueError:
            continue
        if rec.get("free") and rec.get("container"):
            out.add(str(rec["container"]))
    return frozenset(out)


def free_restart(
    app: Any, role: str, t: Any, attempt: dict[str, Any] | None, free_ids: frozenset[str]
) -> tuple[int, int] | None:
    """Is this failure, the cluster's fault (contracts.triage: a peer's or the transport's error, free), a restart
    in place that uses none of ``max_restarts``? Only for a role that can rejoin (:func:`_rejoins`), while the
    role's ``retry.cluster_faults`` x instances last (this attempt's containers YARN took or whose report found
    the cluster's fault). ``(used before, bound)`` when it is, else None."""

    doc = _spec()
    if not t.free or doc is None or not _rejoins(doc, role):
        return None
    r = (doc.get("roles") or {}).get(role) or {}
    if r.get("restart") == "never":
        return None
    bound = int((doc.get("retry") or {}).get("cluster_faults", FREE_RESTARTS)) * int(r.get("instances", 1))
    used = sum(
        1
        for c in app.get_containers(services=[role], states=["FAILED"])
        if (attempt is None or in_attempt(f"{c.service_name}_{c.instance}", attempt))
        and (_cid(c) in free_ids or classify(diagnostics=getattr(c, "exit_message", "") or "").free)
    )
    return (used, bound) if used < bound else None


def _spec() -> dict[str, Any] | None:
    """The job's spec as shipped (JSON of the task's spec file); None without one."""
    try:
        doc = json.loads(Path(os.environ["TFYARN_SPEC_FILE"]).read_text())
    except (KeyError, OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _spec_role(role: str) -> dict[str, Any] | None:
    doc = _spec()
    if doc is None:
        return None
    return (doc.get("roles") or {}).get(role) or {}


def _spec_budget(role: str) -> int | None:
    """The role's restart budget for all its tasks from the task's spec file (None: no spec file)."""
    r = _spec_role(role)
    if r is None:
        return None
    return 0 if r.get("restart") == "never" else int(r.get("max_restarts", 0)) * int(r.get("instances", 1))


def policy_refuses(role: str, code: int, failure: str | None) -> bool:
    """Does the role's ``restart`` policy refuse a restart of this failure (``exit_code``: the code's own exit
    1-127 that triage puts on the user's code)? skein restarts on any failure, so the app must end here: then
    ``restart: exit_code`` means the same on YARN as locally (tfyarn.contracts.triage.restarts)."""

    policy = (_spec_role(role) or {}).get("restart", "on_failure")
    return policy == "exit_code" and not restarts(policy, code, classify(exit_code=code, failure=failure or ""))


def report(app: Any, code: int, died_at: float, settle_s: float = SETTLE_S) -> str:
    """Write this container's ``exit/<task>`` record and, when the failure ends the app, shut it down FAILED with
    the diagnosis — or, when the in-app supervisor may run another attempt, hand the attempt's end to it
    (:func:`hand_over`); when it ends nothing, end a job that is done (:func:`finish_if_done`). A container of an
    attempt that is ending or has ended reports nothing (the supervisor killed it, or clears its records). Returns
    the task label used."""

    cid = os.environ.get("SKEIN_CONTAINER_ID", "")
    kv = SkeinKV(app.kv)
    task = kv.get(f"{TASKMAP_PREFIX}{cid}") or cid or "?"  # no index claimed yet: the skein container id
    attempt = parse_attempt(kv.get(ATTEMPT_KEY))
    if not in_attempt(cid, attempt) or kv.get(ATTEMPT_END_KEY) is not None:
        print(f"[tfyarn] {task}: its job attempt is over; the in-app supervisor runs the next", file=sys.stderr)
        return task
    failure = kv.get(failure_key(task))
    put_json(kv, exit_key(task), exit_record(code, died_at, failure))
    role = os.environ.get("TFYARN_ROLE") or parse_container_id(cid)[0]
    t = classify(exit_code=code, failure=failure or "", task=task)
    free_ids = free_containers(kv.items(CAUSE_PREFIX))
    free = free_restart(app, role, t, attempt, free_ids)
    record = {"task": task, "container": cid, "time": round(died_at, 3), "free": free is not None, **t.to_dict()}
    if free is not None:
        put_json(kv, cause_key(task, cid), {**record, "then": "restarted in place"})
        print(
            f"[tfyarn] {task}: restarted in place, not counted in max_restarts (the cluster's fault "
            f"{free[0] + 1} of retry.cluster_faults {free[1]}): {t.words}; rule: {t.rule}",
            file=sys.stderr,
        )
        return task
    ends = ends_the_app(app, role, attempt, free_ids) or policy_refuses(role, code, failure)
    svc = app.get_specification().services.get(role)
    gone = not ends and role in SIDECAR_ROLES and (svc is None or _budget_spent(app, role, svc, attempt, free_ids))
    then = "the attempt's end" if ends else ("the job goes on without it" if gone else "restarted in place")
    put_json(kv, cause_key(task, cid), {**record, "then": then})
    print(f"[tfyarn] {task}: {t.cls}: {t.words}; rule: {t.rule}", file=sys.stderr)
    if not ends:
        finish_if_done(app, kv, task)
        return task
    time.sleep(settle_s)
    records = {k[len(EXIT_PREFIX) :]: json.loads(v) for k, v in kv.items(EXIT_PREFIX).items()}
    # a task that wrote its failure but whose process has not ended yet is named too (after the dead ones)
    for key, text in kv.items(FAILURE_PREFIX).items():
        records.setdefault(key.split("/", 1)[1], {"code": None, "died_at": time.time(), "failure": text})

    diag = diagnosis(records)
    if hand_over(kv, task, diag):
        return task
    end = job_end.decide(f"{job_end.FAILED_TASK}:{task}", failure=diag, exits=records)
    job_end.end_job(kv, end, app.shutdown, diag)
    return task


def finish_if_done(app: Any, kv: Any, task: str) -> bool:
    """A failure that ends nothing may be the last end the job waited for: a side task (tensorboard) failing after
    every other task reported done. So it makes the check every task's success makes
    (:func:`tfyarn.task.yarn.app_end.finish_if_last`: the job done, the end left to a live supervisor or follower,
    else made here): the app ends SUCCEEDED, not as skein's end without a record (FAILED). True when it was done."""
    try:
        tasks = load_spec_json(Path(os.environ["TFYARN_SPEC_FILE"]).read_text()).tasks()
    except (KeyError, OSError, ValueError, TfyarnError) as exc:
        print(f"[tfyarn] {task}: no spec to tell whether the job is done ({exc})", file=sys.stderr)
        return False
    return finish_if_last(kv, tasks, task, lambda diagnostics: app.shutdown("SUCCEEDED", diagnostics))


def hand_over(kv: Any, task: str, diag: str) -> bool:
    """With a live in-app supervisor, a failure triage retries and an attempt left
    (:func:`tfyarn.contracts.in_app.hand_over`): put ``control/attempt_end`` for the supervisor, which
    runs the next attempt in this application, and True. Else False (the app ends FAILED, as ever)."""

    retry = (_spec() or {}).get("retry") or {}
    decision = in_app.hand_over(
        diag,
        int(retry.get("max_attempts") or 1),
        in_app.ended_diagnoses(kv.items(ATTEMPTS_PREFIX)),
        in_app.heartbeat_fresh(kv.get(SUPERVISOR_KEY), time.time()),
        int(retry.get("cluster_faults", in_app.FREE_ATTEMPTS)),
    )
    if not decision:
        print(f"[tfyarn] {task}: the application ends: {decision.reason}", file=sys.stderr)
        return False
    kv.put(ATTEMPT_END_KEY, in_app.handover_record(f"failed-task:{task}", diag, time.time()))
    print(f"[tfyarn] {task}: the attempt's end handed to the in-app supervisor ({decision.reason})", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    code = int(args[0])
    try:
        died_at = float(args[1])
    except (IndexError, ValueError):
        died_at = time.time()
    who = os.environ.get("SKEIN_CONTAINER_ID", "?")
    print(
        f"[tfyarn] {os.environ.get('TFYARN_ROLE', '?')} task (container {who} = "
        f"{os.environ.get('CONTAINER_ID', '?')}) ended with {exit_text(code)}",
        file=sys.stderr,
        flush=True,
    )
    outcome: list[str] = []

    def run() -> None:
        try:
            outcome.append(report(skein().ApplicationClient.from_current(), code, died_at))
        except Exception as exc:  # noqa: BLE001 - a report must never change how the container ends
            outcome.append(f"! {type(exc).__name__}: {exc}")

    t = threading.Thread(target=run, name="tfyarn-exit-report", daemon=True)
    t.start()
    t.join(REPORT_TIMEOUT_S)
    if not outcome:
        print(
            f"[tfyarn] could not report the exit within {REPORT_TIMEOUT_S:g}s (application master unreachable)",
            file=sys.stderr,
        )
    elif outcome[0].startswith("! "):
        print(f"[tfyarn] could not report the exit: {outcome[0][2:]}", file=sys.stderr)
    else:
        return 0
    return NOT_REPORTED


if __name__ == "__main__":
    sys.exit(main())
