"""Synthetic data: shards with the requested skew, the documented schemas, deterministic, and learnable."""
from __future__ import annotations

import fsspec
import numpy as np
import pytest

from tfyarn.data import build_manifest, summarize, write_synthetic
from tfyarn.data.parse import decode_example, python_parser, schema
from tfyarn.data.synth import SCHEMAS, SynthError, file_sizes
from tfyarn.data.tfrecord import iter_chunks


def read(m, kind):
    parse = python_parser(schema(SCHEMAS[kind]))
    cols = [parse(c.payloads) for f in m.files for c in iter_chunks(f.path, 0, f.records)]
    return {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}


def test_recommender_shards_skew_and_schema(mem):
    urls = write_synthetic(mem, "recommender", files=8, records=4000, skew=10, seed=3)
    assert [u.rsplit("/", 1)[1] for u in urls] == [f"part-{i:05d}.tfrecord" for i in range(8)]
    m = build_manifest([f"{mem}/*"], use_cache=False)
    counts = [f.records for f in m.files]
    assert sum(counts) == 4000 and 8 <= max(counts) / min(counts) <= 12
    first = next(iter_chunks(m.files[0].path, 0, 1)).payloads[0]
    assert {k: v[0] for k, v in decode_example(first).items()} == {
        "label": "float_list", "user_id": "int64_list", "item_id": "int64_list"}
    d = read(m, "recommender")
    assert set(np.unique(d["label"])) == {0.0, 1.0} and 0.3 < d["label"].mean() < 0.7
    # Learnable: the label is a function of (user, item) — the same pair always has the same label.
    pairs = {}
    for u, i, y in zip(d["user_id"].tolist(), d["item_id"].tolist(), d["label"].tolist()):
        assert pairs.setdefault((u, i), y) == y


def test_logreg_is_linearly_learnable(mem):
    write_synthetic(mem, "logreg", files=3, records=3000, skew=1, seed=0)
    d = read(build_manifest([f"{mem}/*"], use_cache=False), "logreg")
    assert d["x"].shape == (3000, 16) and d["x"].dtype == np.float32
    X = np.hstack([d["x"], np.ones((3000, 1), np.float32)])
    w, *_ = np.linalg.lstsq(X[:2000], d["label"][:2000] * 2 - 1, rcond=None)
    accuracy = ((X[2000:] @ w > 0) == (d["label"][2000:] > 0.5)).mean()
    assert accuracy > 0.85


def test_deterministic_by_seed_and_gzip(mem):
    a = write_synthetic(f"{mem}/a", files=2, records=100, seed=1)
    b = write_synthetic(f"{mem}/b", files=2, records=100, seed=1)
    c = write_synthetic(f"{mem}/c", files=2, records=100, seed=2, compression="gzip")
    cat = [fsspec.open(u, "rb").open().read() for u in a + b]
    assert cat[:2] == cat[2:]
    assert c[0].endswith(".tfrecord.gz")
    assert build_manifest([f"{mem}/c/*"], use_cache=False).files[0].gz


def test_file_sizes_and_bad_arguments():
    sizes = file_sizes(5, 1000, 4.0, np.random.default_rng(0))
    assert sum(sizes) == 1000 and len(sizes) == 5
    with pytest.raises(ValueError, match="need files > 0 and records >= files"):
        file_sizes(5, 3, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="kind must be one of recommender, logreg, not 'mnist'"):
        write_synthetic("memory://x", "mnist")


def test_summary_of_many_files(mem):
    write_synthetic(mem, files=25, records=2500, skew=2)
    text = summarize(build_manifest([f"{mem}/*"], use_cache=False))
    assert "... 5 more files ..." in text and text.splitlines()[0].startswith("25 files, 2,500 records")


def _names(url):
    fs, root = fsspec.core.url_to_fs(url)
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))


def test_writing_into_a_directory_that_holds_data_refuses_unless_overwrite(mem):
    """Was: 8 files, then 2 more into the same directory → part-00000/00001 replaced, 00002..00007 kept (mixed)."""
    first = write_synthetic(f"{mem}/syn1", files=8, records=800)
    build_manifest(f"{mem}/syn1")                                  # a run cached its indexes beside the data
    before = {u: fsspec.open(u, "rb").open().read() for u in first}
    with pytest.raises(SynthError) as e:
        write_synthetic(f"{mem}/syn1", files=2, records=100)
    assert str(e.value) == (f"{mem}/syn1: the directory already holds data (part-00000.tfrecord, part-00001.tfrecord, "
                            f"part-00002.tfrecord and 5 more); choose an empty directory or pass overwrite=True "
                            f"(tfyarn data synth --overwrite) to replace it")
    assert isinstance(e.value, ValueError) and e.value.exit_code == 2
    assert {u: fsspec.open(u, "rb").open().read() for u in first} == before          # nothing touched
    urls = write_synthetic(f"{mem}/syn1", files=2, records=100, overwrite=True)
    assert _names(f"{mem}/syn1") == ["part-00000.tfrecord", "part-00001.tfrecord"]    # stale indexes gone too
    m = build_manifest(f"{mem}/syn1")
    assert [f.path.rsplit("/", 1)[1] for f in m.files] == [u.rsplit("/", 1)[1] for u in urls]
    assert m.total_records == 100


def test_overwrite_replaces_gzip_shards_and_never_deletes_what_synth_did_not_write(mem, local):
    write_synthetic(f"{local}/d", files=3, records=30, compression="gzip")
    write_synthetic(f"{local}/d", files=2, records=20, overwrite=True)
    assert _names(f"{local}/d") == ["part-00000.tfrecord", "part-00001.tfrecord"]
    fsspec.filesystem("file").pipe_file(f"{local}/d/mine.tfrecord".removeprefix("file://"), b"precious")
    with pytest.raises(SynthError, match=r"^file://.*/d: the directory already holds data \(mine\.tfrecord\); choose "
                                         r"an empty directory \(overwrite=True replaces only part-NNNNN\.tfrecord"):
        write_synthetic(f"{local}/d", files=2, records=20, overwrite=True)
    assert _names(f"{local}/d") == ["mine.tfrecord", "part-00000.tfrecord", "part-00001.tfrecord"]
    fs = fsspec.filesystem("memory")                             # no data yet (only Hadoop's marker): no overwrite
    fs.pipe_file(f"{mem}/out/_SUCCESS".removeprefix("memory://"), b"")
    assert len(write_synthetic(f"{mem}/out", files=2, records=20)) == 2


@pytest.mark.parametrize("kw, message", [
    ({"files": 0}, "files must be a positive integer, not 0"),
    ({"records": 0}, "records must be a positive integer, not 0"),
    ({"files": -2}, "files must be a positive integer, not -2"),
    ({"records": -5}, "records must be a positive integer, not -5"),
    ({"files": 5, "records": 3}, "records must be >= files (every file gets at least one record): got records=3, "
                                 "files=5"),
    ({"users": 0}, "users must be a positive integer, not 0"),
    ({"compression": "zstd"}, "compression must be none or gzip, not 'zstd'"),
])
def test_bad_arguments_name_the_argument_and_write_nothing(mem, kw, message):
    with pytest.raises(SynthError) as e:
        write_synthetic(f"{mem}/bad", **kw)
    assert str(e.value) == message and isinstance(e.value, ValueError)
    assert not fsspec.filesystem("memory").exists(f"{mem}/bad".removeprefix("memory://"))
