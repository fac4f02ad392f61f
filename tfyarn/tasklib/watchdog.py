"""Stall watchdog and on-demand stack dumps: a distributed TF job that hangs silently (a worker blocked in a
collective on a frozen peer, a feeder thread dead, a chief stuck uploading) becomes a failed job with a diagnosis.

* In every task, :func:`install_stack_dumps`: ``faulthandler`` on ``SIGUSR1`` (C-level: works while the main thread
  is blocked in a TF op) and a thread answering KV requests (:data:`DUMP_REQUEST_KEY`: YARN has no pids to signal).
* In the supervisor, :class:`StallWatchdog`: when no training task's step advanced for ``stall_s``, it asks every
  task for its stacks and reports which stopped, which did not answer and which processes are stopped or dead.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping


from tfyarn.contracts.kv_keys import (
    DONE_KEY,
    DUMP_REQUEST_KEY,
    PROGRESS_PREFIX,
    STACKS_PREFIX,
    progress_key,
    stacks_ack_key,
)
from tfyarn.tasklib.kv import KV

log = logging.getLogger(__name__)

#: Signal the local launcher sends to ask a task for its stacks.
DUMP_SIGNAL = signal.SIGUSR1


# ----------------------------------------------------------------------------------------------------- in every task


def dump_stacks(reason: str, file=None) -> None:
    """Write every thread's Python stack to ``file`` (default stderr = the task's log), with a header saying why.
    faulthandler needs a file descriptor; without one (pytest's capture) the stacks are formatted and logged."""
    out = file if file is not None else sys.stderr
    header = f"==== tfyarn stack dump (pid {os.getpid()}): {reason} ===="
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is not None:
        out.write(header + "\n")
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)
        out.write("==== end of stack dump ====\n")
        out.flush()
        return
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = [header]
    for ident, frame in sys._current_frames().items():
        parts.append(f"Thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame)))
    log.warning("%s", "\n".join(parts))


class _DumpRequestWatcher(threading.Thread):
    """Polls :data:`DUMP_REQUEST_KEY`; dumps stacks and acknowledges once per new request id."""

    def __init__(self, kv: KV, task: str, poll_s: float):
        super().__init__(name="tfyarn-stack-dump", daemon=True)
        self.kv, self.task, self.poll_s = kv, task, poll_s
        self.stop_event = threading.Event()
        self.seen = self._current()  # a request older than this task is not for it

    def _current(self) -> str | None:
        try:
            return self.kv.get(DUMP_REQUEST_KEY)
        except Exception:  # noqa: BLE001 - KV briefly unreachable: treat as no request, retry next poll
            return None

    def run(self) -> None:
        while not self.stop_event.wait(self.poll_s):
            req = self._current()
            if req is None or req == self.seen:
                continue
            self.seen = req
            dump_stacks(f"requested through the KV (request {req}) for {self.task}")
            try:
                self.kv.put(stacks_ack_key(self.task), req)
            except Exception as exc:  # noqa: BLE001 - an ack is advisory
                log.warning("could not acknowledge stack dump request %s: %s", req, exc)


_installed: dict[str, _DumpRequestWatcher | None] = {}


def install_stack_dumps(kv: KV | None = None, task: str | None = None, poll_s: float = 1.0) -> None:
    """Make this process dump all Python stacks into its log on ``SIGUSR1`` and, given ``kv`` and ``task``, on a KV
    request. Idempotent (the runtime calls it for every task; trainers may call it again)."""
    if "signal" not in _installed and hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
            _installed["signal"] = None
        except (AttributeError, ValueError, OSError, RuntimeError) as exc:
            # stderr without a file descriptor (tests); the KV route still works.
            log.debug("faulthandler.register(SIGUSR1) unavailable: %s", exc)
    if kv is not None and task is not None and task not in _installed:
        w = _DumpRequestWatcher(kv, task, poll_s)
        w.start()
        _installed[task] = w


def uninstall_stack_dumps() -> None:
    """Stop the KV watcher threads and unregister the signal (tests, or a task process that is about to exit)."""
    for key, w in list(_installed.items()):
        if w is not None:
            w.stop_event.set()
            w.join(timeout=5)
        if key == "signal" and hasattr(signal, "SIGUSR1"):
            faulthandler.unregister(DUMP_SIGNAL)
        _installed.pop(key, None)


# ------------------------------------------------------------------------------------------------------ the watchdog


@dataclass
class TaskState:
    """What the watchdog knows about one task's progress."""

    task: str
    step: int | None = None  # last step seen (None: never reported)
    changed_at: float = 0.0  # when (watchdog clock) the step last changed
    pid: int | None = None
    finished: bool = False  # its final progress record says done


@dataclass
class StallReport:
    """Why the job is being failed: which tasks stopped, which did not answer, which processes are frozen/dead."""

    stalled_for: float
    tasks: dict[str, TaskState]
    stall_s: float
    now: float
    no_ack: list[str] = field(default_factory=list)  # tasks that did not answer the stack-dump request
    process_states: dict[str, str] = field(default_factory=dict)  # task → 'stopped' / 'dead' / 'running' ...
    dumps_requested: bool = False
    after_done: bool = False  # training finished, these tasks did not
    startup: bool = False  # no step yet: stall_s is the start-up allowance

    @property
    def stopped_tasks(self) -> list[str]:
        """Every task whose step has not advanced for the stall period (in a sync stall: all training tasks)."""
        return [t for t, s in self.tasks.items() if s.step is None or self.now - s.changed_at >= self.stall_s]

    @property
    def suspects(self) -> list[str]:
        """Tasks most likely at fault: stopped (frozen) processes; else processes that are gone or did not answer
        the dump request; else the laggards (lowest step). A blocked all-reduce leaves the healthy peers alive and
        answering, so they are not suspects."""
        stopped = [t for t, st in self.process_states.items() if st == "stopped"]
        if stopped:
            return stopped
        bad = [t for t, st in self.process_states.items() if st in ("dead", "zombie")]
        bad += [t for t in self.no_ack if t not in bad]
        if bad:
            return bad
        steps = {t: s.step for t, s in self.tasks.items()}
        if any(v is None for v in steps.values()):
            return [t for t, v in steps.items() if v is None]
        low = min(v for v in steps.values() if v is not None) if steps else None
        return [t for t, v in steps.items() if v == low] if len({*steps.values()}) > 1 else []

    @property
    def message(self) -> str:
        def one(t: str, s: TaskState) -> str:
            where = "never reported a step" if s.step is None else f"at step {s.step}"
            extra = []
            if t in self.process_states and self.process_states[t] != "running":
                extra.append(f"process {self.process_states[t]}")
            if t in self.no_ack:
                extra.append("did not answer the stack-dump request")
            return f"{t} {where}" + (f" ({', '.join(extra)})" if extra else "")

        stopped = "; ".join(one(t, self.tasks[t]) for t in self.stopped_tasks)
        if self.after_done:
            lines = [
                f"training finished (control/done) but these tasks neither finished nor advanced for "
                f"{self.stalled_for:.0f}s (timeouts.stall = {self.stall_s:g}s): {stopped}"
            ]
        elif self.tasks and all(s.finished for s in self.tasks.values()):
            # every step ran; what is left before control/done is the chief's final checkpoint, export and summary
            lines = [
                f"every training task ran all its steps, but the chief did not finish its final checkpoint, "
                f"export and summary within {self.stalled_for:.0f}s (timeouts.stall = {self.stall_s:g}s): "
                f"a large model on a slow filesystem needs a larger timeouts.stall, else see the chief's log"
            ]
        elif self.startup:
            lines = [
                f"training did not start: no task reported a first step within {self.stalled_for:.0f}s "
                f"(timeouts.rendezvous + timeouts.stall = {self.stall_s:g}s): {stopped}"
            ]
        else:
            lines = [
                f"training stalled: no task's step advanced for {self.stalled_for:.0f}s "
                f"(timeouts.stall = {self.stall_s:g}s); stopped advancing: {stopped}"
            ]
        if self.suspects:
            lines.append(f"likely cause: {', '.join(self.suspects)}")
        if self.dumps_requested:
            lines.append("Python stacks of every responsive task are in its log (look for 'tfyarn stack dump')")
        return ". ".join(lines)


def _progress(value: str | None) -> tuple[int | None, bool]:
    """(step, done) of a ``progress/<task>`` value; (None, False) if absent or unreadable (a bad record is not
    progress). The step is the task's own, else ``global_step``: in async ps mode the global step moves while a
    frozen worker's own step does not; else ``beat`` (a user's program that reports nothing: its log output and
    the batches it took, :mod:`tfyarn.task.entrypoint`)."""
    try:
        d = json.loads(value) if value is not None else None
    except ValueError:
        d = None
    if not isinstance(d, dict):
        return None, False
    step = next((int(d[k]) for k in ("step", "global_step", "beat") if isinstance(d.get(k), (int, float))), None)
    return step, d.get("done") is True


def process_state(pid: int) -> str:
    """'running', 'stopped', 'zombie' or 'dead'."""
    import psutil  # noqa: PLC0415 - lazy: the gateway's status path imports this module and must stay light

    try:
        st = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "dead"
    return {"stopped": "stopped", "tracing-stop": "stopped", "zombie": "zombie", "dead": "dead"}.get(st, "running")


class StallWatchdog:
    """Fail the job when global training progress stops for ``stall_s``.

    ``tasks``: the training tasks to watch, as a list or ``{task: pid}`` (local). ``all_tasks`` (``{task: pid or
    None}``, default ``tasks``): those asked for stack dumps (every task of the job: ps and evaluator stacks too). No
    step within ``startup_s`` of the first :meth:`check` is a stall too. It runs no thread: the supervisor
    (:class:`tfyarn.runner.supervisor.Supervisor`) calls :meth:`poll` from its loop.
    """

    def __init__(
        self,
        kv: KV,
        tasks: Iterable[str] | Mapping[str, int | None],
        stall_s: float,
        on_stall: Callable[[StallReport], None] | None = None,
        *,
        all_tasks: Mapping[str, int | None] | Iterable[str] | None = None,
        startup_s: float | None = None,
        ack_wait_s: float = 3.0,
        signal_pids: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        pids = dict(tasks) if isinstance(tasks, Mapping) else {t: None for t in tasks}
        if not pids:
            raise ValueError("StallWatchdog needs at least one training task to watch")
        self.kv, self.stall_s, self.on_stall = kv, float(stall_s), on_stall
        self.startup_s = float(startup_s if startup_s is not None else stall_s)
        self.ack_wait_s, self.signal_pids, self.clock = ack_wait_s, signal_pids, clock
        at = dict(all_tasks) if isinstance(all_tasks, Mapping) else {t: None for t in (all_tasks or [])}
        self.all_tasks: dict[str, int | None] = {**at, **{t: p for t, p in pids.items() if p or t not in at}}
        self.states = {t: TaskState(t, pid=p or self.all_tasks.get(t)) for t, p in pids.items()}
        self.started_at: float | None = None
        self.done_at: float | None = None  # when control/done was first seen
        self.last_progress: float | None = None
        self.report: StallReport | None = None

    def task_ended(self, task: str) -> None:
        """``task``'s process ended successfully (a chief that returned, a finished side task): not asked for stacks,
        not a suspect — a process that is gone because it finished is not a dead one."""
        self.all_tasks.pop(task, None)
        if task in self.states:
            self.states[task].pid = None

    def update_pid(self, task: str, pid: int | None) -> None:
        """A task was restarted in place: signal and inspect its new process from now on."""
        self.all_tasks[task] = pid
        if task in self.states:
            self.states[task].pid = pid

    # -- pure-ish decision logic ---------------------------------------------------------------------------------------
    def observe(self, progress: Mapping[str, str], now: float) -> None:
        """Fold one snapshot of ``progress/*`` values into the per-task state."""
        if self.started_at is None:
            self.started_at = now
        for t, st in self.states.items():
            step, done = _progress(progress.get(progress_key(t)))
            if step is not None and step != st.step:
                st.step, st.changed_at = step, now
                self.last_progress = now
            st.finished = st.finished or done

    def check(self, now: float | None = None) -> StallReport | None:
        """Read progress from the KV; a report (without dumps/callback) if training stalled, else None. Before
        ``control/done`` a stall is *global*: no training task's step advanced for ``stall_s`` (a paused async worker
        is not one while others advance). After it, a task that neither finished nor advanced for ``stall_s`` is (a
        frozen async worker would keep the job from ever ending)."""
        now = self.clock() if now is None else now
        done = self.kv.get(DONE_KEY) is not None
        self.observe(self.kv.items(PROGRESS_PREFIX), now)
        if done:
            if self.done_at is None:
                self.done_at = now
            # a task that never reported a step (hung in start-up: its session waits for a ps that left) counts
            # from when training finished
            since = {t: now - (s.changed_at if s.step is not None else self.done_at) for t, s in self.states.items()}
            stuck = {t: s for t, s in self.states.items() if not s.finished and since[t] >= self.stall_s}
            if not stuck:
                return None
            return StallReport(
                stalled_for=min(since[t] for t in stuck), tasks=stuck, stall_s=self.stall_s, now=now, after_done=True
            )
        startup = self.last_progress is None  # no step yet: the start-up allowance counts from the first check
        origin = self.started_at if self.last_progress is None else self.last_progress
        assert origin is not None  # observe() above set started_at
        stalled_for = now - origin
        limit = self.startup_s if startup else self.stall_s
        if stalled_for < limit:
            return None
        return StallReport(stalled_for=stalled_for, tasks=dict(self.states), stall_s=limit, now=now, startup=startup)

    # -- side effects on a stall ------------------------------------------------------------------------------------
    def request_dumps(self) -> str:
        """Ask every task for its stacks: KV request (all backends) + SIGUSR1 to known pids (local). Returns the id."""
        req = f"{time.time():.3f}"
        try:
            self.kv.put(DUMP_REQUEST_KEY, req)
        except Exception as exc:  # noqa: BLE001 - the stall is reported anyway
            log.warning("could not post the stack-dump request to the KV: %s", exc)
        if self.signal_pids:
            for t, pid in self.all_tasks.items():
                if pid:
                    try:
                        os.kill(pid, DUMP_SIGNAL)
                    except (ProcessLookupError, PermissionError) as exc:
                        log.info("SIGUSR1 to %s (pid %s) failed: %s", t, pid, exc)
        return req

    def diagnose(self, report: StallReport) -> StallReport:
        """Request dumps, note who did not answer within ``ack_wait_s`` and which processes are stopped or dead;
        fills ``report`` in place."""
        req = self.request_dumps()
        report.dumps_requested = True
        deadline = time.monotonic() + self.ack_wait_s
        while True:
            acks = self.kv.items(STACKS_PREFIX)
            report.no_ack = [t for t in self.all_tasks if acks.get(stacks_ack_key(t)) != req]
            if not report.no_ack or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        for t, pid in self.all_tasks.items():
            if pid:
                report.process_states[t] = process_state(pid)
        return report

    def poll(self, now: float | None = None) -> StallReport | None:
        """One full round: check, and on a stall diagnose and call ``on_stall`` (once). Returns the report."""
        if self.report is not None:
            return self.report
        report = self.check(now)
        if report is None:
            return None
        self.report = self.diagnose(report)
        log.error("%s", self.report.message)
        if self.on_stall is not None:
            self.on_stall(self.report)
        return self.report
