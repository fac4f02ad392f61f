"""Helpers of the predict tests: a real SavedModel of the built-in recommender (tfyarn's own export code), input
tables with a ``row`` column numbering every input row, and a predict spec over them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

RECOMMENDER = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}
INPUTS = {"user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}


def write_model(root: Path, version: int = 7, seed: int = 1) -> Path:
    """A SavedModel version dir ``root/<version>`` as ``tfyarn export`` writes one (random weights)."""
    import tensorflow as tf

    from tfyarn.models.recommender import Recommender
    from tfyarn.spec import Feature
    from tfyarn.train.export import SIGNATURE, serving_module
    from tfyarn.train.model import build_model

    model = build_model(Recommender(num_users=100, num_items=100, dim=8, seed=seed))
    module, fn = serving_module(model, {k: Feature(**v) for k, v in RECOMMENDER.items()}, "label")
    out = Path(root) / str(version)
    tf.saved_model.save(module, str(out), signatures={SIGNATURE: fn})
    return out


def reference_predictions(model_dir: str | Path, user_id: np.ndarray, item_id: np.ndarray) -> np.ndarray:
    """The SavedModel's own predictions (its serving signature called directly, whole arrays at once)."""
    import tensorflow as tf

    sig = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    return sig(user_id=tf.constant(user_id, tf.int64), item_id=tf.constant(item_id, tf.int64))["predictions"].numpy()


def table(first_row: int, n: int, seed: int) -> Any:
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    return pa.table({"row": np.arange(first_row, first_row + n), "user_id": rng.integers(0, 100, n),
                     "item_id": rng.integers(0, 100, n), "label": rng.random(n).astype(np.float32)})


def write_parquet(root: Path, sizes: list[int], row_group: int = 1000) -> int:
    """Parquet files of ``sizes`` rows under ``root`` (a local dir); returns the total."""
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    first = 0
    for k, n in enumerate(sizes):
        pq.write_table(table(first, n, k), root / f"part-{k:05d}.parquet", row_group_size=row_group)
        first += n
    return first


def predict_doc(model: str, data: str, out: str, *, workers: int = 2, **predict: Any) -> dict[str, Any]:
    return {
        "name": "score",
        "job": "predict",
        "predict": {"saved_model": model, "input": data, "output": out, "features": INPUTS,
                    "keep": ["row", "user_id", "item_id"], "batch_size": 128, "part_rows": 2000, **predict},
        "roles": {"worker": {"instances": workers, "memory": "1 GiB"}},
        "timeouts": {"stall": 120, "shutdown": 15},
    }


def read_output(out: str) -> Any:
    """Every part of a predict output dir, in part order (pyarrow's dataset reader leaves _SUCCESS, _tfyarn out)."""
    import pyarrow.dataset as ds

    return ds.dataset(out, format="parquet").to_table()
