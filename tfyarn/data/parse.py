"""Serialized ``tf.train.Example`` batches → dict of numpy arrays, per the spec's feature schema: fixed-length
features (a ``default`` fills one a record lacks) and variable-length ones (``shape: [null]``: :class:`Ragged` rows,
as TF's ``VarLenFeature``; with ``pad_to`` a dense [n, pad_to] array).

The C parser of :mod:`native` (numeric features) hands any group it does not take to one TF ``ParseExampleV2`` call
(TF imported lazily in the feeder's parser thread: gateways have no TF); both release the GIL. When a batch fails, a
tiny pure-Python Example decoder says which record and which feature is wrong (TF's message names neither).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from tfyarn.data import native
from tfyarn.data.ragged import Ragged

log = logging.getLogger(__name__)

#: spec dtype → (Example list kind, numpy dtype of the result)
_KINDS = {
    "float32": ("float_list", np.float32),
    "float64": ("float_list", np.float64),
    "int64": ("int64_list", np.int64),
    "int32": ("int64_list", np.int32),
    "string": ("bytes_list", object),
    "bytes": ("bytes_list", object),
}


@dataclass(frozen=True)
class Field:
    name: str
    dtype: str
    shape: tuple[int, ...]  # () for a variable-length feature
    varlen: bool = False
    pad_to: int | None = None
    default: Any = None  # fixed: fills a missing feature (None: required); varlen: pad_to's padding

    @property
    def size(self) -> int:
        return 0 if self.varlen else math.prod(self.shape)

    @property
    def kind(self) -> str:
        return _KINDS[self.dtype][0]

    @property
    def np_dtype(self) -> Any:
        return _KINDS[self.dtype][1]

    @property
    def pad_value(self) -> Any:
        if self.default is not None:
            return self.default
        return "" if self.dtype == "string" else b"" if self.dtype == "bytes" else 0

    def empty(self) -> Any:
        """No rows of this field, in the form the parsers give."""
        if self.varlen and self.pad_to is None:
            return Ragged.from_lengths(np.empty(0, dtype=self.np_dtype), np.empty(0, dtype=np.int64))
        shape = (self.pad_to,) if self.varlen else self.shape
        return np.empty((0,) + tuple(shape), dtype=self.np_dtype)


def schema(features: Mapping[str, Any]) -> tuple[Field, ...]:
    """Accept spec ``Feature`` models or ``{"dtype":..., "shape":..., "pad_to":..., "default":...}`` dicts."""
    out = []
    for name, f in features.items():
        get = f.get if isinstance(f, Mapping) else (lambda k, d=None, f=f: getattr(f, k, d))
        dtype, shape = get("dtype"), tuple(get("shape", ()) or ())
        if dtype not in _KINDS:
            raise ValueError(f"feature {name!r}: unsupported dtype {dtype!r} (one of {', '.join(_KINDS)})")
        varlen = shape == (None,)
        pad_to, default = get("pad_to"), get("default")
        if pad_to is not None and not varlen:
            raise ValueError(f"feature {name!r}: pad_to is for variable-length features (shape [null])")
        out.append(Field(name, dtype, () if varlen else tuple(int(d) for d in shape), varlen, pad_to, default))
    return tuple(out)


def finalize(fields: tuple[Field, ...], out: dict[str, Any]) -> dict[str, Any]:
    """Every parser's last step: ``pad_to`` fields from rows to a dense [n, pad_to] array."""
    for f in fields:
        if f.varlen and f.pad_to is not None and isinstance(out.get(f.name), Ragged):
            out[f.name] = out[f.name].dense(f.pad_to, f.pad_value)
    return out


# ------------------------------------------------------------------------------------------- pure-Python diagnostics


