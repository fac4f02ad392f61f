"""The chief's and workers' step loop in ps mode: aligned start, rejoin after a restart, fed steps to the global step
target, the chief's wait for every worker's share, final checkpoint and summary, then ``control/done``."""

from __future__ import annotations

import json
import functools
import logging
import threading
import time
from typing import Any

from tfyarn.contracts.kv_keys import REJOIN_PREFIX, rejoin_key
from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.context import ABORT_KEY, DONE_KEY, STEPS_ALIGNED_KEY
from tfyarn.tasklib.kv import put_json
from tfyarn.train import helpers
from tfyarn.train.export import export_at_end
from tfyarn.train.history import restart_number
from tfyarn.train.inputs import feed_values
from tfyarn.train.progress import (
    ProgressReporter,
    fmt_metrics,
    publish_total_steps,
    run_summary,
    skip_counts,
    wait_for_final_progress,
    write_summary,
)
from tfyarn.train.ps.checkpointer import Checkpointer
from tfyarn.train.ps.graph import TrainGraph, build_graph
from tfyarn.train.ps.server import start_server
from tfyarn.train.ps.session import open_session
from tfyarn.train.stop_notice import StopNotice, chief_notice

log = logging.getLogger("tfyarn.train.ps")


class _Aggregator(threading.Thread):
    """Chief only, sync mode: runs the aggregate op round after round until the global step target."""

    def __init__(self, sess: Any, tg: TrainGraph, target: int, start_step: int):
        super().__init__(name="tfyarn-sync-aggregator", daemon=True)
        self.sess, self.tg, self.target, self.gs = sess, tg, target, start_step
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            sync = self.tg.sync
            assert sync is not None  # the chief starts this thread in sync mode only
            while self.gs < self.target:
                self.sess.run(sync.aggregate)
                self.gs += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the main loop
            self.error = exc
            log.error("sync aggregator failed at global step %d: %s", self.gs, exc)


def train(ctx: Any, model: Any) -> dict[str, Any] | None:
    """A chief or worker task in ps mode. Returns the summary on the chief, this task's figures otherwise."""
    import tensorflow as tf

    spec = ctx.spec
    t_start = time.monotonic()
    with helpers.train_pipeline(ctx) as feeder:
        steps = helpers.epoch_steps(feeder, spec.data.epochs)
        per_worker = sum(steps)
        target = per_worker if spec.sync else per_worker * ctx.num_data_workers
        if ctx.is_chief:
            publish_total_steps(ctx.kv, target)
        log.info(
            "%s: ps mode, %s, %d epochs x %s steps per worker, global step target %d, batch %d per worker (global %d)",
            ctx.task_id,
            "sync" if spec.sync else "async",
            spec.data.epochs,
            steps,
            target,
            spec.data.batch_size,
            spec.global_batch_size,
        )
        server = start_server(ctx)
        tg = build_graph(ctx, model)
        if ctx.is_chief:
            log.info("variable placement (ps index): %s", tg.placement)
        ckpt = Checkpointer(ctx, tg, steps) if ctx.is_chief else None
        # Saver.save/restore refuse to run while TF2's eager mode is current: stay in the training graph
        with tg.graph.as_default():
            try:
                restore = ckpt.restore_prefix() if ckpt else None
                warm = ckpt.warm_start_fn() if ckpt and restore is None else None
                sess = open_session(ctx, tg, server, restore, warm)
                if sess is None:
                    log.warning("%s: training already finished (%s is set); nothing to rejoin", ctx.task_id, DONE_KEY)
                    return {"steps": 0, "already_finished": True}
                try:
                    return _run(ctx, tg, sess, feeder, steps, target, ckpt, t_start)
                finally:
                    sess.close()
            except tf.errors.UnavailableError:
                if ctx.is_chief or ctx.kv.get(DONE_KEY) is None:
                    raise
                # The ps left because training finished while this worker was starting: a re-run of a finished job
                # (the chief restores the final checkpoint and is done at once) or a restart at the very end. The
                # chief sets done only once every worker's counter is complete, so nothing is left for this one.
                log.warning(
                    "%s: training finished while this worker was starting (%s is set, the ps have exited); "
                    "nothing left to run",
                    ctx.task_id,
                    DONE_KEY,
                )
                return {"steps": 0, "already_finished": True}


