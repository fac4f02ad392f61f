"""Checkpoints on any fsspec URL (hdfs://, s3://, file://, a local path).

Why not TF's own writer: TF 2.21 has no hdfs:// filesystem. So TF writes to local disk, and :class:`CheckpointStore`
uploads the files **under temporary names, then renames** them, and only then rewrites the index (temp + rename):
a reader that follows the index never sees a half-uploaded checkpoint; a crash leaves ``.tmp-*`` debris, cleaned later.
Re-uploading a committed name first takes it out of the index (a kill among its renames leaves the older one listed),
and :meth:`CheckpointStore.latest` reads only a checkpoint whose files are all there at the sizes its entry
recorded: one that lost a file (a DataNode holding the only replica gone) is skipped, saying so, for the last complete.

Layout under the URL::

    tfyarn-checkpoint.json     {"latest": "ckpt-120", "checkpoints": [{"name", "global_step", "time", ...meta}, ...]}
    ckpt-120.index, ckpt-120.data-00000-of-00001      (a TF checkpoint prefix, name-based or object-based)
    summary.json                                      (written at the end by the chief)

``meta`` carries what a restart or the evaluator needs: ``format`` (``"v1-saver"``: ps mode, graph variable names;
``"tf2-object"``: allreduce), ``model_variables`` (checkpoint keys of ``model.variables`` in creation order, which
:func:`restore_model_variables` loads into any model), ``worker_steps`` and ``epoch``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tfyarn.common.fsio import replace, retry_vanished
from tfyarn.common.fsretry import retry
from tfyarn.train import sharding
from tfyarn.train.events import fs_path

log = logging.getLogger("tfyarn.train.checkpoint")

INDEX = "tfyarn-checkpoint.json"


class KeptDir:
    """A directory under one fsspec URL that keeps its newest ``keep`` entries (checkpoints here, a SavedModel's
    versions in :class:`tfyarn.train.export.ExportStore`)."""

    def __init__(self, url: str, keep: int = 3):
        self.url, self.keep = url.rstrip("/"), max(1, int(keep))
        self.fs, self.root = fs_path(self.url)


class CheckpointStore(KeptDir):
    """Upload, list, prune and download checkpoints under one fsspec URL."""

    def __init__(self, url: str, keep: int = 3):
        super().__init__(url, keep)
        #: what the last :meth:`latest` skipped, ``"ckpt-120: ckpt-120.index missing"``, newest first
        self.skipped: list[str] = []

    def _p(self, name: str) -> str:
        return f"{self.root}/{name}"

    def index(self) -> dict[str, Any]:
        """The index (``{"latest": None, "checkpoints": []}`` when there is no checkpoint yet)."""
        p = self._p(INDEX)
        if not self.fs.exists(p):
            return {"latest": None, "checkpoints": []}

        def read() -> dict[str, Any]:
            with self.fs.open(p, "r") as f:
                return json.load(f)

        return retry_vanished(read)  # being replaced right now (a filesystem without an overwriting rename)

    def latest(self) -> dict[str, Any] | None:
        """The newest committed checkpoint whose files are complete (name, global_step, time, meta...), or None.

        Never a partial one: the index's latest first, then the older ones it keeps, each checked against one
        listing (:func:`incomplete`); the ones skipped are logged and kept in :attr:`skipped`."""
        idx = self.index()
        ckpts = list(idx.get("checkpoints", []))
        names = [c["name"] for c in ckpts]
        self.skipped = []
        if idx.get("latest") not in names:
            return None
        order = list(reversed(ckpts[: names.index(idx["latest"]) + 1]))
        sizes = self._sizes()
        for entry in order:
            why = incomplete(entry, sizes)
            if why is None:
                if self.skipped:
                    log.warning(
                        "checkpoint %s in %s is incomplete (%s): using %s, the last complete one",
                        order[0]["name"],
                        self.url,
                        "; ".join(self.skipped),
                        entry["name"],
                    )
                return entry
            self.skipped.append(f"{entry['name']}: {why}")
        log.warning("no complete checkpoint in %s (%s): starting afresh", self.url, "; ".join(self.skipped))
        return None

    def _sizes(self) -> dict[str, int]:
        """Size of each file under the URL, by base name (empty when there is no directory yet)."""
        try:
            listing = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return {}
        return {os.path.basename(str(d["name"]).rstrip("/")): int(d.get("size") or 0) for d in listing}

    def upload(self, local_prefix: str, global_step: int, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """Upload the files of the TF checkpoint ``local_prefix`` (``.../ckpt-120``), commit it in the index, prune.

        Returns the committed index entry. Files go up as ``.tmp-<id>-<file>`` and are renamed once all are up.
        A file-system fault retries the whole upload (tfyarn.common.fsretry), then fails it with one line.
        """
        return retry(lambda: self._upload(local_prefix, global_step, meta), "checkpoint upload to", self.url)

    def _upload(self, local_prefix: str, global_step: int, meta: dict[str, Any] | None) -> dict[str, Any]:
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
        idx = self.index()
        others = [c for c in idx.get("checkpoints", []) if c["name"] != name]
        if len(others) < len(idx.get("checkpoints", [])):
            # the same name committed before (a resumed run saving that step again): its files are about to be
            # replaced one by one, so the index lists the older ones only until the new files are all in place
            self._write_index(others[-1]["name"] if others else None, others, tag)
        for tmp, final in staged:
            replace(self.fs, tmp, final)
        entry = {
            "name": name,
            "global_step": int(global_step),
            "time": time.time(),
            **(meta or {}),
            "files": {f.name: f.stat().st_size for f in files},  # what latest() checks before it trusts them
        }
        ckpts = others + [entry]
        removed, ckpts = ckpts[: -self.keep], ckpts[-self.keep :]
        self._write_index(name, ckpts, tag)
        for pattern in [f"{old['name']}.*" for old in removed] + [".tmp-*"]:  # pruned, and debris of crashed uploads
            self._remove(pattern)
        log.info(
            "checkpoint %s (global step %d) uploaded to %s in %.2fs", name, global_step, self.url, time.monotonic() - t0
        )
        return entry

    def _write_index(self, latest: str | None, ckpts: list[dict[str, Any]], tag: str) -> None:
        index_tmp = self._p(f".tmp-{tag}-{INDEX}")
        with self.fs.open(index_tmp, "wb") as f:
            f.write(json.dumps({"latest": latest, "checkpoints": ckpts}, indent=1).encode())
        replace(self.fs, index_tmp, self._p(INDEX))

    def _remove(self, pattern: str) -> None:
        for p in self.fs.glob(self._p(pattern)):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(p)

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


def incomplete(entry: dict[str, Any], sizes: dict[str, int]) -> str | None:
    """Why the checkpoint ``entry`` cannot be restored from the files listed in ``sizes`` (base name -> bytes), or
    None when it can: a file its entry recorded is missing or of another size; for an entry from before sizes
    were recorded, its ``.index`` or one of its ``data-0000i-of-0000N`` shards is missing."""
    name = entry["name"]
    files = entry.get("files")
    if isinstance(files, dict) and files:
        for fname, size in sorted(files.items()):
            if fname not in sizes:
                return f"{fname} missing"
            if sizes[fname] != int(size):
                return f"{fname} has {sizes[fname]:,} of {int(size):,} bytes"
        return None
    if f"{name}.index" not in sizes:
        return f"{name}.index missing"
    shards = [f for f in sizes if f.startswith(f"{name}.data-")]
    if not shards:
        return f"{name}.data-* missing"
    try:
        want = int(shards[0].rsplit("-of-", 1)[1])
    except (IndexError, ValueError):
        return None
    missing = sorted({f"{name}.data-{i:05d}-of-{want:05d}" for i in range(want)} - set(shards))
    return f"{missing[0]} missing" if missing else None


class BackgroundUpload:
    """At most one checkpoint upload at a time, on its own thread, so the step loop does not wait for it.

    Why: in sync ps or allreduce mode every peer waits on a chief that uploads inside its step loop; an upload longer
    than ``timeouts.step`` (a few GB on a busy HDFS) failed the job with a step timeout. No queue of uploads builds up
    behind a slow store (:meth:`ready`), and an upload's failure is raised in the step loop, failing the task.
    Only the last committed checkpoint's local files are kept: the end-of-run export reads them.
    """

    def __init__(self, store: CheckpointStore):
        self.store = store
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        #: (index entry, local prefix) of the last checkpoint committed, its local files kept
        self.committed: tuple[dict[str, Any], str] | None = None

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check(self) -> None:
        """Raise the last upload's failure (once)."""
        err, self._error = self._error, None
        if err is not None:
            raise err

    def ready(self) -> bool:
        """May a periodic checkpoint be written now? False while an upload is in flight; raises the last one's error."""
        self.check()
        return not self.busy()

    def commit(self, prefix: str, global_step: int, meta: dict[str, Any], *, final: bool) -> dict[str, Any] | None:
        """Commit the local checkpoint ``prefix``: periodic, by starting its upload (None; :attr:`committed` names it
        once the index does); final, by uploading it here and returning its index entry (after :meth:`wait`)."""
        if final:
            entry = self.store.upload(prefix, global_step, meta)
            self._committed(entry, prefix)
            return entry
        if not self.ready():
            raise RuntimeError("a checkpoint upload is already in flight")

        def run() -> None:
            try:
                self._committed(self.store.upload(prefix, global_step, meta), prefix)
            except BaseException as exc:  # noqa: BLE001 - handed to the step loop, which fails the task with it
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"tfyarn-checkpoint-upload-{global_step}", daemon=True)
        self._thread.start()
        return None

    def _committed(self, entry: dict[str, Any], prefix: str) -> None:
        if self.committed is not None and self.committed[1] != prefix:
            remove_checkpoint_files(self.committed[1])
        self.committed = (entry, prefix)

    def wait(self, log_every_s: float = 30.0) -> None:
        """Until the upload in flight (if any) has committed, then raise its failure. Not bounded here: the stall
        watchdog bounds the chief's finishing phase and its diagnosis names it; meanwhile the log says every
        ``log_every_s`` which upload is being waited for."""
        t = self._thread
        t0 = time.monotonic()
        while t is not None and t.is_alive():
            t.join(log_every_s)
            if t.is_alive():
                log.info(
                    "still waiting for the upload of %s (%.0fs) before the final checkpoint",
                    t.name,
                    time.monotonic() - t0,
                )
        self.check()


