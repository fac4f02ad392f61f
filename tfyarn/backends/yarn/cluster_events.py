"""What YARN did to a job's containers, per task and in words: preempted by the scheduler, lost with
its node, killed for memory (contracts.triage reads skein's exit message, e.g. "Container preempted
by scheduler").

Why: skein counts a preempted container as a failed one and says so nowhere the user looks; status
showed only ``worker:1 PENDING`` and a failed attempt only "Failure in service worker". These words
go into the task's diagnostics, the snapshot (``events``) and the app's diagnosis, where the attempt
budget reads them (contracts.triage.attempt_cause: a preemption does not use up
``retry.max_attempts``)."""

from __future__ import annotations

from typing import Any

from tfyarn.contracts.triage import Triage, classify

#: causes said as cluster events (the others are said by the task's own failure record)
EVENT_CAUSES = ("preempted", "node_lost", "memory")


def container_cause(c: Any) -> Triage | None:
    """The cluster's cause of an ended skein container (None: it ended by itself, or is not ended)."""
    msg = getattr(c, "exit_message", "") or ""
    if str(c.state) not in ("FAILED", "KILLED") or not msg:
        return None
    t = classify(diagnostics=msg)
    return t if t.cause in EVENT_CAUSES else None


def task_events(by_task: dict[str, list[Any]]) -> dict[str, list[str]]:
    """``{task: ["preempted by the scheduler (container_…_000007)", …]}``, oldest first, for tasks
    YARN took a container from."""
    out: dict[str, list[str]] = {}
    for task, cs in by_task.items():
        for c in cs:
            t = container_cause(c)
            if t is not None:
                out.setdefault(task, []).append(f"{t.words} ({c.yarn_container_id or c.id})")
    return out


def event_parts(events: dict[str, list[str]]) -> list[str]:
    """Diagnosis parts, ``worker:1: preempted by the scheduler (container_…); replaced 2x`` style:
    one per task."""
    parts = []
    for task, said in sorted(events.items()):
        more = f" (and {len(said) - 1} more)" if len(said) > 1 else ""
        parts.append(f"{task}: {said[-1]}{more}")
    return parts


def rm_events(rep: Any, events: dict[str, list[str]] | None) -> dict[str, list[str]]:
    """``events`` (the last snapshot's), plus what the ResourceManager's report of an ended app
    counts when the snapshot missed it: skein fails a sync job's app at once when a worker is
    preempted, before any follower saw the container end (``numNonAMContainerPreempted``, kept by
    the RM: rest.AppReport.preempted)."""
    out = dict(events or {})
    n = int(getattr(rep, "preempted", 0) or 0)
    if n and not any("preempted" in e for said in out.values() for e in said):
        q = getattr(rep, "queue", "")
        out["yarn"] = [f"{n} container{'s' * (n != 1)} preempted by the scheduler" + (f" (queue {q})" if q else "")]
    return out
