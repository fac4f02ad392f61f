"""Progress reporting to the KV at a bounded rate, and the final run summary.

Why bounded: a step can take 5 ms; one HTTP PUT per step would cost more than the step and flood the launcher. Each
training task publishes ``progress/<task>`` at most every ``interval`` seconds (and once more at the end, ``force``),
which the launcher turns into a progress line and the stall watchdog into "is anyone moving".
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from tfyarn.common.fsio import replace
from tfyarn.tasklib.context import SUMMARY_KEY, TOTAL_STEPS_KEY, progress_key
from tfyarn.tasklib.kv import KV, KVUnavailable, put_json
from tfyarn.train.history import TaskHistory, restart_number
from tfyarn.train.tracking import attach, with_run

log = logging.getLogger("tfyarn.train.progress")


#: Shortest window over which a rate is computed.
MIN_RATE_WINDOW_S = 0.25


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite: training diverged (``fail_on_nan_loss``)."""


class ProgressReporter:
    """Tracks one task's steps, loss and throughput; publishes ``progress/<task>`` at most every ``interval`` s.

    ``report`` is cheap when it does not publish (a clock read and a few additions), so call it every step.
    A KV that is briefly unreachable does not fail training (progress is advisory); it is logged once.
    """

    def __init__(
        self,
        kv: KV,
        task: str,
        interval: float = 1.0,
        log_every: float = 10.0,
        fail_on_nan_loss: bool = True,
        history: Any = None,
        attempt: int = 0,
        restart: int = 0,
        program: bool = False,
    ):
        self.kv, self.task, self.interval, self.log_every = kv, task, interval, log_every
        self.program = program  # the user's own program (entrypoint): what it never reported is not 0
        self.fail_on_nan_loss = fail_on_nan_loss
        self.history = history  # a tfyarn.train.history.TaskHistory: this task's own points
        self.attempt, self.restart = attempt, restart
        self.step = self.global_step = self.epoch = self.examples = 0
        self.first_loss: float | None = None
        self.last_loss: float | None = None
        self.last_metrics: dict[str, float] = {}  # a compiled Keras model's metrics, on the last step's batch
        self._last_pub = self._rate = self._step_rate = 0.0
        self._gs_rate: float | None = None  # global steps per second (the job's, as this task sees it)
        self._hist_step = -1
        self._kv_warned = False
        self.extra: dict[str, Any] = {}
        self._first_step_at: float | None = None
        self._last_step_at: float | None = None
        self.begin()

    @classmethod
    def for_task(cls, ctx: Any, program: bool = False) -> "ProgressReporter":
        """The reporter of a training task: ``fail_on_nan_loss`` from the spec, and the task's own progress history
        (:mod:`tfyarn.train.history`, next to the checkpoints; the chief's also feeds TensorBoard). ``program``: the
        task runs the user's own program (:meth:`snapshot`)."""

        history = TaskHistory.for_task(ctx)
        attach(ctx, history)  # tracking.mlflow: the chief's points also go to its MLflow run
        return cls(
            ctx.kv,
            ctx.task_id,
            fail_on_nan_loss=ctx.spec.fail_on_nan_loss,
            history=history,
            attempt=ctx.attempt,
            restart=restart_number(),
            program=program,
        )

    @property
    def reported(self) -> bool:
        """Has a step been reported (by tfyarn's loop, or the user's program through ``tfyarn.progress``)?"""
        return self._first_step_at is not None

    def begin(self) -> None:
        """Restart the clock (call right before the first step, so start-up is not counted in examples/s)."""
        self.start = self._win_t = self._win_gs_t = self._last_log = self._hist_t = time.monotonic()
        self._win_ex = self._win_steps = self._hist_ex = 0
        self._win_gs: int | None = None  # global step at the start of its rate window (and its time)
        self._hist_gs: int | None = None  # the history point's own window

    def report(
        self,
        step: int,
        epoch: int,
        loss: float | None = None,
        examples: int = 0,
        global_step: int | None = None,
        force: bool = False,
        metrics: dict[str, float] | None = None,
    ) -> None:
        self.step, self.epoch = step, epoch
        if metrics:
            self.last_metrics = metrics
        self.global_step = step if global_step is None else int(global_step)
        self.examples += examples
        self._win_ex += examples
        if loss is not None:
            self._note_loss(float(loss))
        now = time.monotonic()
        self._last_step_at = time.time()  # wall clock: the job's phase times (status, bench_yarn) compare hosts
        if self._first_step_at is None:
            self._first_step_at = self.extra["first_step_at"] = round(self._last_step_at, 3)
        self._win_steps += 1
        self._hist_ex += examples
        if self._win_gs is None:  # the window of the global step starts at a known global step
            self._win_gs, self._win_gs_t = self.global_step, now
        if self._hist_gs is None:
            self._hist_gs = self.global_step
        if force or now - self._last_pub >= self.interval:
            self._roll_rates(now)
            self._last_pub = now
            self.publish()
        if self.history is not None and (force or self.history.due(now)):
            self.history.add(self._history_point(now), now)
        if now - self._last_log >= self.log_every:
            self._last_log = now
            log.info(
                "%s step %d (global %d) epoch %d loss %s%s %.0f examples/s",
                self.task,
                self.step,
                self.global_step,
                self.epoch,
                _fmt(self.last_loss),
                fmt_metrics(self.last_metrics, sep=" "),
                self._rate,
            )

    def _note_loss(self, loss: float) -> None:
        """The step's loss: a NaN or infinite one fails the task (``fail_on_nan_loss``), after publishing where."""
        if self.fail_on_nan_loss and not math.isfinite(loss):
            self.publish()  # the position reached, for status
            raise NonFiniteLoss(
                f"{self.task}: loss is {loss} at step {self.step} (global step {self.global_step}, epoch "
                f"{self.epoch}; last finite loss {_fmt(self.last_loss)}): training diverged. Lower the learning rate "
                f"or look for NaN/inf in the data; fail_on_nan_loss: false trains on regardless"
            )
        if self.first_loss is None:
            self.first_loss = loss
        self.last_loss = loss

    def _roll_rates(self, now: float) -> None:
        """Close the rate windows that are long enough. A rate over a window shorter than MIN_RATE_WINDOW_S (the
        first step right after begin()) would be noise (millions of examples/s): the position is published, the
        rate kept until a real window has passed."""
        if now - self._win_t >= MIN_RATE_WINDOW_S:
            self._rate = self._win_ex / (now - self._win_t)
            self._step_rate = self._win_steps / (now - self._win_t)
            self._win_t, self._win_ex, self._win_steps = now, 0, 0
        if now - self._win_gs_t >= MIN_RATE_WINDOW_S:
            assert self._win_gs is not None  # set by report before any publish
            self._gs_rate = max(0, self.global_step - self._win_gs) / (now - self._win_gs_t)
            self._win_gs, self._win_gs_t = self.global_step, now

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def examples_per_sec(self) -> float:
        """Mean over the whole run (the windowed rate is what is published while running)."""
        e = self.elapsed
        return self.examples / e if e > 0 else 0.0

    def _history_point(self, now: float) -> dict[str, Any]:
        """A point of this task's own history; its rates are over the time since the previous point (none for the
        first one, whose window is the instant between begin() and step 1)."""
        point = {
            "task": self.task,
            "time": time.time(),
            "step": self.step,
            "global_step": self.global_step,
            "epoch": self.epoch,
            "loss": self.last_loss,
            "attempt": self.attempt,
            "restart": self.restart,
        }
        taken = self.extra.get("taken")
        if taken and taken.get("batches"):  # the user's program: what it took from train_dataset() by then
            point["batches_taken"] = taken["batches"]
        span = now - self._hist_t
        if self.history.points and span >= MIN_RATE_WINDOW_S:
            point["examples_per_sec"] = round(self._hist_ex / span, 1)
            point["global_steps_per_sec"] = round(max(0, self.global_step - (self._hist_gs or 0)) / span, 3)
        self._hist_t, self._hist_ex, self._hist_gs, self._hist_step = now, 0, self.global_step, self.step
        return point

    def snapshot(self) -> dict[str, Any]:
        """The ``progress/<task>`` record. ``global_steps_per_sec`` is how fast the job's global step moved over
        the last window as this task saw it: a single status read (``tfyarn status`` on YARN) has an ETA from it.
        A user's program that has reported no step has none of those: ``reported: false`` and what tfyarn knows
        itself (``extra``: the batches taken from ``train_dataset()``, the log heartbeat). A program that reports
        steps without examples has no examples/s of its own (``None``, not 0)."""
        tail = {"time": time.time(), "attempt": self.attempt, "restart": self.restart, **self.extra}
        if self.program and not self.reported:
            return {"reported": False, **tail}
        return {
            "step": self.step,
            "global_step": self.global_step,
            "epoch": self.epoch,
            "examples_per_sec": None if self.program and not self.examples else round(self._rate, 1),
            "steps_per_sec": round(self._step_rate, 3),
            "global_steps_per_sec": None if self._gs_rate is None else round(self._gs_rate, 3),
            "loss": self.last_loss,
            **({"metrics": self.last_metrics} if self.last_metrics else {}),
            **tail,
        }

    def publish(self) -> None:
        try:
            put_json(self.kv, progress_key(self.task), self.snapshot())
        except KVUnavailable as exc:
            if not self._kv_warned:
                log.warning("%s: cannot publish progress: %s", self.task, exc)
                self._kv_warned = True

    def final(self) -> dict[str, Any]:
        """Publish the final state (done=true) and return this task's figures for the summary."""
        self.extra["done"] = True
        if self._last_step_at is not None:
            self.extra["last_step_at"] = round(self._last_step_at, 3)
        self._rate = self.examples_per_sec
        self.publish()
        if self.history is not None:
            if self.history.points and self.step != self._hist_step:  # the steps since the last point
                self.history.add(self._history_point(time.monotonic()))
            self.history.close()
        return {
            "steps": self.step,
            "examples": self.examples,
            "examples_per_sec": round(self.examples_per_sec, 1),
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            "metrics": dict(self.last_metrics),
            "elapsed_s": round(self.elapsed, 3),
        }


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def fmt_metrics(metrics: dict[str, float] | None, sep: str = ", ") -> str:
    """``metrics`` for a log line after the loss: ``", accuracy 0.8125"`` (``""`` without any)."""
    return sep + " ".join(f"{name} {_fmt(value)}" for name, value in metrics.items()) if metrics else ""


