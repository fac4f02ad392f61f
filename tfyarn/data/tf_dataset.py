"""This worker's equal-steps share of ``data.train`` as a ``tf.data.Dataset``, for a user's own training program
(``entrypoint:``): ``tfyarn.data.train_dataset()`` and ``tfyarn.data.steps_per_epoch()``.

Why: a MultiWorkerMirroredStrategy ``fit`` or custom loop over per-worker file shards hangs at an epoch's end when one
worker has a batch more than another (the seeds' failure; TensorFlowOnSpark's Keras examples stop at 90 % of the
steps to dodge it). Here every worker gets the planner's share (:mod:`tfyarn.data.planner`): the same number of full
batches on every worker, so ``fit(epochs=data.epochs, steps_per_epoch=steps_per_epoch())`` ends together everywhere.

Two ways to read the share:

* default: tfyarn's feeder (any fsspec URL, CRC checks, the C parser) behind ``from_generator`` — for a program
  whose input pipeline runs in its own Python (MWMS, custom loops);
* ``worker=N`` (a ParameterServerStrategy ``dataset_fn``, traced once on the chief and run on every worker server,
  where Python cannot run): TF ops over the share that tfyarn's process on that worker staged on its own disk with
  the feeder (:mod:`staging`, :func:`stage`) — so any source and any filesystem (``hdfs://``, Parquet, ORC, GZIP
  TFRecords), the same batches as the feeder's, and TF reads only local bytes.

The runtime binds the job's data and this task's rank (:func:`bind`) before the program starts; TF is imported only
when a dataset is made. The feeder's pipeline tells the runtime each batch it hands over (``on_batch``): what a
program that reports nothing itself took from ``train_dataset()`` is still known (the run report's "batches taken").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfyarn.data import staging
from tfyarn.data.errors import NoDataError
from tfyarn.data.feeder import Feeder
from tfyarn.data.manifest import section_manifest
from tfyarn.data.planner import plan
from tfyarn.data.ragged import SparseValue


@dataclass
class _Binding:
    data: Any  # the spec's Data section (resolved URLs)
    rank: int  # this task's share (-1: none)
    num_workers: int  # shares of each epoch
    cache_dir: str | None
    wait_s: float = 900.0  # how long a worker's dataset waits for a staged epoch (timeouts.stall)
    manifest: Any = None
    on_batch: Callable[[int, int], None] | None = None  # (epoch, examples) of each batch the feeder pipeline yields


_BOUND: _Binding | None = None


def bind(
    data: Any,
    rank: int,
    num_workers: int,
    cache_dir: str | None = None,
    on_batch: Callable[[int, int], None] | None = None,
    wait_s: float = 900.0,
) -> None:
    """Called by the runtime in each task of an entrypoint job, before the user's program runs: ``num_workers``
    shares, this task's is ``rank`` (-1: none; in mode ps the shares are the workers', the chief coordinates);
    ``on_batch(epoch, examples)`` is called for each batch this task's feeder pipeline yields; ``wait_s``: how long
    a worker's staged epoch may keep its dataset waiting (``timeouts.stall``)."""
    global _BOUND
    _BOUND = _Binding(data, rank, num_workers, cache_dir, wait_s, on_batch=on_batch)


def planned_batches() -> int | None:
    """Batches :func:`train_dataset` holds for every epoch of ``data.epochs`` (None: no data bound, or its manifest
    was never built here: this task made no dataset, and the run report must not index the data for it)."""
    b = _BOUND
    if b is None or not b.data.train or b.manifest is None:
        return None
    return sum(n for _, n in _steps(b, None))


def _bound() -> _Binding:
    if _BOUND is None:
        raise RuntimeError(
            "tfyarn.data.train_dataset()/steps_per_epoch() work inside a task of a tfyarn job with "
            "'entrypoint:' (the runtime tells them the job's data and this worker's share)"
        )
    if not _BOUND.data.train:
        raise NoDataError("this job's spec has no data.train: add a data: section to use tfyarn's data share")
    return _BOUND


def _manifest(b: _Binding) -> Any:
    """The manifest of ``data.train`` (indexes cached, so a second task or run reads no data to build it)."""
    if b.manifest is None:
        b.manifest = section_manifest(b.data.train, b.data, b.cache_dir)
    return b.manifest


def steps_per_epoch(epoch: int | None = None) -> int:
    """Planned steps of ``epoch`` (the same on every worker); None: the fewest of any epoch, which is what
    ``fit(steps_per_epoch=...)`` takes (:func:`train_dataset` then holds exactly ``epochs x`` that many batches)."""
    b = _bound()
    epochs = [epoch] if epoch is not None else range(b.data.epochs)
    return min(plan(_manifest(b), b.num_workers, e, b.data.shuffle_seed, b.data.batch_size).steps for e in epochs)


def _steps(b: _Binding, epoch: int | None) -> list[tuple[int, int]]:
    """(epoch, steps) pairs the dataset yields, in order."""
    if epoch is not None:
        return [(int(epoch), steps_per_epoch(epoch))]
    n = steps_per_epoch()
    return [(e, n) for e in range(b.data.epochs)]


