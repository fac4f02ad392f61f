"""This worker's equal-steps share of ``data.train`` as a ``tf.data.Dataset``, for a user's own training program
(``entrypoint:``): ``tfyarn.data.train_dataset()`` and ``tfyarn.data.steps_per_epoch()``.

Why: a MultiWorkerMirroredStrategy ``fit`` or custom loop over per-worker file shards hangs at an epoch's end when one
worker has a batch more than another (the seeds' failure; TensorFlowOnSpark's Keras examples stop at 90 % of the
steps to dodge it). Here every worker gets the planner's share (:mod:`tfyarn.data.planner`): the same number of full
batches on every worker, so ``fit(epochs=data.epochs, steps_per_epoch=steps_per_epoch())`` ends together everywhere.

Two ways to read the share:

* default: tfyarn's feeder (any fsspec URL, CRC checks, the C parser) behind ``from_generator`` — for a program
  whose input pipeline runs in its own Python (MWMS, custom loops);
* ``worker=N`` (a ParameterServerStrategy ``dataset_fn``, which runs on bare TF servers where Python cannot):
  a pure-TF pipeline of ``TFRecordDataset`` record ranges + ``tf.io.parse_example`` — paths TF itself can read.

The runtime binds the job's data and this task's rank (:func:`bind`) before the program starts; TF is imported only
when a dataset is made. The feeder's pipeline tells the runtime each batch it hands over (``on_batch``): what a
program that reports nothing itself took from ``train_dataset()`` is still known (the run report's "batches taken").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfyarn.data.errors import NoDataError


@dataclass
class _Binding:
    data: Any  # the spec's Data section (resolved URLs)
    rank: int  # this task's share (-1: none)
    num_workers: int  # shares of each epoch
    cache_dir: str | None
    manifest: Any = None
    on_batch: Callable[[int, int], None] | None = None  # (epoch, examples) of each batch the feeder pipeline yields


_BOUND: _Binding | None = None


def bind(
    data: Any,
    rank: int,
    num_workers: int,
    cache_dir: str | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> None:
    """Called by the runtime in each task of an entrypoint job, before the user's program runs: ``num_workers``
    shares, this task's is ``rank`` (-1: none; in mode ps the shares are the workers', the chief coordinates);
    ``on_batch(epoch, examples)`` is called for each batch this task's feeder pipeline yields."""
    global _BOUND
    _BOUND = _Binding(data, rank, num_workers, cache_dir, on_batch=on_batch)


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
        from tfyarn.data.manifest import build_manifest

        d = b.data
        b.manifest = build_manifest(
            list(d.train), compression=d.compression, on_corrupt=d.on_corrupt, cache_dir=b.cache_dir, whole=True
        )
    return b.manifest


def _plan(b: _Binding, epoch: int) -> Any:
    from tfyarn.data.planner import plan

    return plan(_manifest(b), b.num_workers, epoch, b.data.shuffle_seed, b.data.batch_size)


def steps_per_epoch(epoch: int | None = None) -> int:
    """Planned steps of ``epoch`` (the same on every worker); None: the fewest of any epoch, which is what
    ``fit(steps_per_epoch=...)`` takes (:func:`train_dataset` then holds exactly ``epochs x`` that many batches)."""
    b = _bound()
    epochs = [epoch] if epoch is not None else list(range(b.data.epochs))
    return min(int(_plan(b, e).steps) for e in epochs)


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
    ``worker``: read that worker's share with a pure-TF pipeline (a ParameterServerStrategy ``dataset_fn``: pass
    ``input_context.input_pipeline_id``); default: this task's share through tfyarn's feeder."""
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
            out[n] = tf.TensorSpec((d.batch_size, *_dims(f)), _tf_dtype(f.dtype), name=n)
    return out


def _dims(f: Any) -> tuple[int, ...]:
    """A dense feature's dimensions after the batch (a padded variable-length one: ``(pad_to,)``)."""
    return (f.pad_to,) if f.varlen else tuple(f.shape)


def _tf_values(batch: dict[str, Any]) -> dict[str, Any]:
    """A feeder batch for ``from_generator``: a variable-length column's SparseValue as TF's
    SparseTensorValue (what a SparseTensorSpec element is fed as)."""
    import tensorflow as tf

    from tfyarn.data.ragged import SparseValue

    return {k: tf.compat.v1.SparseTensorValue(*v) if isinstance(v, SparseValue) else v for k, v in batch.items()}


