"""allreduce mode: MultiWorkerMirroredStrategy, every training task stepping on ready batches from its own feeder.

Why it is built this way (each point a failure of the seeds or a measured TF 2.21 fact, ``../shared/NOTES.md``):

* **Fed step with a fixed input signature**: the :class:`tfyarn.data.Feeder` reads and decodes ahead into numpy
  batches of exactly ``data.batch_size``, and the step is traced once for the run; no ``tf.data`` pipeline and no
  ``distribute_datasets_from_function`` (which pads short workers with empty batches).
* **Equal steps, so no worker waits for a peer that ran out of data**: every worker plans the same ``steps(epoch)``
  from the shared manifest and checks its total against the chief's before the first step.
* **The loss is averaged over the GLOBAL batch** (per-worker batch x training workers): over the local batch, the
  summed gradients would be N times too large.
* **Collectives time out** (``timeouts.step``): a lost or frozen peer is a DeadlineExceeded error, not a hang.
* **Only the chief checkpoints** (saving mirrored variables needs no collective), writes the summary and sets
  ``control/done``; every worker resumes from the latest checkpoint, whose global step gives the plan position.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from typing import Any

from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.context import DONE_KEY, TOTAL_STEPS_KEY, TaskContext
from tfyarn.tasklib.watchdog import dump_stacks, install_stack_dumps
from tfyarn.train import helpers
from tfyarn.train.checkpoint import (
    PeriodicCheckpoints,
    check_model_fits,
    local_dir_for,
    restore_model_variables,
    warm_start_source,
)
from tfyarn.train.export import export_at_end
from tfyarn.train.inputs import to_tensors
from tfyarn.train.model import build_model, input_signature, is_custom_train, load, split_features
from tfyarn.train.progress import (
    ProgressReporter,
    fmt_metrics,
    run_summary,
    skip_counts,
    wait_for_final_progress,
    write_summary,
)
from tfyarn.train.step_metrics import metric_names, pack, step_metrics, unpack
from tfyarn.train.stop_notice import chief_notice
from tfyarn.train.strategy import check_abort, start_strategy

log = logging.getLogger("tfyarn.train.allreduce")

CHECKPOINT_FORMAT = "tf2-object"


def model_variable_keys(n: int) -> list[str]:
    """Checkpoint keys of ``model.variables`` (creation order) in the object graph written by :func:`train_state`."""
    return [f"model/var_{i}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(n)]


def train_state(model: Any, optimizer: Any, global_step: Any) -> Any:
    """The object graph that is checkpointed: model variables by creation index, optimizer slots, global step."""
    import tensorflow as tf

    model_vars = tf.train.Checkpoint(**{f"var_{i}": v for i, v in enumerate(model.variables)})
    return tf.train.Checkpoint(model=model_vars, optimizer=optimizer, global_step=global_step)


DENSE_GRAD_MIN_BYTES = 1 << 20


def densify_if_small(grad: Any, var: Any, global_batch: int, workers: int) -> Any:
    """Turn a sparse (IndexedSlices) gradient into a dense one when all-reducing it densely is cheaper.

    MWMS all-gathers sparse gradients (indices and values, several collective rounds behind a cond); for an embedding
    table of a few MB a single dense all-reduce is far faster (measured: recommender, 1000x16 tables, 2 workers on
    loopback: 31 ms → 6 ms per step). Large tables stay sparse: dense would move the whole table every step.
    Rule: dense when the table is at most max(1 MiB, 4 x the rows all workers gather per step).
    """
    import tensorflow as tf

    if not isinstance(grad, tf.IndexedSlices) or not var.shape.is_fully_defined():
        return grad
    row_bytes = var.dtype.size * max(1, var.shape[1:].num_elements() or 1)
    dense_bytes = row_bytes * int(var.shape[0])
    if dense_bytes <= max(DENSE_GRAD_MIN_BYTES, 4 * global_batch * row_bytes):
        log.info(
            "gradient of %s (%d bytes) all-reduced dense (cheaper than gathering %d sparse rows x %d workers)",
            var.name,
            dense_bytes,
            global_batch // max(1, workers),
            workers,
        )
        return tf.convert_to_tensor(grad)
    return grad


def make_step(
    strategy: Any,
    model: Any,
    optimizer: Any,
    global_step: Any,
    signature: dict[str, Any],
    label: str | None,
    global_batch: int,
) -> "FedStep":
    """The fed training step: ``step(batch) -> this worker's mean loss`` (a scalar tensor), or with the model's
    compiled metrics ``[loss, *metrics]`` (:mod:`tfyarn.train.step_metrics`: same predictions, one read).

    Gradients of the loss averaged over the global batch; the optimizer's ``apply_gradients`` in replica context
    (v1, or a Keras model's Keras optimizer) all-reduces them (SUM) across workers, so the update equals one step
    over the global batch.
    """
    import tensorflow as tf

    if label is None:
        raise ValueError("allreduce mode trains on a label: set data.label (or name a feature 'label')")

    workers = max(1, global_batch // max(1, int(next(iter(signature.values())).shape[0])))
    keras_vars = getattr(model, "keras_trainable", None)  # a Keras model's optimizer takes its Keras variables

    def replica_step(batch):
        features, labels = split_features(batch, label)
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            per_example = model.loss(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        grads = [densify_if_small(g, v, global_batch, workers) for g, v in zip(grads, model.trainable_variables)]
        if keras_vars is None:
            optimizer.apply_gradients(zip(grads, model.trainable_variables), global_step=global_step)
        else:  # a Keras optimizer all-reduces in apply_gradients too
            optimizer.apply_gradients(zip(grads, keras_vars))
            global_step.assign_add(1)
        return pack(tf.reduce_mean(per_example), step_metrics(model, labels, predictions))

    @tf.function(input_signature=[signature])
    def step(batch):
        return strategy.experimental_local_results(strategy.run(replica_step, args=(batch,)))[0]

    return FedStep(step, signature, metric_names(model))


class FedStep:
    """Calls the step's single concrete function with the batch converted to tensors of the signature's dtypes.

    Why not call the ``tf.function`` itself: with an ``input_signature`` it never retraces, but every call still
    canonicalises its arguments against the signature (~0.3 ms measured, a quarter of a small model's step); the
    concrete function skips that, which is what keeps the fed step within a few percent of an in-graph one.
    """

    def __init__(self, function: Any, signature: dict[str, Any], metric_names: list[str] | None = None):
        import tensorflow as tf

        self.function, self.metric_names, self.signature = function, list(metric_names or []), signature
        self.concrete = function.get_concrete_function()  # the one trace (creates optimizer slots)
        self.dtypes = {k: spec.dtype for k, spec in signature.items()}
        self.convert = tf.convert_to_tensor
        self.sparse = any(isinstance(s, tf.SparseTensorSpec) for s in signature.values())

    def __call__(self, batch: dict[str, Any]) -> Any:
        if self.sparse:  # a variable-length feature: tf.SparseTensor (tfyarn.train.inputs)
            return self.concrete(to_tensors(batch, self.signature))
        return self.concrete({k: self.convert(batch[k], dtype=d) for k, d in self.dtypes.items()})

    def experimental_get_tracing_count(self) -> int:
        return int(self.function.experimental_get_tracing_count())


def build(ctx: TaskContext, strategy: Any) -> tuple[Any, Any, Any, Any]:
    """Model, optimizer and global step created under the strategy (mirrored, initial values from the chief)."""
    import tensorflow as tf

    spec = ctx.spec
    with strategy.scope():  # a Keras factory creates its variables when called: mirrored here
        model = load(spec.model, spec.params, spec.code or None, data=spec.data)
        if is_custom_train(model):
            raise ValueError(
                f"model: {spec.model} returned a custom train function; in allreduce mode decorate "
                f"{spec.model} itself with @tfyarn.train.custom_train"
            )
        build_model(model)
        optimizer = model.optimizer()
        global_step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="global_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
    return model, optimizer, global_step, train_state(model, optimizer, global_step)


def agree_on_total(ctx: TaskContext, total: int) -> None:
    """The chief publishes the planned total; every other worker checks its own plan gives the same number: a
    disagreement (other manifests or code on other hosts) would otherwise hang in an epoch's last all-reduce."""
    if ctx.is_chief:
        ctx.kv.put(TOTAL_STEPS_KEY, str(total))
        return
    chief_total = int(
        ctx.kv.wait(
            TOTAL_STEPS_KEY, ctx.spec.timeouts.rendezvous, what=f"the chief's planned step total ({TOTAL_STEPS_KEY})"
        )
    )
    if chief_total != total:
        raise RuntimeError(
            f"{ctx.task_id} planned {total} steps but the chief planned {chief_total}: the workers "
            f"see different training data (check data.train is the same for every task)"
        )


class Checkpointer(PeriodicCheckpoints):
    """Every worker restores (or warm-starts) from it; only the chief saves. The chief's local write runs in the step
    loop and the upload beside it, so the peers waiting in the next collective do not wait for the upload too."""

    def __init__(self, ctx: TaskContext, state: Any, n_model_vars: int, steps: list[int]):
        super().__init__(ctx.spec, chief=ctx.is_chief)
        self.ctx, self.state, self.n_model_vars, self.steps = ctx, state, n_model_vars, steps
        self.local = local_dir_for(ctx.workdir, f"allreduce-{ctx.task_id.replace(':', '-')}")

    def save(self, global_step: int, worker_steps: int, final: bool = False) -> dict[str, Any] | None:
        """Write a checkpoint of ``global_step`` (chief only): see :meth:`PeriodicCheckpoints.commit`."""
        if self.uploads is None:
            return None
        if final:
            self.uploads.wait()
        if self.last_step == global_step:
            return None
        prefix = self.state.write(str(self.local / f"ckpt-{global_step}"))
        epoch, in_epoch = helpers.position(global_step, self.steps)
        meta = {
            "format": CHECKPOINT_FORMAT,
            "mode": "allreduce",
            "epoch": epoch,
            "step_in_epoch": in_epoch,
            "worker_steps": worker_steps,
            "model_variables": model_variable_keys(self.n_model_vars),
            "num_workers": self.ctx.num_data_workers,
        }
        return self.commit(prefix, global_step, meta, final)

    def model_variables(self) -> list[Any]:
        """The model's variables in creation order, as :func:`train_state` holds them."""
        return [getattr(self.state.model, f"var_{i}") for i in range(self.n_model_vars)]

    def restore_latest(self) -> dict[str, Any] | None:
        """Every worker restores the newest committed checkpoint (same values everywhere); None if there is none."""
        entry = self.store.latest() if self.store else None
        if self.store is None or entry is None:
            return None
        if entry.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"checkpoint {entry['name']} in {self.store.url} has format {entry.get('format')!r}; "
                f"allreduce mode resumes only from its own ({CHECKPOINT_FORMAT!r}) checkpoints"
            )
        prefix = self.store.download(entry, self.local / "restore")
        check_model_fits(
            prefix, self.model_variables(), entry.get("model_variables") or [], f"{entry['name']} in {self.store.url}"
        )
        self.state.read(prefix).expect_partial()
        self.last_step = int(entry["global_step"])
        log.info("%s resumed from %s (global step %d)", self.ctx.task_id, entry["name"], self.last_step)
        return entry

    def warm_start(self) -> str | None:
        """``checkpoint.init_from`` with nothing to resume from: every worker loads the model's variables from its
        latest checkpoint (:func:`warm_start_source`). Returns ``<url>/<name>`` of that checkpoint, or None."""
        src = warm_start_source(self.ctx.spec, self.ctx.workdir)
        if src is None:
            return None
        prefix, entry, keys = src
        restore_model_variables(
            self.model_variables(), prefix, keys, f"{entry['name']} in {entry['url']} (checkpoint.init_from)"
        )
        return f"{entry['url']}/{entry['name']}"


_TF_TASK_RE = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")


def collective_failure(ctx: TaskContext, exc: BaseException, step: int) -> str | None:
    """A tfyarn diagnosis for a step that failed because of a peer (None for any other error), after a stack dump.

    TF reports a frozen or dead peer as UnavailableError ("tasks are unhealthy (stopped sending heartbeats)": the
    coordination service's heartbeat) and a collective that overran ``timeouts.step`` as DeadlineExceededError; both
    name peers as ``/job:worker/replica:0/task:1``, which is translated to tfyarn's task ids.
    """
    kind = type(exc).__name__
    if kind not in ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError"):
        return None
    text = str(exc)
    peers = sorted({f"{j}:{i}" for j, i in _TF_TASK_RE.findall(text)} - {ctx.task_id})
    first = next(
        (
            ln.strip()
            for ln in text.splitlines()
            if "unhealthy" in ln or "timed out" in ln.lower() or "deadline" in ln.lower()
        ),
        text.strip().splitlines()[0] if text.strip() else kind,
    )
    if kind == "DeadlineExceededError":
        why = (
            f"a collective of step {step} did not complete within timeouts.step = {ctx.spec.timeouts.step:g}s "
            f"(a peer is frozen, blocked or far slower)"
        )
    else:
        why = f"step {step} failed because a peer is unreachable or stopped heartbeating (frozen or dead)"
    msg = (
        f"{ctx.task_id}: {why}"
        + (f"; peers named by TF: {', '.join(peers)}" if peers else "")
        + f". TF said: {kind}: {first[:300]}"
    )
    dump_stacks(msg)
    log.error("%s", msg)
    return msg


def _start(ctx: TaskContext) -> tuple[Any, int]:
    """This training task's strategy, one CPU replica per training worker, and the global batch."""
    if ctx.data_rank < 0:
        raise ValueError(f"{ctx.task_id} is not a training task ({', '.join(ctx.training_tasks)})")
    workers, batch = ctx.num_data_workers, ctx.spec.data.batch_size
    global_batch = batch * workers
    log.info(
        "%s: allreduce over %d training workers, per-worker batch %d x %d workers = global batch %d "
        "(the loss is averaged over the global batch)",
        ctx.task_id,
        workers,
        batch,
        workers,
        global_batch,
    )

    strategy = start_strategy(ctx)
    if strategy.num_replicas_in_sync != workers:
        raise RuntimeError(
            f"{ctx.task_id}: the strategy has {strategy.num_replicas_in_sync} replicas, the spec has "
            f"{workers} training workers (one CPU replica per worker expected)"
        )
    return strategy, global_batch


def _figures(
    ctx: TaskContext, figures: dict[str, Any], gstep: int, total: int, step_fn: Any, boundary_waits: list[float]
) -> dict[str, Any]:
    """The task's final figures (its progress's, with the global step, the plan and the step's traces), logged."""
    figures = figures | {
        "global_step": gstep,
        "planned_total": total,
        "traces": int(step_fn.experimental_get_tracing_count()),
        "max_epoch_boundary_wait_s": round(max(boundary_waits, default=0.0), 4),
    }
    log.info(
        "%s: ran %d steps (global step %d of %d planned), %.0f examples/s, last loss %s%s, step traced %d time(s)",
        ctx.task_id,
        figures["steps_this_attempt"],
        gstep,
        total,
        figures["examples_per_sec"],
        figures["last_loss"],
        fmt_metrics(figures.get("metrics")),
        figures["traces"],
    )
    return figures


def run(ctx: TaskContext) -> dict[str, Any]:
    """Train this task's share in allreduce mode; the chief also checkpoints, summarises and sets control/done."""

    spec = ctx.spec
    install_stack_dumps(ctx.kv, ctx.task_id)
    strategy, global_batch = _start(ctx)
    model, optimizer, global_step, state = build(ctx, strategy)
    signature = input_signature(spec.data.features, spec.data.batch_size)
    step_fn = make_step(strategy, model, optimizer, global_step, signature, spec.data.label, global_batch)

    with helpers.train_pipeline(ctx) as feeder:
        steps = helpers.epoch_steps(feeder, spec.data.epochs)
        total = sum(steps)
        agree_on_total(ctx, total)
        ckpt = Checkpointer(ctx, state, len(model.variables), steps)
        entry = ckpt.restore_latest()
        warm = ckpt.warm_start() if entry is None else None
        start = int(global_step.numpy())
        epoch0, in_epoch0 = helpers.position(start, steps)
        log.info(
            "%s: plan %s steps per epoch, %d in total; starting at global step %d (epoch %d, step %d)%s",
            ctx.task_id,
            steps,
            total,
            start,
            epoch0,
            in_epoch0,
            f" from {entry['name']}" if entry else "",
        )
        progress = ProgressReporter.for_task(ctx)
        progress.extra.update({"mode": "allreduce", "global_batch": global_batch})
        ran, boundary_waits = _loop(ctx, feeder, step_fn, steps, epoch0, in_epoch0, start, progress, ckpt)
    # every worker runs every global step, so its steps over all attempts are the global step's (as ps mode counts
    # them); this attempt's are kept apart (its examples/s)
    mine = {"worker_steps": start + ran, "steps_this_attempt": ran}
    progress.extra.update(mine, **feeder.skip_report())  # skipped records and damaged ranges, with file and offset
    gstep = int(global_step.numpy())
    figures = _figures(ctx, progress.final() | mine, gstep, total, step_fn, boundary_waits)
    if gstep != total:
        raise RuntimeError(f"{ctx.task_id}: finished at global step {gstep}, planned {total}")
    if ctx.is_chief:
        _finish(ctx, ckpt, figures, global_batch, steps, resumed_from=entry, warm_started_from=warm)
    return figures


def _loop(
    ctx: TaskContext,
    feeder: Any,
    step_fn: Any,
    steps: list[int],
    epoch0: int,
    in_epoch0: int,
    gstep: int,
    progress: Any,
    ckpt: Checkpointer,
) -> tuple[int, list[float]]:
    """Run the planned steps from (epoch0, in_epoch0). Returns (steps run here, epoch-boundary waits in s).

    The epoch-boundary wait is the time from the end of an epoch's last step to the first batch of the next one
    being ready — the place where the seeds froze — measured so the benchmark can show it stays below a step.
    """
    ran, waits, last_abort_check = 0, [], time.monotonic()
    notice = chief_notice(ctx, ckpt.uploads is not None)  # SIGTERM: save now (train.stop_notice)
    progress.begin()
    prev_epoch, t_end_prev = epoch0, time.monotonic()
    for epoch, batch in feeder.run(epoch0, in_epoch0):
        if epoch != prev_epoch:
            waits.append(time.monotonic() - t_end_prev)
            prev_epoch = epoch
        try:
            out = step_fn(batch)
        except Exception as exc:
            if notice is not None and notice.pending:  # its peers were stopped too: the stop ends it, not them
                notice.save_and_exit(functools.partial(ckpt.save, gstep, gstep, final=True), gstep)
            diagnosis = collective_failure(ctx, exc, gstep + 1)
            if diagnosis is None:
                raise
            # a collective past timeouts.step is a timeout (exit 4); a peer gone or not heartbeating is a failure
            raise (WaitTimeout if type(exc).__name__ == "DeadlineExceededError" else RuntimeError)(diagnosis) from exc
        ran += 1
        gstep += 1
        loss, metrics = unpack(out, getattr(step_fn, "metric_names", []))
        n = len(next(iter(batch.values())))
        progress.report(step=gstep, epoch=epoch, loss=loss, examples=n, global_step=gstep, metrics=metrics)
        if notice is not None and notice.pending:
            notice.save_and_exit(functools.partial(ckpt.save, gstep, gstep, final=True), gstep)
        if ckpt.due(gstep):
            ckpt.save(gstep, gstep)
        now = time.monotonic()
        if now - last_abort_check >= 2.0:
            last_abort_check = now
            check_abort(ctx)
        t_end_prev = time.monotonic()
    return ran, waits


#: Each task's figures in the summary's ``tasks``.
TASK_FIGURES = ("step", "worker_steps", "examples_per_sec", "loss")


def _finish(
    ctx: TaskContext,
    ckpt: Checkpointer,
    figures: dict[str, Any],
    global_batch: int,
    steps: list[int],
    resumed_from: dict[str, Any] | None,
    warm_started_from: str | None = None,
) -> None:
    """Chief: final checkpoint, wait (bounded) for every worker's final figures, summary, then control/done."""

    entry = ckpt.save(figures["global_step"], figures["worker_steps"], final=True)
    exported = export_at_end(ctx, ckpt.committed)
    per_task = wait_for_final_progress(ctx, ctx.spec.timeouts.shutdown)
    train_s = figures["elapsed_s"]
    summary = run_summary(
        ctx,
        global_step=figures["global_step"],
        total_steps=sum(steps),
        steps_per_worker={t: p.get("worker_steps") for t, p in per_task.items()},
        examples_per_sec=round(figures["steps_this_attempt"] * global_batch / train_s, 1) if train_s else 0.0,
        first_loss=figures["first_loss"],
        last_loss=figures["last_loss"],
        metrics=figures.get("metrics"),
        train_s=train_s,
        last_checkpoint=(entry or ckpt.store.latest() or {}).get("name") if ckpt.store else None,
        resumed_from=(resumed_from or {}).get("name"),
        resumed_step=(resumed_from or {}).get("global_step"),
        warm_started_from=warm_started_from,
        steps_per_epoch=steps,
        chief=figures,
        export=exported,
        **skip_counts(per_task),
        tasks={t: {k: p.get(k) for k in TASK_FIGURES} for t, p in per_task.items()},
    )
    write_summary(ctx, summary)
    ctx.kv.put(DONE_KEY, "1")
    log.info("%s: training done at global step %d; control/done set", ctx.task_id, figures["global_step"])
