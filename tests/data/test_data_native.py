"""The C loops (``tfyarn/data/_records.c``) against the Python/numpy/TF code they stand in for.

Framing: identical offsets, header verdicts, payloads and CRC verdicts on random streams cut at random points and
damaged at random bytes. Parsing: whatever the C parser accepts it decodes exactly as the reference decoder and as
TensorFlow do; canonical Examples (what TF and every protobuf library write) are always accepted; anything ambiguous
is handed back, and the default parser then gives TF's answer (values or the same error).
"""
from __future__ import annotations

import contextlib
import os

import google_crc32c
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tfyarn.data import native, parse, tfrecord
from tfyarn.data.example import _field, _varint, encode_example
from tfyarn.data.parse import BatchParseError, python_parser, schema

from _datahelpers import batches

lib = native.records
pytestmark = pytest.mark.skipif(lib is None and not os.environ.get("TFYARN_REQUIRE_NATIVE"),
                                reason="tfyarn.data._records is not built (no C compiler at install?)")


def test_built_when_required():
    # CI sets TFYARN_REQUIRE_NATIVE: a build that silently fell back to Python must fail there, not skip
    assert lib is not None, "tfyarn.data._records is not built: pip install -e . needs a C compiler"


@pytest.mark.parametrize("software", [False, True])
def test_crc32c_matches_google_crc32c(software):
    rng = np.random.default_rng(1)
    for n in list(range(0, 70)) + [255, 256, 1000, 4097]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert lib.crc32c(data, software) == google_crc32c.value(data), n


@contextlib.contextmanager
def _python_loops():
    """The Python/numpy loops instead of the C ones, in this process (no fixture: hypothesis reruns the body)."""
    saved, native.records = native.records, None
    try:
        yield
    finally:
        native.records = saved


def _stream(rng: np.random.Generator, n: int) -> bytes:
    return b"".join(tfrecord.encode_record(rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8)
                                           .tobytes()) for _ in range(n))


def _frame(buf: bytes, pos: int, limit: int) -> tuple:
    """(offsets, end, first bad header, payloads and bad data CRCs of the records before it), as iter_chunks uses
    the three framing functions."""
    fr = tfrecord.scan(buf, pos, limit)
    arr = np.frombuffer(buf, dtype=np.uint8)
    bad_h = tfrecord.check_headers(arr, fr.offsets)
    good = fr if bad_h < 0 else tfrecord.Framed(fr.offsets[:bad_h], int(fr.offsets[bad_h]))
    pays, bad = tfrecord.payloads_and_check(buf, arr, good.offsets, good.lengths(), True)
    return fr.offsets.tolist(), fr.end, bad_h, pays, bad.tolist()


def _frame_both(buf: bytes, pos: int, limit: int) -> tuple:
    c = _frame(buf, pos, limit)
    with _python_loops():
        return c, _frame(buf, pos, limit)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 40), st.data())
def test_framing_matches_python(seed, n, data):
    rng = np.random.default_rng(seed)
    buf = bytearray(_stream(rng, n))
    if buf and data.draw(st.booleans()):                      # damage: a header, a payload or a CRC byte
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(buf)))                  # a block that ends anywhere, mid-record included
    buf = bytes(buf[:cut])
    pos = data.draw(st.sampled_from([0, 0, min(3, len(buf))]))
    limit = data.draw(st.sampled_from([1, 5, 1 << 62]))
    c, py = _frame_both(buf, pos, limit)
    assert c == py


def test_scan_stops_before_a_record_whose_footer_is_cut():
    rec = tfrecord.encode_record(b"x" * 10)
    for cut in range(len(rec) + 1):        # every truncation of a one-record block: a complete record or none
        c, py = _frame_both(rec[:cut], 0, 1 << 62)
        assert c == py
        assert c[0] == ([0] if cut == len(rec) else [])


def test_huge_length_is_not_an_overflow():
    header = (2**64 - 8).to_bytes(8, "little")
    fr = tfrecord.scan(header + b"\0" * 40, 0, 10)
    assert len(fr.offsets) == 0 and fr.end == 0


