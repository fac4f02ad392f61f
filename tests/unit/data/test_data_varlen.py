"""Variable-length features (``shape: [null]``, ``pad_to``) and ``default:`` on fixed features, against TensorFlow's
own ``tf.io.parse_example`` with ``VarLenFeature`` / ``FixedLenFeature(default_value=...)``: the C parser, TF's
ragged path and the pure-Python parser give the same values, rows and dense shapes; the feeder's batches equal
parse_example of the same records; bad input is named."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tfyarn.data import Feeder, TFRecordWriter, build_manifest, native, parse
from tfyarn.data.errors import DataError
from tfyarn.data.example import encode_example
from tfyarn.data.ragged import Ragged, SparseValue, finish

tf = pytest.importorskip("tensorflow")

SCHEMA = {"hist": {"dtype": "int64", "shape": [None]}, "w": {"dtype": "float32", "shape": [None]},
          "x": {"dtype": "float32", "shape": [2], "default": 0.5}, "k": {"dtype": "int64", "default": -3},
          "y": {"dtype": "float32"}}
TF_FEATURES = {"hist": tf.io.VarLenFeature(tf.int64), "w": tf.io.VarLenFeature(tf.float32),
               "x": tf.io.FixedLenFeature([2], tf.float32, default_value=[0.5, 0.5]),
               "k": tf.io.FixedLenFeature([], tf.int64, default_value=-3), "y": tf.io.FixedLenFeature([], tf.float32)}

_i64 = st.integers(-2**63, 2**63 - 1)
_f32 = st.floats(width=32, allow_nan=False)
_record = st.fixed_dictionaries(
    {"y": _f32},
    optional={"hist": st.lists(_i64, max_size=6), "w": st.lists(_f32, max_size=6),
              "x": st.lists(_f32, min_size=2, max_size=2), "k": _i64})
KINDS = {"hist": "int64", "w": "float", "x": "float", "k": "int64", "y": "float"}


def _encode(rec: dict) -> bytes:
    return encode_example({k: np.asarray(v, dtype=np.float32 if KINDS[k] == "float" else np.int64)
                           for k, v in rec.items()}, KINDS)


def _tf_reference(payloads: list[bytes]) -> dict:
    got = tf.io.parse_example(tf.constant(payloads), TF_FEATURES)
    out = {}
    for k, v in got.items():
        if isinstance(v, tf.SparseTensor):
            out[k] = SparseValue(v.indices.numpy(), v.values.numpy(), v.dense_shape.numpy())
        else:
            out[k] = v.numpy()
    return out


def _same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        x, y = finish(a[k]), finish(b[k])
        if isinstance(y, SparseValue):
            assert isinstance(x, SparseValue), k
            for xa, ya in zip(x, y):
                np.testing.assert_array_equal(xa, ya, err_msg=k)
        else:
            np.testing.assert_array_equal(x, y, err_msg=k)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_record, min_size=1, max_size=12))
def test_parsers_equal_tf_parse_example(records):
    payloads = [_encode(r) for r in records]
    want = _tf_reference(payloads)
    fields = parse.schema(SCHEMA)
    _same(parse.tf_parser(fields)(payloads), want)
    _same(parse.python_parser(fields)(payloads), want)
    if native.records is not None:
        got = parse.native_parser(fields, lambda p: pytest.fail("the C parser handed back a canonical group"))
        _same(got(payloads), want)


def test_c_parser_hands_back_wrong_varlen_dtype_and_tf_names_it():
    fields = parse.schema(SCHEMA)
    bad = encode_example({"y": np.float32(1), "hist": np.float32([1.5])}, {"y": "float", "hist": "float"})
    assert parse.diagnose(bad, fields) == ("hist", "variable-length feature 'hist' has the wrong dtype: "
                                                   "float_list, expected int64_list (dtype int64)")
    if native.records is not None:
        handed = []
        parse.native_parser(fields, lambda p: handed.append(p) or {})([bad])
        assert handed == [[bad]]
    with pytest.raises(parse.BatchParseError):
        parse.tf_parser(fields)([bad])


def test_pad_to_truncates_and_pads_with_default():
    fields = parse.schema({"h": {"dtype": "int64", "shape": [None], "pad_to": 3, "default": -1},
                           "s": {"dtype": "string", "shape": [None], "pad_to": 2}})
    recs = [encode_example({"h": np.int64([1, 2, 3, 4, 5]), "s": ["a", "b", "c"]}),
            encode_example({"s": ["z"]}), encode_example({"h": np.int64([7])})]
    for p in (parse.default_parser(fields), parse.python_parser(fields), parse.tf_parser(fields)):
        out = p(recs)
        np.testing.assert_array_equal(out["h"], [[1, 2, 3], [-1, -1, -1], [7, -1, -1]])
        assert out["s"].tolist() == [["a", "b"], ["z", ""], ["", ""]]


def test_ragged_slices_concat_and_sparse():
    r = Ragged.from_rows([[1, 2], [], [3], [4, 5, 6]], np.int64)
    tail = r[1:]
    assert tail.lengths.tolist() == [0, 1, 3]
    sv = tail.sparse()
    assert sv.indices.tolist() == [[1, 0], [2, 0], [2, 1], [2, 2]] and sv.values.tolist() == [3, 4, 5, 6]
    assert sv.dense_shape.tolist() == [3, 3]
    from tfyarn.data.ragged import concat
    both = concat([r[:1], r[3:]])
    assert both.lengths.tolist() == [2, 3] and both.flat().tolist() == [1, 2, 4, 5, 6]
    assert r[1:2].sparse().dense_shape.tolist() == [1, 0]          # an all-empty batch: width 0, as TF gives
    saved, native.records = native.records, None                   # the numpy indices equal the C ones
    try:
        py = r[1:].sparse()
    finally:
        native.records = saved
    assert all((a == b).all() for a, b in zip(py, sv))


def test_feeder_batches_equal_tf_parse_example(local, no_thread_leak):
    rng = np.random.default_rng(4)
    recs = [{"y": float(i), **({"hist": rng.integers(0, 1000, int(rng.integers(0, 6))).tolist()} if i % 3 else {}),
             "w": rng.random(int(rng.integers(0, 4))).astype(np.float32).tolist()} for i in range(300)]
    payloads = [_encode(r) for r in recs]
    with TFRecordWriter(f"{local}/v.tfrecord") as w:
        for p in payloads:
            w.write(p)
    m = build_manifest(f"{local}/v.tfrecord", use_cache=False)
    batches = []
    with Feeder(m, SCHEMA, 32, 0, 1, prefetch=2, parse_group=96) as f:
        for b in f.epoch(0):
            batches.append(b)
    assert len(batches) == 300 // 32
    by_y = {int(r["y"]): p for r, p in zip(recs, payloads)}
    for b in batches:
        assert isinstance(b["hist"], SparseValue) and b["hist"].indices.dtype == np.int64
        _same(b, _tf_reference([by_y[int(y)] for y in b["y"]]))


def test_missing_fixed_feature_without_default_still_fails(local):
    with TFRecordWriter(f"{local}/m.tfrecord") as w:
        for i in range(64):
            w.write(encode_example({"y": np.float32(i)} if i != 40 else {"k": np.int64([1])}))
    m = build_manifest(f"{local}/m.tfrecord", use_cache=False)
    with Feeder(m, SCHEMA, 32, 0, 1) as f, pytest.raises(DataError) as e:
        list(f.epoch(0))
    assert "record 40" in str(e.value) and "feature 'y' is missing" in str(e.value)
