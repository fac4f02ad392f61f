"""What both built-in loops and a user's ``@custom_train`` function share: this task's feeder, progress, checkpoints
(kept apart from the loops so the escape hatch gets exactly their plumbing, not a second, drifting copy)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tfyarn.data import Feeder
from tfyarn.data.pipeline import EpochPipeline
from tfyarn.data.shared_index import shared_manifest
from tfyarn.tasklib.context import DONE_KEY
from tfyarn.train.checkpoint import CheckpointStore
from tfyarn.train.progress import ProgressReporter, loop_summary, write_summary
from tfyarn.train.strategy import start_strategy

log = logging.getLogger("tfyarn.train")


def index_cache(spec: Any) -> str | None:
    """``data.index_cache`` (the YARN backend sets it to ``<staging dir>/index`` when unset), else None: this
    machine's cache (``tfyarn.data.manifest.default_cache_dir``), which is what every local task shares."""
    return spec.data.index_cache or None


def train_manifest(ctx: Any) -> Any:
    """The manifest of ``data.train``, built together by the training tasks: each indexes ~1/N of the files not
    indexed yet and every one ends with the identical manifest (:mod:`tfyarn.data.shared_index`; a task's silence
    is judged by ``timeouts.stall``)."""
    d = ctx.spec.data
    return shared_manifest(
        list(d.train),
        kv=ctx.kv,
        tasks=list(ctx.training_tasks),
        rank=ctx.data_rank,
        app_id=ctx.app_id,
        attempt=ctx.attempt,
        compression=d.compression,
        format=d.format,
        on_corrupt=d.on_corrupt,
        cache_dir=index_cache(ctx.spec),
        stall=ctx.spec.timeouts.stall,
        timeout=max(3600.0, ctx.spec.timeouts.stall),
    )


def make_feeder(ctx: Any, manifest: Any = None) -> Any:
    """This task's share of ``data.train`` as ready numpy batches (``tfyarn.data.Feeder``, rank = ``ctx.data_rank``);
    ``manifest``: :func:`train_manifest`'s, when the task already has it (else built here)."""
    if ctx.data_rank < 0:
        raise ValueError(f"{ctx.task_id} is not a training task; it has no share of the data")
    manifest = manifest if manifest is not None else train_manifest(ctx)
    return Feeder.for_data(manifest, ctx.spec.data, ctx.data_rank, ctx.num_data_workers)


def train_pipeline(ctx: Any) -> EpochPipeline:
    """This task's share of ``data.train`` epoch after epoch: two feeders alternating, so the next epoch is read while
    this one trains (no cold start at a boundary), on the one manifest (built, or read from its cache, once)."""
    manifest = train_manifest(ctx)
    return EpochPipeline(lambda: make_feeder(ctx, manifest), ctx.spec.data.epochs)


def epoch_steps(feeder: Any, epochs: int) -> list[int]:
    """Steps of each epoch (identical on every worker: the planner computes them from the manifest alone)."""
    return [int(feeder.steps(e)) for e in range(epochs)]


def position(done_steps: int, steps: list[int]) -> tuple[int, int]:
    """``done_steps`` local steps already run → (epoch, step within that epoch) to resume at.

    Returns ``(len(steps), 0)`` when everything is done.
    """
    left = int(done_steps)
    for e, n in enumerate(steps):
        if left < n:
            return e, left
        left -= n
    return len(steps), 0


@dataclass
class Helpers:
    """Handed to a ``@custom_train`` function as its second argument (see :mod:`tfyarn.train.model`)."""

    ctx: Any
    params: dict[str, Any]
    progress: ProgressReporter
    summary_extra: dict[str, Any] = field(default_factory=dict)

    def feeder(self) -> Any:
        return make_feeder(self.ctx)

    def strategy(self) -> Any:
        """A MultiWorkerMirroredStrategy set up as allreduce mode's (:func:`tfyarn.train.strategy.start_strategy`).
        Call it once, on every training task, before other TF work (TF's rule for this strategy)."""

        return start_strategy(self.ctx)

    def checkpoint_store(self) -> Any:
        """A :class:`tfyarn.train.checkpoint.CheckpointStore` on ``checkpoint.dir``, or None when none is set."""
        ck = self.ctx.spec.checkpoint
        return CheckpointStore(ck.dir, keep=ck.keep) if ck.dir else None

    def upload_checkpoint(self, local_prefix: str, global_step: int, meta: dict[str, Any] | None = None) -> Any:
        """Commit the local TF checkpoint ``local_prefix`` to ``checkpoint.dir`` (:meth:`CheckpointStore.upload`)."""
        store = self.checkpoint_store()
        if store is None:
            raise ValueError("checkpoint.dir is not set in the spec")
        return store.upload(local_prefix, global_step, meta)


def jsonable(values: dict[str, Any], what: str) -> dict[str, Any]:
    """``values`` made JSON-serializable for the summary: numpy scalars and arrays (what a training loop naturally
    returns) become Python numbers and lists. Anything else JSON cannot hold fails here, naming the key — not later,
    in the summary writer, after training, with a bare TypeError."""

    def numpy_value(v: Any) -> Any:
        if isinstance(v, (np.generic, np.ndarray)):
            return v.tolist()
        raise TypeError(type(v).__name__)

    out = {}
    for key, value in values.items():
        try:
            out[key] = json.loads(json.dumps(value, default=numpy_value))
        except (TypeError, ValueError):
            raise TypeError(
                f"{what}: {key!r} is a {type(value).__name__}, which the run summary (JSON) cannot hold; "
                f"return numbers, strings, lists or dicts"
            ) from None
    return out


def run_custom(ctx: Any, fn: Callable) -> Any:
    """Run a user's ``@custom_train`` function; on the chief, then write the summary and set ``control/done``."""
    progress = ProgressReporter.for_task(ctx)
    helpers = Helpers(ctx=ctx, params=dict(ctx.spec.params), progress=progress)
    t0 = time.monotonic()
    log.info("%s: running custom train function %s", ctx.task_id, getattr(fn, "__qualname__", fn))
    result = fn(ctx, helpers)
    mine = progress.final()
    if ctx.is_chief:
        summary = loop_summary(ctx, progress.global_step, mine, t0)
        if isinstance(result, dict):
            summary.update(jsonable(result, "the custom train function's result"))
        summary.update(jsonable(helpers.summary_extra, "helpers.summary_extra"))
        write_summary(ctx, summary)
        ctx.kv.put(DONE_KEY, "1")
    return result
