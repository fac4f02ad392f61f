"""A training task's own progress history, kept next to the checkpoints, and the chief's TensorBoard scalars.

Why the task records it: a follower only samples ``progress/<task>`` (a short YARN job's report had one point per
task, a job nobody followed had none). Points come at a rate adapted to the run's length (~100 per e-fold of run
time), go to a local file, and the whole file is uploaded (temporary name, rename: HDFS has no reliable append) from
a background thread, so the training loop never waits on the filesystem. Layout (read by
:func:`tfyarn.report.load_task_history`), one file per process, so a restart is a new segment::

    <checkpoint dir>/history/<app id>/<task>.a<attempt>.<start ms>.jsonl

The chief also writes its points as TensorBoard scalars (run ``train``), uploaded with the history.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from tfyarn.train.events import EventWriter, fs_path, upload_file
from tfyarn.train.tracking import POINT_METRICS

log = logging.getLogger("tfyarn.train.history")

TASK_HISTORY_DIR = "history"  # under the checkpoint dir; tfyarn.report reads it too

#: Shortest time between two points (also the shortest window a point's rate is computed over).
MIN_INTERVAL_S = 0.25
#: Points per e-fold of elapsed time once the interval grows past the minimum (interval = elapsed / this).
POINTS_PER_E = 100.0
#: Seconds between two uploads of the history (and the chief's event file) while training: a quarter of the time
#: trained so far, within these bounds — a process killed early (kill -9, OOM) has left its first points behind.
MIN_UPLOAD_S, MAX_UPLOAD_S = 1.0, 15.0
#: Bound on the final upload at the end of the task (the task is exiting; a hung filesystem must not hold it).
CLOSE_TIMEOUT_S = 30.0

_open: set["TaskHistory"] = set()
_open_lock = threading.Lock()


class TaskHistory:
    """Points of one task process: :meth:`due` / :meth:`add` from the training loop (cheap), uploads elsewhere."""

    def __init__(self, url: str | None, app_id: str, task: str, attempt: int, local_dir: Path, events: bool = False):
        self.task, self.attempt = task, attempt
        self.start = time.monotonic()
        self.name = f"{task.replace(':', '-')}.a{attempt}.{int(time.time() * 1000)}.jsonl"
        self.local = Path(local_dir) / self.name
        self.local.parent.mkdir(parents=True, exist_ok=True)
        self.local.write_text("")
        self.fs, self.remote = fs_path(url, f"{TASK_HISTORY_DIR}/{app_id}/{self.name}")
        self.events = EventWriter(url, "train", Path(local_dir) / "events") if events else None
        self.points = 0
        self.sink: Any = None  # also gets each batch of points (tfyarn.train.tracking: MLflow)
        self._next = 0.0  # monotonic time the next point is due
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._uploaded_size = -1
        self._warned = False
        self._thread: threading.Thread | None = None
        with _open_lock:
            _open.add(self)

    @classmethod
    def for_task(cls, ctx: Any) -> "TaskHistory":
        """The history of this task process; uploaded next to the checkpoints when the spec has a checkpoint dir.
        The chief also writes the ``train`` TensorBoard run."""
        url = ctx.spec.checkpoint.dir or None
        return cls(
            url, ctx.app_id, ctx.task_id, ctx.attempt, Path(ctx.workdir) / "history", events=bool(ctx.is_chief and url)
        )

    def due(self, now: float) -> bool:
        return now >= self._next and not self._closed

    def add(self, point: dict[str, Any], now: float | None = None) -> None:
        """Queue one point (``time`` = wall clock, plus the progress fields); the next one is due after the
        adaptive interval. The file and the event scalars are written by the upload thread."""
        now = time.monotonic() if now is None else now
        self._next = now + max(MIN_INTERVAL_S, (now - self.start) / POINTS_PER_E)
        with self._lock:
            if self._closed:
                return
            self._pending.append(point)
        self.points += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"tfyarn-history-{self.task}", daemon=True)
            self._thread.start()

    def _write_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        with self.local.open("a") as f:
            f.writelines(json.dumps(p, separators=(",", ":")) + "\n" for p in pending)
        if self.sink is not None:
            self.sink(pending)
        if self.events is not None:
            for p in pending:
                values = {k: p.get(k) for k in POINT_METRICS}
                self.events.scalars(int(p.get("global_step") or p.get("step") or 0), values, p.get("time"))

    def flush(self) -> None:
        """Write what is queued and upload the file (and the chief's event file) when it changed."""
        self._write_pending()
        if self.fs is None:  # (no checkpoint dir: nowhere to upload)
            return
        size = self.local.stat().st_size
        if size != self._uploaded_size:
            upload_file(self.fs, self.local, self.remote)
            self._uploaded_size = size
        if self.events is not None:
            self.events.sync()

    def _run(self) -> None:
        while not self._closed:
            elapsed = time.monotonic() - self.start
            self._wake.wait(min(MAX_UPLOAD_S, max(MIN_UPLOAD_S, elapsed / 4)))
            if self._closed:
                break
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - history is advisory: training goes on without it
                if not self._warned:
                    log.warning("%s: could not upload the progress history to %s: %s", self.task, self.remote, exc)
                    self._warned = True

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the upload thread and upload the last points (bounded by ``timeout``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        with _open_lock:
            _open.discard(self)
        if self._thread is not None:
            self._thread.join(timeout)

        def final() -> None:
            try:
                self.flush()
                if self.events is not None:
                    self.events.close()
            except Exception as exc:  # noqa: BLE001 - see _run
                log.warning("%s: could not upload the progress history to %s: %s", self.task, self.remote, exc)

        last = threading.Thread(target=final, name=f"tfyarn-history-close-{self.task}", daemon=True)
        last.start()
        last.join(timeout)
        if last.is_alive():
            log.warning(
                "%s: the last upload of the progress history to %s did not finish within %gs; left behind",
                self.task,
                self.remote,
                timeout,
            )


@atexit.register
def close_all() -> None:
    """A task that fails (or returns without ``ProgressReporter.final``) still uploads its points: they show how far
    it got. Runs at exit in spawned and forked tasks alike (the fork server runs atexit functions)."""
    with _open_lock:
        histories = list(_open)
    for h in histories:
        h.close(timeout=10.0)


def restart_number() -> int:
    """The in-place restart of this task process (``TFYARN_RESTART``, 0 when not restarted or unknown)."""
    try:
        return int(os.environ.get("TFYARN_RESTART", "0") or 0)
    except ValueError:
        return 0