def publish_total_steps(kv: KV, total: int) -> None:
    kv.put(TOTAL_STEPS_KEY, str(int(total)))


def wait_for_final_progress(ctx: Any, timeout: float, reporting_only: bool = False) -> dict[str, dict[str, Any]]:
    """Chief, before ``control/done``: every training task's progress, once each other one has published its final
    record (``done``), or after ``timeout`` (logged, naming the missing ones). ``reporting_only`` (the user's own
    program): wait only for the tasks that reported a step or took batches from ``train_dataset()`` (a
    ParameterServerStrategy worker does neither).

    Why wait: ``control/done`` lets the ps exit. A worker still starting (a re-run of a finished job: the chief
    restores the last checkpoint and is done at once) would then wait forever on a session to a ps that left.
    """
    others = [t for t in ctx.training_tasks if t != ctx.task_id]

    def worked(p: dict[str, Any]) -> bool:  # a step reported, or batches taken from train_dataset()
        return bool(p.get("step") or (p.get("taken") or {}).get("batches"))

    deadline = time.monotonic() + timeout
    while True:
        raw = {t: ctx.kv.get(progress_key(t)) for t in ctx.training_tasks}
        per_task = {t: json.loads(v) for t, v in raw.items() if v is not None}
        waited = [t for t in others if not reporting_only or worked(per_task.get(t, {}))]
        missing = [t for t in waited if not per_task.get(t, {}).get("done")]
        if not missing:
            return per_task
        if time.monotonic() >= deadline:
            log.warning(
                "summary written without the final figures of %s (timed out after %gs waiting for them)",
                ", ".join(missing),
                timeout,
            )
            return per_task
        time.sleep(0.1)