def _wait_for_aligned_steps(ctx: Any, poll: float = 0.05) -> None:
    """A worker's first step waits for the chief's ``control/steps_aligned``: the async resume alignment (global step
    := sum of the worker counters) reads and writes the global step, and a worker step in between would be lost from
    the count. Bounded by ``timeouts.rendezvous``; a job already done needs no wait (the loop then finds nothing)."""
    deadline = time.monotonic() + ctx.spec.timeouts.rendezvous
    while ctx.kv.get(STEPS_ALIGNED_KEY) is None and ctx.kv.get(DONE_KEY) is None:
        if ctx.kv.get(ABORT_KEY) is not None:
            raise RuntimeError(
                f"{ctx.task_id}: job aborted while waiting for the chief to start: {ctx.kv.get(ABORT_KEY)}"
            )
        if time.monotonic() > deadline:
            raise WaitTimeout(
                f"{ctx.task_id}: timed out after {ctx.spec.timeouts.rendezvous:g}s waiting for the "
                f"chief to start its training loop ({STEPS_ALIGNED_KEY})"
            )
        time.sleep(poll)


def _rejoin(ctx: Any, tg: TrainGraph, sess: Any, steps: list[int]) -> int:
    """Before the first step: what did this worker's previous process leave in flight? Returns the lost steps.

    started > counted on the ps = a step began and was never counted (the process died in it): the restarted worker
    resumes at its counter, i.e. runs that step again, and reports the loss (log, and ``rejoin/<task>/<restart>``
    for the summary). Then started := counted. A fresh attempt only resets: a checkpoint can catch a live step
    between the two counters, which is not a loss of this attempt.

    Sync mode refuses: a dead process may have pushed gradients for a round that completes only after the restarted
    one read the global step, so it would push a second gradient into that round or wait for a token it drained —
    extra steps or a deadlock. The spec forbids worker restarts in sync ps mode; ``retry.max_attempts`` restarts the
    whole job from its checkpoint instead.
    """
    restart = restart_number()
    if restart and ctx.spec.sync:
        raise RuntimeError(
            f"{ctx.task_id}: a restarted worker cannot rejoin a sync (lockstep) ps job; "
            f"use retry.max_attempts (a job attempt from the latest checkpoint)"
        )
    started, counted = (int(x[ctx.data_rank]) for x in sess.run([tg.worker_started, tg.worker_steps]))
    sess.run(tg.reset_started)
    if not restart:
        return 0
    lost = max(0, started - counted)
    epoch, step = helpers.position(counted, steps)
    record = {
        "restart": restart,
        "resume_at": counted,
        "epoch": epoch,
        "step": step,
        "lost_steps": lost,
        "lost_records": lost * ctx.spec.data.batch_size,
    }
    if lost:
        log.warning(
            "%s: restart %d rejoins; its previous process died with %d step(s) in flight (epoch %d step %d, "
            "%d records): that run is lost, the step runs again from the worker's counter %d",
            ctx.task_id,
            restart,
            lost,
            epoch,
            step,
            record["lost_records"],
            counted,
        )
    else:
        log.warning(
            "%s: restart %d rejoins at epoch %d step %d (counter %d); no step was in flight",
            ctx.task_id,
            restart,
            epoch,
            step,
            counted,
        )
    put_json(ctx.kv, rejoin_key(ctx.task_id, restart), record)
    return lost


def _rejoins(kv: Any, tasks: list[str]) -> dict[str, Any]:
    """Summary fields from the ``rejoin/`` keys: per training task, restarts rejoined and steps/records lost."""
    out: dict[str, Any] = {field: dict.fromkeys(tasks, 0) for field in ("rejoins", "lost_steps", "lost_records")}
    for key, raw in kv.items(REJOIN_PREFIX).items():
        task, rec = key.split("/")[1], json.loads(raw)
        for field, n in (("rejoins", 1), ("lost_steps", rec["lost_steps"]), ("lost_records", rec["lost_records"])):
            out[field][task] = out[field].get(task, 0) + int(n)
    return out


