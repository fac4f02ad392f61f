"""A ParameterServerStrategy worker's staged share (tfyarn.data.staging): from a Parquet table, TF ops give exactly the
feeder's batches (variable-length and string columns too); an epoch still being written is waited for; an unstaged
share fails naming where it was looked for."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from tfyarn.spec import load_spec_dict

tf = pytest.importorskip("tensorflow")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FEATURES = {"label": {"dtype": "float32"}, "uid": {"dtype": "int64"}, "name": {"dtype": "string"},
            "hist": {"dtype": "int64", "shape": [None]}, "tags": {"dtype": "int64", "shape": [None], "pad_to": 2}}


def _bind(tmp_path, epochs=2):
    from tfyarn.data.tf_dataset import bind
    root = tmp_path / "data"
    root.mkdir()
    for k, n in enumerate([330, 170]):
        uid = np.arange(n) + 1000 * k
        pq.write_table(pa.table({"label": (uid % 2).astype(np.float32), "uid": uid,
                                 "name": [f"n{u}" for u in uid], "hist": [list(range(u % 4)) for u in uid],
                                 "tags": [[u, u + 1, u + 2][: u % 4] for u in uid]}),
                       root / f"part-{k}.parquet", row_group_size=64)
    spec = load_spec_dict({"name": "s", "entrypoint": "t.py", "mode": "ps",
                           "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 2}},
                           "data": {"train": [f"{root}/*.parquet"], "features": FEATURES, "batch_size": 40,
                                    "epochs": epochs}})
    bind(spec.data, -1, 2, wait_s=30.0)
    return spec


def test_staged_parquet_share_is_the_feeders_batches(tmp_path, monkeypatch):
    import tfyarn.data
    from tfyarn.data import Feeder, build_manifest
    from tfyarn.data.tf_dataset import stage
    spec = _bind(tmp_path)
    monkeypatch.chdir(tmp_path)
    stage(1).join(60)
    steps = tfyarn.data.steps_per_epoch()
    got = list(tfyarn.data.train_dataset(worker=1))
    assert len(got) == 2 * steps and steps == 500 // 80
    d = spec.data
    with Feeder(build_manifest(list(d.train)), dict(d.features), 40, 1, 2, seed=d.shuffle_seed) as f:
        want = [b for e in range(2) for i, b in enumerate(f.epoch(e)) if i < steps]
    for (feats, label), b in zip(got, want):
        np.testing.assert_array_equal(feats["uid"].numpy(), b["uid"])
        np.testing.assert_array_equal(label.numpy(), b["label"])
        assert [s.decode() for s in feats["name"].numpy()] == list(b["name"])
        for part in ("indices", "values", "dense_shape"):
            np.testing.assert_array_equal(getattr(feats["hist"], part).numpy(), getattr(b["hist"], part))
        np.testing.assert_array_equal(feats["tags"].numpy(), b["tags"])
    spec_ = tfyarn.data.train_dataset(worker=1).element_spec[0]
    assert spec_["tags"].shape == (40, 2) and spec_["hist"] == tf.SparseTensorSpec([40, None], tf.int64)


def test_an_epoch_being_written_is_waited_for(tmp_path, monkeypatch):
    import tfyarn.data
    from tfyarn.data import staging
    from tfyarn.data.tf_dataset import stage
    _bind(tmp_path)
    monkeypatch.chdir(tmp_path)
    stage(0).join(60)
    later = staging.epoch_path(1)
    os.rename(later, f"{later}.held")                  # epoch 1 not there yet: it comes 1.5 s later

    def put_back():
        time.sleep(1.5)
        os.rename(f"{later}.held", later)
    t = threading.Thread(target=put_back)
    t.start()
    t0 = time.monotonic()
    n = sum(1 for _ in tfyarn.data.train_dataset(worker=0))
    t.join()
    assert n == 2 * tfyarn.data.steps_per_epoch() and time.monotonic() - t0 >= 1.4


def test_an_unstaged_share_fails_naming_where_it_looked(tmp_path, monkeypatch):
    import tfyarn.data
    _bind(tmp_path)
    monkeypatch.chdir(tmp_path)                        # nothing staged here
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tfyarn: \.tfyarn-share/epoch-00000\.tfrecord "
                                                               r"\(the share staged for epoch 0\) is not in the"):
        list(tfyarn.data.train_dataset(worker=0))
