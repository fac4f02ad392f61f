"""``entrypoint:``: the user's own training program runs on each chief and worker instead of tfyarn's loop.

The program gets what TF expects (``TF_CONFIG``, set by the runtime after rendezvous) and keeps everything else a
tfyarn job has: rendezvous, restarts and attempts, logs, status, exit codes, the run report, and the stall watchdog:

* ``tfyarn.progress(step=, loss=)`` publishes the task's progress (status, history, the watchdog); without any call
  the task's **log output** is its heartbeat (:class:`_LogHeartbeat`: prints, log records, growing stdout/stderr
  files count as progress), so a program that prints nothing and reports nothing for ``timeouts.stall`` is a stall.
* ``tfyarn.data.train_dataset()`` is this worker's equal-steps share (:mod:`tfyarn.data.tf_dataset`, bound here).
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
from pathlib import Path
from typing import Any

from tfyarn.tasklib.context import DONE_KEY, TaskContext, progress_key

log = logging.getLogger("tfyarn.entrypoint")

_REPORTER: Any = None  # this task's ProgressReporter, once the program runs
_HEARTBEAT: _LogHeartbeat | None = None


def report_progress(
    step: int, loss: float | None = None, examples: int = 0, epoch: int = 0, global_step: int | None = None
) -> None:
    """What ``tfyarn.progress`` does inside a task (outside one it is a no-op): the first call stops the log
    heartbeat, every call publishes like tfyarn's own loops (a NaN loss fails the task when fail_on_nan_loss)."""
    if _REPORTER is None:
        return
    if _HEARTBEAT is not None:
        _HEARTBEAT.stop()
    _REPORTER.report(step=int(step), epoch=int(epoch), loss=loss, examples=int(examples), global_step=global_step)


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

    def __init__(self, ctx: TaskContext, interval: float = 1.0):
        super().__init__(name="tfyarn-log-heartbeat", daemon=True)
        self.ctx, self.interval = ctx, interval
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
            try:
                total += os.fstat(fd).st_size
            except OSError:
                pass
        return total

    def run(self) -> None:
        last = (self._size(), self.writes)
        while not self.stopped.wait(self.interval):
            now = (self._size(), self.writes)
            if now != last:
                last, self.beats = now, self.beats + 1
                try:
                    self.ctx.kv.put(
                        progress_key(self.ctx.task_id),
                        json.dumps({"step": self.beats, "heartbeat": "log", "time": time.time()}),
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
    from tfyarn.train.model import resolve_ref

    fn = resolve_ref(target, code_dir)
    sys.argv = [target, *args]
    return target, fn


def run(ctx: TaskContext, finish: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run the program on this chief or worker (``finish``: what the runtime does after a task succeeded, for a
    worker ended at ``control/done``). The chief then writes the summary and sets ``control/done``."""
    global _REPORTER, _HEARTBEAT
    from tfyarn.data.tf_dataset import bind
    from tfyarn.train.helpers import index_cache
    from tfyarn.train.progress import ProgressReporter, loop_summary, wait_for_final_progress, write_summary

    spec = ctx.spec
    cache = index_cache(spec) if spec.has_data else None
    if spec.mode == "ps":  # ParameterServerStrategy: the workers read (a dataset_fn per worker), the chief drives
        bind(spec.data, ctx.index if ctx.role == "worker" else -1, max(1, spec.instances("worker")), cache)
    else:
        bind(spec.data, ctx.data_rank, ctx.num_data_workers, cache)
    _REPORTER = ProgressReporter.for_task(ctx)
    _HEARTBEAT = _LogHeartbeat(ctx)
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
    mine = _REPORTER.final()
    log.info(
        "%s: %s returned after %.1fs (%d steps reported)",
        ctx.task_id,
        what,
        time.monotonic() - t0,
        mine.get("steps") or 0,
    )
    if ctx.is_chief:  # the summary and status see every reporting task's last step (MWMS workers end with it)
        wait_for_final_progress(ctx, min(spec.timeouts.shutdown, 30.0), reporting_only=True)
        summary = loop_summary(ctx, _REPORTER.global_step, mine, t0, entrypoint=spec.entrypoint)
        write_summary(ctx, summary)
        ctx.kv.put(DONE_KEY, "1")
    return mine
