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

from _datahelpers import assert_same_arrays, batches, damaged

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


def test_output_size_overflow_is_refused():
    with pytest.raises(ValueError, match="bytes for 1 records of"):
        lib.parse_dense([b""], ((b"a", 0, 2**62),), (np.zeros(0, np.float32),))


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
    assert_same_arrays(got, ref, fields)


@settings(max_examples=200, deadline=None)
@given(batches(extra_features=False), st.data())
def test_damaged_records_are_handed_back_or_decoded_exactly(case, data):
    fields, payloads = case
    payloads = damaged(payloads, data)
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


def _tf_verdict(fields, payloads):
    """TF's parser on ``payloads``: its arrays, or None when it raises."""
    try:
        return parse.tf_parser(fields)(payloads)
    except BatchParseError:
        return None


def _assert_never_differs_from_tf(fields, payloads, name=""):
    """The invariant: whatever the C parser accepts, TF accepts with the same values."""
    got = _c_parse(fields, payloads)
    if got is None:
        return None
    ref = _tf_verdict(fields, payloads)
    assert ref is not None, f"{name}: the C parser accepted what TF rejects"
    for f in fields:
        np.testing.assert_array_equal(got[f.name], ref[f.name], err_msg=f"{name}: {f.name}")
    return got


FIELDS_AB = schema({"a": {"dtype": "int64", "shape": (2,)}, "b": {"dtype": "float32", "shape": ()}})
_B = _field(2, _field(1, np.float32(1.5).tobytes()))                     # b: packed float_list [1.5]
_A = _field(3, _field(1, _varint(1) + _varint(2)))                        # a: packed int64_list [1, 2]
_UNKNOWN = _varint(5 << 3) + _varint(99)                                  # field 5, varint 99

#: encodings TF's fast parser takes: the C parser must take them too (else every group would go to TF)
TF_LAYOUTS = {
    "canonical": _field(1, _entry(b"a", _A) + _entry(b"b", _B)),
    "unpacked ints": _field(1, _entry(b"a", _field(3, _varint(8) + _varint(7) + _varint(8) + _varint(2**64 - 3)))
                            + _entry(b"b", _B)),
    "unpacked float": _field(1, _entry(b"a", _A) + _entry(b"b", _field(2, _varint(13) + np.float32(-2.0).tobytes()))),
    "value before key": _field(1, _field(1, _field(2, _A) + _field(1, b"a")) + _entry(b"b", _B)),
    "unknown Example field": _UNKNOWN + _field(1, _entry(b"a", _A) + _entry(b"b", _B)),
    "features split in two": _field(1, _entry(b"a", _A)) + _field(1, _entry(b"b", _B)),
    "extra feature of another kind": _field(1, _entry(b"z", _field(1, _field(1, b"x"))) + _entry(b"a", _A)
                                            + _entry(b"b", _B)),
}
#: protobuf allows these, TF's fast parser does not (its layout is fixed): they must be handed back
NOT_TF_LAYOUTS = {
    "unknown field in Features": _field(1, _UNKNOWN + _entry(b"a", _A) + _entry(b"b", _B)),
    "third field in an entry": _field(1, _field(1, _field(1, b"a") + _field(2, _A) + _UNKNOWN) + _entry(b"b", _B)),
    "entry without value (not in the schema)": _field(1, _field(1, _field(1, b"zz")) + _entry(b"a", _A)
                                                      + _entry(b"b", _B)),
    "unknown field before the list": _field(1, _entry(b"a", _UNKNOWN + _A) + _entry(b"b", _B)),
    "unknown field first in a list": _field(1, _entry(b"a", _field(3, _UNKNOWN + _field(1, _varint(1) + _varint(2))))
                                     + _entry(b"b", _B)),
    "two packed blocks": _field(1, _entry(b"a", _field(3, _field(1, _varint(1)) + _field(1, _varint(2))))
                                + _entry(b"b", _B)),
    "packed then unpacked": _field(1, _entry(b"a", _field(3, _field(1, _varint(1)) + _varint(8) + _varint(2)))
                                   + _entry(b"b", _B)),
    "unpacked then packed": _field(1, _entry(b"a", _field(3, _varint(8) + _varint(1) + _field(1, _varint(2))))
                                   + _entry(b"b", _B)),
    "overlong features tag": b"\x8a\x00" + _field(1, _entry(b"a", _A) + _entry(b"b", _B))[1:],
}


def test_takes_the_layouts_tf_takes_and_hands_back_the_others():
    pytest.importorskip("tensorflow")
    for name, payload in TF_LAYOUTS.items():
        assert _tf_verdict(FIELDS_AB, [payload]) is not None, f"{name}: TF rejects it (the test is wrong)"
        assert _assert_never_differs_from_tf(FIELDS_AB, [payload], name) is not None, f"{name} was handed back"
    for name, payload in NOT_TF_LAYOUTS.items():
        assert _c_parse(FIELDS_AB, [payload]) is None, f"{name}: accepted"
        # what TF says of it is TF's business (it rejects each of these today); the C parser must not decide
        _assert_never_differs_from_tf(FIELDS_AB, [payload], name)


@settings(max_examples=150, deadline=None)
@given(batches(), st.data())
def test_damaged_records_never_parse_differently_from_tf(case, data):
    pytest.importorskip("tensorflow")
    fields, payloads = case
    _assert_never_differs_from_tf(fields, damaged(payloads, data))


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


def test_a_missing_extension_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(native, "records", None)
    monkeypatch.setattr(native, "_why_missing", ["No module named 'tfyarn.data._records'"])
    native.warn_if_missing()
    native.warn_if_missing()
    said = [r.getMessage() for r in caplog.records if "C input loops are not available" in r.getMessage()]
    assert len(said) == 1 and "No module named" in said[0] and "~5x the CPU" in said[0]
    monkeypatch.setattr(native, "_why_missing", [])          # TFYARN_NATIVE=0 asked for it: nothing to say
    caplog.clear()
    native.warn_if_missing()
    assert not caplog.records
