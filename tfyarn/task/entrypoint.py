"""``entrypoint:``: the user's own training program runs on each chief and worker instead of tfyarn's loop.

The program gets what TF expects (``TF_CONFIG``, set by the runtime after rendezvous) and keeps everything else a
tfyarn job has: rendezvous, restarts and attempts, logs, status, exit codes, the run report, and the stall watchdog:

* ``tfyarn.progress(step=, loss=)`` publishes the task's progress (status, history, the watchdog); without any call
  the task's **log output** is its heartbeat (:class:`_LogHeartbeat`: prints, log records, growing stdout/stderr
  files count as progress), so a program that prints nothing and reports nothing for ``timeouts.stall`` is a stall.
* ``tfyarn.data.train_dataset()`` is this worker's equal-steps share (:mod:`tfyarn.data.tf_dataset`, bound here);
  the batches it hands over are counted (:class:`_Taken`), so a program that reports nothing still has a true run
  report: batches, examples and epochs taken from ``train_dataset()`` and how long it ran; what nobody reported
  (global step, loss) is ``None`` there — "not reported", never 0.
* the callback of ``tfyarn/keras.py``: a Keras ``fit`` reports its steps, loss and metrics through ``tfyarn.progress``
  (named so here: this module is read by warm_imports.code_uses_keras, which takes a dotted Keras name for Keras).
* When the chief's program returns, tfyarn writes the summary and sets ``control/done``. A worker whose program is
  still running then (a ParameterServerStrategy worker serving in ``server.join()``) is ended cleanly: exit 0.
* A program that raises fails its task with the exception's last traceback line as the diagnosis
  (``ValueError: ...``); ``sys.exit(n)`` with n ≠ 0 fails it too.

ps tasks run tfyarn's own parameter server (:func:`tfyarn.train.ps.serve`), which exits on ``control/done``.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from tfyarn.data.tf_dataset import bind, planned_batches, stage
from tfyarn.tasklib.context import DONE_KEY, TaskContext, progress_key
from tfyarn.train.helpers import index_cache
from tfyarn.train.model import resolve_ref
from tfyarn.train.progress import ProgressReporter, loop_summary, wait_for_final_progress, write_summary

log = logging.getLogger("tfyarn.entrypoint")

_REPORTER: Any = None  # this task's ProgressReporter, once the program runs
_HEARTBEAT: _LogHeartbeat | None = None


def program_reporter() -> Any:
    """The reporter ``tfyarn.progress`` publishes through inside a task, like tfyarn's own loops (a NaN loss fails
    the task when fail_on_nan_loss); None outside one (a no-op there). The program reports its own steps from its
    first call on, so the log heartbeat stops."""
    if _REPORTER is not None and _HEARTBEAT is not None:
        _HEARTBEAT.stop()
    return _REPORTER


class _Taken:
    """What this task's program took from ``train_dataset()``: each batch the feeder pipeline yields (its thread
    calls :meth:`add`). ``record`` is the very dict in the task's progress record (``taken``), updated in place."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {
            "batches": 0,
            "examples": 0,
            "epochs": 0,
            "seconds": None,
            "examples_per_sec": None,
        }
        self._epochs: set[int] = set()
        self._first: float | None = None

    def add(self, epoch: int, examples: int) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        self._epochs.add(epoch)
        r = self.record
        r["batches"] += 1
        r["examples"] += examples
        r["epochs"] = len(self._epochs)
        span = now - self._first
        r["seconds"] = round(span, 3)
        if span >= 0.25:  # the mean since the first batch (a shorter window is noise)
            r["examples_per_sec"] = round(r["examples"] / span, 1)


class _Tee:
    """sys.stdout/sys.stderr as the program sees them: every write counted (they may be pipes, whose size says
    nothing), then passed on."""

    def __init__(self, inner: Any, beat: Callable[[], None]):
        self._inner, self._beat = inner, beat

    def write(self, text: str) -> int:
        self._beat()
        return self._inner.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _LogTap(logging.Handler):
    """Counts the log records of the task (the program's logging and tfyarn's alike)."""

    def __init__(self, beat: Callable[[], None]):
        super().__init__(logging.NOTSET)
        self._beat = beat

    def emit(self, record: logging.LogRecord) -> None:
        self._beat()


