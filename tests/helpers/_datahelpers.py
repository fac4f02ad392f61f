"""Helpers for the data-layer tests (a plain module: conftest is not importable without packages)."""
from __future__ import annotations

import os

import numpy as np
from hypothesis import strategies as st

from tfyarn.data.example import encode_example
from tfyarn.data.parse import schema
from tfyarn.data.tfrecord import TFRecordWriter

#: schema of the records written by write_ids: every record has a globally unique id, so tests can check
#: "every record exactly once" across workers.
ID_SCHEMA = {"rid": {"dtype": "int64", "shape": ()}, "x": {"dtype": "float32", "shape": (2,)}}


def example(rid: int) -> bytes:
    return encode_example({"rid": [rid], "x": [float(rid), -float(rid)]}, {"rid": "int64", "x": "float"})


def write_ids(url: str, start: int, n: int, compression: str = "none") -> list[bytes]:
    """Write records rid = start .. start+n-1; returns their payloads."""
    payloads = [example(start + i) for i in range(n)]
    with TFRecordWriter(url, compression=compression) as w:
        for p in payloads:
            w.write(p)
    return payloads


def job_spec(train: list[str], features: dict, **data):
    """A minimal valid job spec reading ``train`` (for the preflight checks that sample data files)."""
    from tfyarn.spec import load_spec_dict
    return load_spec_dict({"name": "t", "model": "tfyarn.models.recommender:model",
                           "data": {"train": train, "features": features, "batch_size": 2, **data},
                           "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}}})


def framer_children() -> list[int]:
    """Live framing processes (``python -m tfyarn.data.framer``) started by this test process."""
    me, found = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            cmd = open(f"/proc/{d}/cmdline", "rb").read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and b"tfyarn.data.framer" in cmd and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(int(d))
    return found


# ------------------------------------------------------------------ random Example batches (the parsers' tests)

DT = st.sampled_from(["float32", "float64", "int64", "int32"])
SHAPE = st.sampled_from([(), (1,), (3,), (2, 2)])
NAME = st.text("abcdefgh_", min_size=1, max_size=12)


@st.composite
def batches(draw, extra_features=True):
    """(fields, payloads): a random numeric schema and 1-40 canonical Examples of it, with optional extra features
    outside the schema."""
    spec = draw(st.dictionaries(NAME, st.tuples(DT, SHAPE), min_size=1, max_size=4))
    extra = draw(st.dictionaries(NAME.map(lambda s: "zz" + s), st.tuples(DT, SHAPE),
                                 max_size=2 if extra_features else 0))
    n = draw(st.integers(1, 40))
    ints = st.integers(-(2**63), 2**63 - 1)
    int32s = st.integers(-(2**31), 2**31 - 1)
    floats = st.floats(width=32, allow_nan=False)
    payloads = []
    for _ in range(n):
        feats, kinds = {}, {}
        for name, (dt, shape) in {**spec, **extra}.items():
            k = int(np.prod(shape))
            if dt.startswith("float"):
                feats[name] = draw(st.lists(floats, min_size=k, max_size=k))
                kinds[name] = "float"
            else:
                feats[name] = draw(st.lists(int32s if dt == "int32" else ints, min_size=k, max_size=k))
                kinds[name] = "int64"
        payloads.append(encode_example(feats, kinds))
    fields = schema({k: {"dtype": d, "shape": s} for k, (d, s) in spec.items()})
    return fields, payloads


def damaged(payloads: list[bytes], data) -> list[bytes]:
    """``payloads`` with one record damaged, as hypothesis ``data`` draws it: a byte flipped, the record cut short, or
    1-5 bytes inserted."""
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
    return payloads[:i] + [bytes(p)] + payloads[i + 1:]


def assert_same_arrays(got: dict, ref: dict, fields) -> None:
    """Same dtype, shape and values per field (NaN equal to NaN)."""
    for f in fields:
        assert got[f.name].dtype == ref[f.name].dtype and got[f.name].shape == ref[f.name].shape, f.name
        np.testing.assert_array_equal(got[f.name], ref[f.name], err_msg=f.name)
