"""TF event files (TensorBoard scalars) written locally and mirrored to the checkpoint dir through fsspec.

Why: TF 2.21 cannot write ``hdfs://`` (no HDFS filesystem in TF, tensorflow-io does not load), so summaries are
written to local disk by ``tf.summary`` and copied up whole, under a temporary name then renamed, so a reader (the
TensorBoard role) never sees a torn file. Layout: ``<checkpoint dir>/<run>/events.out.tfevents...`` with ``run`` =
``train`` (chief) or ``eval`` (evaluator), which TensorBoard shows as two runs.
"""
from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any, Mapping

from tfyarn.fsio import replace

log = logging.getLogger("tfyarn.train.events")


def upload_file(fs: Any, local: Path, remote: str) -> None:
    """Copy ``local`` to ``remote`` under a temporary name, then rename over the old copy."""
    parent = remote.rsplit("/", 1)[0]
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex[:8]}-{local.name}"
    fs.put_file(str(local), tmp)
    replace(fs, tmp, remote)


def _scalar_metadata() -> Any:
    from tensorflow.core.framework import summary_pb2
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR)


class EventWriter:
    """``scalars(step, {name: value})`` into a local event file; ``sync()`` uploads changed files to ``url/run``."""

    def __init__(self, url: str | None, run: str, local_dir: Path):
        import tensorflow as tf
        self.local = Path(local_dir) / run
        self.local.mkdir(parents=True, exist_ok=True)
        self.writer = tf.summary.create_file_writer(str(self.local))
        self.fs = self.remote = None
        if url:
            import fsspec
            self.fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
            self.remote = f"{root.rstrip('/')}/{run}"
        self._sizes: dict[str, int] = {}

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Scalars in TensorBoard's "scalars" plugin format, written with TF core only.

        ``tf.summary.scalar`` lives in the ``tensorboard`` package, which TF no longer installs; training must not
        depend on it, so the summary is written with ``tf.summary.write`` and the plugin metadata TensorBoard expects.
        """
        import tensorflow as tf
        with self.writer.as_default():
            for name, v in values.items():
                if v is not None:
                    tf.summary.write(name, tf.constant(float(v), tf.float32), step=int(step),
                                     metadata=_scalar_metadata())
        self.writer.flush()

    def sync(self) -> int:
        """Upload event files that grew since the last sync; returns how many were uploaded."""
        if self.fs is None:
            return 0
        self.writer.flush()
        self.fs.makedirs(self.remote, exist_ok=True)
        n = 0
        for f in sorted(self.local.glob("events.out.tfevents.*")):
            size = f.stat().st_size
            if self._sizes.get(f.name) != size:
                upload_file(self.fs, f, f"{self.remote}/{f.name}")
                self._sizes[f.name] = size
                n += 1
        return n

    def close(self) -> None:
        self.writer.close()
        try:
            self.sync()
        except OSError as exc:
            log.warning("could not upload event files to %s: %s", self.remote, exc)
