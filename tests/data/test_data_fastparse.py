"""The vectorised Example decoder: identical to the reference decoder on everything it accepts (hypothesis over
random schemas, values, key order, extra features), declines (None) anything non-canonical, never mis-decodes."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from tfyarn.data import fastparse
from tfyarn.data.example import _field, _varint, encode_example
from tfyarn.data.parse import python_parser, schema

from _datahelpers import assert_same_arrays, batches, damaged

@settings(max_examples=120, deadline=None)
@given(batches())
def test_matches_reference_decoder(case):
    fields, payloads = case
    fast = fastparse.parse(payloads, fields)
    assert fast is not None
    ref = python_parser(fields)(payloads)
    assert_same_arrays(fast, ref, fields)


@settings(max_examples=150, deadline=None)
@given(batches(extra_features=False), st.data())
def test_damaged_records_are_declined_or_decoded_exactly(case, data):
    # Without extra features every byte belongs to the schema's features or the structure. (The contents of
    # features outside the schema are skipped unparsed, as TF's own fast parser does.)
    fields, payloads = case
    payloads = damaged(payloads, data)
    fast = fastparse.parse(payloads, fields)
    if fast is None:
        return
    try:
        ref = python_parser(fields)(payloads)
    except Exception:   # noqa: BLE001 - the reference rejects it: then the fast decoder must have too
        raise AssertionError("fast decoder accepted a batch the reference decoder rejects") from None
    for f in fields:
        np.testing.assert_array_equal(fast[f.name], ref[f.name], err_msg=f.name)   # NaN == NaN


def test_declines_non_canonical_encodings():
    fields = schema({"a": {"dtype": "int64", "shape": ()}})
    ok = encode_example({"a": [5]}, {"a": "int64"})
    assert fastparse.parse([ok], fields)["a"].tolist() == [5]
    unpacked = _field(1, _field(1, _field(1, b"a") + _field(2, _field(3, _varint(8) + _varint(5)))))
    missing = encode_example({"b": [5]}, {"b": "int64"})
    wrong_kind = encode_example({"a": [5.0]}, {"a": "float"})
    dup = _field(1, _field(1, _field(1, b"a") + _field(2, _field(3, _field(1, _varint(1)))))
                 + _field(1, _field(1, b"a") + _field(2, _field(3, _field(1, _varint(2))))))
    for bad in (unpacked, missing, wrong_kind, dup, b"", b"\x0a"):
        assert fastparse.parse([ok, bad], fields) is None
    assert not fastparse.supports(schema({"s": {"dtype": "string", "shape": ()}}))