def train_dataset(epoch: int | None = None, worker: int | None = None) -> Any:
    """This worker's share as a ``tf.data.Dataset`` of ready batches, ``(features, label)`` when the spec has a label
    (else the feature dict), with exactly the planned number of steps (its cardinality says so).

    ``epoch``: that epoch's share only; None: every epoch of ``data.epochs``, each cut to :func:`steps_per_epoch`.
    ``worker``: TF ops only, for a ParameterServerStrategy ``dataset_fn`` (pass ``input_context.input_pipeline_id``):
    the share staged on the worker server that runs the traced function — worker N's server reads worker N's share
    (TF runs one traced ``dataset_fn`` on every worker and passes them all pipeline id 0, so the share cannot be
    chosen by the id); default: this task's share through tfyarn's feeder."""
    b = _bound()
    plan_steps = _steps(b, epoch)
    if worker is not None:
        ds = _tf_pipeline(b, plan_steps, int(worker))
    else:
        if b.rank < 0:
            raise RuntimeError(
                "this task has no share of data.train (in mode ps the shares are the workers': build "
                "the dataset in a ParameterServerStrategy dataset_fn with "
                "worker=input_context.input_pipeline_id)"
            )
        ds = _feeder_pipeline(b, plan_steps)
    import tensorflow as tf

    opts = tf.data.Options()  # already this worker's share: a strategy must not shard it again
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.apply(tf.data.experimental.assert_cardinality(sum(n for _, n in plan_steps))).with_options(opts)


def _signature(b: _Binding) -> dict[str, Any]:
    """The batch's TypeSpecs: a variable-length feature is a SparseTensorSpec [B, None] (dense [B, N] with
    ``pad_to``), as tfyarn's own loops give it (``tfyarn.train.inputs``, a floor above this one)."""
    import tensorflow as tf

    d, out = b.data, {}
    for n, f in d.features.items():
        if f.varlen and f.pad_to is None:
            out[n] = tf.SparseTensorSpec([d.batch_size, None], _tf_dtype(f.dtype))
        else:
            out[n] = tf.TensorSpec((d.batch_size, *staging.dims(f)), _tf_dtype(f.dtype), name=n)
    return out


def _tf_values(batch: dict[str, Any]) -> dict[str, Any]:
    """A feeder batch for ``from_generator``: a variable-length column's SparseValue as TF's
    SparseTensorValue (what a SparseTensorSpec element is fed as)."""
    import tensorflow as tf

    return {k: tf.compat.v1.SparseTensorValue(*v) if isinstance(v, SparseValue) else v for k, v in batch.items()}


def _tf_dtype(name: str) -> Any:
    import tensorflow as tf

    return tf.string if name == "bytes" else tf.as_dtype(name)


def _split(label: str | None) -> Callable[[dict[str, Any]], Any]:
    if label is None:
        return lambda batch: batch
    return lambda batch: ({k: v for k, v in batch.items() if k != label}, batch[label])


def _feeder_pipeline(b: _Binding, plan_steps: list[tuple[int, int]]) -> Any:
    import tensorflow as tf

    d = b.data

    def batches() -> Any:
        with Feeder.for_data(_manifest(b), d, b.rank, b.num_workers) as feeder:
            for e, n in plan_steps:
                for i, batch in enumerate(feeder.epoch(e)):
                    if i >= n:
                        break
                    if b.on_batch is not None:
                        b.on_batch(e, d.batch_size)
                    yield _tf_values(batch)

    ds = tf.data.Dataset.from_generator(batches, output_signature=_signature(b))
    return ds.map(_split(d.label)).prefetch(2)


def _tf_pipeline(b: _Binding, plan_steps: list[tuple[int, int]], worker: int) -> Any:
    """TF ops only: the share staged on the server that runs this graph (:mod:`staging`), each epoch cut to its
    planned steps, decoded into the feeder's batches."""

    d = b.data
    if not 0 <= worker < b.num_workers:
        raise ValueError(f"worker={worker}: the job has {b.num_workers} training workers")
    # epoch 0 is staged before the worker's program starts; a later one may still be being written
    parts = [staging.epoch_records(e, 2.0 if e == 0 else float(b.wait_s)).take(n) for e, n in plan_steps]
    ds = functools.reduce(lambda a, p: a.concatenate(p), parts)

    def decode(record: Any) -> Any:
        return staging.decode(record, dict(d.features), d.batch_size, _tf_dtype)

    return ds.map(decode).map(_split(d.label)).prefetch(2)


def stage(worker: int | None = None) -> Any:
    """Stage this worker's share for ``train_dataset(worker=...)`` (:mod:`staging`), in this process's working
    directory: what tfyarn's process on a ParameterServerStrategy worker does before the program starts its server.
    Returns the :class:`staging.Stager` (epoch 0 written, the rest being written)."""

    b = _bound()
    rank = b.rank if worker is None else int(worker)
    if not 0 <= rank < b.num_workers:
        raise ValueError(f"worker {rank}: the job has {b.num_workers} training workers")
    feeder = Feeder.for_data(_manifest(b), b.data, rank, b.num_workers)
    return staging.Stager(feeder, dict(b.data.features), b.data.epochs).start()