class _LogHeartbeat(threading.Thread):
    """Until the program first calls ``tfyarn.progress``: each second with new log output — a write to sys.stdout
    or sys.stderr, a log record, or growth of the stdout/stderr files (TF's C++ logging on YARN) — counts as a step
    of ``progress/<task>`` (marked ``heartbeat: log``), so the watchdog sees a program that is working."""

    def __init__(self, ctx: TaskContext, interval: float = 1.0, taken: _Taken | None = None):
        super().__init__(name="tfyarn-log-heartbeat", daemon=True)
        self.ctx, self.interval, self.taken = ctx, interval, taken
        self.stopped = threading.Event()
        self.beats = self.writes = 0
        self.tap = _LogTap(self._wrote)

    def _wrote(self) -> None:
        self.writes += 1

    def install(self) -> None:
        sys.stdout = _Tee(sys.stdout, self._wrote)
        sys.stderr = _Tee(sys.stderr, self._wrote)
        logging.getLogger().addHandler(self.tap)
        self.start()

    @staticmethod
    def _size() -> int:
        total = 0
        for fd in (1, 2):
            with suppress(OSError):
                total += os.fstat(fd).st_size
        return total

    def _now(self) -> tuple[int, int, int]:
        return self._size(), self.writes, self.taken.record["batches"] if self.taken is not None else 0

    def run(self) -> None:
        last = self._now()
        while not self.stopped.wait(self.interval):
            now = self._now()
            if now != last:
                last, self.beats = now, self.beats + 1
                try:
                    if _REPORTER is not None:  # the program's record ("reported": false, its batches taken)
                        _REPORTER.extra["beat"] = self.beats
                        _REPORTER.publish()
                    else:
                        self.ctx.kv.put(
                            progress_key(self.ctx.task_id),
                            json.dumps({"beat": self.beats, "heartbeat": "log", "time": time.time()}),
                        )
                except Exception as exc:  # noqa: BLE001 - progress is advisory
                    log.debug("heartbeat not published: %s", exc)

    def stop(self) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            logging.getLogger().removeHandler(self.tap)


def _end_when_done(ctx: TaskContext, finish: Callable[[], None] | None, poll: float = 0.5) -> None:
    """A worker's program still running after ``control/done`` (a PSS worker serving) is ended: exit 0."""

    def watch() -> None:
        while ctx.kv.get(DONE_KEY) is None:
            time.sleep(poll)
        time.sleep(2 * poll)  # a program ending by itself right now does so
        log.info("%s: training is done (%s); ending this worker's program, still running", ctx.task_id, DONE_KEY)
        try:
            if finish is not None:
                finish()
        finally:
            logging.shutdown()
            os._exit(0)

    threading.Thread(target=watch, name="tfyarn-end-when-done", daemon=True).start()


def _program(ctx: TaskContext) -> tuple[str, Callable[[], Any]]:
    """(what runs, how): a script of ``code:`` as ``__main__`` with its arguments, or ``module:function``."""
    spec = ctx.spec
    target, args = spec.entrypoint_parts()
    code_dir = spec.code or None
    if code_dir and code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    if target.endswith(".py"):
        path = Path(target) if Path(target).is_absolute() else Path(code_dir or spec.base_dir or ".") / target
        if not path.is_file():
            raise FileNotFoundError(f"entrypoint: {path} not found (is it in code: {code_dir}?)")
        sys.argv = [str(path), *args]
        return str(path), lambda: runpy.run_path(str(path), run_name="__main__")

    fn = resolve_ref(target, code_dir)
    sys.argv = [target, *args]
    return target, fn


