"""Parquet and ORC as training data (pyarrow over fsspec): the footer-only index, equal steps per worker from skewed
files, batches equal to pyarrow's own reading of the same columns, variable-length list columns, dictionary columns,
resume, and every kind of bad input named (file, row group, column, both types)."""
from __future__ import annotations

import numpy as np
import pytest

from tfyarn.data import Feeder, build_manifest
from tfyarn.data.errors import DataError
from tfyarn.data.manifest import STATS
from tfyarn.data.ragged import SparseValue
from tfyarn.data.sources import for_file
from tfyarn.data.table import SchemaError
from tfyarn.errors import ExitCode

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FEATURES = {"label": {"dtype": "float32"}, "uid": {"dtype": "int64"}, "hist": {"dtype": "int64", "shape": [None]},
            "cat": {"dtype": "string"}}


def _table(n: int, seed: int, nulls: bool = False):
    rng = np.random.default_rng(seed)
    label = rng.random(n).astype(np.float32)
    return pa.table({
        "label": pa.array(label, pa.float32(), mask=(np.arange(n) % 97 == 5) if nulls else None),
        "uid": pa.array(np.arange(n) + 100_000 * seed, pa.int64()),
        "hist": pa.array([None if i % 11 == 3 else rng.integers(0, 99, int(rng.integers(0, 5))).tolist()
                          for i in range(n)], pa.list_(pa.int64())),
        "cat": pa.array([str(x) for x in rng.integers(0, 3, n)]).dictionary_encode(),
        "unused": pa.array(np.zeros(n))})


def _write(root, sizes, fmt="parquet", nulls=False, group=128):
    tables = {}
    for k, n in enumerate(sizes):
        t = _table(n, k, nulls)
        path = f"{root}/part-{k}.{fmt}"
        if fmt == "parquet":
            pq.write_table(t, path, row_group_size=group)
        else:
            import pyarrow.orc as orc          # (ORC has no dictionary type in arrow's writer)
            t = t.set_column(3, "cat", t.column("cat").cast(pa.string()))
            orc.write_table(t, path, stripe_size=16 * 1024)
        tables[f"file://{path}"] = t
    return tables


def _epoch(m, rank, workers, batch=100, epoch=0, **kw):
    with Feeder(m, FEATURES, batch, rank, workers, **kw) as f:
        return list(f.epoch(epoch))


def test_format_by_extension_or_declared():
    assert for_file("hdfs://nn/t/part-0.parquet").name == "parquet" and for_file("x/a.ORC").name == "orc"
    assert for_file("x/000000_0").name == "tfrecord" and for_file("x/000000_0", "orc").name == "orc"


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_skewed_tables_equal_steps_and_rows_equal_pyarrow(tmp_path, fmt):
    tables = _write(tmp_path, [1000, 300, 50], fmt)
    before = STATS.snapshot()["bytes_read"]
    m = build_manifest(f"file://{tmp_path}", use_cache=False)
    assert m.total_records == 1350 and {fi.format for fi in m.files} == {fmt}
    if fmt == "parquet":
        assert m.files[0].offsets[:3] == (0, 128, 256)                    # one entry per row group
    assert STATS.snapshot()["bytes_read"] - before <= m.total_bytes
    by_uid = {}
    for t in tables.values():
        for row in t.to_pylist():
            by_uid[row["uid"]] = row
    seen = []
    for rank in range(2):
        batches = _epoch(m, rank, 2)
        assert len(batches) == 1350 // 200                                   # equal steps: 6 each
        for b in batches:
            assert isinstance(b["hist"], SparseValue) and b["cat"].dtype == object
            dense = np.zeros(tuple(b["hist"].dense_shape), np.int64) - 1
            dense[tuple(b["hist"].indices.T)] = b["hist"].values
            for i, uid in enumerate(b["uid"].tolist()):
                row = by_uid[uid]
                assert b["label"][i] == np.float32(row["label"]) and b["cat"][i] == row["cat"]
                assert [v for v in dense[i] if v >= 0] == (row["hist"] or [])   # a null list: empty
                seen.append(uid)
    assert len(seen) == len(set(seen)) == 1200                                # no row twice, 150 dropped


def test_resume_mid_epoch_reproduces_the_batches(tmp_path):
    _write(tmp_path, [700, 400])
    m = build_manifest(f"file://{tmp_path}", use_cache=False)
    full = _epoch(m, 1, 2, epoch=1)
    with Feeder(m, FEATURES, 100, 1, 2) as f:
        tail = list(f.epoch(1, start_step=3))
    assert [b["uid"].tolist() for b in tail] == [b["uid"].tolist() for b in full[3:]]