def _tf_dtype(name: str) -> Any:
    import tensorflow as tf

    return tf.string if name == "bytes" else tf.as_dtype(name)


def _split(label: str | None) -> Callable[[dict[str, Any]], Any]:
    def split(batch: dict[str, Any]) -> Any:
        if label is None:
            return batch
        feats = {k: v for k, v in batch.items() if k != label}
        return feats, batch[label]

    return split


def _feeder_pipeline(b: _Binding, plan_steps: list[tuple[int, int]]) -> Any:
    import tensorflow as tf

    from tfyarn.data.feeder import Feeder

    d = b.data

    def batches() -> Any:
        feeder = Feeder(
            _manifest(b),
            dict(d.features),
            d.batch_size,
            b.rank,
            b.num_workers,
            seed=d.shuffle_seed,
            shuffle_buffer=d.shuffle_buffer,
            prefetch=d.prefetch,
            on_corrupt=d.on_corrupt,
        )
        with feeder:
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
    """TFRecord record ranges of ``worker``'s share, batched and parsed by TF ops only."""
    import tensorflow as tf

    d = b.data
    if not 0 <= worker < b.num_workers:
        raise ValueError(f"worker={worker}: the job has {b.num_workers} training workers")
    spec = {n: _parse_spec(f) for n, f in d.features.items()}
    dtypes = {n: _tf_dtype(f.dtype) for n, f in d.features.items()}

    def parse(serialized: Any) -> Any:
        parsed = tf.io.parse_example(serialized, spec)
        out = {}
        for n, v in parsed.items():
            f = d.features[n]
            if f.varlen and f.pad_to is not None:  # dense [B, pad_to]: truncated, padded with default
                v = _pad(v, d.batch_size, f.pad_to, _default(f))
            if isinstance(v, tf.SparseTensor):  # [B, None] as the feeder's pipeline declares it
                out[n] = tf.SparseTensor(v.indices, tf.cast(v.values, dtypes[n]), v.dense_shape)
                out[n].set_shape([d.batch_size, None])
            else:
                out[n] = tf.cast(v, dtypes[n]) if v.dtype != dtypes[n] else v
        return out

    parts = []
    for e, n in plan_steps:
        ranges = _plan(b, e).shares[worker]
        records = None
        for r in ranges:
            gz = d.compression == "gzip" or (d.compression == "auto" and r.path.endswith(".gz"))
            one = tf.data.TFRecordDataset(r.path, compression_type="GZIP" if gz else "").skip(r.start).take(len(r))
            records = one if records is None else records.concatenate(one)
        if records is not None:
            parts.append(records.batch(d.batch_size, drop_remainder=True).take(n))
    ds = parts[0]
    for p in parts[1:]:
        ds = ds.concatenate(p)
    return ds.map(parse).map(_split(d.label)).prefetch(2)


def _wire(f: Any) -> Any:
    """The Example list a feature is stored in (int64, float or bytes)."""
    import tensorflow as tf

    return tf.int64 if "int" in f.dtype else tf.float32 if "float" in f.dtype else tf.string


def _default(f: Any) -> Any:
    """The spec's ``default`` (a padded list's filler: 0 or the empty string when not given)."""
    return f.default if f.default is not None else ("" if _wire(f).name == "string" else 0)


def _parse_spec(f: Any) -> Any:
    """TF's parse spec of a feature: a VarLenFeature for a variable-length list, else fixed (with the spec's
    ``default`` for a record that lacks it)."""
    import tensorflow as tf

    if f.varlen:
        return tf.io.VarLenFeature(_wire(f))
    if f.default is None:
        return tf.io.FixedLenFeature(f.shape, _wire(f))
    value = f.default if f.shape == () else [f.default] * int(f.size)
    return tf.io.FixedLenFeature(f.shape, _wire(f), default_value=value)


def _pad(sp: Any, batch: int, width: int, default: Any) -> Any:
    """A SparseTensor [batch, any] → dense [batch, width]: rows truncated or padded with ``default``."""
    import tensorflow as tf

    dense = tf.sparse.to_dense(sp, default_value=tf.constant(default, sp.dtype))[:, :width]
    padding = tf.fill([tf.shape(dense)[0], width - tf.shape(dense)[1]], tf.constant(default, sp.dtype))
    return tf.ensure_shape(tf.concat([dense, padding], 1), [batch, width])
