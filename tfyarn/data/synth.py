"""Synthetic, learnable TFRecord data for the built-in models, tests and benchmarks (no TensorFlow needed).

Why deliberately uneven file sizes (``skew``): real Hadoop output is skewed, and uneven files are exactly what made
file-sharded synchronous training stall. Every demo and benchmark therefore runs on skewed data by default.

Why learnable: a demo whose loss does not go down proves nothing. ``recommender`` labels are the sign of a hidden
user·item dot product (a dot-product embedding model can learn it); ``logreg`` labels are a noisy linear threshold
of ``x`` (a logistic regression can learn it).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Iterator

import fsspec  # noqa: TID253 - the data path writes through fsspec
import numpy as np

from tfyarn.data.example import _field, _varint, entry, float_feature
from tfyarn.data.listing import data_files
from tfyarn.data.tfrecord import TFRecordWriter
from tfyarn.errors import ExitCode, TfyarnError

log = logging.getLogger(__name__)

SCHEMAS = {
    "recommender": {
        "label": {"dtype": "float32", "shape": ()},
        "user_id": {"dtype": "int64", "shape": ()},
        "item_id": {"dtype": "int64", "shape": ()},
    },
    "logreg": {"label": {"dtype": "float32", "shape": ()}, "x": {"dtype": "float32", "shape": (16,)}},
}


#: What this module writes (``part-00000.tfrecord[.gz]``) and the index tfyarn caches beside each such file: the
#: only files ``overwrite=True`` removes.
_OURS = re.compile(r"\.?part-\d{5}\.tfrecord(\.gz)?(\.tfyidx\.json)?")


class SynthError(ValueError, TfyarnError):
    """Bad arguments to :func:`write_synthetic`, or an output directory that already holds data. A ValueError (a
    bad argument) and a usage error for the CLI (exit 2): nothing was written."""

    exit_code = ExitCode.INVALID


def _check_arguments(kind: str, files: int, records: int, compression: str, **positive: int) -> None:
    """Every argument checked before anything is written, each error naming the argument."""
    if kind not in SCHEMAS:
        raise SynthError(f"kind must be one of {', '.join(SCHEMAS)}, not {kind!r}")
    for name, value in {"files": files, "records": records, **positive}.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
            raise SynthError(f"{name} must be a positive integer, not {value!r}")
    if records < files:
        raise SynthError(
            f"records must be >= files (every file gets at least one record): got records={records}, files={files}"
        )
    if compression not in ("none", "gzip"):
        raise SynthError(f"compression must be none or gzip, not {compression!r}")


def _clear(fs: Any, root: str, url_dir: str, overwrite: bool) -> None:
    """Make sure the shards written next are the directory's whole data set, not mixed with older shards that a
    job reading the directory would train on without a word.

    Without ``overwrite`` any data file (:func:`tfyarn.data.listing.data_files`) refuses; with it, the shards a
    previous run wrote and their cached indexes are removed, and any other data file still refuses (not ours).
    """
    if not fs.isdir(root):
        return
    prefix = root.rstrip("/") + "/"
    existing = sorted(p[len(prefix) :] if p.startswith(prefix) else p for p in data_files(fs, root))
    if not existing:
        return
    others = [n for n in existing if "/" in n or not _OURS.fullmatch(n)]
    if not overwrite or others:
        shown = others or existing
        what = ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")
        raise SynthError(
            f"{url_dir}: the directory already holds data ({what}); choose an empty directory"
            + (
                " (overwrite=True replaces only part-NNNNN.tfrecord files written by synth)"
                if overwrite
                else " or pass overwrite=True (tfyarn data synth --overwrite) to replace it"
            )
        )
    doomed = [p for p in fs.ls(root, detail=False) if _OURS.fullmatch(p.rstrip("/").rsplit("/", 1)[-1])]
    fs.rm(doomed)
    log.info("overwrite: removed %d files under %s", len(doomed), url_dir)


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


class _Recommender:
    """Like real click data: strong user/item popularity (biases, learnt within an epoch) plus a taste interaction
    (the dot product, learnt more slowly). Scales chosen so the quickstart's loss visibly drops."""

    def __init__(self, rng: np.random.Generator, users: int, items: int, dim: int):
        self.users, self.items = users, items
        self.U = rng.normal(size=(users, dim)) / np.sqrt(dim)
        self.V = rng.normal(size=(items, dim))
        self.bu = rng.normal(scale=1.5, size=users)
        self.bi = rng.normal(scale=1.5, size=items)

    def examples(self, rng: np.random.Generator, n: int) -> Iterator[bytes]:
        """``n`` serialized Examples (label, user_id, item_id)."""
        u = rng.integers(0, self.users, n)
        it = rng.integers(0, self.items, n)
        label = ((self.U[u] * self.V[it]).sum(axis=1) + self.bu[u] + self.bi[it] > 0).astype("<f4")
        raw = label.tobytes()
        labs = [raw[4 * k : 4 * k + 4] for k in range(n)]
        for uu, ii, lab in zip(u.tolist(), it.tolist(), labs):
            yield _field(
                1,
                entry(b"item_id", _int_feature(ii))
                + entry(b"label", float_feature(lab))
                + entry(b"user_id", _int_feature(uu)),
            )