def test_bad_offsets_raise_instead_of_reading_outside_the_buffer():
    buf = tfrecord.encode_record(b"abc")
    with pytest.raises(IndexError):
        lib.first_bad_header(buf, np.array([len(buf)], dtype=np.int64))
    with pytest.raises(IndexError):
        lib.payloads(buf, np.array([0], dtype=np.int64), len(buf) + 10, True)
    with pytest.raises(ValueError):
        lib.payloads(buf, b"1234567", len(buf), True)


# ------------------------------------------------------------------------------------------------------- parsing

def _c_parse(fields, payloads):
    """The C parser alone: its arrays, or None when it hands the batch back."""
    seen = []

    def fallback(p):
        seen.append(p)
        return {}
    out = parse.native_parser(fields, fallback)(payloads)
    return None if seen else out


@settings(max_examples=150, deadline=None)
@given(batches())
def test_canonical_examples_are_accepted_and_match_the_reference(case):
    fields, payloads = case
    got = _c_parse(fields, payloads)
    assert got is not None, "a canonical Example was handed back"
    ref = python_parser(fields)(payloads)
    for f in fields:
        assert got[f.name].dtype == ref[f.name].dtype and got[f.name].shape == ref[f.name].shape
        np.testing.assert_array_equal(got[f.name], ref[f.name], err_msg=f.name)   # NaN == NaN


@settings(max_examples=200, deadline=None)
@given(batches(extra_features=False), st.data())
def test_damaged_records_are_handed_back_or_decoded_exactly(case, data):
    fields, payloads = case
    i = data.draw(st.integers(0, len(payloads) - 1))
    p = bytearray(payloads[i])
    op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    at = data.draw(st.integers(0, len(p) - 1))
    if op == "flip":
        p[at] ^= data.draw(st.integers(1, 255))
    elif op == "cut":
        del p[at:]
    else:
        p[at:at] = bytes(data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=5)))
    payloads = payloads[:i] + [bytes(p)] + payloads[i + 1:]
    got = _c_parse(fields, payloads)
    if got is None:
        return
    try:
        ref = python_parser(fields)(payloads)
    except BatchParseError:
        raise AssertionError("the C parser accepted a batch the reference decoder rejects") from None
    for f in fields:
        np.testing.assert_array_equal(got[f.name], ref[f.name], err_msg=f.name)   # NaN == NaN


def _entry(key: bytes, feature: bytes) -> bytes:
    return _field(1, _field(1, key) + _field(2, feature))


def test_valid_non_canonical_encodings():
    """Unpacked lists, value-before-key entries, unknown fields and split ``features`` messages are valid protobuf:
    decoded, identically to the reference."""
    fields = schema({"a": {"dtype": "int64", "shape": (2,)}, "b": {"dtype": "float32", "shape": ()}})
    b_feat = _field(2, _field(1, np.float32(1.5).tobytes()))
    unpacked_ints = _field(3, _varint(8) + _varint(7) + _varint(8) + _varint(2**64 - 3))   # two field-1 varints
    unpacked_float = _field(2, _varint(13) + np.float32(-2.0).tobytes())                    # field 1, wire type 5
    value_first = _field(1, _field(2, _field(3, _field(1, _varint(4) + _varint(5)))) + _field(1, b"a"))
    unknown = _varint(5 << 3) + _varint(99)                                                 # field 5, varint
    cases = {
        "unpacked ints": _field(1, _entry(b"a", unpacked_ints) + _entry(b"b", b_feat)),
        "unpacked float": _field(1, _entry(b"a", _field(3, _field(1, _varint(1) + _varint(2))))
                                 + _entry(b"b", unpacked_float)),
        "value before key": _field(1, value_first + _entry(b"b", b_feat)),
        "unknown fields": unknown + _field(1, unknown + _entry(b"b", b_feat) + _entry(b"a", _field(
            3, _field(1, _varint(1) + _varint(2))))),
        "features split in two": _field(1, _entry(b"a", _field(3, _field(1, _varint(1) + _varint(2)))))
        + _field(1, _entry(b"b", b_feat)),
    }
    for name, payload in cases.items():
        got = _c_parse(fields, [payload])
        assert got is not None, name
        ref = python_parser(fields)([payload])
        for f in fields:
            assert np.array_equal(got[f.name], ref[f.name]), (name, f.name)


