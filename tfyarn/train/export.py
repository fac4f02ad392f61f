"""The trained model as a SavedModel, in TF Serving's layout: ``<export.dir>/<global step>/saved_model.pb`` + variables.

* **From a committed checkpoint**, never from live variables: the export is exactly a checkpoint's model, and one
  code path serves both modes' checkpoint formats by restoring by creation order
  (:func:`tfyarn.train.checkpoint.restore_model_variables`). ``tfyarn export SPEC`` re-exports one later.
* **The serving signature is the spec's features**: ``serving_default`` takes every ``data.features`` entry but the
  label, with a free batch dimension, and returns ``{"predictions": ...}`` (or the model's own dict). A
  variable-length feature ``h`` is taken as ``h_indices``, ``h_values``, ``h_dense_shape`` (``tfyarn.train.inputs``).
* **Atomic on any fsspec URL**: TF writes locally (TF 2.21 has no ``hdfs://``); the files go up under
  ``.tmp-<id>-<version>/``, renamed to ``<version>`` once complete, so a model server watching ``export.dir`` never
  loads a half-written version. The newest ``export.keep`` versions are kept.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tfyarn.errors import ExportError
from tfyarn.train.checkpoint import (
    CheckpointStore,
    KeptDir,
    download_model_checkpoint,
    has_checkpoint_files,
    restore_model_variables,
)
from tfyarn.train.inputs import from_serving, serving_signature
from tfyarn.train.model import build_model, load_model

log = logging.getLogger("tfyarn.train.export")

SIGNATURE = "serving_default"


def serving_module(model: Any, features: dict[str, Any], label: str | None) -> tuple[Any, Any]:
    """A ``tf.Module`` tracking the built ``model``'s variables, and its serving function (a concrete function)."""
    import tensorflow as tf

    inputs = serving_signature(features, label)  # a sparse feature: <name>_indices, _values, _dense_shape
    if not inputs:
        raise ValueError("export: the model has no input features (data.features holds only the label)")
    module = tf.Module()
    module.model_variables = list(model.variables)  # tracked: saved with the module

    @tf.function(input_signature=[inputs])
    def serve(feats):
        out = model(from_serving(feats, features, label), training=False)
        return dict(out) if isinstance(out, dict) else {"predictions": out}

    module.serve = serve
    return module, serve.get_concrete_function()


def write_saved_model(spec: Any, prefix: str, keys: list[str], local_dir: Path, what: str) -> Path:
    """Build the spec's model eagerly, restore it from the local checkpoint ``prefix`` and write a SavedModel."""
    import tensorflow as tf

    model = build_model(load_model(spec))
    restore_model_variables(model.variables, prefix, keys, what)
    module, fn = serving_module(model, dict(spec.data.features), spec.data.label)
    if local_dir.exists():
        shutil.rmtree(local_dir)
    tf.saved_model.save(module, str(local_dir), signatures={SIGNATURE: fn})
    return local_dir


class ExportStore(KeptDir):
    """Numbered SavedModel versions under one fsspec URL: upload (temp dir, rename), list, prune to ``keep``."""

    def versions(self) -> list[int]:
        """Committed versions, oldest first (names that are not numbers, such as ``.tmp-*``, are not versions)."""
        if not self.fs.exists(self.root):
            return []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        return sorted(int(n) for n in names if n.isdigit())

    def upload(self, local_dir: Path, version: int) -> str:
        """Copy ``local_dir`` up as ``<version>`` (replacing an existing one) and prune; returns its URL."""
        tmp = f"{self.root}/.tmp-{uuid.uuid4().hex[:8]}-{version}"
        final = f"{self.root}/{version}"
        try:
            for f in sorted(p for p in Path(local_dir).rglob("*") if p.is_file()):
                dst = f"{tmp}/{f.relative_to(local_dir).as_posix()}"
                self.fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
                self.fs.put_file(str(f), dst)
        except BaseException:
            try:  # a failed upload leaves no half version behind (on HDFS: its blocks)
                if self.fs.exists(tmp):
                    self.fs.rm(tmp, recursive=True)
            except Exception as exc:  # noqa: BLE001 - the upload's own error is the one to report
                log.warning("could not remove the partial export %s: %s", tmp, exc)
            raise
        if self.fs.exists(final):  # a re-export of the same step: the new copy wins
            self.fs.rm(final, recursive=True)
        self.fs.mv(tmp, final, recursive=True)
        for old in self.versions()[: -self.keep]:
            if old != version:  # an older checkpoint re-exported on purpose is not pruned at once
                self.fs.rm(f"{self.root}/{old}", recursive=True)
        return f"{self.url}/{version}"


