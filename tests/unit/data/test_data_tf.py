"""Compatibility with TensorFlow itself (imports TF, ~3 s): our files read by TF and TF's read by us, and the default
TF batch parser agreeing with the pure-Python one on every dtype, including its error diagnosis."""
from __future__ import annotations

import numpy as np
import pytest

from tfyarn.data import DataError, Feeder, TFRecordWriter, build_manifest
from tfyarn.data.example import encode_example
from tfyarn.data.parse import python_parser, schema, tf_parser
from tfyarn.data.tfrecord import iter_chunks

tf = pytest.importorskip("tensorflow")

from _datahelpers import ID_SCHEMA, write_ids  # noqa: E402


@pytest.mark.parametrize("gz", [False, True])
def test_tensorflow_reads_our_files(tmp_path, gz):
    path = str(tmp_path / ("a.tfrecord.gz" if gz else "a.tfrecord"))
    payloads = write_ids(f"file://{path}", 0, 300, compression="gzip" if gz else "none")
    got = [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type="GZIP" if gz else "")]
    assert got == payloads


@pytest.mark.parametrize("gz", [False, True])
def test_we_read_tensorflows_files(tmp_path, gz):
    path = str(tmp_path / "tf.rec")
    payloads = [bytes([i % 256]) * (i % 700) for i in range(400)]
    with tf.io.TFRecordWriter(path, options="GZIP" if gz else None) as w:
        for p in payloads:
            w.write(p)
    m = build_manifest([f"file://{path}"], use_cache=False, stride=64)
    assert m.files[0].gz == gz and m.files[0].records == 400
    fi = m.files[0]
    off, first = fi.boundary(130)
    got = [p for c in iter_chunks(fi.path, 130, 400, offset=off, first_record=first, gz=gz) for p in c.payloads]
    assert got == payloads[130:]


ALL_DTYPES = {"f32": {"dtype": "float32", "shape": (3,)}, "f64": {"dtype": "float64", "shape": ()},
              "i64": {"dtype": "int64", "shape": (2, 2)}, "i32": {"dtype": "int32", "shape": ()},
              "s": {"dtype": "string", "shape": ()}, "b": {"dtype": "bytes", "shape": (2,)}}


def all_dtypes_example(i):
    return encode_example({"f32": [i, i + 0.5, -i], "f64": [i / 3], "i64": [i, -i, 2**40 + i, 0], "i32": [i - 5],
                           "s": [f"naïve-{i}"], "b": [bytes([i % 256]), b"\x00\xff"]},
                          {"f32": "float", "f64": "float", "i64": "int64", "i32": "int64", "s": "bytes", "b": "bytes"})


def test_tf_parser_matches_python_parser_on_every_dtype():
    fields = schema(ALL_DTYPES)
    payloads = [all_dtypes_example(i) for i in range(50)]
    a, b = tf_parser(fields)(payloads), python_parser(fields)(payloads)
    assert set(a) == set(b) == set(ALL_DTYPES)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert (a[name] == b[name]).all(), name
    assert a["f32"].shape == (50, 3) and a["i64"].shape == (50, 2, 2) and a["i64"][3, 1, 0] == 2**40 + 3
    assert a["i32"].dtype == np.int32 and a["f64"].dtype == np.float64
    assert a["s"][7] == "naïve-7" and a["b"][7, 1] == b"\x00\xff"


def test_tf_parser_failure_is_diagnosed_per_record(mem):
    url = f"{mem}/a.tfrecord"
    payloads = [encode_example({"rid": [i]}, {"rid": "int64"}) if i == 12 else
                encode_example({"rid": [i], "x": [1.0, 2.0]}, {"rid": "int64", "x": "float"}) for i in range(30)]
    with TFRecordWriter(url) as w:
        for p in payloads:
            w.write(p)
    offset = sum(len(p) + 16 for p in payloads[:12])
    m = build_manifest([url], use_cache=False)
    with Feeder(m, ID_SCHEMA, 10, 0, 1, timeout=60) as f, pytest.raises(DataError) as e:
        list(f.epoch(0))
    assert e.value.feature == "x" and e.value.record == 12
    assert str(e.value) == f"{m.files[0].path}: record 12 at byte offset {offset}: feature 'x' is missing"
    with Feeder(m, ID_SCHEMA, 10, 0, 1, on_corrupt="skip", timeout=60) as f:
        got = [int(r) for b in f.epoch(0) for r in b["rid"]]
        assert f.skipped == 1
    assert len(got) == 30 and set(got) == set(range(30)) - {12}