class _LogReg:
    """A noisy linear boundary over 16 normal features."""

    def __init__(self, rng: np.random.Generator):
        self.w = rng.normal(size=16)

    def examples(self, rng: np.random.Generator, n: int) -> Iterator[bytes]:
        """``n`` serialized Examples (label, x)."""
        x = rng.normal(size=(n, 16)).astype("<f4")
        label = ((x @ self.w + rng.normal(scale=0.5, size=n)) > 0).astype("<f4")
        for k in range(n):
            yield _field(
                1,
                entry(b"label", float_feature(label[k : k + 1].tobytes())) + entry(b"x", float_feature(x[k].tobytes())),
            )


def write_synthetic(
    url_dir: str,
    kind: str = "recommender",
    *,
    files: int = 16,
    records: int = 100_000,
    skew: float = 10.0,
    seed: int = 0,
    compression: str = "none",
    users: int = 1000,
    items: int = 1000,
    dim: int = 8,
    overwrite: bool = False,
) -> list[str]:
    """Write ``records`` Examples in ``files`` shards ``part-NNNNN.tfrecord[.gz]`` under ``url_dir``.

    kind: ``recommender`` (label float32 (), user_id int64 (), item_id int64 ()) or ``logreg`` (label float32 (),
    x float32 (16,)). skew: largest/smallest file size ratio (1 = even). compression: ``none`` or ``gzip``.
    Deterministic from ``seed``. Returns the URLs written, in order.

    A directory already holding data raises :class:`SynthError` unless ``overwrite=True``: then the shards of an
    earlier run (and their cached indexes) are removed first, so the directory holds exactly the new set. Bad
    arguments raise :class:`SynthError` naming the argument, before anything is written.
    """
    _check_arguments(kind, files, records, compression, users=users, items=items, dim=dim)
    rng = np.random.default_rng(seed)
    sizes = file_sizes(files, records, skew, rng)
    fs, root = fsspec.core.url_to_fs(url_dir)
    _clear(fs, root, url_dir, overwrite)
    fs.makedirs(root, exist_ok=True)
    ext = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    kind_of = _Recommender(rng, users, items, dim) if kind == "recommender" else _LogReg(rng)
    urls = []
    for i, n in enumerate(sizes):
        url = f"{url_dir.rstrip('/')}/part-{i:05d}{ext}"
        with TFRecordWriter(url, compression="gzip" if compression == "gzip" else "none") as wr:
            for example in kind_of.examples(rng, n):
                wr.write(example)
        urls.append(url)
    log.info(
        "wrote %d %s records in %d files under %s (sizes %d..%d)", records, kind, files, url_dir, min(sizes), max(sizes)
    )
    return urls
