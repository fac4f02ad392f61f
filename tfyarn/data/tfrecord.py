"""TFRecord framing over any fsspec file object: reader (both CRC checks), writer, GZIP.

Why not ``tf.data.TFRecordDataset``: TF 2.21 cannot open ``hdfs://`` at all, and gateways have no TF. A record is
``u64 length | u32 masked_crc(length) | data | u32 masked_crc(data)``: only walking the length chain is sequential, so
the reader reads large blocks (HDFS round trips are expensive) and checks every CRC of a block in bulk (the C loops of
:mod:`native`, else numpy and google-crc32c). A failed check names the file, the byte offset of the record (in the
decompressed stream for GZIP files) and its record index, so a user can find it with ``dd``/``xxd``.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from contextlib import nullcontext
from dataclasses import dataclass, field
from io import FileIO
from itertools import repeat
from typing import IO, Any, Callable, Generator, Iterator, Mapping, cast

import fsspec  # noqa: TID253 - the data path reads through fsspec
import numpy as np
from google_crc32c import _crc32c  # the C implementation; importing it fails loudly if only the slow one exists

from tfyarn.data import native
from tfyarn.data.errors import DataError
from tfyarn.common.fsretry import open_read

_crc_value = _crc32c.value
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
HEADER = 12  # u64 length + u32 crc
FOOTER = 4  # u32 crc
DEFAULT_BLOCK = 8 << 20


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C (the mask makes a CRC of a CRC-containing buffer not degenerate)."""
    crc = _crc_value(bytes(data))
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _mask_np(crc: np.ndarray) -> np.ndarray:
    crc = crc.astype(np.uint32, copy=False)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)  # CRC32C, reflected
    return table


_TABLE = _crc_table()


def crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC32C of every row of a uint8 matrix at once (used for the 8-byte length headers: N records, 8 numpy steps)."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for j in range(rows.shape[1]):
        crc = _TABLE[(crc ^ rows[:, j]) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


# ------------------------------------------------------------------------------------------------------------ opening

GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str, compression: str = "auto", head: bytes | None = None) -> bool:
    """GZIP by option, by extension, or (auto) by the magic bytes — Hadoop jobs often write ``part-00000`` without
    an extension, so the extension alone is not enough."""
    if compression not in ("auto", "none", "gzip"):
        raise ValueError(f"compression must be auto, none or gzip, not {compression!r}")
    if compression != "auto":
        return compression == "gzip"
    return path.endswith((".gz", ".gzip")) or (head is not None and head[:2] == GZIP_MAGIC)


def detect_gzip(path: str, compression: str, head: bytes) -> bool:
    """:func:`is_gzip` for reading, checked against ``head`` (the file's first 12 bytes, fewer only if it is shorter).

    Why: a setting that contradicts the bytes otherwise fails deep inside ``gzip`` naming no file, or reads compressed
    bytes as garbage framing; the :class:`DataError` names the file and the setting to change. Gzip magic in a file
    read uncompressed is only reported when it is not also a valid record header (a 35,615-byte first record).
    """
    gz = is_gzip(path, compression, head)
    if not head:
        return gz  # empty: nothing to decompress, nothing to contradict
    magic = head[:2] == GZIP_MAGIC
    if gz and not magic:
        why = (
            "data.compression is gzip"
            if compression == "gzip"
            else "its name ends in .gz (data.compression: auto); set data.compression: none to read it uncompressed"
        )
        raise DataError(
            f"{path}: not gzip-compressed (it does not start with the gzip magic bytes 1f 8b) although {why}",
            path=path,
            offset=0,
            record=0,
        )
    if not gz and magic and not (len(head) >= HEADER and header_ok(head, 0)):
        raise DataError(
            f"{path}: looks gzip-compressed (it starts with the gzip magic bytes 1f 8b) but "
            f"data.compression is {compression}: set data.compression: gzip",
            path=path,
            offset=0,
            record=0,
        )
    return gz


