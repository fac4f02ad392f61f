"""A vectorised numpy decoder for batches of ``tf.train.Example`` with fixed-length numeric features.

Why: it lets the feeder run at useful speed where TensorFlow is not installed (~0.4 us of CPU per record over
8k-record groups, about what ``tf.io.parse_example`` costs, and ~100x the pure-Python decoder). It walks the protobuf
structure of *all records of a batch in lockstep* — each step is one numpy operation over the batch — so its cost is
a few hundred numpy calls per batch, not per record. It is not the default on training hosts: it holds the GIL,
TF's parser does not (see :func:`tfyarn.data.parse.default_parser`).

It is strict on purpose: it accepts only the canonical encoding TensorFlow and every protobuf library write (one
``features`` field, map entries as key-then-value, packed numeric lists, every schema feature present exactly once
with exactly its size). Anything else — bytes/string features, unpacked lists, duplicate keys, garbage — makes it
return ``None`` and the caller falls back to ``tf.io.parse_example`` (and to per-record diagnosis on errors), so an
unusual file is slower, never wrongly decoded. Extra features not in the schema are skipped, as TF does.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

_FLOAT_LIST, _INT64_LIST = 0x12, 0x1A     # Feature field tags: float_list (2), int64_list (3), both LEN
_NUMERIC = {"float32": _FLOAT_LIST, "float64": _FLOAT_LIST, "int64": _INT64_LIST, "int32": _INT64_LIST}
_OUT = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32}


class _Bad(Exception):
    """Not the canonical encoding: fall back."""


def supports(fields: tuple) -> bool:
    return all(f.dtype in _NUMERIC for f in fields)


def _varint(a: np.ndarray, pos: np.ndarray, lim: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode one varint at each position → (value as int64, position after it). Lengths in this format are small;
    a value that does not fit (or runs past the data) means garbage."""
    b = a[np.minimum(pos, lim)]
    if not (b & 0x80).any():                     # the common case: every length < 128
        return b.astype(np.int64), pos + 1
    val = np.zeros(len(pos), dtype=np.int64)
    cur = pos.copy()
    done = np.zeros(len(pos), dtype=bool)
    for j in range(5):                           # lengths need at most 5 bytes (< 2^35)
        b = a[np.minimum(cur, lim)].astype(np.int64)
        live = ~done
        val[live] |= (b[live] & 0x7F) << (7 * j)
        cur[live] += 1
        done |= (b & 0x80) == 0
        if done.all():
            return val, cur
    raise _Bad


def _ints(a: np.ndarray, vpos: np.ndarray, vlen: np.ndarray, k: int) -> np.ndarray:
    """k packed varints per row (rows may differ in byte width) → (n, k) int64 (two's complement, as protobuf)."""
    n = len(vpos)
    width = int(vlen.max()) if n else 0
    if width > 10 * k or (vlen < k).any():
        raise _Bad
    j = np.arange(width)
    m = a[np.minimum(vpos[:, None] + j, len(a) - 1)].astype(np.uint64)
    inside = j < vlen[:, None]
    ends = ((m & np.uint64(0x80)) == 0) & inside
    if not (ends.sum(axis=1) == k).all() or not ends[np.arange(n), vlen - 1].all():
        raise _Bad
    if k == 1:
        shift = (7 * j).astype(np.uint64)
        vals = ((m & np.uint64(0x7F)) << shift) * inside
        return vals.sum(axis=1, dtype=np.uint64).view(np.int64).reshape(n, 1)
    # Which value each byte belongs to, and its position inside that value.
    vid = np.cumsum(ends, axis=1) - ends
    last_end = np.maximum.accumulate(np.where(ends, j, -1), axis=1)
    prev = np.empty_like(last_end)
    prev[:, 0] = -1
    prev[:, 1:] = last_end[:, :-1]
    within = j - prev - 1
    if (within[inside] >= 10).any():
        raise _Bad                                 # a varint longer than 10 bytes
    shift = within.clip(0, 9).astype(np.uint64) * np.uint64(7)
    contrib = ((m & np.uint64(0x7F)) << shift) * inside
    out = np.zeros((n, k), dtype=np.uint64)
    for v in range(k):
        out[:, v] = (contrib * (vid == v)).sum(axis=1, dtype=np.uint64)
    return out.view(np.int64)


def parse(payloads: list[bytes], fields: tuple) -> dict[str, np.ndarray] | None:
    """Decode ``payloads`` per ``fields`` (numeric, fixed shapes), or None if any record is not canonical."""
    n = len(payloads)
    if n == 0:
        return None
    lens = np.fromiter(map(len, payloads), dtype=np.int64, count=n)
    a = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    lim = len(a) - 1
    start = np.zeros(n, dtype=np.int64)
    np.cumsum(lens[:-1], out=start[1:])
    end = start + lens
    try:
        return _walk(a, lim, start, end, fields)
    except (_Bad, IndexError):
        return None