class _Malformed(Exception):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise _Malformed("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Malformed("varint too long")


def _int64(x: int) -> int:
    """A decoded varint as protobuf's int64: bits above 64 are dropped, then two's complement."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """Top-level (field number, wire type, value) of a protobuf message; LEN values are bytes."""
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        num, wt = tag >> 3, tag & 7
        val: int | bytes
        if wt == 0:
            val, pos = _varint(buf, pos)
        elif wt == 1:
            val, pos = buf[pos : pos + 8], pos + 8
        elif wt == 2:
            n, pos = _varint(buf, pos)
            if pos + n > len(buf):
                raise _Malformed("truncated length-delimited field")
            val, pos = buf[pos : pos + n], pos + n
        elif wt == 5:
            val, pos = buf[pos : pos + 4], pos + 4
        else:
            raise _Malformed(f"wire type {wt}")
        if pos > len(buf) or num == 0:
            raise _Malformed("truncated field")
        out.append((num, wt, val))
    return out


def decode_example(payload: bytes) -> dict[str, tuple[str, list[Any]]]:
    """``{name: (kind, values)}`` of one serialized Example (slow; for diagnostics and tests)."""
    feats: dict[str, tuple[str, list[Any]]] = {}
    for num, _, features in _fields(payload):
        if num != 1:
            continue
        for fnum, _, entry in _fields(features):
            if fnum != 1:
                continue
            parts = {num: v for num, _, v in _fields(entry)}  # 1: key, 2: value (the last one given wins)
            key, value = parts.get(1, b""), parts.get(2, b"")
            kind = "empty"
            values: list[Any] = []
            for knum, _, lst in _fields(value):
                kind = {1: "bytes_list", 2: "float_list", 3: "int64_list"}.get(knum, "unknown")
                for vnum, wt, v in _fields(lst):
                    if vnum != 1:
                        continue
                    if kind == "float_list":
                        values += np.frombuffer(v, "<f4").tolist() if wt == 2 else [np.frombuffer(v, "<f4")[0]]
                    elif kind == "int64_list":
                        if wt == 2:
                            p = 0
                            while p < len(v):
                                x, p = _varint(v, p)
                                values.append(_int64(x))
                        else:
                            values.append(_int64(v))
                    else:
                        values.append(v)
            feats[key.decode("utf-8", "replace")] = (kind, values)
    return feats


def diagnose(payload: bytes, fields: tuple[Field, ...]) -> tuple[str | None, str] | None:
    """(feature name or None, problem) for the first thing wrong with one record, or None if it fits the schema."""
    try:
        feats = decode_example(payload)
    except _Malformed as exc:
        return None, f"not a serialized tf.train.Example ({exc})"
    for f in fields:
        if f.name not in feats:
            if f.varlen or f.default is not None:
                continue
            return f.name, f"feature {f.name!r} is missing"
        kind, values = feats[f.name]
        if kind != f.kind and kind != "empty":
            what = "variable-length feature" if f.varlen else "feature"
            return f.name, f"{what} {f.name!r} has the wrong dtype: {kind}, expected {f.kind} (dtype {f.dtype})"
        if not f.varlen and len(values) != f.size:
            return f.name, (
                f"feature {f.name!r} has the wrong shape: {len(values)} values, expected {f.size} (shape {f.shape})"
            )
    return None


# ------------------------------------------------------------------------------------------------------ TF fast path


class BatchParseError(Exception):
    """A batch did not parse; the feeder then diagnoses record by record."""


def tf_parser(fields: tuple[Field, ...]) -> Callable[[list[bytes]], dict[str, Any]]:
    """A function parsing a list of serialized Examples with one TF parse op per call (imports TF).

    Calls ``tf.raw_ops.ParseExampleV2`` with arguments built once: ``tf.io.parse_example``'s Python wrapper rebuilds
    them on every call (measured, interleaved A/B over 6 epochs of 800k records: whole-feeder CPU 1.11 vs 1.27 us per
    record, median; 963k vs 837k records/s). Variable-length features are its ragged outputs (values + row splits:
    the same values and rows as a VarLenFeature's SparseTensor, cheaper to cut into batches).
    """
    import tensorflow as tf  # lazily: only feeder threads on training hosts get here

    tf_types = {"float_list": tf.float32, "int64_list": tf.int64, "bytes_list": tf.string}
    dense = sorted((f for f in fields if not f.varlen), key=lambda f: f.name)
    ragged = sorted((f for f in fields if f.varlen), key=lambda f: f.name)

    def default(f: Field) -> Any:
        if f.default is None:
            return tf.zeros([0], tf_types[f.kind])  # empty default = required
        return tf.fill(list(f.shape), tf.constant(f.default, tf_types[f.kind]))

    args = dict(
        names=[],
        sparse_keys=[],
        dense_keys=[f.name for f in dense],
        ragged_keys=[f.name for f in ragged],
        dense_defaults=[default(f) for f in dense],
        num_sparse=0,
        sparse_types=[],
        ragged_value_types=[tf_types[f.kind] for f in ragged],
        ragged_split_types=[tf.int64] * len(ragged),
        dense_shapes=[list(f.shape) for f in dense],
    )

    def to_np(f: Field, t: Any) -> np.ndarray:
        a = t.numpy()
        if f.dtype == "string":
            return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(a) if a.size else a.astype(object)
        return a if a.dtype == f.np_dtype else a.astype(f.np_dtype)

    def parse(payloads: list[bytes]) -> dict[str, Any]:
        try:
            res = tf.raw_ops.ParseExampleV2(serialized=tf.constant(payloads, dtype=tf.string), **args)
        except (tf.errors.InvalidArgumentError, ValueError) as exc:
            raise BatchParseError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None
        out: dict[str, Any] = {f.name: to_np(f, t) for f, t in zip(dense, res[3])}
        for f, values, splits in zip(ragged, res[4], res[5]):
            out[f.name] = Ragged(to_np(f, values), splits.numpy())
        return finalize(fields, out)

    return parse


def python_parser(fields: tuple[Field, ...]) -> Callable[[list[bytes]], dict[str, Any]]:
    """A TF-free parser (pure Python, ~100x slower than TF): for hosts without TensorFlow and for fast tests. Like
    the TF parser, it raises :class:`BatchParseError` for a record that does not fit the schema (the feeder then
    diagnoses record by record)."""

    def parse(payloads: list[bytes]) -> dict[str, Any]:
        cols: dict[str, list[Any]] = {f.name: [] for f in fields}
        for p in payloads:
            if diagnose(p, fields) is not None:
                raise BatchParseError("a record does not match the schema")
            feats = decode_example(p)
            for f in fields:
                if f.name in feats:
                    vals = feats[f.name][1]
                    if f.dtype == "string":
                        vals = [v.decode("utf-8") for v in vals]
                else:
                    vals = [] if f.varlen else [f.default] * f.size
                cols[f.name].append(vals)
        out: dict[str, Any] = {}
        for f in fields:
            wide = np.int64 if f.np_dtype in (np.int32, np.int64) else np.float32
            if f.varlen:
                # int64 first, then cast: an int32 feature wraps exactly as on the TF path, instead of raising.
                r = Ragged.from_rows(cols[f.name], object if f.np_dtype is object else wide)
                out[f.name] = Ragged(r.values.astype(f.np_dtype), r.splits)
                continue
            if f.np_dtype is object:
                a = np.empty((len(payloads), f.size), dtype=object)
                for i, v in enumerate(cols[f.name]):
                    a[i, :] = v
            else:
                a = np.asarray(cols[f.name], dtype=wide).astype(f.np_dtype)
            out[f.name] = a.reshape((len(payloads),) + f.shape)
        return finalize(fields, out)

    return parse


#: groups in a row the C parser may hand back before it is no longer tried (a layout it does not take would
#: otherwise be walked twice forever)
NATIVE_GIVE_UP = 3
_NUMERIC_KIND = {"float32": 0, "float64": 0, "int64": 1, "int32": 1}  # _records.c: 0 float_list, 1 int64_list


def native_parser(
    fields: tuple[Field, ...], fallback: Callable[[list[bytes]], dict[str, Any]]
) -> Callable[[list[bytes]], dict[str, Any]]:
    """The C Example parser (``_records.parse_dense``, or ``parse_mixed`` when a feature is variable-length or has a
    default), with ``fallback`` parsing any group it does not accept.

    Why: TF's ParseExampleV2 costs ~0.4 us of CPU per record spread over TF's intra-op pool, taking the step's cores
    on a small host; the C loop costs a tenth of that, on the parser thread alone, without the GIL. It accepts only
    records in TF's own layout without ambiguity (every required feature once, of its kind and size); for any other
    group ``fallback`` (TF) parses it and reports errors, so results never differ between the two.
    """

    lib = native.records
    assert lib is not None
    modes = [2 if f.varlen else 1 if f.default is not None else 0 for f in fields]
    mixed = any(modes)
    specs = tuple(
        (f.name.encode("utf-8"), _NUMERIC_KIND[f.dtype], f.size) + ((m,) if mixed else ())
        for f, m in zip(fields, modes)
    )
    raw_types = [np.float32 if _NUMERIC_KIND[f.dtype] == 0 else np.int64 for f in fields]
    handed_back = 0

    def run(payloads: list[bytes], n: int) -> tuple[int, tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
        outs = tuple(None if m == 2 else np.empty((n, f.size), dtype=t) for f, t, m in zip(fields, raw_types, modes))
        if not mixed:
            return lib.parse_dense(payloads, specs, outs), outs, (), ()
        aux = tuple(None if m == 0 else np.empty(n, dtype=np.uint8 if m == 1 else np.int64) for m in modes)
        res, values = lib.parse_mixed(payloads, specs, outs, aux)
        return res, outs, aux, values

    def parse(payloads: list[bytes]) -> dict[str, Any]:
        nonlocal handed_back
        if handed_back >= NATIVE_GIVE_UP:
            return fallback(payloads)
        n = len(payloads)
        res, outs, aux, values = run(payloads, n)
        if res >= 0:
            handed_back += 1
            if handed_back == NATIVE_GIVE_UP:
                log.info(
                    "the C Example parser could not take %d groups in a row (an encoding it does not know?); "
                    "using the general parser from now on",
                    NATIVE_GIVE_UP,
                )
            return fallback(payloads)
        handed_back = 0
        return finalize(fields, _native_columns(fields, modes, raw_types, n, outs, aux, values))

    return parse


def _native_columns(
    fields: tuple[Field, ...], modes: list[int], raw_types: list[Any], n: int, outs: Any, aux: Any, values: Any
) -> dict[str, Any]:
    """The C parser's buffers as one column a feature, in its dtype and shape: variable-length ones (mode 2) as
    :class:`Ragged`, defaults (mode 1) filled in where a record had no value."""
    out: dict[str, Any] = {}
    with np.errstate(invalid="ignore"):  # float32 -> float64 of a signalling NaN sets the FP invalid flag
        for i, (f, a, t) in enumerate(zip(fields, outs, raw_types)):
            want = f.np_dtype
            if modes[i] == 2:
                v = np.frombuffer(values[i], dtype=t)
                out[f.name] = Ragged.from_lengths(v if v.dtype == want else v.astype(want), aux[i])
                continue
            if modes[i] == 1:
                a[aux[i] == 0] = f.default
            out[f.name] = (a if a.dtype == want else a.astype(want)).reshape((n,) + f.shape)
    return out


def default_parser(fields: tuple[Field, ...]) -> Callable[[list[bytes]], dict[str, np.ndarray]]:
    """The feeder's parser: the C parser (:func:`native_parser`) when built and the schema is numeric, in front of
    :func:`general_parser` (built on first use: a process the C parser serves never imports TF for it)."""

    if native.records is None or not all(f.dtype in _NUMERIC_KIND and (f.size > 0 or f.varlen) for f in fields):
        return general_parser(fields)
    general = functools.cache(lambda: general_parser(fields))
    return native_parser(fields, lambda payloads: general()(payloads))


def general_parser(fields: tuple[Field, ...]) -> Callable[[list[bytes]], dict[str, np.ndarray]]:
    """Any schema, any valid encoding: TensorFlow's parser (training hosts have TF), else the pure-Python one."""
    return tf_parser(fields) if importlib.util.find_spec("tensorflow") is not None else python_parser(fields)
