"""A minimal ``tf.train.Example`` encoder, without TensorFlow or generated protobuf classes.

Why: synthetic data and test fixtures are written on gateways and in tests that must not import TF. The wire format
is tiny: Example{1: Features{1: map<string, Feature>}} and Feature is one of bytes_list(1), float_list(2),
int64_list(3), each a repeated field 1 (numbers packed, as TF writes them).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 two's complement, as protobuf encodes negative int64
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return _varint((num << 3) | 2) + _varint(len(payload)) + payload


def float_feature(raw: bytes) -> bytes:
    """A float_list Feature of little-endian float32 bytes."""
    return _field(2, _field(1, raw))


def entry(name: bytes, feature: bytes) -> bytes:
    """One entry of an Example's feature map (entries are concatenated, then wrapped in ``_field(1, ...)``)."""
    return _field(1, _field(1, name) + _field(2, feature))


def encode_feature(values: Any, kind: str | None = None) -> bytes:
    """Serialize one Feature. ``kind`` is 'float', 'int64' or 'bytes' (guessed from the values when None)."""
    arr = np.asarray(values)
    kind = kind or ("float" if arr.dtype.kind == "f" else "int64" if arr.dtype.kind in "iub" else "bytes")
    flat = arr.reshape(-1)
    if kind == "float":
        return float_feature(flat.astype("<f4").tobytes())
    if kind == "int64":
        return _field(3, _field(1, b"".join(_varint(int(v)) for v in flat)))
    if kind == "bytes":
        items: Iterable[bytes] = (v.encode() if isinstance(v, str) else bytes(v) for v in flat.tolist())
        return _field(1, b"".join(_field(1, v) for v in items))
    raise ValueError(f"unknown feature kind {kind!r}")


def encode_example(features: dict[str, Any], kinds: dict[str, str] | None = None) -> bytes:
    """Serialize a ``tf.train.Example`` from ``{name: value(s)}`` (keys written sorted, as TF does)."""
    kinds = kinds or {}
    return _field(
        1, b"".join(entry(name.encode(), encode_feature(features[name], kinds.get(name))) for name in sorted(features))
    )