def test_ambiguous_or_wrong_records_are_handed_back():
    fields = schema({"a": {"dtype": "int64", "shape": ()}})
    ok = encode_example({"a": [5]}, {"a": "int64"})
    one = _field(3, _field(1, _varint(1)))
    cases = {
        "missing": encode_example({"b": [5]}, {"b": "int64"}),
        "wrong kind": encode_example({"a": [5.0]}, {"a": "float"}),
        "too many values": encode_example({"a": [5, 6]}, {"a": "int64"}),
        "no values": encode_example({"a": []}, {"a": "int64"}),
        "duplicate key": _field(1, _entry(b"a", one) + _entry(b"a", one)),
        "entry without value": _field(1, _field(1, _field(1, b"a"))),
        "two lists": _field(1, _entry(b"a", one + one)),
        "group wire type": _field(1, _entry(b"a", one)) + _varint((7 << 3) | 3),
        "field number 0": b"\x00\x00" + ok,
        "truncated": ok[:-1],
        "empty": b"",
    }
    for name, bad in cases.items():
        assert _c_parse(fields, [ok, bad]) is None, name
    assert _c_parse(fields, [ok, ok])["a"].tolist() == [5, 5]
    assert not parse.native_supports(schema({"s": {"dtype": "string", "shape": ()}}))
    assert not parse.native_supports(schema({"z": {"dtype": "float32", "shape": (0,)}}))


def test_int32_wraps_like_the_tf_path():
    fields = schema({"a": {"dtype": "int32", "shape": ()}})
    got = _c_parse(fields, [encode_example({"a": [2**31 + 5]}, {"a": "int64"})])
    assert got["a"].dtype == np.int32 and got["a"].tolist() == [np.int64(2**31 + 5).astype(np.int32)]


def test_hands_back_to_the_general_parser_then_gives_up_trying(caplog):
    caplog.set_level("INFO", logger="tfyarn.data.parse")
    fields = schema({"a": {"dtype": "int64", "shape": ()}})
    dup = _field(1, _entry(b"a", _field(3, _field(1, _varint(1)))) + _entry(b"a", _field(3, _field(1, _varint(2)))))
    calls = []

    def fallback(p):
        calls.append(len(p))
        return {"a": np.zeros(len(p), np.int64)}
    parser = parse.native_parser(fields, fallback)
    ok = encode_example({"a": [5]}, {"a": "int64"})
    assert parser([ok])["a"].tolist() == [5] and calls == []
    for _ in range(parse.NATIVE_GIVE_UP + 2):
        parser([dup])
    assert calls == [1] * (parse.NATIVE_GIVE_UP + 2)
    assert parser([ok])["a"].tolist() == [0]           # stopped trying: the general parser answers
    assert "from now on" in caplog.text


def test_default_parser_gives_tfs_answer_for_handed_back_groups():
    pytest.importorskip("tensorflow")
    fields = schema({"a": {"dtype": "int64", "shape": ()}})
    dup = _field(1, _entry(b"a", _field(3, _field(1, _varint(1)))) + _entry(b"a", _field(3, _field(1, _varint(2)))))
    ok = encode_example({"a": [5]}, {"a": "int64"})
    assert parse.default_parser(fields)([ok, dup])["a"].tolist() == parse.tf_parser(fields)([ok, dup])["a"].tolist()
    missing = encode_example({"b": [5]}, {"b": "int64"})
    with pytest.raises(BatchParseError):
        parse.default_parser(fields)([ok, missing])


@settings(max_examples=25, deadline=None)
@given(batches())
def test_matches_tensorflow(case):
    pytest.importorskip("tensorflow")
    fields, payloads = case
    got = _c_parse(fields, payloads)
    ref = parse.tf_parser(fields)(payloads)
    for f in fields:
        assert got[f.name].dtype == ref[f.name].dtype and np.array_equal(got[f.name], ref[f.name]), f.name
