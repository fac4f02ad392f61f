"""Bad input in the new formats and features is one clear line and exit 2 before anything starts (validate
--check-files, the CLI's preflight), or the job failing naming file + offset; `tfyarn data index` on tables."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml

from tfyarn.data import Feeder, TFRecordWriter, build_manifest
from tfyarn.data.errors import DataError
from tfyarn.data.example import encode_example

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"},
            "hist": {"dtype": "int64", "shape": [None]}}


def _parquet(d, sizes):
    d.mkdir(parents=True, exist_ok=True)
    for k, n in enumerate(sizes):
        pq.write_table(pa.table({"label": np.zeros(n, np.float32), "user_id": np.arange(n), "item_id": np.arange(n),
                                 "hist": pa.array([[1, 2]] * n, pa.list_(pa.int64()))}), d / f"part-{k}.parquet")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tfyarn.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def _spec(tmp_path, data, batch=100, features=None):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "pq", "model": "tfyarn.models.recommender:model", "params": {"history": "hist"}, "mode": "ps",
        "data": {"train": str(data), "features": features or FEATURES, "batch_size": batch},
        "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 2}}}))
    return str(path)


def test_index_and_preflight_of_parquet(tmp_path):
    _parquet(tmp_path / "data", [200, 100])
    index = _cli("data", "index", str(tmp_path / "data"))
    assert index.returncode == 0 and index.stdout.startswith("2 files, 300 records"), index.stderr
    ok = _cli("validate", _spec(tmp_path, tmp_path / "data"), "--check-files")
    assert ok.returncode == 0, ok.stderr
    few = _cli("validate", _spec(tmp_path, tmp_path / "data", batch=500), "--check-files")
    assert few.returncode == 2 and ("data.train: 300 records are fewer than one global batch (3 training tasks x "
                                    "data.batch_size 500 = 1500)") in few.stderr, few.stderr


def test_index_of_tables_named_without_extension_by_format(tmp_path):
    _parquet(tmp_path / "data", [200, 100])
    for k in range(2):                                 # as Hive writes them: 000000_0
        (tmp_path / "data" / f"part-{k}.parquet").rename(tmp_path / "data" / f"00000{k}_0")
    index = _cli("data", "index", "--format", "parquet", str(tmp_path / "data"))
    assert index.returncode == 0 and index.stdout.startswith("2 files, 300 records"), index.stderr
    old = _cli("data", "index", "--compression", "parquet", str(tmp_path / "data"))   # the old spelling still works
    assert old.returncode == 0 and old.stdout.startswith("2 files, 300 records"), old.stderr
    wrong = _cli("data", "index", str(tmp_path / "data"))                              # read as TFRecords: refused
    assert wrong.returncode != 0 and "_0: not a TFRecord file" in wrong.stderr, wrong.stderr   # (either file)


@pytest.mark.parametrize("change,message", [
    ({"item_id": {"dtype": "string"}}, "column 'item_id' is int64, but feature 'item_id' is string shape []"),
    ({"age": {"dtype": "int64"}}, "no column 'age' for feature 'age'"),
    ({"hist": {"dtype": "float32", "shape": [None]}},
     "column 'hist' is list<element: int64>, but feature 'hist' is float32 shape [null]")])
def test_wrong_columns_are_one_line_exit_2_before_start(tmp_path, change, message):
    _parquet(tmp_path / "data", [200])
    proc = _cli("validate", _spec(tmp_path, tmp_path / "data", features={**FEATURES, **change}), "--check-files")
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_pad_to_on_a_fixed_feature_is_a_spec_error(tmp_path):
    _parquet(tmp_path / "data", [200])
    proc = _cli("validate", _spec(tmp_path, tmp_path / "data",
                                  features={**FEATURES, "user_id": {"dtype": "int64", "pad_to": 4}}))
    assert proc.returncode == 2 and "pad_to is for variable-length features (shape: [null])" in proc.stderr, \
        proc.stderr


def test_tfrecord_varlen_of_the_wrong_dtype_fails_naming_file_and_offset(tmp_path):
    url = f"file://{tmp_path}/v.tfrecord"
    with TFRecordWriter(url) as w:
        for i in range(40):
            hist = np.float32([1.5]) if i == 17 else np.int64([i])
            w.write(encode_example({"label": np.float32(0), "user_id": np.int64(i), "item_id": np.int64(i),
                                    "hist": hist}))
    m = build_manifest(url, use_cache=False)
    with Feeder(m, FEATURES, 20, 0, 1) as f, pytest.raises(DataError) as e:
        list(f.epoch(0))
    assert e.value.record == 17 and e.value.offset is not None and str(e.value).startswith(
        f"{url}: record 17 at byte offset {e.value.offset}: variable-length feature 'hist' has the wrong dtype: "
        f"float_list, expected int64_list")
