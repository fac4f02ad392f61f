"""TF event files (TensorBoard scalars) written locally and mirrored to the checkpoint dir through fsspec.

Why: TF 2.21 cannot write ``hdfs://`` (tensorflow-io does not load), so event files are written locally and copied up
whole under a temporary name, then renamed: the TensorBoard role never sees a torn file. Layout:
``<checkpoint dir>/<run>/events.out.tfevents...``, ``run`` = ``train`` (the chief's history) or ``eval``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

from tfyarn.data.tfrecord import encode_record
from tfyarn.common.fsio import replace
from tfyarn.common.fsretry import retry

log = logging.getLogger("tfyarn.train.events")

#: Scalars by name; a None value is left out (a point that lacks that figure).
Scalars = Mapping[str, float | None]


def fs_path(url: str | None, sub: str = "") -> tuple[Any, str]:
    """(fsspec filesystem of ``url``, the path of ``sub`` under it; without ``sub``, of ``url`` itself); for no
    ``url``, (None, "")."""
    import fsspec

    if not url:
        return None, ""
    fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
    return fs, f"{root.rstrip('/')}/{sub}" if sub else root.rstrip("/")


def upload_file(fs: Any, local: Path, remote: str) -> None:
    """Copy ``local`` to ``remote`` under a temporary name, then rename over the old copy (retried: fsretry)."""
    retry(lambda: _upload_file(fs, local, remote), "upload to", remote)


def _upload_file(fs: Any, local: Path, remote: str) -> None:
    parent = remote.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex[:8]}-{local.name}"
    fs.put_file(str(local), tmp)
    replace(fs, tmp, remote)


def scalar_event(step: int, values: Scalars, wall_time: float | None = None) -> bytes:
    """One serialized ``Event`` holding ``values`` as scalars in TensorBoard's "scalars" plugin format (what
    ``tf.summary.scalar`` writes: a float tensor with the plugin's metadata), built from TF's protos alone."""
    from tensorflow.core.framework import summary_pb2, tensor_pb2, types_pb2
    from tensorflow.core.util import event_pb2

    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR,
    )
    summary = summary_pb2.Summary(
        value=[
            summary_pb2.Summary.Value(
                tag=name, metadata=meta, tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[float(v)])
            )
            for name, v in values.items()
            if v is not None
        ]
    )
    return event_pb2.Event(
        wall_time=time.time() if wall_time is None else wall_time, step=int(step), summary=summary
    ).SerializeToString()


class EventWriter:
    """``scalars(step, {name: value})`` into a local event file; ``sync()`` uploads changed files to ``url/run``.

    The records are TF's ``Event`` protos framed as TFRecords, written by tfyarn itself rather than by
    ``tf.summary``: ``tf.summary.scalar`` lives in the ``tensorboard`` package (no longer installed with TF), and a
    summary op cannot run where the ps chief's finalized training graph is the default one, nor off the main thread.
    Calls are serialised by a lock, so a background thread may sync while another writes.
    """

    def __init__(self, url: str | None, run: str, local_dir: Path):
        self.local = Path(local_dir) / run
        self.local.mkdir(parents=True, exist_ok=True)
        self.path = self.local / (
            f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}.v2"
        )
        self._lock = threading.Lock()
        from tensorflow.core.util import event_pb2

        version = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        self._file = open(self.path, "ab")
        self._file.write(encode_record(version.SerializeToString()))
        self._file.flush()
        self.fs, self.remote = fs_path(url, run)
        self._sizes: dict[str, int] = {}

    def scalars(self, step: int, values: Scalars, wall_time: float | None = None) -> None:
        record = encode_record(scalar_event(step, values, wall_time))
        with self._lock:
            if self._file.closed:
                return
            self._file.write(record)
            self._file.flush()

    def sync(self) -> int:
        """Upload event files that grew since the last sync; returns how many were uploaded."""
        if self.fs is None:
            return 0
        with self._lock:
            n = 0
            for f in sorted(self.local.glob("events.out.tfevents.*")):
                size = f.stat().st_size
                if self._sizes.get(f.name) != size:
                    upload_file(self.fs, f, f"{self.remote}/{f.name}")
                    self._sizes[f.name] = size
                    n += 1
            return n

    def close(self) -> None:
        with self._lock:
            self._file.close()
        try:
            self.sync()
        except OSError as exc:
            log.warning("could not upload event files to %s: %s", self.remote, exc)