class PeriodicCheckpoints:
    """The chief's checkpoint schedule (``checkpoint.every_steps`` / ``every_secs``) over a :class:`BackgroundUpload`;
    each mode's subclass writes the local files. ``uploads`` is None where this task saves nothing."""

    def __init__(self, spec: Any, chief: bool):
        c = spec.checkpoint
        self.store = CheckpointStore(c.dir, keep=c.keep) if c.dir else None
        self.uploads = BackgroundUpload(self.store) if self.store and chief else None
        self.every_steps, self.every_secs = c.every_steps, c.every_secs
        self.last_step: int | None = None
        self.last_time = time.monotonic()

    @property
    def committed(self) -> tuple[dict[str, Any], str] | None:
        """(index entry, local prefix) of the last checkpoint committed (its local files kept for the export)."""
        return self.uploads.committed if self.uploads else None

    def due(self, global_step: int) -> bool:
        """False while the previous upload is in flight (due again once it has committed)."""
        if self.uploads is None or global_step == self.last_step or not self.uploads.ready():
            return False
        if self.every_steps and global_step - (self.last_step or 0) >= self.every_steps:
            return True
        return bool(self.every_secs) and time.monotonic() - self.last_time >= self.every_secs

    def commit(self, prefix: str, global_step: int, meta: dict[str, Any], final: bool) -> dict[str, Any] | None:
        """Periodic (``final=False``): start the upload and return None. Final (the caller has waited for the upload
        in flight): upload here and return the entry; a subclass returns None when this step is already saved."""
        assert self.uploads is not None
        self.last_step, self.last_time = global_step, time.monotonic()
        return self.uploads.commit(prefix, global_step, meta, final=final)


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
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True, exist_ok=True)
    return d