_J8 = np.arange(8)


def _head(key: np.ndarray) -> tuple[np.uint64, np.uint64]:
    """(value, mask) of a key's first 8 bytes as a little-endian uint64 (shorter keys: masked)."""
    k = key[:8]
    buf = np.zeros(8, dtype=np.uint8)
    buf[:len(k)] = k
    mask = np.zeros(8, dtype=np.uint8)
    mask[:len(k)] = 0xFF
    return buf.view("<u8")[0], mask.view("<u8")[0]


def _walk(a: np.ndarray, lim: int, start: np.ndarray, end: np.ndarray, fields: tuple) -> dict[str, np.ndarray]:
    n = len(start)
    # Example: exactly one field 1 (features) spanning the record.
    if not (a[np.minimum(start, lim)] == 0x0A).all():
        raise _Bad
    flen, pos = _varint(a, start + 1, lim)
    if not (pos + flen == end).all():
        raise _Bad
    keys = [np.frombuffer(f.name.encode(), dtype=np.uint8) for f in fields]
    key_heads = [_head(k) for k in keys]
    key_tails = [k[8:] for k in keys]
    vpos = [np.zeros(n, dtype=np.int64) for _ in fields]
    vlen = [np.zeros(n, dtype=np.int64) for _ in fields]
    count = [np.zeros(n, dtype=np.int64) for _ in fields]
    for _ in range(1 << 16):                     # one map entry of every record per step
        act = np.flatnonzero(pos < end)
        if len(act) == 0:
            break
        p = pos[act]
        if not (a[p] == 0x0A).all():
            raise _Bad
        elen, p = _varint(a, p + 1, lim)
        eend = p + elen
        if not ((a[np.minimum(p, lim)] == 0x0A) & (eend <= end[act])).all():
            raise _Bad
        klen, p = _varint(a, p + 1, lim)
        kstart = p
        p = p + klen
        if not (a[np.minimum(p, lim)] == 0x12).all():
            raise _Bad
        vl, p = _varint(a, p + 1, lim)
        if not (p + vl == eend).all():
            raise _Bad
        ftag = a[np.minimum(p, lim)]
        ll, p = _varint(a, p + 1, lim)
        if not (p + ll == eend).all():
            raise _Bad
        # Key match in one gather: the first 8 key bytes as one uint64 per record (+ the length), the rest of a
        # longer key compared only for the records whose prefix already matched.
        head = a[np.minimum(kstart[:, None] + _J8, lim)].view("<u8").ravel()
        for i, (f, key, kh, kt) in enumerate(zip(fields, keys, key_heads, key_tails)):
            m = (klen == len(key)) & ((head & kh[1]) == kh[0])
            if not m.any():
                continue
            rows = np.flatnonzero(m)
            if len(kt):
                rows = rows[(a[np.minimum(kstart[rows, None] + 8 + np.arange(len(kt)), lim)] == kt).all(axis=1)]
                if len(rows) == 0:
                    continue
            q = p[rows]
            if not ((ftag[rows] == _NUMERIC[f.dtype]) & (ll[rows] > 0) & (a[np.minimum(q, lim)] == 0x0A)).all():
                raise _Bad                         # wrong list kind, empty list, or not packed
            plen, q = _varint(a, q + 1, lim)
            if not (q + plen == eend[rows]).all():
                raise _Bad
            r = act[rows]
            vpos[i][r], vlen[i][r] = q, plen
            count[i][r] += 1
        pos[act] = eend
    else:
        raise _Bad
    out = {}
    for i, f in enumerate(fields):
        if not (count[i] == 1).all():
            raise _Bad                             # missing or duplicated: let TF (and the diagnosis) decide
        k = f.size
        if _NUMERIC[f.dtype] == _FLOAT_LIST:
            if not (vlen[i] == 4 * k).all():
                raise _Bad
            raw = a[vpos[i][:, None] + np.arange(4 * k)]
            vals = np.ascontiguousarray(raw).view("<f4").reshape(n, k)
        else:
            vals = _ints(a, vpos[i], vlen[i], k)
        vals = vals.astype(_OUT[f.dtype], copy=False)
        out[f.name] = vals.reshape((n,) + tuple(f.shape))
    return out


def with_fallback(fields: tuple, fallback: Callable[[tuple], Callable[[list[bytes]], dict[str, np.ndarray]]]
                  ) -> Callable[[list[bytes]], dict[str, np.ndarray]]:
    """The fast decoder, falling back per batch to ``fallback(fields)`` (built on first need) when it declines."""
    slow: list[Callable[[list[bytes]], dict[str, np.ndarray]]] = []

    def run(payloads: list[bytes]) -> dict[str, np.ndarray]:
        out = parse(payloads, fields)
        if out is not None:
            return out
        if not slow:
            slow.append(fallback(fields))
        return slow[0](payloads)

    return run