def _run(
    ctx: Any,
    tg: TrainGraph,
    sess: Any,
    feeder: Any,
    steps: list[int],
    target: int,
    ckpt: Checkpointer | None,
    t_start: float,
) -> dict[str, Any] | None:
    spec = ctx.spec
    lost, gs0, ws0, done = _start_position(ctx, tg, sess, steps, ckpt)
    epoch, start = helpers.position(done, steps)
    names = list(tg.placeholders)
    fetches = [tg.train_op, tg.loss, *tg.metrics.values()]  # the compiled metrics ride on the step's own run
    step_fn = sess.make_callable(fetches, feed_list=[p for n in names for p in tg.feeds[n]])
    aggregator = _Aggregator(sess, tg, target, gs0) if spec.sync and ctx.is_chief else None
    if aggregator is not None:
        aggregator.start()
    progress = ProgressReporter.for_task(ctx)
    local, gs = done, gs0
    label = spec.data.label
    progress.begin()
    t_first = None
    notice = chief_notice(ctx, ckpt is not None and ckpt.uploads is not None)  # SIGTERM: save now
    for e, batch in feeder.run(epoch, start):
        try:
            gs, loss, *values = step_fn(*feed_values(batch, names, tg.feeds))
        except Exception:
            if notice is not None and notice.pending and ckpt is not None:  # its peers were stopped too:
                notice.save_and_exit(functools.partial(ckpt.save, sess, final=True), gs)  # the stop ends it
            raise
        gs = int(gs)
        local += 1
        if t_first is None:
            t_first = time.monotonic()
            log.info("%s: first step %.2fs after start, loss %.4f", ctx.task_id, t_first - t_start, loss)
        if spec.sync and gs != local:
            raise RuntimeError(f"{ctx.task_id}: sync lockstep broken: local step {local} but global step {gs}")
        progress.report(
            step=local,
            epoch=e,
            loss=loss,
            global_step=gs,
            examples=len(batch[label]) if label else spec.data.batch_size,
            metrics=dict(zip(tg.metrics, map(float, values))) if values else None,
        )
        _after_step(sess, ckpt, notice, aggregator, gs)
        if spec.sync and gs >= target:
            break
    progress.extra.update(feeder.skip_report())  # skipped records and damaged ranges, with file and offset
    mine = _task_figures(ctx, progress, ws0, lost, gs)
    if not ctx.is_chief:
        return mine
    if aggregator is not None:
        aggregator.join(timeout=spec.timeouts.step)
        if aggregator.is_alive():
            raise WaitTimeout(f"sync aggregator still running {spec.timeouts.step:g}s after the last step")
    worker_steps = _wait_for_workers(ctx, tg, sess, steps, ckpt, notice)
    return _finish(ctx, tg, sess, ckpt, mine, worker_steps, target, t_start)


def _start_position(
    ctx: Any, tg: TrainGraph, sess: Any, steps: list[int], ckpt: Checkpointer | None
) -> tuple[int, int, Any, int]:
    """Where this task starts: the chief aligns the step counters (sync, or a resumed checkpoint) and the workers wait
    for it; a restarted worker rejoins. (steps lost in flight, global step, every worker's steps, this task's)."""
    spec = ctx.spec
    if ctx.is_chief:
        if spec.sync or (ckpt is not None and ckpt.resumed_from):
            sess.run(tg.align_steps)
        ctx.kv.put(STEPS_ALIGNED_KEY, "1")
    else:
        _wait_for_aligned_steps(ctx)
    lost = _rejoin(ctx, tg, sess, steps)
    gs0, ws0 = sess.run([tg.global_step, tg.worker_steps])
    gs0 = int(gs0)
    if spec.sync:
        ws0 = [gs0] * ctx.num_data_workers
    done = gs0 if spec.sync else int(ws0[ctx.data_rank])
    if done:
        epoch, start = helpers.position(done, steps)
        log.info("%s: resuming at epoch %d step %d (global step %d)", ctx.task_id, epoch, start, gs0)
    if ckpt:
        ckpt.last_step = gs0
    return lost, gs0, ws0, done


def _after_step(
    sess: Any, ckpt: Checkpointer | None, notice: StopNotice | None, aggregator: "_Aggregator | None", gs: int
) -> None:
    """What may follow a step: a failed sync aggregation fails the task, a stop notice saves and exits, a due
    checkpoint is saved."""
    if aggregator is not None and aggregator.error is not None:
        raise RuntimeError(f"sync aggregation failed: {aggregator.error}") from aggregator.error
    if notice is not None and notice.pending and ckpt is not None:  # a notice only with a ckpt
        notice.save_and_exit(functools.partial(ckpt.save, sess, final=True), gs)
    if ckpt and ckpt.due(gs):
        ckpt.save(sess)