def skip_counts(per_task: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The summary's ``skipped_records``, ``skipped_by_task`` and ``skipped_at`` from the tasks' final progress records.

    ``skipped_records``: each damaged record once per epoch it was met in (by the task whose share held it), plus
    each damaged range of the files' framing once (indexing left those out of every plan, so no task meets them).
    ``skipped_at``: where (file and byte offset), the ranges first."""
    by_task = {t: int(p.get("skipped_records") or 0) for t, p in per_task.items()}
    damaged = max((int(p.get("damaged_count") or 0) for p in per_task.values()), default=0)
    ranges = max((list(p.get("damaged") or ()) for p in per_task.values()), key=len, default=[])
    records = [w for t in sorted(per_task) for w in per_task[t].get("skipped_at") or ()]
    return {
        "skipped_records": sum(by_task.values()) + damaged,
        "skipped_by_task": {t: n for t, n in by_task.items() if n},
        "skipped_at": list(dict.fromkeys(ranges + records))[:20],
    }


def run_summary(
    ctx: Any,
    *,
    global_step: int,
    total_steps: int | None,
    steps_per_worker: dict[str, Any] | None,
    examples_per_sec: float | None,
    first_loss: float | None,
    last_loss: float | None,
    train_s: float | None,
    metrics: dict[str, float] | None = None,
    last_checkpoint: str | None = None,
    resumed_from: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The run summary with the keys every mode writes (README, "The run summary"; ``metrics``: the chief's compiled
    metrics on its last batch, empty for a plain model), then the mode's ``extra`` keys:
    one builder, so a scheduler, ``tfyarn status`` and the end-of-run text read the same names whatever the mode."""
    spec = ctx.spec
    ckpt = spec.checkpoint.dir
    return {
        "mode": spec.mode,
        "sync": spec.sync,
        "epochs": spec.data.epochs,
        "global_step": global_step,
        "total_steps": total_steps,
        "steps_per_worker": steps_per_worker,
        "examples_per_sec": examples_per_sec,
        "first_loss": first_loss,
        "last_loss": last_loss,
        "metrics": dict(metrics or {}),
        "batch_size": spec.data.batch_size,
        "global_batch_size": spec.global_batch_size,
        "num_workers": ctx.num_data_workers,
        "train_s": train_s,
        "checkpoint_dir": ckpt or None,
        "last_checkpoint": last_checkpoint,
        "resumed_from": resumed_from,
        "app_id": ctx.app_id,
        "attempt": ctx.attempt,
        **extra,
    }


def loop_summary(ctx: Any, global_step: int, mine: dict[str, Any], t0: float, **extra: Any) -> dict[str, Any]:
    """The summary of a loop tfyarn did not plan (a ``@custom_train`` function, the user's own program): no planned
    total or per-worker steps, only what its reporter's :meth:`ProgressReporter.final` (``mine``) saw since ``t0``."""
    return run_summary(
        ctx,
        global_step=global_step,
        total_steps=None,
        steps_per_worker=None,
        examples_per_sec=mine["examples_per_sec"],
        first_loss=mine["first_loss"],
        last_loss=mine["last_loss"],
        train_s=mine["elapsed_s"],
        custom=True,
        elapsed_s=round(time.monotonic() - t0, 3),
        **extra,
    )


def write_summary(ctx: Any, summary: dict[str, Any]) -> str:
    """Write the summary JSON next to the checkpoints, else in the task's workdir (fsspec: temp name then rename), and
    put it in the KV ``summary``; returns its URL."""
    import fsspec

    summary = with_run(ctx, summary)  # tracking.mlflow: the run named in the summary, the summary logged
    ckpt = ctx.spec.checkpoint.dir
    url = ckpt.rstrip("/") + "/summary.json" if ckpt else str(Path(ctx.workdir) / "summary.json")
    fs, path = fsspec.core.url_to_fs(url)
    parent = path.rsplit("/", 1)[0]
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.summary.json.tmp-{ctx.attempt}" if parent else f".summary.json.tmp-{ctx.attempt}"
    with fs.open(tmp, "w") as f:
        f.write(json.dumps(summary, indent=1, sort_keys=True))
    replace(fs, tmp, path)  # a summary of an earlier run of this spec may be there (HDFS refuses a plain mv)
    ctx.kv.put(SUMMARY_KEY, json.dumps(summary, separators=(",", ":")))
    log.info("summary written to %s", url)
    return url