def export_checkpoint(
    spec: Any,
    entry: dict[str, Any] | None = None,
    scratch: str | Path | None = None,
    to: str | None = None,
    local_prefix: str | None = None,
) -> dict[str, Any]:
    """Export a committed checkpoint of ``checkpoint.dir`` (``entry``; default the latest) to ``to`` (default
    ``export.dir``). Returns ``{"url", "version", "checkpoint", "seconds", "downloaded"}``.

    ``local_prefix``: the chief's local copy of ``entry``, read (when its files are still there) instead of
    downloading the checkpoint again, the largest part of an export on HDFS."""

    if not spec.checkpoint.dir:
        raise ExportError("export: the spec has no checkpoint.dir to export from")
    dest = to or (spec.export.dir if spec.export else None)
    if not dest:
        raise ExportError("export: no destination: set export.dir in the spec or pass --to URL")
    t0 = time.monotonic()
    store = CheckpointStore(spec.checkpoint.dir, keep=spec.checkpoint.keep)
    with tempfile.TemporaryDirectory(prefix="tfyarn-export-", dir=scratch) as tmp:
        local = bool(entry and local_prefix and entry.get("model_variables") and has_checkpoint_files(local_prefix))
        if local and entry is not None:
            prefix, keys = str(local_prefix), list(entry["model_variables"])
        else:
            prefix, entry, keys = download_model_checkpoint(store, Path(tmp) / "ckpt", "export", entry)
        saved = write_saved_model(spec, prefix, keys, Path(tmp) / "saved_model", f"{entry['name']} in {store.url}")
        url = ExportStore(dest, keep=spec.export.keep if spec.export else 3).upload(saved, int(entry["global_step"]))
    secs = time.monotonic() - t0
    log.info(
        "exported %s (global step %d) as a SavedModel to %s in %.2fs (%s)",
        entry["name"],
        entry["global_step"],
        url,
        secs,
        "from the local copy" if local else "downloaded",
    )
    return {
        "url": url,
        "version": int(entry["global_step"]),
        "checkpoint": entry["name"],
        "seconds": round(secs, 3),
        "downloaded": not local,
    }


def export_at_end(ctx: Any, committed: tuple[dict[str, Any], str] | None = None) -> dict[str, Any] | None:
    """The chief, after the final checkpoint of a successful run: export it when the spec has ``export``, from the
    local files of ``committed`` (index entry, local prefix) or else the latest committed checkpoint downloaded. A
    failed export fails the task (a pipeline's next step expects the model); ``tfyarn export SPEC`` can redo it."""
    if ctx.spec.export is None:
        return None

    entry, local_prefix = committed or (None, None)
    try:
        # in a thread of its own: the ps chief finishes inside its finalized training graph, and a SavedModel needs
        # eager execution; TF's default graph is per thread, so a fresh thread is eager whatever the caller's graph
        with ThreadPoolExecutor(1, thread_name_prefix="tfyarn-export") as pool:
            return pool.submit(
                export_checkpoint, ctx.spec, entry, scratch=ctx.workdir, local_prefix=local_prefix
            ).result()
    except Exception as exc:
        raise RuntimeError(
            f"{ctx.task_id}: training finished and its final checkpoint is committed, but the export "
            f"to {ctx.spec.export.dir} failed: {type(exc).__name__}: {exc} "
            f"(retry with: tfyarn export SPEC)"
        ) from exc