def run(ctx: TaskContext, finish: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run the program on this chief or worker (``finish``: what the runtime does after a task succeeded, for a
    worker ended at ``control/done``). The chief then writes the summary and sets ``control/done``."""
    global _REPORTER, _HEARTBEAT

    spec = ctx.spec
    cache = index_cache(spec) if spec.has_data else None
    taken = _Taken()
    stall = float(spec.timeouts.stall)
    if spec.mode == "ps":  # ParameterServerStrategy: the workers read (a dataset_fn per worker), the chief drives
        worker = ctx.index if ctx.role == "worker" else -1
        bind(spec.data, worker, max(1, spec.instances("worker")), cache, taken.add, wait_s=stall)
        if ctx.role == "worker" and spec.data.train:  # its share on local disk, for the dataset_fn's TF ops
            stage()
    else:
        bind(spec.data, ctx.data_rank, ctx.num_data_workers, cache, taken.add)
    _REPORTER = ProgressReporter.for_task(ctx, program=True)
    _REPORTER.extra["taken"] = taken.record
    _HEARTBEAT = _LogHeartbeat(ctx, taken=taken)
    _HEARTBEAT.install()
    if not ctx.is_chief:
        _end_when_done(ctx, finish)
    what, program = _program(ctx)
    log.info(
        "%s: running %s %s (TF_CONFIG set: %s)", ctx.task_id, what, " ".join(sys.argv[1:]), "TF_CONFIG" in os.environ
    )
    t0 = time.monotonic()
    try:
        program()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"{what} exited with code {exc.code}") from None
    finally:
        _HEARTBEAT.stop()
    _REPORTER.extra["program_s"] = round(time.monotonic() - t0, 3)
    mine = _REPORTER.final()
    log.info(
        "%s: %s returned after %.1fs (%s steps reported, %d batches taken from train_dataset())",
        ctx.task_id,
        what,
        time.monotonic() - t0,
        mine.get("steps") if _REPORTER.reported else "no",
        taken.record["batches"],
    )
    if ctx.is_chief:  # the summary and status see every reporting task's last step (MWMS workers end with it)
        per_task = wait_for_final_progress(ctx, min(spec.timeouts.shutdown, 30.0), reporting_only=True)
        summary = program_summary(
            # metrics: fit's compiled metrics on its last batch (tfyarn/keras.py's callback), or the program's own
            loop_summary(ctx, _REPORTER.global_step, mine, t0, entrypoint=spec.entrypoint, metrics=mine["metrics"]),
            ctx,
            per_task,
            chief_reported=_REPORTER.reported,
            planned=planned_batches(),
        )
        write_summary(ctx, summary)
        ctx.kv.put(DONE_KEY, "1")
    return mine


def program_summary(
    summary: dict[str, Any], ctx: Any, per_task: dict[str, dict[str, Any]], chief_reported: bool, planned: int | None
) -> dict[str, Any]:
    """The run summary of the user's program, true to what is known: each task's batches, examples and epochs
    taken from ``train_dataset()`` (``taken``, with ``planned_batches`` per worker) and how long its program ran
    (``program_s``); what no task reported (the global step, the loss, examples/s) is ``None``, never 0; the batch
    size and epochs only where the spec has a ``data:`` section. ``reported``: did any task call
    ``tfyarn.progress``."""
    has_data = ctx.spec.has_data
    reported = {t: p for t, p in per_task.items() if p.get("reported") is not False and p.get("step") is not None}
    taken = {t: dict(p["taken"]) for t, p in sorted(per_task.items()) if (p.get("taken") or {}).get("batches")}
    out = dict(summary)
    if not chief_reported:
        steps = [int(p.get("global_step") or p.get("step") or 0) for p in reported.values()]
        out["global_step"] = max(steps) if steps else None
        out["first_loss"] = out["last_loss"] = None
        out["train_s"] = None
    if not (chief_reported and (summary.get("examples_per_sec") or 0) > 0):
        rates = [r["examples_per_sec"] for r in taken.values() if r.get("examples_per_sec")]
        out["examples_per_sec"] = round(sum(rates), 1) if rates else None
        if rates:
            out["examples_from"] = "train_dataset()"  # what the tasks took, not what they reported
    out["steps_per_worker"] = {t: p.get("step") for t, p in sorted(reported.items())} or None
    out["reported"] = bool(reported) or chief_reported
    out["taken"] = taken
    out["planned_batches"] = planned
    out["program_s"] = {t: p["program_s"] for t, p in sorted(per_task.items()) if p.get("program_s") is not None}
    if not has_data:
        out["epochs"] = out["batch_size"] = out["global_batch_size"] = None
    return out
