"""A compiled Keras model with a variable-length feature (issue 28, item 1): ``keras.Input(shape=(None,),
sparse=True, dtype="int64", name="hist")`` is fed the history as a ``tf.SparseTensor`` — preflight's Keras check
accepts it, and real jobs (processes over loopback gRPC, tests/helpers/harness.py) train it in both modes and export
it serving ``hist_indices`` / ``hist_values`` / ``hist_dense_shape``.

The model is :mod:`tfyarn.models.keras_recommender` with ``history: hist``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from harness import LocalCluster

from tfyarn.spec import load_spec_dict

FEATURES = {
    "label": {"dtype": "float32"},
    "user_id": {"dtype": "int64"},
    "item_id": {"dtype": "int64"},
    "hist": {"dtype": "int64", "shape": [None]},
}
PARAMS = {"num_users": 50, "num_items": 50, "dim": 4, "hidden": 4, "learning_rate": 0.1, "history": "hist"}


def _write(directory: Path, sizes: list[int]) -> list[str]:
    """Examples with a 0-5 item history; label: whether the item is odd."""
    from tfyarn.data import TFRecordWriter
    from tfyarn.data.example import encode_example

    directory.mkdir(parents=True)
    rng = np.random.default_rng(4)
    out = []
    for k, n in enumerate(sizes):
        path = directory / f"part-{k}.tfrecord"
        with TFRecordWriter(str(path)) as w:
            for _ in range(n):
                item = int(rng.integers(0, 50))
                w.write(
                    encode_example(
                        {
                            "label": np.float32(item % 2),
                            "user_id": np.int64(rng.integers(0, 50)),
                            "item_id": np.int64(item),
                            "hist": rng.integers(0, 50, int(rng.integers(0, 6))).astype(np.int64),
                        },
                        {"hist": "int64"},
                    )
                )
        out.append(str(path))
    return out


def _spec(tmp: Path, mode: str, train: list[str], optimizer: str = "Adam"):
    roles = {"chief": {"instances": 1}, "worker": {"instances": 1}}
    if mode == "ps":
        roles["ps"] = {"instances": 1}
    doc = {
        "name": f"keras-hist-{mode}",
        "model": "tfyarn.models.keras_recommender:model",
        "params": {**PARAMS, "optimizer": optimizer},
        "mode": mode,
        "data": {"train": train, "features": FEATURES, "batch_size": 100, "epochs": 2},
        "roles": roles,
        "export": {"dir": str(tmp / "models")},
        "checkpoint": {"dir": str(tmp / "ckpt"), "every_secs": None, "keep": 1},
        "timeouts": {"step": 60, "rendezvous": 120, "shutdown": 30, "stall": 60},
    }
    if mode == "ps":
        doc["sync"] = True
    return load_spec_dict(doc)


def test_preflight_keras_check_accepts_a_sparse_input_and_the_model_takes_a_sparse_tensor(tmp_path):
    import tensorflow as tf

    from tfyarn.train.keras_check import problems
    from tfyarn.train.model import build_model, load

    for mode, opt in (("allreduce", "Adam"), ("ps", "SGD")):
        assert problems(_spec(tmp_path, mode, ["x"], opt).to_json()) == [], mode
    spec = _spec(tmp_path, "allreduce", ["x"])
    model = build_model(load(spec.model, spec.params, data=spec.data))
    feats = {"user_id": tf.constant([1, 2, 3], tf.int64), "item_id": tf.constant([4, 5, 6], tf.int64)}
    with_hist = model(
        {**feats, "hist": tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([7, 8, 9], tf.int64), [3, 2])},
        training=False,
    )
    empty = model(
        {**feats, "hist": tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [3, 1])}, training=False
    )
    assert with_hist.shape == empty.shape == (3, 1)
    assert with_hist[1, 0] == empty[1, 0] and with_hist[0, 0] != empty[0, 0]  # row 1's history is empty in both


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["allreduce", "ps"])
def test_keras_model_with_a_history_feature_trains_and_serves_it_sparse(tmp_path, mode):
    sizes = [900, 500]
    spec = _spec(tmp_path, mode, _write(tmp_path / "data", sizes), "Adam" if mode == "allreduce" else "SGD")
    with LocalCluster(spec, tmp_path / "run") as c:
        c.start()
        codes = c.wait(timeout=300)
        assert codes == {t: 0 for t in c.procs}, "\n".join(f"--- {t}\n{c.log(t)[-3000:]}" for t in c.procs)
    planned = 2 * (sum(sizes) // (2 * 100))
    summary = json.loads((tmp_path / "ckpt" / "summary.json").read_text())
    assert summary["global_step"] == summary["total_steps"] == planned, summary
    assert np.isfinite(summary["last_loss"]) and summary["last_loss"] < summary["first_loss"] * 1.05, summary
    import tensorflow as tf

    served = tf.saved_model.load(str(tmp_path / "models" / str(planned))).signatures["serving_default"]
    assert set(served.structured_input_signature[1]) == {
        "user_id",
        "item_id",
        "hist_indices",
        "hist_values",
        "hist_dense_shape",
    }
    base = {"user_id": tf.constant([1, 2], tf.int64), "item_id": tf.constant([3, 3], tf.int64)}
    got = served(
        **base,
        hist_indices=tf.constant([[0, 0], [0, 1]], tf.int64),
        hist_values=tf.constant([5, 6], tf.int64),
        hist_dense_shape=tf.constant([2, 2], tf.int64),
    )
    none = served(
        **base,
        hist_indices=tf.zeros([0, 2], tf.int64),
        hist_values=tf.zeros([0], tf.int64),
        hist_dense_shape=tf.constant([2, 1], tf.int64),
    )
    p, q = got["predictions"].numpy().reshape(-1), none["predictions"].numpy().reshape(-1)
    assert p.shape == (2,) and np.isfinite(p).all()
    # the history reaches the served model
    assert float(p[1]) == pytest.approx(float(q[1])) and float(p[0]) != pytest.approx(float(q[0]))


def test_an_unbuilt_keras_model_is_built_on_a_sparse_history_and_a_padded_one():
    """A subclassed model is built on example inputs: an empty SparseTensor for ``shape: [null]``, zeros
    [1, pad_to] for a padded feature."""
    import keras
    import tensorflow as tf

    from tfyarn.train.keras_model import wrap
    from tfyarn.train.model import build_model

    seen = {}

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.head = keras.layers.Dense(1)

        def call(self, f):
            seen.update({k: type(v).__name__ for k, v in f.items()})
            bag = tf.cast(tf.sparse.reduce_sum(f["hist"], 1, keepdims=True), tf.float32)
            return self.head(tf.concat([bag, tf.cast(f["padded"], tf.float32)], 1))

    def factory():
        m = Net()
        m.compile(optimizer="adam", loss="mse")
        return m

    spec = load_spec_dict(
        {
            "name": "u",
            "model": "m:f",
            "mode": "allreduce",
            "roles": {"worker": {"instances": 1}},
            "data": {
                "train": ["x"],
                "batch_size": 4,
                "features": {
                    "hist": {"dtype": "int64", "shape": [None]},
                    "padded": {"dtype": "int64", "shape": [None], "pad_to": 3},
                    "label": {"dtype": "float32"},
                },
            },
        }
    )
    model = build_model(wrap(factory, factory(), spec.data, "m:f"))
    assert seen == {"hist": "SparseTensor", "padded": "EagerTensor"}, seen
    assert [tuple(v.shape) for v in model.variables] == [(4, 1), (1,)]