class CheckpointMismatch(ValueError):
    """The checkpoint to resume from (or evaluate) was written by another model, or the same one with other params."""


def check_fits(prefix: str, expected: dict[str, list[int]], what: str, labels: dict[str, str] | None = None) -> None:
    """Raise :class:`CheckpointMismatch` unless every ``expected`` key is in the checkpoint at ``prefix`` with that
    shape. ``what`` names the checkpoint for the message (e.g. ``ckpt-80 in hdfs:///ckpt``); ``labels`` names keys
    for it (the model's variable names where the keys are positional, ``model/var_0``).

    Why: TF1's Saver restores a (1000, 8) tensor into a (1000, 16) resource variable without a word, and TF2 fails
    naming neither the checkpoint nor the way out; both happen to a user who changed the model or its params and
    kept ``checkpoint.dir``. Reads only the checkpoint's index (shapes), not its values.
    """
    import tensorflow as tf

    have = {k: list(v) for k, v in tf.train.list_variables(prefix)}
    labels = labels or {}
    problems = []
    for key, shape in expected.items():
        name = labels.get(key) or key.removesuffix("/.ATTRIBUTES/VARIABLE_VALUE")
        if key not in have:
            problems.append(f"{name} is not in the checkpoint")
        elif have[key] != list(shape):
            problems.append(f"{name} has shape {have[key]} in the checkpoint, {list(shape)} in the model")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointMismatch(
            f"checkpoint {what} does not fit this job's model: {problems[0]}{more}. It was written by another model "
            f"or other params: point checkpoint.dir at a new directory to train afresh, or run the model and params it "
            f"was written by"
        )


