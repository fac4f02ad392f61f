"""The recommender with a variable-length history feature (a Parquet list column, or a TFRecord int64 list) trains in
both modes (real TF processes over loopback
gRPC, tests/helpers/harness.py), from skewed files, with equal steps per worker; its export serves the history as
``hist_indices`` / ``hist_values`` / ``hist_dense_shape``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness import LocalCluster
from tfyarn.tasklib.context import progress_key
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.slow
SKEWED = [1400, 500, 300]
FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"},
            "hist": {"dtype": "int64", "shape": [None]}}


def write_history_files(directory: Path, sizes: list[int], fmt: str = "tfrecord") -> list[str]:
    """Recommender examples with a 0-5 item history; the label says whether the item is in the history's bag."""
    from tfyarn.data.example import encode_example
    from tfyarn.data.tfrecord import TFRecordWriter
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    out = []
    for k, n in enumerate(sizes):
        rows = []
        for _ in range(n):
            hist = rng.integers(0, 100, int(rng.integers(0, 6))).tolist()
            item = int(rng.integers(0, 100))
            rows.append({"label": float(item % 2), "user_id": int(rng.integers(0, 100)), "item_id": item,
                         "hist": hist})
        path = directory / f"part-{k}.{'parquet' if fmt == 'parquet' else 'tfrecord'}"
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq
            pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([
                ("label", pa.float32()), ("user_id", pa.int64()), ("item_id", pa.int64()),
                ("hist", pa.list_(pa.int64()))])), path, row_group_size=256)
        else:
            with TFRecordWriter(str(path)) as w:
                for r in rows:
                    w.write(encode_example({"label": np.float32(r["label"]), "user_id": np.int64(r["user_id"]),
                                            "item_id": np.int64(r["item_id"]), "hist": np.int64(r["hist"])},
                                           {"hist": "int64"}))
        out.append(str(path))
    return out


def _spec(tmp: Path, mode: str, train: list[str]):
    roles = ({"chief": {"instances": 1}, "worker": {"instances": 1}} if mode == "allreduce"
             else {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 1}})
    doc = {"name": f"hist-{mode}", "model": "tfyarn.models.recommender:model",
           "params": {"num_users": 100, "num_items": 100, "dim": 8, "history": "hist"}, "mode": mode,
           "data": {"train": train, "features": FEATURES, "batch_size": 100, "epochs": 2},
           "roles": roles, "export": {"dir": str(tmp / "models")},
           "checkpoint": {"dir": str(tmp / "ckpt"), "every_secs": None, "keep": 1},
           "timeouts": {"step": 60, "rendezvous": 120, "shutdown": 30, "stall": 60}}
    if mode == "ps":
        doc["sync"] = True
    return load_spec_dict(doc)


@pytest.mark.parametrize("mode,fmt", [("allreduce", "parquet"), ("ps", "tfrecord")])
def test_history_feature_trains_with_equal_steps_and_is_served(tmp_path, mode, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    spec = _spec(tmp_path, mode, write_history_files(tmp_path / "data", SKEWED, fmt))
    with LocalCluster(spec, tmp_path / "run") as c:
        c.start()
        codes = c.wait(timeout=240)
        logs = {t: c.log(t) for t in c.procs}
        assert codes == {t: 0 for t in c.procs}, "\n".join(f"--- {t}\n{v[-3000:]}" for t, v in logs.items())
        progress = {t: json.loads(c.kv.get(progress_key(t))) for t in spec.training_tasks}
    planned = 2 * (sum(SKEWED) // (2 * 100))
    summary = json.loads((tmp_path / "ckpt" / "summary.json").read_text())
    assert summary["global_step"] == planned
    steps = {t: p.get("worker_steps", p.get("step")) for t, p in progress.items()}
    assert len(set(steps.values())) == 1, steps                 # equal steps per worker from skewed files
    import tensorflow as tf
    served = tf.saved_model.load(str(tmp_path / "models" / str(planned))).signatures["serving_default"]
    assert {"hist_indices", "hist_values", "hist_dense_shape", "user_id", "item_id"} == \
        set(served.structured_input_signature[1])
    out = served(user_id=tf.constant([1, 2], tf.int64), item_id=tf.constant([3, 4], tf.int64),
                 hist_indices=tf.constant([[0, 0], [0, 1]], tf.int64), hist_values=tf.constant([5, 6], tf.int64),
                 hist_dense_shape=tf.constant([2, 2], tf.int64))
    assert out["predictions"].shape == (2,) and np.isfinite(out["predictions"].numpy()).all()
