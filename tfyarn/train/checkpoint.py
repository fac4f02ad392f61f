"""Checkpoints on any fsspec URL (hdfs://, s3://, file://, a local path).

Why not TF's own writer: TF 2.21 has no hdfs:// filesystem (NOTES.md). So TF writes a checkpoint to local disk, and
:class:`CheckpointStore` uploads its files **under temporary names, then renames** them, and only then rewrites the
index file ``tfyarn-checkpoint.json`` (also temp + rename). A reader that follows the index therefore never sees a
half-uploaded checkpoint, whatever the filesystem; a crash mid-upload leaves only ``.tmp-*`` debris, cleaned later.

Layout under the URL::

    tfyarn-checkpoint.json     {"latest": "ckpt-120", "checkpoints": [{"name", "global_step", "time", ...meta}, ...]}
    ckpt-120.index, ckpt-120.data-00000-of-00001      (a TF checkpoint prefix, name-based or object-based)
    summary.json                                      (written at the end by the chief)

``meta`` carries what a restart or the evaluator needs: ``format`` (``"v1-saver"`` for ps mode: names are graph
variable names; ``"tf2-object"`` for allreduce), ``model_variables`` (checkpoint keys of ``model.variables`` in
creation order: :func:`restore_model_variables` uses them to load a ps-mode checkpoint into an eager model),
``worker_steps`` and ``epoch``.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tfyarn.fsio import replace, retry_vanished

log = logging.getLogger("tfyarn.train.checkpoint")

INDEX = "tfyarn-checkpoint.json"


class CheckpointStore:
    """Upload, list, prune and download checkpoints under one fsspec URL."""

    def __init__(self, url: str, keep: int = 3):
        import fsspec

        self.url = url.rstrip("/")
        self.keep = max(1, int(keep))
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.root = self.root.rstrip("/")

    def _p(self, name: str) -> str:
        return f"{self.root}/{name}"

    # -- index ------------------------------------------------------------------------------------------------------
    def index(self) -> dict[str, Any]:
        """The index (``{"latest": None, "checkpoints": []}`` when there is no checkpoint yet)."""
        p = self._p(INDEX)
        if not self.fs.exists(p):
            return {"latest": None, "checkpoints": []}

        def read() -> dict[str, Any]:
            with self.fs.open(p, "r") as f:
                return json.load(f)
        return retry_vanished(read)        # being replaced right now (a filesystem without an overwriting rename)

    def latest(self) -> dict[str, Any] | None:
        """The newest committed checkpoint's entry (name, global_step, time, meta...), or None."""
        idx = self.index()
        for entry in reversed(idx.get("checkpoints", [])):
            if entry["name"] == idx.get("latest"):
                return entry
        return None

    def _write_atomic(self, name: str, data: bytes) -> None:
        tmp = self._p(f".tmp-{uuid.uuid4().hex[:8]}-{name}")
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        replace(self.fs, tmp, self._p(name))

    # -- write ------------------------------------------------------------------------------------------------------
    def upload(self, local_prefix: str, global_step: int, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """Upload the files of the TF checkpoint ``local_prefix`` (``.../ckpt-120``), commit it in the index, prune.

        Returns the committed index entry. Files go up as ``.tmp-<id>-<file>`` and are renamed once all are up.
        """
        t0 = time.monotonic()
        local_prefix = str(local_prefix)
        name = os.path.basename(local_prefix)
        files = local_checkpoint_files(local_prefix)
        if not files:
            raise FileNotFoundError(f"no checkpoint files for prefix {local_prefix}")
        self.fs.makedirs(self.root, exist_ok=True)
        tag = uuid.uuid4().hex[:8]
        staged = []
        for f in files:
            tmp = self._p(f".tmp-{tag}-{f.name}")
            self.fs.put_file(str(f), tmp)
            staged.append((tmp, self._p(f.name)))
        for tmp, final in staged:
            replace(self.fs, tmp, final)
        entry = {"name": name, "global_step": int(global_step), "time": time.time(), **(meta or {})}
        idx = self.index()
        ckpts = [c for c in idx.get("checkpoints", []) if c["name"] != name] + [entry]
        removed, ckpts = ckpts[:-self.keep], ckpts[-self.keep:]
        self._write_atomic(INDEX, json.dumps({"latest": name, "checkpoints": ckpts}, indent=1).encode())
        for old in removed:
            self._delete(old["name"])
        self._clean_tmp(keep_tag=None)
        log.info("checkpoint %s (global step %d) uploaded to %s in %.2fs", name, global_step, self.url,
                 time.monotonic() - t0)
        return entry

    def _delete(self, name: str) -> None:
        for p in self.fs.glob(self._p(name + ".*")):
            try:
                self.fs.rm(p)
            except FileNotFoundError:
                pass

    def _clean_tmp(self, keep_tag: str | None) -> None:
        for p in self.fs.glob(self._p(".tmp-*")):
            try:
                self.fs.rm(p)
            except FileNotFoundError:
                pass

    # -- read -------------------------------------------------------------------------------------------------------
    def download(self, entry: dict[str, Any], local_dir: str | Path) -> str:
        """Copy the checkpoint ``entry`` into ``local_dir``; returns the local prefix to restore from."""
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        name = entry["name"]
        paths = self.fs.glob(self._p(name + ".*"))
        if not any(p.endswith(".index") for p in paths):
            raise FileNotFoundError(f"checkpoint {name} listed in {self.url}/{INDEX} but its files are missing")
        for p in paths:
            self.fs.get_file(p, str(local_dir / os.path.basename(p)))
        return str(local_dir / name)


class BackgroundUpload:
    """At most one checkpoint upload at a time, on its own thread, so the step loop does not wait for it.

    Why: a chief uploading inside its step loop stops stepping for as long as the upload takes, and in sync ps or
    allreduce mode every peer then waits on it; an upload longer than ``timeouts.step`` (a model of a few GB on a
    busy HDFS) failed the job with a step timeout. The local write stays in the loop (it reads the variables at
    that step); only the copy to the store runs beside training. A checkpoint is *due* again only once the previous
    upload has committed (no queue of uploads builds up behind a slow store), and an upload's failure is raised in
    the step loop at the next :meth:`ready`, failing the task as an inline upload would have.

    It also keeps the chief's local copies to one: the last committed checkpoint's files stay (the end-of-run export
    reads them instead of downloading the checkpoint again), the previous one's go (a Saver with
    ``write_state=False`` deletes none itself).
    """

    def __init__(self, store: CheckpointStore):
        self.store = store
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        #: (index entry, local prefix) of the last checkpoint committed, its local files kept
        self.committed: tuple[dict[str, Any], str] | None = None

    def busy(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def check(self) -> None:
        """Raise the last upload's failure (once)."""
        err, self._error = self._error, None
        if err is not None:
            raise err

    def ready(self) -> bool:
        """May a periodic checkpoint be written now? Raises the previous upload's failure (in the step loop); False
        while an upload is in flight (due again once it has committed)."""
        self.check()
        return not self.busy()

    def commit(self, prefix: str, global_step: int, meta: dict[str, Any], *, final: bool) -> dict[str, Any] | None:
        """Commit the local checkpoint ``prefix``: periodic, by starting its upload (None); final, by uploading it
        here and returning its index entry (the caller has :meth:`wait`-ed for the upload in flight)."""
        if not final:
            self.start(prefix, global_step, meta)
            return None
        entry = self.store.upload(prefix, global_step, meta)
        self._committed(entry, prefix)
        return entry

    def _committed(self, entry: dict[str, Any], prefix: str) -> None:
        if self.committed is not None and self.committed[1] != prefix:
            remove_checkpoint_files(self.committed[1])
        self.committed = (entry, prefix)

    def start(self, prefix: str, global_step: int, meta: dict[str, Any]) -> None:
        """Upload ``prefix`` as ``global_step`` on the upload thread (:attr:`committed` names it once the index does).
        The caller makes sure no upload is in flight (:meth:`ready`, :meth:`wait`)."""
        self.check()
        if self.busy():
            raise RuntimeError("a checkpoint upload is already in flight")

        def run() -> None:
            try:
                self._committed(self.store.upload(prefix, global_step, meta), prefix)
            except BaseException as exc:  # noqa: BLE001 - handed to the step loop, which fails the task with it
                self._error = exc
        self._thread = threading.Thread(target=run, name=f"tfyarn-checkpoint-upload-{global_step}", daemon=True)
        self._thread.start()

    def wait(self, log_every_s: float = 30.0) -> None:
        """Until the upload in flight (if any) has committed, then raise its failure. Not bounded here: the stall
        watchdog bounds the chief's finishing phase and its diagnosis names it; meanwhile the log says every
        ``log_every_s`` which upload is being waited for."""
        t = self._thread
        t0 = time.monotonic()
        while t is not None and t.is_alive():
            t.join(log_every_s)
            if t.is_alive():
                log.info("still waiting for the upload of %s (%.0fs) before the final checkpoint", t.name,
                         time.monotonic() - t0)
        self.check()


def local_checkpoint_files(prefix: str | Path) -> list[Path]:
    """The files of the local TF checkpoint ``prefix`` (``.../ckpt-120``) that exist: its index and data shards,
    sorted (not ``ckpt-12*``, which would also match ``ckpt-120``)."""
    p = Path(prefix)
    return sorted(f for f in [p.with_name(p.name + ".index"), *p.parent.glob(p.name + ".data-*")] if f.is_file())


def has_checkpoint_files(prefix: str | Path) -> bool:
    """Whether the local TF checkpoint ``prefix`` has its index and at least one data file."""
    files = local_checkpoint_files(prefix)
    return any(f.name.endswith(".index") for f in files) and len(files) > 1


def remove_checkpoint_files(prefix: str | Path) -> None:
    """Delete the local TF checkpoint ``prefix``'s files."""
    for f in local_checkpoint_files(prefix):
        f.unlink(missing_ok=True)


def local_dir_for(workdir: str | Path, sub: str) -> Path:
    """A fresh local scratch directory for checkpoints (``<workdir>/ckpt-<sub>``)."""
    d = Path(workdir) / f"ckpt-{sub}"
    if d.exists():
        shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True, exist_ok=True)
    return d


class CheckpointMismatch(ValueError):
    """The checkpoint to resume from (or evaluate) was written by another model, or the same one with other params."""


def _label(key: str) -> str:
    return key.removesuffix("/.ATTRIBUTES/VARIABLE_VALUE")


def check_fits(prefix: str, expected: dict[str, list[int]], what: str, labels: dict[str, str] | None = None) -> None:
    """Raise :class:`CheckpointMismatch` unless every ``expected`` key is in the checkpoint at ``prefix`` with that
    shape. ``what`` names the checkpoint for the message (e.g. ``ckpt-80 in hdfs:///ckpt``); ``labels`` names keys
    for it (the model's variable names where the keys are positional, ``model/var_0``).

    Why: TF1's Saver restores a (1000, 8) tensor into a (1000, 16) resource variable without a word (the variable
    takes the checkpoint's shape, and the job goes on with a model its graph was not built for); TF2 fails with a
    message naming neither the checkpoint nor the way out. Both happen to a user who changed the model or its params
    and kept ``checkpoint.dir``. Reads only the checkpoint's index (shapes), not its values.
    """
    import tensorflow as tf

    have = {k: list(v) for k, v in tf.train.list_variables(prefix)}
    labels = labels or {}
    problems = []
    for key, shape in expected.items():
        name = labels.get(key) or _label(key)
        if key not in have:
            problems.append(f"{name} is not in the checkpoint")
        elif have[key] != list(shape):
            problems.append(f"{name} has shape {have[key]} in the checkpoint, {list(shape)} in the model")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointMismatch(
            f"checkpoint {what} does not fit this job's model: {problems[0]}{more}. It was written by another model "
            f"or other params: point checkpoint.dir at a new directory to train afresh, or run the model and params it "
            f"was written by")


def expected_model_shapes(variables: list[Any], keys: list[str],
                          what: str) -> tuple[dict[str, list[int]], dict[str, str]]:
    """``{checkpoint key: shape}`` of the model's ``variables`` (creation order) under the entry's
    ``model_variables`` keys, and ``{checkpoint key: variable name}`` for messages."""
    if len(keys) != len(variables):
        raise CheckpointMismatch(f"checkpoint {what} does not fit this job's model: it has {len(keys)} model "
                                 f"variables, the model built {len(variables)}. It was written by another model: "
                                 f"point checkpoint.dir at a new directory to train afresh")
    pairs = list(zip(keys, variables))
    return {k: v.shape.as_list() for k, v in pairs}, {k: v.name.split(":")[0] for k, v in pairs}


def check_model_fits(prefix: str, variables: list[Any], keys: list[str], what: str) -> None:
    """:func:`check_fits` for a model's ``variables`` stored under an index entry's ``model_variables`` keys (the
    allreduce restore and the evaluator's), named in messages by the variables' own names."""
    shapes, labels = expected_model_shapes(variables, keys, what)
    check_fits(prefix, shapes, what, labels)


def restore_model_variables(variables: list[Any], prefix: str, keys: list[str], what: str | None = None) -> None:
    """Assign a checkpoint's model variables to ``variables`` (a model's, in creation order) by the index entry's
    ``meta['model_variables']`` keys, shapes checked first. Eager or mirrored variables, either checkpoint format
    (name-based ps, object-based allreduce), no Saver: the evaluator, the export and the allreduce warm start load
    checkpoints whose variable names need not match their own."""
    import tensorflow as tf

    check_model_fits(prefix, list(variables), keys, what or prefix)
    reader = tf.train.load_checkpoint(prefix)
    for key, var in zip(keys, variables):
        var.assign(reader.get_tensor(key))


def download_model_checkpoint(store: CheckpointStore, scratch: str | Path, purpose: str,
                              entry: dict[str, Any] | None = None) -> tuple[str, dict[str, Any], list[str]]:
    """``entry`` (default: the latest committed checkpoint of ``store``) downloaded into ``scratch``: (local prefix,
    entry, checkpoint keys of the model's variables in creation order). Errors start with ``purpose``."""
    entry = entry or store.latest()
    if entry is None:
        raise FileNotFoundError(f"{purpose}: no committed checkpoint in {store.url}")
    keys = entry.get("model_variables")
    if not keys:
        raise ValueError(f"{purpose}: checkpoint {entry['name']} in {store.url} does not list its model variables")
    return store.download(entry, scratch), entry, list(keys)


def warm_start_source(spec: Any, workdir: str | Path) -> tuple[str, dict[str, Any], list[str]] | None:
    """``checkpoint.init_from``: download its latest committed checkpoint into the task's scratch (created only
    then, under ``workdir``); returns (local prefix,
    index entry, checkpoint keys of the model's variables in creation order), or None without ``init_from``.

    Why only the model's variables: a warm start (e.g. yesterday's model trained on today's data into a new dir)
    continues the model, not the run — global step, epoch position and optimizer slots start afresh."""
    url = spec.checkpoint.init_from
    if not url:
        return None
    store = CheckpointStore(spec.resolve_path(url))
    prefix, entry, keys = download_model_checkpoint(store, local_dir_for(workdir, "warm-start"), "checkpoint.init_from")
    log.info("warm start from %s in %s (its global step %d)", entry["name"], store.url, entry["global_step"])
    return prefix, {**entry, "url": store.url}, keys