def check_model_fits(prefix: str, variables: list[Any], keys: list[str], what: str) -> None:
    """:func:`check_fits` for a model's ``variables`` (creation order) stored under an index entry's
    ``model_variables`` keys, named in messages by the variables' own names."""
    if len(keys) != len(variables):
        raise CheckpointMismatch(
            f"checkpoint {what} does not fit this job's model: it has {len(keys)} model "
            f"variables, the model built {len(variables)}. It was written by another model: "
            f"point checkpoint.dir at a new directory to train afresh"
        )
    pairs = list(zip(keys, variables))
    shapes = {k: sharding.checkpoint_shape(v) for k, v in pairs}
    check_fits(prefix, shapes, what, {k: v.name.split(":")[0] for k, v in pairs})


def restore_model_variables(variables: list[Any], prefix: str, keys: list[str], what: str | None = None) -> None:
    """Assign a checkpoint's model variables to ``variables`` (a model's, in creation order) by the index entry's
    ``model_variables`` keys, shapes checked first: eager or mirrored variables, either checkpoint format, no Saver,
    so variable names need not match (the evaluator, the export, the allreduce warm start)."""
    import tensorflow as tf

    check_model_fits(prefix, list(variables), keys, what or prefix)
    reader = tf.train.load_checkpoint(prefix)
    for key, var in zip(keys, variables):
        var.assign(reader.get_tensor(key))


def download_model_checkpoint(
    store: CheckpointStore, scratch: str | Path, purpose: str, entry: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any], list[str]]:
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
    """``checkpoint.init_from``'s latest committed checkpoint downloaded under ``workdir``, as
    :func:`download_model_checkpoint` returns it (the entry with its ``url``), or None without ``init_from``.

    Only the model's variables are loaded from it: a warm start continues the model, not the run (global step,
    epoch position and optimizer slots start afresh)."""
    url = spec.checkpoint.init_from
    if not url:
        return None
    store = CheckpointStore(url)
    prefix, entry, keys = download_model_checkpoint(store, local_dir_for(workdir, "warm-start"), "checkpoint.init_from")
    log.info("warm start from %s in %s (its global step %d)", entry["name"], store.url, entry["global_step"])
    return prefix, {**entry, "url": store.url}, keys
