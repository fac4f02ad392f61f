"""A ParameterServerStrategy worker's share staged on its own disk, so TF ops on that worker's server read it.

Why: a PSS ``dataset_fn`` is traced once on the chief and the same graph runs on every worker server (TF passes
``input_pipeline_id`` 0 to all of them), where no Python runs and TF 2.21 reads neither ``hdfs://`` nor Parquet/ORC.
So tfyarn's own process on each worker — the one that hosts the worker's TF server — reads *its* share with the
feeder (any source, any fsspec URL, the exact equal-steps plan) and writes it as local TFRecord files, one per epoch,
at a path relative to its working directory (:func:`epoch_path`): the same relative path in the one traced graph
names each worker's own share on each worker.

One record per batch: the feeder's batch, each column a serialized ``TensorProto`` (bit for bit what the feeder
gives; a variable-length column as its three sparse parts), the columns together a serialized string tensor.
:func:`decode` turns it back with TF ops only. Epoch 0 is staged before the worker's program starts (its server
cannot serve a dataset before), the others behind it in a thread; the TF side waits for an epoch's file (renamed
into place when complete), so a slow writer delays a step but never shortens an epoch. Disk: every epoch's share
stays (a ``repeat()`` reads them again), in serialized batches about the size of the share's raw columns.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from tfyarn.data.tfrecord import encode_record

log = logging.getLogger(__name__)

#: the staging directory, relative to the worker process's working directory (its YARN container or task dir)
STAGE_DIR = ".tfyarn-share"
#: how often the TF side looks for an epoch's file that is not there yet
POLL_US = 50_000


def epoch_path(epoch: int, root: str = STAGE_DIR) -> str:
    """Where a worker stages ``epoch`` (relative: each worker's own directory)."""
    return f"{root}/epoch-{epoch:05d}.tfrecord"


def columns(features: dict[str, Any]) -> list[tuple[str, bool]]:
    """(name, sparse) of each feature in record order: a variable-length feature without ``pad_to`` is three parts."""
    return [(n, bool(f.varlen and f.pad_to is None)) for n, f in sorted(features.items())]


def dims(f: Any) -> tuple[int, ...]:
    """A dense feature's dimensions after the batch (a padded variable-length one: ``(pad_to,)``)."""
    return (f.pad_to,) if f.varlen else tuple(f.shape)


def serialize(batch: dict[str, Any], cols: list[tuple[str, bool]]) -> bytes:
    """One feeder batch as one record (TF's own encoding: :func:`decode` reads it with TF ops)."""
    from tensorflow import make_tensor_proto

    parts: list[bytes] = []
    for name, sparse in cols:
        v = batch[name]
        arrays = (v.indices, v.values, v.dense_shape) if sparse else (v,)
        parts.extend(make_tensor_proto(a).SerializeToString() for a in arrays)
    return make_tensor_proto(parts).SerializeToString()


def decode(record: Any, features: dict[str, Any], batch_size: int, dtype_of: Any) -> dict[str, Any]:
    """TF ops: a staged record back into the batch's tensors (dense ``[B, ...]``, sparse ``[B, None]``)."""
    import tensorflow as tf

    parts = tf.io.parse_tensor(record, tf.string)
    out, i = {}, 0
    for name, sparse in columns(features):
        f, dt = features[name], dtype_of(features[name].dtype)
        if sparse:
            sp = tf.SparseTensor(*(tf.io.parse_tensor(parts[i + k], t) for k, t in enumerate((tf.int64, dt, tf.int64))))
            sp.indices.set_shape([None, 2])
            sp.values.set_shape([None])
            sp.dense_shape.set_shape([2])
            sp.set_shape([batch_size, None])
            out[name] = sp
            i += 3
        else:
            out[name] = tf.ensure_shape(tf.io.parse_tensor(parts[i], dt), (batch_size, *dims(f)))
            i += 1
    return out


def epoch_records(epoch: int, wait_s: float) -> Any:
    """TF ops: the records of a staged epoch, once its file is there (looked for every :data:`POLL_US`, at most
    ``wait_s``); a file that does not come fails the dataset saying where it was looked for and who writes it."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops.testing import sleep

    path = epoch_path(epoch)
    polls = max(1, int(wait_s * 1e6 / POLL_US))
    tries = tf.data.Dataset.range(1).concatenate(tf.data.Dataset.range(polls).apply(sleep(POLL_US)))

    # the pattern depends on the element (an empty suffix), or graph optimisation folds the look-up into one
    # constant taken when the iterator is made, and a file staged later is never seen
    def present(i: Any) -> Any:
        pattern = tf.strings.join([path, tf.strings.substr(tf.strings.as_string(i), 0, 0)])
        return tf.size(tf.io.matching_files(pattern)) > 0

    found = tries.map(present).filter(lambda ok: ok).take(1)
    why = (
        f"tfyarn: {path} (the share staged for epoch {epoch}) is not in the working directory of the TF server "
        f"running this dataset after {wait_s:g}s: train_dataset(worker=...) reads the share that the tfyarn "
        "process of a ParameterServerStrategy worker stages (mode: ps, entrypoint:, data.train set); elsewhere "
        "call tfyarn.data.tf_dataset.stage() first"
    )

    def checked(ok: Any) -> Any:
        with tf.control_dependencies([tf.debugging.Assert(ok, [why])]):
            return tf.constant(path)

    first = found.concatenate(tf.data.Dataset.from_tensors(False)).take(1)
    return first.map(checked).flat_map(tf.data.TFRecordDataset)


class Stager:
    """Writes a worker's share epoch by epoch (:func:`epoch_path`), from ``feeder`` (this worker's rank)."""

    def __init__(self, feeder: Any, features: dict[str, Any], epochs: int, root: str = STAGE_DIR):
        self.feeder, self.epochs, self.root = feeder, epochs, root
        self.cols = columns(features)
        self.written: dict[int, int] = {}  # epoch -> batches staged
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write_epoch(self, epoch: int) -> int:
        """Stage one epoch: every planned batch, into a temporary file renamed into place when complete."""
        os.makedirs(self.root, exist_ok=True)
        path = epoch_path(epoch, self.root)
        tmp = f"{path}.tmp"
        n, t0 = 0, time.monotonic()
        with open(tmp, "wb") as out:
            for batch in self.feeder.epoch(epoch):
                if self._stop.is_set():
                    return n
                out.write(encode_record(serialize(batch, self.cols)))
                n += 1
        os.replace(tmp, path)
        self.written[epoch] = n
        log.info("staged epoch %d: %d batches in %s (%.2fs)", epoch, n, path, time.monotonic() - t0)
        return n

    def start(self) -> "Stager":
        """Epoch 0 now (before the worker's server can be asked for it), the rest in a thread."""
        if self.epochs > 0:
            self.write_epoch(0)
        if self.epochs > 1:
            self._thread = threading.Thread(target=self._rest, name="tfyarn-stager", daemon=True)
            self._thread.start()
        return self

    def _rest(self) -> None:
        try:
            for e in range(1, self.epochs):
                if self._stop.is_set():
                    return
                self.write_epoch(e)
        except BaseException as exc:  # noqa: BLE001 - logged; the TF side then finds the epoch missing
            self.error = exc
            log.error("staging this worker's share failed: %s", exc)
        finally:
            self.feeder.close()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        self._stop.set()
        self.join(10.0)
        self.feeder.close()