def _task_figures(ctx: Any, progress: ProgressReporter, ws0: Any, lost: int, gs: int) -> dict[str, Any]:
    """This task's figures once its steps are done (logged): its progress's, where every worker started, what a
    rejoin lost."""
    mine = progress.final() | {
        "start_worker_steps": [int(x) for x in ws0],
        "lost_steps": lost,
        "train_start": progress.start,
    }
    log.info(
        "%s: finished %d local steps (global step %d), %.0f examples/s, loss %s -> %s%s",
        ctx.task_id,
        mine["steps"],
        gs,
        mine["examples_per_sec"],
        mine["first_loss"],
        mine["last_loss"],
        fmt_metrics(mine.get("metrics")),
    )
    return mine


def _wait_for_workers(
    ctx: Any, tg: TrainGraph, sess: Any, steps: list[int], ckpt: Checkpointer | None, notice: StopNotice | None = None
) -> list[int]:
    """Chief: wait until every worker has run its share (async workers finish at their own pace). Bounded: fails
    when no worker step happened for ``timeouts.step`` (a stopped worker, named in the error)."""
    want = sum(steps)
    last, last_change = None, time.monotonic()
    while True:
        ws = [int(x) for x in sess.run(tg.worker_steps)]
        if all(n >= want for n in ws):
            return ws
        if ws != last:
            last, last_change = ws, time.monotonic()
        elif time.monotonic() - last_change > ctx.spec.timeouts.step:
            behind = {t: n for t, n in zip(ctx.training_tasks, ws) if n < want}
            raise WaitTimeout(
                f"waited {ctx.spec.timeouts.step:g}s (timeouts.step) for workers to finish their "
                f"{want} steps; no progress from: {behind}"
            )
        if ckpt:
            _after_step(sess, ckpt, notice, None, int(sess.run(tg.global_step)))
        time.sleep(0.1)


def _finish(
    ctx: Any,
    tg: TrainGraph,
    sess: Any,
    ckpt: Checkpointer | None,
    mine: dict[str, Any],
    worker_steps: list[int],
    target: int,
    t_start: float,
) -> dict[str, Any]:
    """Chief: final checkpoint, summary (file + KV), then ``control/done`` so the ps tasks exit."""
    spec = ctx.spec
    gs = int(sess.run(tg.global_step))
    train_s = time.monotonic() - mine["train_start"]  # before the final checkpoint and the wait for final records
    entry = ckpt.save(sess, final=True) if ckpt else None
    elapsed = time.monotonic() - t_start
    progress = wait_for_final_progress(ctx, spec.timeouts.shutdown)
    trained = (sum(worker_steps) - sum(mine["start_worker_steps"])) * spec.data.batch_size
    latest = entry or (ckpt.store.latest() if ckpt and ckpt.store else None)  # None: saved at this step already
    exported = export_at_end(ctx, ckpt.committed if ckpt else None)
    summary = run_summary(
        ctx,
        global_step=gs,
        total_steps=target,
        steps_per_worker=dict(zip(ctx.training_tasks, worker_steps)),
        examples_per_sec=round(trained / train_s, 1) if train_s > 0 else 0.0,
        first_loss=mine["first_loss"],
        last_loss=mine["last_loss"],
        metrics=mine.get("metrics"),
        train_s=round(train_s, 3),
        last_checkpoint=(latest or {}).get("name"),
        resumed_from=ckpt.resumed_from if ckpt else None,
        resumed_step=ckpt.resumed_step if ckpt else None,
        warm_started_from=ckpt.warm_started_from if ckpt else None,
        loss_by_worker={t: p.get("loss") for t, p in progress.items()} | {ctx.task_id: mine["last_loss"]},
        elapsed_s=round(elapsed, 3),
        num_ps=len(ctx.cluster.get("ps", [])),
        export=exported,
        **skip_counts(progress),
        **_rejoins(ctx.kv, ctx.training_tasks),
    )
    _log_done(summary, gs, target, elapsed)
    summary["summary_url"] = write_summary(ctx, summary)
    ctx.kv.put(DONE_KEY, "1")
    return summary


def _log_done(summary: dict[str, Any], gs: int, target: int, elapsed: float) -> None:
    """The chief's last word on the run (and on workers that rejoined, whose in-flight steps ran again)."""
    log.info(
        "training done: global step %d/%d, steps per worker %s, %.0f examples/s, loss %s -> %s%s, %.1fs",
        gs,
        target,
        summary["steps_per_worker"],
        summary["examples_per_sec"],
        summary["first_loss"],
        summary["last_loss"],
        fmt_metrics(summary["metrics"]),
        elapsed,
    )
    if any(summary["rejoins"].values()):
        log.warning(
            "workers restarted and rejoined: %s; in-flight steps lost (run again): %s",
            summary["rejoins"],
            summary["lost_steps"],
        )