class _Gunzip(gzip.GzipFile):
    """A GzipFile whose decompression errors name the file: ``gzip`` raises ``BadGzipFile``, ``EOFError`` (a
    truncated stream) or ``zlib.error`` without saying which of a thousand files it was reading."""

    def __init__(self, fileobj: IO[bytes], path: str, *, own: bool = False):
        super().__init__(fileobj=fileobj, mode="rb")
        self._path = path
        if own:
            # closed with this stream (GzipFile leaves a passed-in file open); typeshed says
            # FileIO, gzip only calls its close()
            self.myfileobj = cast(FileIO, fileobj)

    def _named(self, op: Callable[..., Any], *args: Any) -> Any:
        try:
            return op(*args)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise DataError(
                f"{self._path}: cannot decompress (gzip): {type(exc).__name__}: {exc}", path=self._path
            ) from exc

    def read(self, size: int | None = -1) -> bytes:
        return self._named(super().read, size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._named(super().seek, offset, whence)


def open_records(path: str, gz: bool) -> IO[bytes]:
    """A binary stream of TFRecord bytes (decompressed when ``gz``). The caller closes it."""
    f = open_read(path)  # HDFS: a DataNode fault reopens the file at the same offset (tfyarn.common.fsretry)
    return cast("IO[bytes]", _Gunzip(f, path, own=True)) if gz else f  # (GzipFile: no IO)


def first_record(f: IO[bytes], path: str, compression: str = "auto", limit: int = 64 << 20) -> bytes | None:
    """The first record of an open raw (possibly GZIP) file, both CRCs checked; None for an empty file.

    For checks that sample files (preflight) without indexing them; the compression is checked against the bytes as
    when indexing (:func:`detect_gzip`). Raises :class:`DataError` naming the file when the bytes are not TFRecord
    framing, the record is truncated, or it is longer than ``limit`` (a length read from garbage must not become a
    huge read)."""
    gz = detect_gzip(path, compression, f.read(HEADER))
    f.seek(0)
    with _Gunzip(f, path) if gz else nullcontext(f) as stream:
        head = stream.read(HEADER)
        if not head:
            return None
        if len(head) < HEADER or not header_ok(head, 0):
            raise DataError(f"{path}: not a TFRecord file (no valid record header at byte 0)")
        (n,) = _U64.unpack_from(head)
        if n > limit:
            raise DataError(f"{path}: first record claims {n} bytes (more than {limit}): not a TFRecord file?")
        body = stream.read(n + FOOTER)
    if len(body) < n + FOOTER:
        raise DataError(f"{path}: the first record is truncated ({len(body)} of {n + FOOTER} bytes)")
    if masked_crc(body[:n]) != _U32.unpack_from(body, n)[0]:
        raise DataError(f"{path}: the first record's data CRC does not match (corrupt data)")
    return body[:n]


# ------------------------------------------------------------------------------------------------------------ framing


@dataclass
class Framed:
    """Records framed in one block: ``offsets[i]`` is the byte position of record i's header inside ``buf``."""

    offsets: np.ndarray  # int64
    end: int  # position in buf just after the last complete record

    def lengths(self) -> np.ndarray:
        """Payload lengths, in bulk (cheaper than collecting them in the loop): each record ends where the next
        begins, the last at ``end``."""
        return np.append(self.offsets[1:], self.end) - self.offsets - (HEADER + FOOTER)


def scan(buf: bytes, pos: int, limit: int) -> Framed:
    """Walk the length chain from ``pos``; stops at ``limit`` records or at the first record not complete in buf.

    Nothing is verified here: a corrupt length only makes the walk stop early or go astray, and :func:`check_headers`
    then reports the first bad header, the corrupt one. The C loop (:mod:`native`) when built; else this Python loop,
    kept minimal (~0.1 us a record, 2x faster than a ``while`` loop that also collects lengths).
    """
    lib = native.records
    if lib is not None:
        raw, end = lib.scan(buf, pos, limit)
        return Framed(np.frombuffer(raw, dtype=np.int64), end)
    offsets: list[int] = []
    app = offsets.append
    unpack = _U64.unpack_from
    end = len(buf)
    last = end - HEADER
    for _ in repeat(None, limit):
        if pos > last:
            break
        nxt = pos + (HEADER + FOOTER) + unpack(buf, pos)[0]
        if nxt > end:
            break
        app(pos)
        pos = nxt
    return Framed(np.asarray(offsets, dtype=np.int64), pos)


def header_ok(buf: bytes, pos: int) -> bool:
    """Length-CRC check of the one header a scan stopped at (is it really a long record, or garbage?)."""
    return masked_crc(buf[pos : pos + 8]) == _U32.unpack_from(buf, pos + 8)[0]


def check_headers(arr: np.ndarray, offsets: np.ndarray) -> int:
    """Index of the first record whose length CRC is wrong, or -1. ``arr`` is the block as uint8; ``offsets``
    int64. C when built, else a vectorised numpy CRC over all the headers at once."""
    if len(offsets) == 0:
        return -1
    lib = native.records
    if lib is not None:
        return lib.first_bad_header(arr, np.ascontiguousarray(offsets, dtype=np.int64))
    rows = arr[offsets[:, None] + np.arange(8)]
    stored = arr[offsets[:, None] + np.arange(8, 12)].copy().view("<u4").ravel()
    bad = np.flatnonzero(_mask_np(crc32c_rows(rows)) != stored)
    return int(bad[0]) if len(bad) else -1


def payloads_and_check(
    buf: bytes, arr: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, check: bool = True
) -> tuple[list[bytes], np.ndarray]:
    """The record payloads (bytes) and the indexes of those whose data CRC is wrong (empty when all are good).

    C when built (one pass: slice + CRC per record), else slices and google-crc32c mapped over them."""
    lib = native.records
    if lib is not None and len(offsets):
        end = int(offsets[-1]) + HEADER + int(lengths[-1]) + FOOTER
        payloads, bad = lib.payloads(buf, np.ascontiguousarray(offsets, dtype=np.int64), end, check)
        return payloads, np.asarray(bad, dtype=np.int64)
    starts = offsets + HEADER
    ends = starts + lengths
    payloads = [buf[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
    if not check or not payloads:
        return payloads, np.empty(0, dtype=np.int64)
    computed = np.fromiter(map(_crc_value, payloads), dtype=np.uint32, count=len(payloads))
    stored = arr[ends[:, None] + np.arange(4)].copy().view("<u4").ravel()
    return payloads, np.flatnonzero(_mask_np(computed) != stored)


# ------------------------------------------------------------------------------------------------------------ reading


@dataclass
class Chunk:
    """Consecutive good records of one file: ``payloads[i]`` is record ``first + i`` unless listed in ``skipped``."""

    payloads: list[bytes | None]  # None where a record was skipped
    first: int
    offsets: np.ndarray  # byte offset of each record in the (decompressed) file
    skipped: list[DataError] = field(default_factory=list)


@dataclass(frozen=True)
class FrameOptions:
    """How :func:`iter_chunks` frames records: the feeder's choice travels as one value to its reader thread or its
    framing process (:mod:`tfyarn.data.framer`). ``block_bytes``: read at a time; ``max_records``: a chunk's most;
    ``on_corrupt="skip"``: a record whose data CRC is wrong is left out (see :func:`iter_chunks`)."""

    check_crc: bool = True
    on_corrupt: str = "fail"
    block_bytes: int = DEFAULT_BLOCK
    max_records: int = 1 << 16


FRAME_DEFAULTS = FrameOptions()


def _error(path: str, offset: int, record: int, what: str) -> DataError:
    """A :class:`DataError` about the record at ``offset``, naming the file, the offset and the record index."""
    return DataError(
        f"{path}: record {record} at byte offset {offset}: {what}", path=path, offset=offset, record=record
    )


class Window:
    """The bytes of an open TFRecord stream being framed block by block: ``buf`` holds the stream from offset
    ``base``; the next record begins at ``buf[pos]``. Shared by reading (:func:`iter_chunks`) and indexing
    (:func:`tfyarn.data.sources.tfrecords.index_file`), which differ only in what they do with a block's records."""

    def __init__(self, f: IO[bytes], offset: int = 0):
        if offset:
            f.seek(offset)
        self.f, self.buf, self.base, self.pos, self.eof = f, b"", offset, 0, False

    def fill(self, block_bytes: int) -> int:
        """Read the next block after what is not framed yet (keeping that); the bytes read (0 at the end)."""
        if self.eof:
            return 0
        block = self.f.read(max(block_bytes, 1))
        if not block:
            self.eof = True
        else:
            self.base += self.pos
            self.buf = self.buf[self.pos :] + block if self.pos < len(self.buf) else block
            self.pos = 0
        return len(block)

    def jump(self, to: int) -> None:
        """Go on at stream offset ``to`` (past damage): in the buffer when it holds it, else by seeking."""
        if to - self.base <= len(self.buf):
            self.pos = to - self.base
        else:
            self.f.seek(to)
            self.buf, self.base, self.pos = b"", to, 0


def iter_chunks(
    path: str,
    start: int,
    stop: int,
    *,
    offset: int = 0,
    first_record: int = 0,
    gz: bool = False,
    holes: Mapping[int, int] | None = None,
    opts: FrameOptions = FRAME_DEFAULTS,
) -> Iterator[Chunk]:
    """Yield records ``[start, stop)`` of one TFRecord file in chunks of at most ``opts.max_records``.

    ``offset``/``first_record`` is a known record boundary at or before ``start`` (the manifest's sparse index);
    records between it and ``start`` are framed and their headers checked, their data CRCs not computed.

    ``opts.on_corrupt="skip"``: a record whose *data* CRC is wrong is left out and reported in ``Chunk.skipped``.
    Damaged *framing* is only skipped where the manifest (built with ``skip``) found the next valid record: ``holes``
    maps the byte offset of the damage to the offset to resume at. Anywhere else it raises.
    """
    if stop <= start:
        return
    with open_records(path, gz) as f:
        reader = _ChunkReader(path, start, stop, Window(f, offset), first_record, holes or {})
        yield from reader.chunks(opts.check_crc, opts.on_corrupt, opts.block_bytes, opts.max_records)


class _ChunkReader:
    """:func:`iter_chunks`' walk through one file: a block at a time (Python per block and per chunk, never per
    record); ``rec`` is the index of the record at ``w.buf[w.pos]``."""

    def __init__(self, path: str, start: int, stop: int, w: Window, rec: int, holes: Mapping[int, int]):
        self.path, self.start, self.stop, self.w, self.rec, self.holes = path, start, stop, w, rec, holes

    def chunks(self, check_crc: bool, on_corrupt: str, block_bytes: int, max_records: int) -> Iterator[Chunk]:
        w = self.w
        while self.rec < self.stop:
            w.fill(block_bytes)
            if w.eof and w.pos >= len(w.buf):
                raise _error(
                    self.path,
                    w.base + w.pos,
                    self.rec,
                    f"file ends after {self.rec} records but the manifest says it has at least {self.stop} (file "
                    "changed since it was indexed? rebuild the index)",
                )
            jump, progressed = yield from self._block(check_crc, on_corrupt, max_records)
            if jump is not None:
                w.jump(jump)
            elif w.eof and not progressed and self.rec < self.stop:
                _raise_incomplete(self.path, w.buf, w.pos, w.base, self.rec)

    def _block(
        self, check_crc: bool, on_corrupt: str, max_records: int
    ) -> Generator[Chunk, None, tuple[int | None, bool]]:
        """The chunks of the records the buffer holds; then (where to jump past a hole, or None; whether any record
        was framed)."""
        w = self.w
        arr = np.frombuffer(w.buf, dtype=np.uint8)
        progressed = False
        while self.rec < self.stop:
            rec = self.rec
            fr = scan(w.buf, w.pos, min(self.stop - rec, max_records) if rec >= self.start else self.start - rec)
            if len(fr.offsets) == 0:
                return self._stuck(), progressed
            progressed = True
            fr, jump = self._cut_at_damage(arr, fr)
            n = len(fr.offsets)
            if n and rec < self.start:  # framing only: records before the range
                take = min(n, self.start - rec)
                # (take < n only when a jump cut a scan that was meant to stop at start)
                self.rec, w.pos = rec + take, fr.end if take == n else int(fr.offsets[take])
            elif n:
                chunk = self._chunk(arr, fr, check_crc, on_corrupt)
                self.rec, w.pos = rec + n, fr.end
                yield chunk
            if jump is not None:
                return jump, True
        return None, progressed

    def _stuck(self) -> int | None:
        """No complete record at ``pos``: a known hole's end to jump to, or None to read more (damage raises)."""
        w, at = self.w, self.w.base + self.w.pos
        if at in self.holes:
            return self.holes[at]
        if w.eof:
            _raise_incomplete(self.path, w.buf, w.pos, w.base, self.rec)
        if len(w.buf) - w.pos >= HEADER and not header_ok(w.buf, w.pos):
            _raise_bad_header(self.path, at, self.rec)
        return None

    def _cut_at_damage(self, arr: np.ndarray, fr: Framed) -> tuple[Framed, int | None]:
        """``fr`` up to its first record with a bad length CRC, and where to jump past it (a known hole: the records
        before it are kept), or ``fr`` whole and None; damage that is not a known hole raises."""
        bad = check_headers(arr, np.asarray(fr.offsets, dtype=np.int64))
        if bad < 0:
            return fr, None
        at = self.w.base + int(fr.offsets[bad])
        if at not in self.holes:
            _raise_bad_header(self.path, at, self.rec + bad)
        return Framed(fr.offsets[:bad], int(fr.offsets[bad])), self.holes[at]

    def _chunk(self, arr: np.ndarray, fr: Framed, check_crc: bool, on_corrupt: str) -> Chunk:
        """The records of ``fr`` with their data CRCs checked: a wrong one raises, or under ``skip`` is left out
        (None) and reported in ``Chunk.skipped``."""
        base, rec = self.w.base, self.rec
        offs = np.asarray(fr.offsets, dtype=np.int64)
        good, bad = payloads_and_check(self.w.buf, arr, offs, fr.lengths(), check_crc)
        payloads = cast("list[bytes | None]", good)  # None: skipped (below)
        skipped: list[DataError] = []
        for i in bad.tolist():
            err = _error(self.path, base + int(offs[i]), rec + i, "corrupted data (data CRC mismatch)")
            if on_corrupt != "skip":
                raise err
            skipped.append(err)
            payloads[i] = None
        return Chunk(payloads, rec, offs + base, skipped)


def find_resync(buf: bytes, start: int, window: int = 1 << 20) -> int | None:
    """First position >= ``start`` in ``buf`` where a complete valid record begins (length and data CRC), or None.

    Only after damage: candidate headers are found in bulk (a vectorised CRC of every 8-byte window), then each
    candidate's data CRC confirms it (a false header match is 1 in 2^32, confirmed by a second 1 in 2^32 check).
    """
    arr = np.frombuffer(buf, dtype=np.uint8)
    lo = start
    while lo + HEADER + FOOTER <= len(buf):
        hi = min(len(buf) - (HEADER + FOOTER) + 1, lo + window)
        span = arr[lo : hi + 11]
        rows = np.lib.stride_tricks.sliding_window_view(span, 8)[: hi - lo]
        b = np.lib.stride_tricks.sliding_window_view(span[8:], 4)[: hi - lo].astype(np.uint32)
        stored = b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16 | b[:, 3] << 24
        for c in np.flatnonzero(_mask_np(crc32c_rows(rows)) == stored).tolist():
            p = lo + c
            (length,) = _U64.unpack_from(buf, p)
            e = p + HEADER + length
            if e + FOOTER <= len(buf) and masked_crc(buf[p + HEADER : e]) == _U32.unpack_from(buf, e)[0]:
                return p
        lo = hi
    return None


def _raise_bad_header(path: str, offset: int, rec: int) -> None:
    if offset == 0 and rec == 0:
        raise DataError(
            f"{path}: not a TFRecord file (the first record header, at byte offset 0, fails its length CRC check)",
            path=path,
            offset=0,
            record=0,
        )
    raise _error(path, offset, rec, "corrupted record header (length CRC mismatch)")


def _raise_incomplete(path: str, buf: bytes, pos: int, base: int, rec: int) -> None:
    left = len(buf) - pos
    if rec == 0 and base + pos == 0 and left < HEADER:
        raise DataError(
            f"{path}: not a TFRecord file ({left} bytes, shorter than one record header)", path=path, offset=0, record=0
        )
    if left >= HEADER and not header_ok(buf, pos):
        _raise_bad_header(path, base + pos, rec)
    raise _error(path, base + pos, rec, f"truncated file ({left} trailing bytes are not a complete record)")


# ------------------------------------------------------------------------------------------------------------ writing


def encode_record(data: bytes) -> bytes:
    header = _U64.pack(len(data))
    return header + _U32.pack(masked_crc(header)) + data + _U32.pack(masked_crc(data))


class TFRecordWriter:
    """Write TFRecords to any fsspec URL (GZIP when ``compression="gzip"`` or, with ``auto``, a .gz name).

    Buffered in memory per ``flush_bytes`` so remote filesystems see few large writes.
    """

    def __init__(self, url: str, compression: str = "auto", flush_bytes: int = 4 << 20):
        self.url = url
        self._gz = is_gzip(url, compression)
        self._raw = fsspec.open(url, "wb").open()
        self._f = gzip.GzipFile(fileobj=self._raw, mode="wb") if self._gz else self._raw
        self._parts: list[bytes] = []
        self._size = 0
        self._flush_bytes = flush_bytes
        self.records = 0

    def write(self, data: bytes) -> None:
        rec = encode_record(data)
        self._parts.append(rec)
        self._size += len(rec)
        self.records += 1
        if self._size >= self._flush_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._parts:
            self._f.write(b"".join(self._parts))
            self._parts, self._size = [], 0

    def close(self) -> None:
        self._flush()
        if self._gz:
            self._f.close()
        self._raw.close()

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
