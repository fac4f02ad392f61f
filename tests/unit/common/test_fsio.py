"""fsio.replace: how every committed file (checkpoint index, summary, event files, report, staged env, manifest) is
renamed into place. HDFS is not available here: ``StrictRenameFS`` is fsspec's memory filesystem with hdfs-native's
rename rules (``mv`` refuses an existing destination unless ``overwrite=True``, as ``hdfs_native.Client.rename``
documents), registered as ``hdfs`` — the edge we cannot run."""
from __future__ import annotations

import json

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from tfyarn.common.fsio import replace, retry_vanished


class StrictRenameFS(MemoryFileSystem):
    protocol = ("hdfs", "viewfs")
    root_marker = "/"
    store: dict = {}               # its own, not the memory filesystem's
    pseudo_dirs = [""]
    removed: list[str] = []

    @classmethod
    def _strip_protocol(cls, path):
        for p in ("hdfs://", "viewfs://"):
            if path.startswith(p):
                path = path[len(p):]
        return "/" + path.lstrip("/").rstrip("/")

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if dst in self.store and not kwargs.get("overwrite", False):
            raise FileExistsError(path2)
        self.store[dst] = self.store.pop(src)          # one rename (files only: all that is renamed here)

    def rm(self, path, *args, **kwargs):
        StrictRenameFS.removed.append(path)
        super().rm(path, *args, **kwargs)


@pytest.fixture
def hdfs():
    fsspec.register_implementation("hdfs", StrictRenameFS, clobber=True)
    StrictRenameFS.store.clear()
    StrictRenameFS.pseudo_dirs[:] = [""]
    StrictRenameFS.removed = []
    yield fsspec.filesystem("hdfs")
    fsspec.register_implementation("hdfs", "hdfs_native.fsspec.HdfsFileSystem", clobber=True)


def test_on_hdfs_the_destination_is_replaced_by_one_rename_never_removed_first(hdfs):
    hdfs.pipe("/d/f", b"old")
    hdfs.pipe("/d/.tmp", b"new")
    replace(hdfs, "/d/.tmp", "/d/f")
    assert hdfs.cat("/d/f") == b"new" and not hdfs.exists("/d/.tmp") and StrictRenameFS.removed == []


def test_a_checkpoint_index_and_a_summary_are_replaced_on_hdfs_without_a_gap(hdfs, tmp_path):
    """The index is rewritten at every checkpoint and a rerun of a spec writes its summary where the last run's is:
    both used to fail (summary: FileExistsError at the end of training) or delete the live file first (index)."""
    from tfyarn.train.checkpoint import INDEX, CheckpointStore
    from tfyarn.train.progress import write_summary
    local = tmp_path / "ck"
    local.mkdir()
    store = CheckpointStore("hdfs:///ckpt", keep=2)
    for step in (5, 10, 15):
        (local / f"ckpt-{step}.index").write_bytes(b"i")
        (local / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"d")
        store.upload(str(local / f"ckpt-{step}"), step, {})
    assert store.latest()["name"] == "ckpt-15" and [c["name"] for c in store.index()["checkpoints"]] == \
        ["ckpt-10", "ckpt-15"]
    assert not any(p.endswith(INDEX) for p in StrictRenameFS.removed)       # the live index was never missing
    assert any("ckpt-5." in p for p in StrictRenameFS.removed)              # pruning still removes old ones

    ctx = type("Ctx", (), {"attempt": 0, "kv": type("KV", (), {"put": lambda self, k, v: None})(),
                           "spec": type("Spec", (), {"checkpoint": type("C", (), {"dir": "hdfs:///ckpt"})()})()})()
    for run in (1, 2):
        url = write_summary(ctx, {"run": run})
    assert json.loads(hdfs.cat(url.split("://", 1)[1])) == {"run": 2}


def test_elsewhere_a_rename_error_not_about_the_destination_leaves_it(tmp_path):
    fs = fsspec.filesystem("file")
    dst = tmp_path / "f"
    dst.write_text("old")
    with pytest.raises(FileNotFoundError):
        replace(fs, str(tmp_path / "missing"), str(tmp_path / "other"))
    (tmp_path / "new").write_text("new")
    replace(fs, str(tmp_path / "new"), str(dst))                          # POSIX rename replaces
    assert dst.read_text() == "new"


def test_a_read_of_a_file_being_replaced_is_retried():
    calls = []

    def read():
        calls.append(1)
        if len(calls) < 3:
            raise FileNotFoundError("gone for a moment")
        return "ok"
    assert retry_vanished(read, pause_s=0.01) == "ok" and len(calls) == 3
    with pytest.raises(FileNotFoundError):
        retry_vanished(lambda: open("/nonexistent/x"), attempts=2, pause_s=0.01)
