"""The job's rules, written once for every backend: attempts, deadlines, allocation, the stall watch, progress.

A backend only starts apps, reads their status and KV, streams logs and kills; whatever *decides* about the job is
here, in pure calls (no thread of its own, a :class:`Verdict` value rather than an exception), applied by the runner
(:mod:`tfyarn.runner`) and by the in-app drivers (:mod:`tfyarn.runner.local_app`, :mod:`tfyarn.runner.yarn_app`).
One :class:`Supervisor` per job, across all its attempts::

    sup = Supervisor(spec, started=time.time(), timeout=None)   # timeout: the caller's, besides active_deadline
    sup.begin_attempt(kv, pids=None)   # a new stall watch over this attempt's KV (kv may come later: sup.watch(kv))
    verdict = sup.check(raw_status)    # Verdict(state, diagnosis, reason) | None: deadline, allocation, stall
    progress = sup.progress(kv)        # dict for AppStatus.progress (+ sup.summary, sup.history points)
    sup.end_attempt()
    if sup.next_attempt(state, diagnosis, stopped=False):   # FAILED/TIMED_OUT, attempts left, deadline not passed
        sup.backoff(stop_event)        # interruptible; False when stopped meanwhile
    diagnosis = sup.final_diagnosis(diagnosis)   # the earlier attempts' diagnoses folded in
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from tfyarn.contracts.progress import GlobalStepRate, attempt_totals, read_progress
from tfyarn.contracts.status import AppState, AppStatus
from tfyarn.report import ProgressHistory, checkpoint_step, checkpoint_url
from tfyarn.tasklib.watchdog import StallWatchdog
from tfyarn.spec import JobSpec
from tfyarn.contracts.triage import AttemptBudget

log = logging.getLogger(__name__)

#: Seconds between two stall checks (a KV read of every ``progress/*`` record).
STALL_CHECK_S = 1.0


@dataclass(frozen=True)
class Verdict:
    """The supervisor ends the job: the state it ends in, why (one line for the user), and which rule said so
    (``deadline`` | ``allocation`` | ``stall``): a backend may add what only it knows (YARN: the queue's state)."""

    state: AppState
    diagnosis: str
    reason: str


class Supervisor:
    """The rules of one job, across its attempts. ``spec`` None (a YARN app submitted elsewhere): :meth:`progress`
    only. ``started``: wall time the deadline counts from; ``timeout``: the caller's bound, besides
    ``timeouts.active_deadline``; ``history_path``: where progress points are appended (the run report's curves);
    ``ack_wait_s``: how long a stall's diagnosis waits for the tasks' stack dumps."""

    def __init__(
        self,
        spec: JobSpec | None,
        started: float | None = None,
        timeout: float | None = None,
        history_path: Path | None = None,
        clock: Callable[[], float] = time.time,
        ack_wait_s: float = 3.0,
    ):
        self.spec, self.timeout, self.clock, self.ack_wait_s = spec, timeout, clock, ack_wait_s
        self.started = clock() if started is None else started
        self.attempt = 0
        self.earlier: list[str] = []  # why each earlier attempt failed
        self.budget: AttemptBudget | None = None  # attempts counted apart: the job's own and the cluster's
        self.rate = GlobalStepRate()
        self.history = ProgressHistory(history_path)
        self.summary: dict[str, Any] | None = None
        self._watch: StallWatchdog | None = None
        self._stall_checked = 0.0
        self._pending_since: float | None = None
        self._last_step: int | None = None  # the global step last seen in this attempt's progress
        # per ended attempt: the step it reached, the one the next resumed at
        self.redone: list[dict[str, int]] = []
        self._ckpt_steps: dict[str, int | None] = {}

    @property
    def job(self) -> JobSpec:
        """The spec, for the rules that need one (a bare status read, which has none, applies none of them)."""
        assert self.spec is not None, "this job's spec is unknown: its rules cannot be applied"
        return self.spec

    # ------------------------------------------------------------------------------------------------- deadline
    def deadline(self) -> tuple[float, str] | None:
        """The earlier of ``timeouts.active_deadline`` and the caller's ``timeout`` (seconds from the start), with
        what set it; None without either."""
        t = self.job.timeouts
        asked = ((t.active_deadline, "timeouts.active_deadline"), (self.timeout, "the caller's timeout"))
        return min(((d, w) for d, w in asked if d is not None), default=None)

    def time_left(self) -> float | None:
        """Seconds until the deadline (may be negative); None without one."""
        d = self.deadline()
        return None if d is None else d[0] - (self.clock() - self.started)

    # ------------------------------------------------------------------------------------------------- attempts
    def begin_attempt(self, kv: Any = None, pids: Mapping[str, int] | None = None) -> None:
        """A new attempt starts: its own stall watch (over ``kv``, now or later through :meth:`watch`) and its own
        allocation clock. ``pids`` (local only): the watch signals those processes for stacks and inspects them."""
        self.end_attempt()
        self._pending_since = None
        if kv is not None:
            self.watch(kv, pids)

    def watch(self, kv: Any, pids: Mapping[str, int] | None = None) -> None:
        """Start this attempt's stall watch over ``kv`` if it has none yet (YARN: once the KV can be reached). Its
        clock starts at the first :meth:`check` that finds the tasks running: start-up (imports, rendezvous) gets
        ``timeouts.rendezvous + timeouts.stall`` before the first step must appear."""
        if self._watch is not None:
            return
        t = self.job.timeouts
        training = self.job.training_tasks
        if pids is not None:
            watched: Mapping[str, int | None] | list[str] = {n: pids.get(n) for n in training}
            every: Mapping[str, int | None] | list[str] = dict(pids)
        else:
            watched, every = list(training), self.job.tasks()
        self._watch = StallWatchdog(
            kv,
            watched,
            t.stall,
            all_tasks=every,
            signal_pids=pids is not None,
            startup_s=t.rendezvous + t.stall,
            clock=self.clock,
            ack_wait_s=self.ack_wait_s,
        )

    def task_restarted(self, task: str, pid: int | None) -> None:
        """A task was restarted in place (local): its new process is the one to signal and inspect."""
        if self._watch is not None:
            self._watch.update_pid(task, pid)

    def task_ended(self, task: str) -> None:
        """A task finished successfully: a process gone because it finished is not a suspect."""
        if self._watch is not None:
            self._watch.task_ended(task)

    def end_attempt(self) -> None:
        self._watch = None

    def next_attempt(self, state: AppState, diagnosis: str, stopped: bool = False, label: str = "") -> bool:
        """After an attempt ended in ``state``: does another one run? Only after FAILED or TIMED_OUT, with attempts
        left, not ``stopped`` (a kill, Ctrl-C) and before the deadline (counting the backoff). When it does, the
        attempt's diagnosis (prefixed with ``label``, e.g. the YARN application id) is kept for the final one."""
        retry = self.job.retry
        left = self.time_left()
        if self.budget is None:
            self.budget = AttemptBudget(retry.max_attempts, retry.cluster_faults)
        # an attempt the cluster ended (preempted, a lost node: contracts.triage) uses a budget of its own
        if (
            state not in (AppState.FAILED, AppState.TIMED_OUT)
            or stopped
            or (left is not None and left <= retry.backoff)
            or not self.budget.next(diagnosis, state.value)
        ):
            refused = self.budget.refused  # the user's code failed: contracts.triage.should_retry
            if refused is not None:
                log.error("attempt %d failed (%s): %s", self.attempt + 1, diagnosis, refused.reason)
            return False
        self.earlier.append(f"{label}: {diagnosis}" if label else diagnosis)
        self._count_redone()
        self.attempt += 1
        cause = self.budget.causes[-1]
        free = f" [{cause.words}: not counted in retry.max_attempts]" if cause and cause.free else ""
        log.warning(
            "attempt %d/%d failed (%s)%s; starting attempt %d from the latest checkpoint in %gs",
            self.attempt,
            retry.max_attempts,
            diagnosis,
            free,
            self.attempt + 1,
            retry.backoff,
        )
        return True

    def _checkpoint_step(self, name: str) -> int | None:
        """The global step of the committed checkpoint ``name`` (read once per name)."""
        if name not in self._ckpt_steps:
            self._ckpt_steps[name] = checkpoint_step(checkpoint_url(self.spec), name)
        return self._ckpt_steps[name]

    def _count_redone(self) -> None:
        """The attempt that just ended reached ``_last_step``; the next one resumes at the latest
        checkpoint's step: the steps in between are done again."""
        reached = self._last_step or 0
        resumes = 0
        url = checkpoint_url(self.spec)
        if url:
            try:
                from tfyarn.train.checkpoint import CheckpointStore  # noqa: PLC0415 - tfyarn.train loads numpy; status stays light

                latest = CheckpointStore(url).latest()
                resumes = int(latest.get("global_step") or 0) if latest else 0
            except Exception as exc:  # noqa: BLE001 - a summary figure must not stop the attempt
                log.debug("latest checkpoint of %s: %s", url, exc)
        self.redone.append(
            {
                "attempt": self.attempt,
                "reached": reached,
                "resumes_at": resumes,
                "lost_steps": max(0, reached - resumes),
            }
        )
        self._last_step = None

    def totals(self, summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every attempt's figures for the summary: how many, the wall time from the first one's
        start, the global steps done again (``lost_steps``, each attempt's steps past the checkpoint
        the next one resumed from). The last attempt's ``summary`` names the checkpoint it really
        resumed from: an ended attempt's tasks may still commit one after its end was seen (an AM
        killed: YARN stops its containers seconds later)."""
        s = summary or {}
        step = s.get("resumed_step")  # ps and allreduce say it; else its index entry while it is kept
        if not isinstance(step, int):
            step = self._checkpoint_step(str(s.get("resumed_from") or ""))
        return attempt_totals(self.attempt + 1, self.clock() - self.started, self.redone, step)

    def fold_totals(self, st: AppStatus) -> AppStatus:
        """``st`` (the last attempt's) counting every attempt: started at the first one's start, its
        summary with :meth:`totals` under ``attempts``. Unchanged after one attempt."""
        if not self.redone:
            return st
        st.started = min(st.started or self.started, self.started)
        if st.summary is not None:
            st.summary = {**st.summary, "attempts": self.totals(st.summary)}
        return st

    def backoff(self, stop: threading.Event | None = None) -> bool:
        """Wait ``retry.backoff`` before the next attempt; False when ``stop`` was set meanwhile (Ctrl-C, a kill)."""
        return not (stop or threading.Event()).wait(self.job.retry.backoff)

    def final_diagnosis(self, diagnosis: str) -> str:
        """``diagnosis`` with the earlier attempts' diagnoses after it (none: unchanged)."""
        refused = self.budget.refused if self.budget is not None else None
        if refused is not None and refused.reason not in diagnosis:
            diagnosis = f"{diagnosis}\n{refused.reason}".strip()
        if not self.earlier:
            return diagnosis
        notes = [
            f"{self.attempt + 1} attempts in {self.clock() - self.started:.0f}s in all",
            *([self.budget.note()] if self.budget is not None and self.budget.note() else []),
        ]
        return (diagnosis + "\nearlier attempts: " + "; ".join(self.earlier) + f" ({', '.join(notes)})").strip()

    # ------------------------------------------------------------------------------------------------- checks
    def check(self, raw: AppStatus | None = None) -> Verdict | None:
        """Should the job be ended now? The deadline, then the allocation timeout (``raw`` tasks — or, with none yet,
        the application itself — PENDING for ``timeouts.allocation``), then the stall watch (only while ``raw`` is
        RUNNING, at most every :data:`STALL_CHECK_S`): the first that says so wins. ``raw``: the backend's status
        of the attempt (None: only the deadline and the stall watch)."""
        now = self.clock()
        d = self.deadline()
        if d is not None and now - self.started > d[0]:
            return Verdict(
                AppState.TIMED_OUT, f"active deadline of {d[0]:g}s exceeded ({d[1]}); stopped every task", "deadline"
            )
        if raw is not None:
            v = self._allocation(raw, now)
            if v is not None:
                return v
        if (
            self._watch is not None
            and (raw is None or raw.state is AppState.RUNNING)
            and now - self._stall_checked >= STALL_CHECK_S
        ):
            self._stall_checked = now
            try:
                report = self._watch.poll(now)
            except Exception as exc:  # noqa: BLE001 - a KV going away (the app ending): its status says why
                log.debug("stall watch: %s", exc)
                return None
            if report is not None:
                return Verdict(AppState.TIMED_OUT, report.message, "stall")
        return None

    def _allocation(self, raw: AppStatus, now: float) -> Verdict | None:
        """What waits for a container: PENDING tasks, else the application itself while it is PENDING with none."""
        pending = [] if raw.state.is_terminal else [t.task for t in raw.tasks if t.state == "PENDING"]
        if not pending and raw.state is AppState.PENDING and not raw.tasks:
            pending = ["the application master"]
        if not pending:
            self._pending_since = None
            return None
        if self._pending_since is None:
            self._pending_since = now
        limit = self.job.timeouts.allocation
        if now - self._pending_since <= limit:
            return None
        return Verdict(
            AppState.TIMED_OUT,
            f"containers not allocated within {limit:g}s (timeouts.allocation): {', '.join(pending)} still pending",
            "allocation",
        )

    # ------------------------------------------------------------------------------------------------- progress
    def progress(self, kv: Any) -> dict[str, Any]:
        """The job's progress for ``AppStatus.progress`` from ``kv`` (a KV, or a dict of every KV item), with the
        side roles' (tensorboard URL, newest evaluation); records :attr:`history` points and the chief's
        :attr:`summary`."""
        training = self.spec.training_tasks if self.spec is not None else []
        out, summary, items = read_progress(kv, training, self.rate)
        self.history.record(items)
        if summary is not None:
            self.summary = summary | ({"attempts": self.totals(summary)} if self.redone else {})
        self.seen(out)
        return out

    def seen(self, progress: Mapping[str, Any]) -> None:
        """A status read's ``progress`` (a follower's, whose backend read it): the global step this attempt
        reached, which :meth:`next_attempt` counts as done again by the next one."""
        if isinstance(progress.get("global_step"), int):
            self._last_step = progress["global_step"]


def training_end_note(
    progress: Mapping[str, Any], summary: Mapping[str, Any] | None, checkpoint_url: str | None
) -> str:
    """``"; training had completed (global step N/N): ..."`` when the job's progress reached its planned total (or
    the chief wrote the summary), else ``""``: a job stopped from outside after training says so, and whether the
    final checkpoint and the summary were written, so the user knows whether to run it again."""
    gs, total = progress.get("global_step"), progress.get("total_steps")
    if summary:
        gs, total = summary.get("global_step", gs), summary.get("total_steps") or total
    if summary is None and not (total and gs is not None and gs >= total):
        return ""
    step = f"global step {gs}/{total}" if total else f"global step {gs}"
    if summary is not None:
        ckpt = summary.get("last_checkpoint")
        written = (
            f"the final checkpoint ({ckpt}) and the summary were written"
            if ckpt
            else "the summary was written" + ("" if checkpoint_url else " (no checkpoint.dir)")
        )
        return f"; training had completed ({step}): {written}"
    if not checkpoint_url:
        return f"; training had completed ({step}): the summary was not written (no checkpoint.dir)"
    try:
        from tfyarn.train.checkpoint import CheckpointStore  # noqa: PLC0415 - tfyarn.train loads numpy; status stays light

        latest = CheckpointStore(checkpoint_url).latest()
    except Exception as exc:  # noqa: BLE001 - a note on the diagnosis must not fail the caller
        return f"; training had completed ({step}): the summary was not written; {checkpoint_url}: {exc}"
    if latest is not None and total and int(latest.get("global_step", -1)) >= total:
        return (
            f"; training had completed ({step}): the final checkpoint ({latest['name']}) was written, the summary "
            f"was not"
        )
    had = f"the latest is {latest['name']}, global step {latest.get('global_step')}" if latest else "none was committed"
    return f"; training had completed ({step}): the final checkpoint was not written ({had}), nor the summary"
