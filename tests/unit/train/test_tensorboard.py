"""The TensorBoard role: event files mirrored through fsspec, a clear error without the package, a live server.

Why: tf-yarn's TensorBoard task silently showed nothing (TF cannot read hdfs://). The mirror must pick up new and
grown files and never a half-uploaded one; the role must say which package is missing; and the scalars tfyarn writes
without the ``tensorboard`` package must be readable by TensorBoard.
"""
from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harness import LocalCluster
from tfyarn.tasklib.context import DONE_KEY, TENSORBOARD_URL_KEY, TaskContext
from tfyarn.tasklib.kv import MemoryKV
from tfyarn.spec import load_spec_dict
from tfyarn.train.tensorboard import EventMirror, MissingTensorBoard, run

def spec_for(tmp: Path):
    return load_spec_dict({"name": "tb", "model": "tfyarn.models.recommender:model", "mode": "allreduce",
                           "data": {"train": ["x"], "features": {"label": {"dtype": "float32"}}, "batch_size": 1},
                           "roles": {"worker": {"instances": 1}, "tensorboard": {"instances": 1}},
                           "checkpoint": {"dir": str(tmp / "ckpt")}})


def test_mirror_copies_new_and_grown_event_files_and_ignores_temporaries(tmp_path):
    src, dst = tmp_path / "ckpt", tmp_path / "mirror"
    (src / "train").mkdir(parents=True)
    (src / "eval").mkdir()
    (src / "train" / "events.out.tfevents.1.host").write_bytes(b"a" * 10)
    (src / "eval" / ".tmp-1234-events.out.tfevents.2.host").write_bytes(b"partial")
    (src / "ckpt-5.index").write_bytes(b"not an event file")
    m = EventMirror(str(src), dst)
    assert m.sync() == 1
    assert (dst / "train" / "events.out.tfevents.1.host").read_bytes() == b"a" * 10
    assert not list(dst.rglob(".tmp-*")) and not (dst / "ckpt-5.index").exists()
    assert m.sync() == 0                                           # unchanged: nothing copied
    (src / "train" / "events.out.tfevents.1.host").write_bytes(b"a" * 25)
    (src / "eval" / "events.out.tfevents.2.host").write_bytes(b"b")
    assert m.sync() == 2
    assert (dst / "train" / "events.out.tfevents.1.host").stat().st_size == 25


def test_mirror_of_a_dir_not_yet_created_copies_nothing(tmp_path):
    assert EventMirror(str(tmp_path / "nothing-yet"), tmp_path / "m").sync() == 0


def test_missing_package_fails_at_once_naming_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)          # import tensorboard → ImportError
    ctx = TaskContext(spec=spec_for(tmp_path), role="tensorboard", index=0, kv=MemoryKV(), workdir=tmp_path)
    with pytest.raises(MissingTensorBoard, match=r"'tensorboard' package.*pip install tensorboard"):
        run(ctx)
    assert ctx.kv.get(TENSORBOARD_URL_KEY) is None


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_serves_scalars_written_without_the_tensorboard_package(tmp_path, tensorboard_dir):
    spec = spec_for(tmp_path)
    # the chief's writer (TF core only, no tensorboard on its path) uploads train/ event files to the checkpoint dir
    writer = ("from tfyarn.train.events import EventWriter; import sys; "
              "w = EventWriter(sys.argv[1], 'train', sys.argv[2]); "
              "[w.scalars(s, {'loss': 1.0 / (s + 1)}) for s in range(5)]; w.close()")
    subprocess.run([sys.executable, "-c", writer, str(tmp_path / "ckpt"), str(tmp_path / "local")], check=True,
                   timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert list((tmp_path / "ckpt" / "train").glob("events.out.tfevents.*"))
    with LocalCluster(spec, tmp_path / "run", tasks=["tensorboard:0"], env={"PYTHONPATH": tensorboard_dir}) as c:
        c.start()
        url = c.wait_key(TENSORBOARD_URL_KEY, timeout=120, what="the TensorBoard URL")
        deadline, scalars = time.monotonic() + 60, []
        while time.monotonic() < deadline and len(scalars) < 5:    # TensorBoard loads the mirror asynchronously
            try:
                scalars = json.loads(_get(url + "data/plugin/scalars/scalars?run=train&tag=loss"))
            except (OSError, http.client.HTTPException, ValueError):  # not serving yet, or no JSON yet
                scalars = []
            time.sleep(1)
        c.kv.put(DONE_KEY, "1")
        codes = c.wait(timeout=60)
        log = c.log("tensorboard:0")
    assert codes == {"tensorboard:0": 0}, log[-3000:]
    assert [s[1] for s in scalars] == [0, 1, 2, 3, 4], scalars
    assert scalars[-1][2] == pytest.approx(0.2)