@pytest.mark.parametrize("fmt,compression", [("parquet", "snappy"), ("orc", "zlib"), ("orc", "zstd")])
def test_index_reads_the_footer_not_the_data(tmp_path, fmt, compression):
    n = 200_000
    t = pa.table({"label": np.zeros(n, np.float32), "uid": np.random.default_rng(0).integers(0, 1 << 60, n)})
    path = tmp_path / f"big.{fmt}"
    if fmt == "parquet":
        pq.write_table(t, path, row_group_size=20_000, compression=compression)
    else:
        import pyarrow.orc as orc
        orc.write_table(t, path, stripe_size=256 * 1024, compression=compression)
    before = STATS.snapshot()["bytes_read"]
    m = build_manifest(f"file://{path}", use_cache=False)
    read = STATS.snapshot()["bytes_read"] - before
    assert m.total_records == n and len(m.files[0].offsets) >= 3
    with Feeder(m, {"uid": {"dtype": "int64"}}, 7000, 1, 2) as f:         # a range starting mid row group
        got = np.concatenate([b["uid"] for b in f.epoch(0)])
        share = f.plan(0).shares[1]
    assert share[0].start % 20_000 != 0
    want = t.column("uid").to_numpy()
    np.testing.assert_array_equal(got, np.concatenate([want[r.start:r.stop] for r in share]))
    assert read < m.total_bytes / 4, (read, m.total_bytes)


def test_null_without_default_fails_naming_file_row_group_and_column(tmp_path):
    _write(tmp_path, [600], nulls=True)
    m = build_manifest(f"file://{tmp_path}", use_cache=False)
    with pytest.raises(DataError) as e:
        _epoch(m, 0, 1)
    assert str(e.value).startswith(f"file://{tmp_path}/part-0.parquet: row group 0, row 5: column 'label' is null")
    assert e.value.feature == "label" and e.value.record == 5


def test_null_rows_skipped_and_counted_with_equal_steps(tmp_path):
    _write(tmp_path, [600, 200], nulls=True)
    m = build_manifest(f"file://{tmp_path}", use_cache=False, on_corrupt="skip")
    with Feeder(m, FEATURES, 100, 0, 2, on_corrupt="skip") as f:
        batches = list(f.epoch(0))
        assert len(batches) == 4 and f.skipped > 0
        assert all(np.isfinite(b["label"]).all() for b in batches)


def test_null_with_default_is_filled(tmp_path):
    _write(tmp_path, [300], nulls=True)
    m = build_manifest(f"file://{tmp_path}", use_cache=False)
    feats = {**FEATURES, "label": {"dtype": "float32", "default": -1.0},
             "hist": {"dtype": "int64", "shape": [None], "pad_to": 3, "default": -7}}
    with Feeder(m, feats, 100, 0, 1) as f:
        b = list(f.epoch(0))
    labels = np.concatenate([x["label"] for x in b])
    assert (labels == -1.0).sum() == 4 and b[0]["hist"].shape == (100, 3)


def test_wrong_type_and_missing_column_fail_before_start(tmp_path):
    _write(tmp_path, [300])
    m = build_manifest(f"file://{tmp_path}", use_cache=False)
    with pytest.raises(SchemaError) as e:
        Feeder(m, {**FEATURES, "cat": {"dtype": "float32"}}, 100, 0, 1)
    assert "column 'cat' is dictionary<values=string" in str(e.value) and "feature 'cat' is float32" in str(e.value)
    assert e.value.exit_code == ExitCode.INVALID
    with pytest.raises(SchemaError, match="column 'uid' is int64, but feature 'uid' is int64 shape \\[null\\]"):
        Feeder(m, {**FEATURES, "uid": {"dtype": "int64", "shape": [None]}}, 100, 0, 1)
    with pytest.raises(SchemaError, match="no column 'age' for feature 'age'"):
        Feeder(m, {**FEATURES, "age": {"dtype": "int64"}}, 100, 0, 1)


@pytest.mark.parametrize("damage", ["footer", "truncated"])
def test_corrupt_footer_or_truncated_file_names_the_file(tmp_path, damage):
    _write(tmp_path, [300])
    path = tmp_path / "part-0.parquet"
    data = bytearray(path.read_bytes())
    if damage == "footer":
        data[-12:-8] = b"\xff\xff\xff\x7f"            # footer length beyond the file
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=f"file://{path}: not a readable parquet file"):
        build_manifest(f"file://{path}", use_cache=False)


def test_damaged_data_pages_fail_naming_the_file_and_row_group(tmp_path):
    n = 4000
    rng = np.random.default_rng(1)
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"label": rng.random(n).astype(np.float32), "uid": rng.integers(0, 1 << 60, n),
                             "hist": pa.array([[1, 2]] * n, pa.list_(pa.int64())), "cat": ["a"] * n}),
                   path, row_group_size=1000, compression="snappy")
    m = build_manifest(f"file://{path}", use_cache=False)             # the footer is intact: indexing works
    meta = pq.read_metadata(path)
    col = meta.row_group(2).column(1)                                 # row group 2's uid pages
    data = bytearray(path.read_bytes())
    start = col.data_page_offset
    data[start + 20:start + 2000] = bytes(1980)
    path.write_bytes(bytes(data))
    with Feeder(m, {"uid": {"dtype": "int64"}}, 500, 0, 1) as f, pytest.raises(DataError) as e:
        list(f.epoch(0))
    assert str(e.value).startswith(f"file://{path}: row group 2: cannot read rows"), str(e.value)
