"""Synthetic, learnable TFRecord data for the built-in models, tests and benchmarks (no TensorFlow needed).

Why deliberately uneven file sizes (``skew``): real Hadoop output is skewed, and uneven files are exactly what made
file-sharded synchronous training stall. Every demo and benchmark therefore runs on skewed data by default.

Why learnable: a demo whose loss does not go down proves nothing. ``recommender`` labels are the sign of a hidden
user·item dot product (a dot-product embedding model can learn it); ``logreg`` labels are a noisy linear threshold
of ``x`` (a logistic regression can learn it).
"""
from __future__ import annotations

import logging

import fsspec
import numpy as np

from tfyarn.data.example import _field, _varint
from tfyarn.data.tfrecord import TFRecordWriter

log = logging.getLogger(__name__)

KINDS = ("recommender", "logreg")
SCHEMAS = {
    "recommender": {"label": {"dtype": "float32", "shape": ()}, "user_id": {"dtype": "int64", "shape": ()},
                    "item_id": {"dtype": "int64", "shape": ()}},
    "logreg": {"label": {"dtype": "float32", "shape": ()}, "x": {"dtype": "float32", "shape": (16,)}},
}


def file_sizes(files: int, records: int, skew: float, rng: np.random.Generator) -> list[int]:
    """``files`` sizes summing to ``records``, largest/smallest ≈ ``skew``, in a seeded random order."""
    if files <= 0 or records < files:
        raise ValueError(f"need files > 0 and records >= files (got files={files}, records={records})")
    weights = np.geomspace(1.0, max(1.0, float(skew)), files)
    rng.shuffle(weights)
    sizes = np.maximum(1, np.floor(weights / weights.sum() * records)).astype(int)
    sizes[int(np.argmax(sizes))] += records - int(sizes.sum())
    return sizes.tolist()


def _int_feature(v: int) -> bytes:
    return _field(3, _field(1, _varint(v)))


def _float_feature(raw: bytes) -> bytes:
    return _field(2, _field(1, raw))


def _entry(key: bytes, feature: bytes) -> bytes:
    return _field(1, _field(1, key) + _field(2, feature))


def write_synthetic(url_dir: str, kind: str = "recommender", *, files: int = 16, records: int = 100_000,
                    skew: float = 10.0, seed: int = 0, compression: str = "none", users: int = 1000,
                    items: int = 1000, dim: int = 8) -> list[str]:
    """Write ``records`` Examples in ``files`` shards ``part-NNNNN.tfrecord[.gz]`` under ``url_dir``.

    kind: ``recommender`` (label float32 (), user_id int64 (), item_id int64 ()) or ``logreg`` (label float32 (),
    x float32 (16,)). skew: largest/smallest file size ratio (1 = even). compression: ``none`` or ``gzip``.
    Deterministic from ``seed``. Returns the URLs written, in order.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    rng = np.random.default_rng(seed)
    sizes = file_sizes(files, records, skew, rng)
    fs, root = fsspec.core.url_to_fs(url_dir)
    fs.makedirs(root, exist_ok=True)
    ext = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    if kind == "recommender":
        # Like real click data: strong user/item popularity (biases, learnt within an epoch) plus a taste
        # interaction (the dot product, learnt more slowly). Scales chosen so the quickstart's loss visibly drops.
        U = rng.normal(size=(users, dim)) / np.sqrt(dim)
        V = rng.normal(size=(items, dim))
        bu = rng.normal(scale=1.5, size=users)
        bi = rng.normal(scale=1.5, size=items)
    else:
        w = rng.normal(size=16)
    urls = []
    for i, n in enumerate(sizes):
        url = f"{url_dir.rstrip('/')}/part-{i:05d}{ext}"
        with TFRecordWriter(url, compression="gzip" if compression == "gzip" else "none") as wr:
            if kind == "recommender":
                u = rng.integers(0, users, n)
                it = rng.integers(0, items, n)
                label = ((U[u] * V[it]).sum(axis=1) + bu[u] + bi[it] > 0).astype("<f4")
                raw = label.tobytes()
                labs = [raw[4 * k:4 * k + 4] for k in range(n)]
                for uu, ii, lab in zip(u.tolist(), it.tolist(), labs):
                    wr.write(_field(1, _entry(b"item_id", _int_feature(ii)) + _entry(b"label", _float_feature(lab))
                                    + _entry(b"user_id", _int_feature(uu))))
            else:
                x = rng.normal(size=(n, 16)).astype("<f4")
                label = ((x @ w + rng.normal(scale=0.5, size=n)) > 0).astype("<f4")
                for k in range(n):
                    wr.write(_field(1, _entry(b"label", _float_feature(label[k:k + 1].tobytes()))
                                    + _entry(b"x", _float_feature(x[k].tobytes()))))
        urls.append(url)
    log.info("wrote %d %s records in %d files under %s (sizes %d..%d)", records, kind, files, url_dir,
             min(sizes), max(sizes))
    return urls
