"""``tfyarn.data.train_dataset()`` with variable-length features (issue 28, item 1, for entrypoint scripts): a
``shape: [null]`` feature is a ``tf.SparseTensor`` and a ``pad_to: N`` one a dense [B, N] tensor, in the feeder's
pipeline and the pure-TF one (``worker=N``) alike, equal to ``tf.io.parse_example`` with ``VarLenFeature`` /
``FixedLenFeature(default_value=...)`` of the same records (matched by a record id)."""

from __future__ import annotations

import numpy as np
import pytest

from tfyarn.data import TFRecordWriter
from tfyarn.data.example import encode_example
from tfyarn.spec import load_spec_dict

tf = pytest.importorskip("tensorflow")

FEATURES = {
    "rid": {"dtype": "int64"},
    "hist": {"dtype": "int64", "shape": [None]},
    "tags": {"dtype": "float32", "shape": [None], "pad_to": 3, "default": -1.0},
    "k": {"dtype": "int64", "default": 7},
    "label": {"dtype": "float32"},
}
TF_FEATURES = {
    "rid": tf.io.FixedLenFeature([], tf.int64),
    "hist": tf.io.VarLenFeature(tf.int64),
    "tags": tf.io.VarLenFeature(tf.float32),
    "k": tf.io.FixedLenFeature([], tf.int64, default_value=7),
    "label": tf.io.FixedLenFeature([], tf.float32),
}
KINDS = {"rid": "int64", "hist": "int64", "tags": "float", "k": "int64", "label": "float"}


def _write(directory, sizes):
    """Records with 0-5 history ids, 0-5 tags, ``k`` missing in every third; returns (files, {rid: payload})."""
    rng = np.random.default_rng(5)
    directory.mkdir()
    files, payloads, rid = [], {}, 0
    for n, size in enumerate(sizes):
        path = directory / f"part-{n}.tfrecord"
        with TFRecordWriter(str(path)) as w:
            for _ in range(size):
                rec = {
                    "rid": np.int64(rid),
                    "label": np.float32(rid % 2),
                    "hist": rng.integers(0, 1000, int(rng.integers(0, 6))).astype(np.int64),
                    "tags": rng.normal(size=int(rng.integers(0, 6))).astype(np.float32),
                }
                if rid % 3:
                    rec["k"] = np.int64(rid)
                payloads[rid] = encode_example(rec, KINDS)
                w.write(payloads[rid])
                rid += 1
        files.append(str(path))
    return files, payloads


def _padded(sp, width, default):
    dense = tf.sparse.to_dense(sp, default_value=default).numpy()[:, :width]
    return np.pad(dense, ((0, 0), (0, width - dense.shape[1])), constant_values=default)


def test_train_dataset_gives_a_sparse_tensor_and_padded_dense_equal_to_parse_example(tmp_path, monkeypatch):
    import tfyarn.data
    from tfyarn.data.tf_dataset import bind, stage

    files, payloads = _write(tmp_path / "data", [130, 70])
    spec = load_spec_dict(
        {
            "name": "v",
            "entrypoint": "t.py",
            "mode": "allreduce",
            "roles": {"chief": {"instances": 1}, "worker": {"instances": 1}},
            "data": {"train": files, "features": FEATURES, "batch_size": 32, "epochs": 2, "shuffle_buffer": 50},
        }
    )
    bind(spec.data, 1, 2)
    steps = tfyarn.data.steps_per_epoch()
    assert steps == 3  # 200 records, 2 workers, batches of 32
    monkeypatch.chdir(tmp_path)                 # worker 1's process stages its share here; its TF ops read it
    stage(1).join(60)
    fed, by_tf = tfyarn.data.train_dataset(), tfyarn.data.train_dataset(worker=1)
    for ds in (fed, by_tf):
        feats, label = ds.element_spec
        assert feats["hist"] == tf.SparseTensorSpec([32, None], tf.int64), feats["hist"]
        assert (feats["tags"].shape, feats["tags"].dtype) == ((32, 3), tf.float32), feats["tags"]
        assert feats["k"].shape == (32,) and label.shape == (32,)
    seen = {"fed": set(), "by_tf": set()}
    for which, ds in (("fed", fed), ("by_tf", by_tf)):
        n = 0
        for feats, label in ds:
            n += 1
            rids = feats["rid"].numpy()
            seen[which].update(rids.tolist())
            want = tf.io.parse_example(tf.constant([payloads[int(r)] for r in rids]), TF_FEATURES)
            assert isinstance(feats["hist"], tf.SparseTensor)
            for part in ("indices", "values", "dense_shape"):
                np.testing.assert_array_equal(getattr(feats["hist"], part), getattr(want["hist"], part))
            np.testing.assert_array_equal(feats["tags"].numpy(), _padded(want["tags"], 3, -1.0))
            np.testing.assert_array_equal(feats["k"].numpy(), want["k"].numpy())
            np.testing.assert_array_equal(label.numpy(), want["label"].numpy())
        assert n == 2 * steps, (which, n)
    assert seen["fed"] == seen["by_tf"] and len(seen["fed"]) > 32  # the same share by either reader
    assert any(r % 3 == 0 for r in seen["fed"])  # records without k (their k: the default) were read
