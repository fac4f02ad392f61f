"""The evaluator role: follow new checkpoints, evaluate each on ``data.eval``, write metrics, end when training ends.

* It follows the checkpoint **index** (:class:`tfyarn.train.checkpoint.CheckpointStore`) through fsspec: the index
  names only fully uploaded checkpoints, and it works on ``hdfs://`` where TF itself cannot read.
* The model is built eagerly and restored by variable creation order (:func:`restore_model_variables`), so one code
  path evaluates both modes' checkpoints.
* It may skip checkpoints when training is faster than evaluation (it evaluates the newest), but always evaluates
  the **final** one: ``control/done`` is read before the index.
* Metrics go to ``<checkpoint dir>/eval/metrics.jsonl`` (one JSON object per evaluated checkpoint), to TF event files in
  ``<checkpoint dir>/eval/`` (TensorBoard's "eval" run) and to the KV under ``eval/latest``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from tfyarn.data import Feeder
from tfyarn.data.manifest import section_manifest
from tfyarn.tasklib.context import ABORT_KEY, DONE_KEY, EVAL_KEY, FAILURE_PREFIX, TaskContext
from tfyarn.tasklib.watchdog import install_stack_dumps
from tfyarn.train.checkpoint import CheckpointStore, download_model_checkpoint, local_dir_for, restore_model_variables
from tfyarn.train.events import EventWriter, fs_path, upload_file
from tfyarn.train.helpers import index_cache
from tfyarn.train.inputs import to_tensors
from tfyarn.train.model import build_model, input_signature, load_model, split_features

log = logging.getLogger("tfyarn.train.evaluator")

POLL_S = 2.0


#: Roles that follow training without being part of it: their failure does not end training (on YARN they are
#: skein's ``allow_failures``; locally a tensorboard failure is only reported).
SIDE_ROLES = ("evaluator", "tensorboard")


def training_ended_badly(ctx: TaskContext) -> str | None:
    """Why training will never set ``control/done`` (abort, or a training task or ps reported a failure), or None:
    a follower role must not depend on the launcher to end it. A side role's failure is not training's."""
    reason = ctx.kv.get(ABORT_KEY)
    if reason is not None:
        return f"job aborted: {reason}"
    failures = {k[len(FAILURE_PREFIX) :]: v for k, v in ctx.kv.items(FAILURE_PREFIX).items()}
    # a task that will be restarted in place (its role's max_restarts) has not ended training; nor has this task's
    # own record from before its restart (on YARN nothing deletes either)
    fatal = {
        t: v for t, v in failures.items() if t.split(":", 1)[0] not in SIDE_ROLES and not _restartable(ctx.spec, t)
    }
    if fatal:
        return "training failed: " + "; ".join(f"{t}: {v}" for t, v in sorted(fatal.items()))
    return None


def _restartable(spec: Any, task: str) -> bool:
    role = spec.roles.get(task.split(":", 1)[0])
    return role is not None and role.restart != "never" and role.max_restarts > 0


def make_eval_feeder(ctx: TaskContext) -> Any:
    """One reader over the whole eval set (rank 0 of 1): full batches of ``data.batch_size``, same order every time."""
    d = ctx.spec.data
    return Feeder.for_data(section_manifest(d.eval, d, index_cache(ctx.spec)), d, 0, 1, shuffle_buffer=0)


def make_eval_step(model: Any, features: dict[str, Any], batch_size: int, label: str | None) -> Any:
    """``step(batch) -> {metric: batch mean}``, traced once (fixed input signature)."""
    import tensorflow as tf

    if label is None:
        raise ValueError("the evaluator needs a label: set data.label (or name a feature 'label')")

    signature = input_signature(features, batch_size)

    @tf.function(input_signature=[signature])
    def step(batch):
        feats, labels = split_features(batch, label)
        return model.metrics(labels, model(feats, training=False))

    return lambda batch: step(to_tensors(batch, signature))  # (a variable-length feature: a SparseTensor)


def evaluate(step: Any, feeder: Any) -> tuple[dict[str, float], int]:
    """Mean of each metric over every eval batch (equal batch sizes, so the mean of means is exact)."""
    sums: dict[str, float] = {}
    n = 0
    for batch in feeder.epoch(0):
        for k, v in step(batch).items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n += 1
    if n == 0:
        raise ValueError("the eval data gives no full batch: data.eval has fewer records than data.batch_size")
    return {k: s / n for k, s in sums.items()}, n


class MetricsLog:
    """metrics.jsonl kept locally in full and re-uploaded whole (temp name, rename): HDFS has no reliable append."""

    def __init__(self, url: str, local_dir: Path):
        self.fs, self.remote = fs_path(url, "eval/metrics.jsonl")
        self.local = Path(local_dir) / "metrics.jsonl"
        self.local.parent.mkdir(parents=True, exist_ok=True)
        self.local.write_text("")
        if self.fs.exists(self.remote):  # a restarted job: keep the earlier attempts' lines
            self.fs.get_file(self.remote, str(self.local))

    def append(self, record: dict[str, Any]) -> None:
        with self.local.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        upload_file(self.fs, self.local, self.remote)


def run(ctx: TaskContext) -> list[dict[str, Any]]:
    """Evaluate checkpoints as they appear until ``control/done`` (then the final one) or ``control/abort``."""
    import tensorflow as tf

    install_stack_dumps(ctx.kv, ctx.task_id)
    spec = ctx.spec
    if not spec.checkpoint.dir or not spec.data.eval:
        raise ValueError("the evaluator needs checkpoint.dir and data.eval")
    url = spec.checkpoint.dir
    store = CheckpointStore(url, keep=spec.checkpoint.keep)
    model = build_model(load_model(spec))
    step = make_eval_step(model, dict(spec.data.features), spec.data.batch_size, spec.data.label)
    scratch = local_dir_for(ctx.workdir, "evaluator")
    events = EventWriter(url, "eval", scratch / "events")
    metrics_log = MetricsLog(url, scratch)
    results: list[dict[str, Any]] = []
    last: str | None = None
    feeder = make_eval_feeder(ctx)
    log.info("evaluator: following %s, evaluating on %s", url, ", ".join(spec.data.eval))
    with contextlib.closing(events), feeder:
        while True:
            done = ctx.kv.get(DONE_KEY) is not None  # read before the index: the final one is then listed
            entry = store.latest()
            if entry is not None and entry["name"] != last:
                try:
                    results.append(
                        _evaluate_entry(ctx, store, entry, model, step, feeder, scratch, events, metrics_log)
                    )
                except (FileNotFoundError, tf.errors.NotFoundError) as exc:
                    if any(c["name"] == entry["name"] for c in store.index().get("checkpoints", [])):
                        raise  # not a pruned checkpoint: eval data gone, an upload failing... say so
                    # pruned (checkpoint.keep) while we downloaded it: a newer one is in the index
                    log.info(
                        "checkpoint %s disappeared before it was evaluated (%s); reading the index again",
                        entry["name"],
                        exc,
                    )
                    continue
                last = entry["name"]
                continue  # a newer one may have landed meanwhile
            if done:
                break
            reason = training_ended_badly(ctx)
            if reason is not None:
                log.warning("evaluator: %s; stopping after %d evaluations", reason, len(results))
                break
            time.sleep(POLL_S)
    if not results:
        log.warning("evaluator: training ended without any checkpoint in %s: nothing evaluated", url)
    log.info("evaluator: %d checkpoint(s) evaluated; final %s", len(results), results[-1] if results else None)
    return results


def _evaluate_entry(
    ctx: TaskContext,
    store: Any,
    entry: dict[str, Any],
    model: Any,
    step: Any,
    feeder: Any,
    scratch: Path,
    events: Any,
    metrics_log: MetricsLog,
) -> dict[str, Any]:
    t0 = time.monotonic()
    local = scratch / "restore" / entry["name"]
    prefix, entry, keys = download_model_checkpoint(store, local, "evaluator", entry)
    restore_model_variables(model.variables, prefix, keys, f"{entry['name']} in {store.url}")
    metrics, batches = evaluate(step, feeder)
    gstep = int(entry["global_step"])
    record = {
        "checkpoint": entry["name"],
        "global_step": gstep,
        "epoch": entry.get("epoch"),
        "batches": batches,
        "examples": batches * ctx.spec.data.batch_size,
        "time": time.time(),
        "eval_seconds": round(time.monotonic() - t0, 3),
        **{k: round(v, 6) for k, v in metrics.items()},
    }
    metrics_log.append(record)
    events.scalars(gstep, metrics)
    events.sync()
    ctx.kv.put(EVAL_KEY, json.dumps(record, separators=(",", ":")))
    for p in local.glob("*"):
        p.unlink(missing_ok=True)
    log.info(
        "evaluated %s (global step %d) on %d examples in %.2fs: %s",
        entry["name"],
        gstep,
        record["examples"],
        record["eval_seconds"],
        ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()),
    )
    return record
