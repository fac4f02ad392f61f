"""YARN's view of an application (states, containers) mapped to tfyarn's: :class:`AppState`, one
:class:`TaskStatus` per task. Pure functions of what skein returns, so they are tested without a cluster."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

from tfyarn.contracts.status import AppState, AppStatus, TaskStatus
from tfyarn.errors import TIMEOUT_MARK
from tfyarn.contracts.kv_keys import (
    END_KEY,
    EXIT_PREFIX,
    FAILURE_PREFIX,
    PROGRESS_PREFIX,
    SUMMARY_KEY,
    TASKMAP_PREFIX,
    ATTEMPT_KEY,
    ATTEMPTS_PREFIX,
    CAUSE_PREFIX,
)
from tfyarn.spec import JobSpec
from tfyarn.backends.yarn.cluster_events import container_cause, task_events, event_parts
from tfyarn.backends.yarn.appspec import ATTEMPT_TAG, SUPERVISOR_SERVICE
from tfyarn.contracts.progress import side_roles, summary_with_eval, apply_resources
from tfyarn.backends.yarn import phases
from tfyarn.contracts.in_app import parse_attempt, in_attempt
from tfyarn.contracts.triage import attempt_cause
from tfyarn.task.yarn.exit_report import exit_text, diagnosis

ALL_CONTAINER_STATES = ("WAITING", "REQUESTED", "RUNNING", "SUCCEEDED", "FAILED", "KILLED")
ACTIVE_APP_STATES = ("SUBMITTED", "ACCEPTED", "RUNNING")
ALL_APP_STATES = ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED", "RUNNING", "FINISHED", "FAILED", "KILLED")


def app_state(
    yarn_state: Any, final_status: Any, diagnostics: str = "", task_states: list[str] | None = None
) -> AppState:
    """tfyarn's AppState from YARN's (state, final status), e.g. (FINISHED, SUCCEEDED) → SUCCEEDED.

    A running app is PENDING until all of its tasks' containers run (YARN calls it RUNNING as soon as the AM runs).
    A failure is TIMED_OUT when its diagnostics say a tfyarn deadline ended it.
    """
    st, fs = str(yarn_state).upper(), str(final_status).upper()
    if st in ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED"):
        return AppState.PENDING
    if st == "RUNNING":
        if task_states is not None and (
            not task_states or any(s in ("WAITING", "REQUESTED", "PENDING") for s in task_states)
        ):
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
    for t in tags or ():
        if t.startswith(ATTEMPT_TAG) and t[len(ATTEMPT_TAG) :].isdigit():
            return int(t[len(ATTEMPT_TAG) :])
    return 0


def timestamp(dt: Any) -> float | None:
    """A skein/YARN datetime as epoch seconds (None stays None)."""
    return dt.timestamp() if dt is not None else None


def app_status(rep: Any, state: AppState, diagnostics: str, **more: Any) -> AppStatus:
    """The status of the application of ``rep`` (skein's ``ApplicationReport`` or :class:`rest.AppReport`)."""
    finished = timestamp(rep.finish_time) if state.is_terminal else None
    return AppStatus(
        app_id=rep.id,
        backend="yarn",
        name=rep.name,
        state=state,
        diagnostics=diagnostics,
        started=timestamp(rep.start_time),
        finished=finished,
        tracking_url=rep.tracking_url or None,
        tags=sorted(rep.tags or ()),
        attempt=attempt_of(rep.tags),
        **more,
    )


def _exit_code(msg: str) -> int | None:
    m = re.search(r"[Ee]xit (?:code|status):?\s*(-?\d+)", msg or "")
    return int(m.group(1)) if m else None


_ENDED = ("FAILED", "KILLED")


def _start_order(c: Any) -> tuple:
    return (c.start_time is None, timestamp(c.start_time) or 0, c.instance)


def _by_task(containers: list[Any], taskmap: dict[str, str], spec: JobSpec | None) -> dict[str, list[Any]]:
    """Containers grouped by the task they hold. skein numbers a replacement container past the role's instances
    (worker:1's is ``worker_2``); until it has claimed its task in the KV it is given to the task of its role whose
    newest container ended (the one it replaces) — never shown as a task of its own (the phantom ``worker:2``)."""
    instances = {r: spec.instances(r) for r in spec.roles} if spec is not None else {}
    by_task: dict[str, list[Any]] = {}
    unclaimed = []
    for c in containers:
        task = taskmap.get(f"{c.service_name}_{c.instance}")
        if task is None and c.instance >= instances.get(c.service_name, c.instance + 1):
            unclaimed.append(c)
            continue
        by_task.setdefault(task or f"{c.service_name}:{c.instance}", []).append(c)
    for c in sorted(unclaimed, key=lambda c: c.instance):
        ended = sorted(
            (timestamp(max(cs, key=_start_order).finish_time) or 0, t)
            for t, cs in by_task.items()
            if t.split(":")[0] == c.service_name and str(max(cs, key=_start_order).state) in _ENDED
        )
        if ended:
            by_task[ended[0][1]].append(c)
    return by_task


def snapshot(
    containers: list[Any], kv: dict[str, str], spec: JobSpec | None, progress: dict[str, Any]
) -> dict[str, Any]:
    """What a status read keeps of a running app (tasks, progress, summary, failures, phases …), from its containers
    and its whole KV: the follower's saved snapshot and the in-app supervisor's record have this one shape.
    ``progress``: the caller's reading of ``kv`` (:func:`tfyarn.contracts.progress.read_progress`)."""
    taskmap = {k[len(TASKMAP_PREFIX) :]: v for k, v in kv.items() if k.startswith(TASKMAP_PREFIX)}
    failures = {k[len(FAILURE_PREFIX) :]: v for k, v in kv.items() if k.startswith(FAILURE_PREFIX)}
    exits = {k[len(EXIT_PREFIX) :]: json.loads(v) for k, v in kv.items() if k.startswith(EXIT_PREFIX)}
    tasks = tasks_from_containers(containers, taskmap, spec, failures, exits, parse_attempt(kv.get(ATTEMPT_KEY)))
    apply_resources(tasks, kv)  # CPU % and RSS each task publishes of itself (issue 32)
    events = task_events(_by_task([c for c in containers if c.service_name != SUPERVISOR_SERVICE], taskmap, spec))
    progress_items = {k: v for k, v in kv.items() if k.startswith(PROGRESS_PREFIX)}
    sides = side_roles(kv.get)
    return {
        "tasks": [t.__dict__ for t in tasks],
        "progress": progress,
        "summary": summary_with_eval(kv.get(SUMMARY_KEY), sides),
        "failures": failures,
        "exits": exits,
        "taskmap": taskmap,
        "events": events,
        "end": kv.get(END_KEY),
        "phases": phases.task_phases(kv, progress_items),
        "containers": {f"{c.service_name}_{c.instance}": c.yarn_container_id for c in containers},
        "causes": restart_causes(containers, kv, taskmap),
        **in_app_attempts(kv),
    }


def restart_causes(containers: list[Any], kv: dict[str, str], taskmap: dict[str, str]) -> list[dict[str, Any]]:
    """Why each task's container failed or was taken and each in-app attempt ended, oldest first, with the triage
    rule that decided (status ``causes``): the exit reports' ``cause/`` records, the containers YARN took (no report
    of their own: preempted, a lost node) and the ``attempts/<n>`` records."""
    out: list[dict[str, Any]] = []
    reported = set()
    for rec in json_records(kv, CAUSE_PREFIX):
        reported.add(rec.get("container"))
        out.append({"kind": "restart", **rec})
    for c in containers:
        cid = f"{c.service_name}_{c.instance}"
        t = container_cause(c)
        if t is None or cid in reported:
            continue
        task = taskmap.get(cid) or cid
        when = timestamp(getattr(c, "finish_time", None)) or timestamp(c.start_time) or 0.0
        out.append(
            {
                "kind": "restart",
                "task": task,
                "container": cid,
                "time": when,
                "free": t.free,
                "then": "replaced by YARN's restart",
                **t.to_dict(),
            }
        )
    for rec in json_records(kv, ATTEMPTS_PREFIX):
        t = attempt_cause(str(rec.get("diagnosis") or ""))
        if t is not None:
            out.append(
                {
                    "kind": "attempt",
                    "task": f"attempt {rec.get('attempt')}",
                    "time": rec.get("ended") or 0.0,
                    "free": t.free,
                    "then": "the next in-app attempt",
                    **t.to_dict(),
                }
            )
    return sorted(out, key=lambda r: r.get("time") or 0.0)


def in_app_attempts(kv: dict[str, str]) -> dict[str, Any]:
    """The in-app attempt running (``attempt``: ``control/attempt``'s number) and the ended ones
    (``attempts``: their ``attempts/<n>`` records, in order), when the in-app supervisor ran any."""
    rec = parse_attempt(kv.get(ATTEMPT_KEY))
    if rec is None:
        return {}
    ended = list(json_records(kv, ATTEMPTS_PREFIX))
    return {"attempt": rec["attempt"], "attempts": sorted(ended, key=lambda r: r.get("attempt") or 0)}


def json_records(kv: dict[str, str], prefix: str) -> Iterator[Any]:
    """The JSON values of ``kv``'s keys under ``prefix``; one that does not parse (its writer died mid-write) is
    left out: a status snapshot reads what it can."""
    for k, v in kv.items():
        if k.startswith(prefix):
            try:
                yield json.loads(v)
            except ValueError:
                continue


def _state_and_code(c: Any, ex: dict[str, Any]) -> tuple[str, int | None]:
    """A task's state and exit code from its newest container ``c`` and that container's exit record ``ex``."""
    state = str(c.state)
    state = "PENDING" if state in ("WAITING", "REQUESTED") else state
    if ex and state in ("RUNNING", "KILLED"):
        # its process died (exit/ records only non-zero exits): RUNNING = the application master has not heard
        # yet; KILLED = its container script was still reporting when the app's shutdown, which that report
        # asked for, killed the container
        state = "FAILED"
    code = None
    if state in _ENDED:
        code = ex["code"] if ex else _exit_code(c.exit_message)
    elif state == "SUCCEEDED":
        code = 0
    return state, code


def tasks_from_containers(
    containers: list[Any],
    taskmap: dict[str, str],
    spec: JobSpec | None,
    failures: dict[str, str],
    exits: dict[str, dict[str, Any]],
    attempt: dict[str, Any] | None = None,
) -> list[TaskStatus]:
    """One TaskStatus per task (``role:index``) from skein containers: the newest container holding each task;
    ``restarts`` = how many earlier containers held it. Tasks with no container yet are PENDING.

    ``exits`` (``exit/<task>`` records, :mod:`tfyarn.task.yarn.exit_report`) give a failed task's exit code and tell
    a container that died before the application master noticed (FAILED at once, not RUNNING for seconds).
    ``attempt`` (``control/attempt``): restarts count only the running in-app attempt's containers."""
    by_task = _by_task([c for c in containers if c.service_name != SUPERVISOR_SERVICE], taskmap, spec)  # no task
    out = []
    order = spec.tasks() if spec is not None else []
    names = order + sorted(t for t in by_task if t not in order)
    for task in names:
        cs = sorted(by_task.get(task, []), key=_start_order)
        role = next((r for n, r in spec.roles.items() if n == task.split(":")[0]), None) if spec else None
        memory = role.memory_mib if role is not None else None
        if not cs:
            out.append(TaskStatus(task=task, state="PENDING", diagnostics=failures.get(task, ""), memory_mib=memory))
            continue
        c = cs[-1]
        ex = exits.get(task) or {}
        if ex.get("container") != c.yarn_container_id:
            ex = {}  # how an earlier container of this task ended
        state, code = _state_and_code(c, ex)
        diag = failures.get(task) or ""
        if state in _ENDED and not diag:
            diag = exit_text(ex["code"]) if ex else c.exit_message
        cause = container_cause(c) if not ex else None
        if cause is not None:  # YARN took it (contracts.triage): said in words, its text after
            diag = f"{cause.words} (YARN: {c.exit_message})"
        elif state == "PENDING" and len(cs) > 1 and (prev := container_cause(cs[-2])) is not None:
            diag = f"replacing its container {prev.words} ({cs[-2].yarn_container_id})"
        out.append(
            TaskStatus(
                task=task,
                state=state,
                host=(c.yarn_node_http_address or "").split("://")[-1].rsplit(":", 1)[0] or None,
                restarts=sum(1 for x in cs[:-1] if in_attempt(f"{x.service_name}_{x.instance}", attempt)),
                exit_code=code,
                diagnostics=diag,
                log=c.yarn_container_logs or None,
                memory_mib=memory,
            )
        )
    return out


def failure_diagnosis(
    app_diagnostics: str,
    failures: dict[str, str],
    exits: dict[str, dict[str, Any]],
    events: dict[str, list[str]] | None = None,
) -> str:
    """The application's diagnosis with every task that ended badly named in it, root cause first: each task's exit
    code and its own failure record (the ``failure/`` and ``exit/`` keys the follower saw), before YARN's text,
    skipping tasks that text already names (the container script's shutdown writes the same parts). ``events``:
    containers YARN took (preempted, lost node: cluster_events), said first: the root cause a peer's error follows."""
    diag = (app_diagnostics or "").strip()
    records = {
        t: {"code": r.get("code"), "died_at": r.get("died_at"), "failure": failures.get(t) or r.get("failure")}
        for t, r in exits.items()
    }
    for t, text in failures.items():
        records.setdefault(t, {"code": None, "died_at": float("inf"), "failure": text})
    new = {t: r for t, r in records.items() if f"{t}: " not in diag}
    text = "; ".join([*event_parts(events or {}), *([diagnosis(new)] if new else [])])
    return f"{text}\n{diag}".strip() if text else diag
