"""A checkpoint upload cut halfway (issue 40: a preemption or a DataNode restart during the write) leaves a complete
checkpoint or none that a resume reads: real files, a real upload process SIGKILLed in the middle, and a committed
checkpoint that lost a file afterwards (HDFS with replication 1 losing the only DataNode holding it). The upload is
slowed at one point only so that the kill lands there; everything else is CheckpointStore's own code."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from tfyarn.train.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(120)


def _write(local: Path, name: str, data_bytes: int, fill: bytes) -> str:
    local.mkdir(parents=True, exist_ok=True)
    (local / f"{name}.index").write_bytes(fill * 512)
    (local / f"{name}.data-00000-of-00002").write_bytes(fill * data_bytes)
    (local / f"{name}.data-00001-of-00002").write_bytes(fill * (data_bytes // 2))
    return str(local / name)


def _upload_then_hang(url: str, prefix: str, step: int, where: str) -> None:
    """The child: upload ``prefix``, hanging after the first ``where`` ("put": file staged, "rename": file renamed)
    so the parent's SIGKILL lands in the middle of the upload."""
    import tfyarn.train.checkpoint as ck

    store = ck.CheckpointStore(url)
    calls = []
    if where == "put":
        put = store.fs.put_file

        def slow_put(*a, **kw):
            put(*a, **kw)
            calls.append(1)
            if len(calls) == 1:
                time.sleep(60)

        store.fs.put_file = slow_put
    else:
        replace = ck.replace

        def slow_replace(fs, src, dst):
            replace(fs, src, dst)
            if not dst.endswith(ck.INDEX):
                calls.append(1)
                if len(calls) == 1:
                    time.sleep(60)

        ck.replace = slow_replace
    store.upload(prefix, step)


def _cut(url: str, prefix: str, step: int, where: str, root: Path, done) -> None:
    ctx = multiprocessing.get_context("fork")  # no TF in this process: forking is safe
    p = ctx.Process(target=_upload_then_hang, args=(url, prefix, step, where))
    p.start()
    t0 = time.monotonic()
    while not done() and time.monotonic() - t0 < 60:
        time.sleep(0.02)
    assert done(), f"the child's upload did not reach its {where} point within 60 s"
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert p.exitcode == -signal.SIGKILL


def test_an_upload_killed_while_staging_leaves_the_last_complete_checkpoint(tmp_path):
    root = tmp_path / "store"
    url = str(root)
    store = CheckpointStore(url)
    store.upload(_write(tmp_path / "l10", "ckpt-10", 1 << 20, b"a"), 10)
    _cut(url, _write(tmp_path / "l20", "ckpt-20", 1 << 20, b"b"), 20, "put", root,
         lambda: any(f.name.startswith(".tmp-") for f in root.iterdir()))
    assert any(f.name.startswith(".tmp-") for f in root.iterdir())  # cut halfway: debris, no ckpt-20 file
    assert not any(f.name.startswith("ckpt-20") for f in root.iterdir())
    again = CheckpointStore(url)
    assert again.latest()["name"] == "ckpt-10" and again.skipped == []
    assert (Path(again.download(again.latest(), tmp_path / "r") + ".index")).read_bytes() == b"a" * 512
    again.upload(_write(tmp_path / "l30", "ckpt-30", 1 << 20, b"c"), 30)  # the next commit cleans the debris
    assert not any(f.name.startswith(".tmp-") for f in root.iterdir())
    assert again.latest()["name"] == "ckpt-30"


def test_an_upload_killed_while_it_replaces_a_committed_name_never_leaves_it_mixed(tmp_path, caplog):
    """A resumed run saving the same step again renames new files over a committed checkpoint's, one by one: a kill
    in between must not leave the index pointing at a mix of old and new files."""
    root = tmp_path / "store"
    url = str(root)
    store = CheckpointStore(url)
    store.upload(_write(tmp_path / "l5", "ckpt-5", 1 << 20, b"a"), 5)
    store.upload(_write(tmp_path / "l10", "ckpt-10", 1 << 20, b"b"), 10)
    # the same name again, other content and sizes: killed after its first file was renamed into place
    _cut(url, _write(tmp_path / "l10b", "ckpt-10", 3 << 19, b"c"), 10, "rename", root,
         lambda: (root / "ckpt-10.data-00000-of-00002").stat().st_size == 3 << 19)
    caplog.set_level(logging.WARNING, logger="tfyarn.train.checkpoint")
    again = CheckpointStore(url)
    entry = again.latest()
    assert entry is not None and entry["name"] == "ckpt-5", entry  # the older complete one, not a mixed ckpt-10
    prefix = again.download(entry, tmp_path / "r")
    assert Path(prefix + ".data-00000-of-00002").read_bytes() == b"a" * (1 << 20)


def test_a_committed_checkpoint_that_lost_a_file_is_skipped_saying_so(tmp_path, caplog):
    """What a DataNode restart with replication 1 can leave: the index names ckpt-20 but a file of it is gone or
    short. A resume reads ckpt-10, the last complete one, and the log says which and why."""
    root = tmp_path / "store"
    url = str(root)
    store = CheckpointStore(url)
    store.upload(_write(tmp_path / "l10", "ckpt-10", 1 << 20, b"a"), 10)
    store.upload(_write(tmp_path / "l20", "ckpt-20", 1 << 20, b"b"), 20)
    data = root / "ckpt-20.data-00001-of-00002"
    data.write_bytes(data.read_bytes()[: 1000])  # short
    caplog.set_level(logging.WARNING, logger="tfyarn.train.checkpoint")
    assert store.latest()["name"] == "ckpt-10"
    assert store.skipped == ["ckpt-20: ckpt-20.data-00001-of-00002 has 1,000 of 524,288 bytes"]
    assert any("using ckpt-10, the last complete one" in r.getMessage() for r in caplog.records)
    data.unlink()
    assert store.latest()["name"] == "ckpt-10" and "missing" in store.skipped[0]
    (root / "ckpt-10.index").unlink()
    assert store.latest() is None and len(store.skipped) == 2  # none complete: start afresh, never a partial one
