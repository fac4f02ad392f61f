"""TFRecord files of ``tf.train.Example`` records (optionally GZIP): tfyarn's own framing and C parser.

* index: the file read once (:func:`index_file`): records counted, every ``stride``-th boundary noted, every length
  CRC checked; damaged framing fails, or under ``on_corrupt: skip`` becomes a hole readers jump over.
* read: the reader thread frames records itself (the C loops of :mod:`tfyarn.data.native`), or takes chunks from the
  feeder's framing process (:mod:`tfyarn.data.framer`) once it is up; it drops data-CRC-corrupt records
  (``skip``), applies the seeded shuffle buffer and groups records for the parser.
* parse: :func:`tfyarn.data.parse.default_parser` (C, else TF's ParseExampleV2); a group that does not parse is
  diagnosed record by record (:meth:`TFRecordSource.salvage`).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from contextlib import closing
from typing import Any, Callable, Generator, Iterator, cast

import numpy as np

from tfyarn.data import parse as parse_mod, tfrecord
from tfyarn.data.errors import DataError
from tfyarn.data.fileindex import DEFAULT_STRIDE, MAX_OFFSETS, STATS, FileInfo
from tfyarn.data.framer import FrameJob
from tfyarn.data.planner import RecordRange, advance
from tfyarn.data.sources.base import POLL, Parse, Source, concat, empty, reject
from tfyarn.data.tfrecord import Chunk
from tfyarn.common.fsretry import open_read

log = logging.getLogger(__name__)


#: what the reader emits: payloads of one file, their record indexes and byte offsets
_Item = tuple[list[bytes], str, np.ndarray, np.ndarray]


def _good_records(run: Any, chunk: Chunk) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """A chunk's records but those skipped as corrupt (counted once an epoch), with their indexes and offsets."""
    got, offs = chunk.payloads, chunk.offsets
    run.records_read += len(got)
    recs = np.arange(chunk.first, chunk.first + len(got))
    if not chunk.skipped:
        return cast("list[bytes]", got), recs, offs  # (None marks only a skipped record)
    run.f.record_skips(chunk.skipped, run)
    keep = np.array([p is not None for p in got])
    return [p for p in got if p is not None], recs[keep], offs[keep]


class _ShuffleBuffer:
    """The feeder's seeded shuffle buffer of ``size`` records: each record read takes the place of a random one
    held, which goes out; what is held goes out shuffled at the end of a pass over the share."""

    def __init__(self, size: int, rng: random.Random):
        self.size, self.rng = size, rng
        self.held: list[tuple[bytes, str, int, int]] = []

    def add(self, pays: list[bytes], path: str, recs: np.ndarray, offs: np.ndarray) -> Iterator[_Item]:
        held, size, rng = self.held, self.size, self.rng
        for p, r, o in zip(pays, recs.tolist(), offs.tolist()):
            if len(held) < size:
                held.append((p, path, r, o))
                continue
            j = rng.randrange(size)
            out_p, out_path, out_r, out_o = held[j]
            held[j] = (p, path, r, o)
            yield [out_p], out_path, np.array([out_r]), np.array([out_o])

    def drain(self) -> Iterator[_Item]:
        self.rng.shuffle(self.held)
        rest, self.held = self.held, []
        for p, path, r, o in rest:
            yield [p], path, np.array([r]), np.array([o])


class TFRecordSource(Source):
    """TFRecord files (the default format: any file name not claimed by another source)."""

    name = "tfrecord"
    extensions = (".tfrecord", ".tfrecords")
    compressed = True
    shuffles = True
    frames_in_process = True

    def index(self, url: str, size: int, mtime: str, **opts: Any) -> FileInfo:
        return index_file(url, size, mtime, **opts)

    def parser(self, fields: tuple[Any, ...]) -> Parse:
        return parse_mod.default_parser(fields)

    def read_range(self, fi: FileInfo, start: int, stop: int, fields: tuple[Any, ...]) -> dict[str, Any]:
        chunks = FrameJob.of(fi, start, stop).chunks(tfrecord.FrameOptions(max_records=8192))
        parse = self.parser(fields)
        return concat([parse(cast("list[bytes]", c.payloads)) for c in chunks], fields)

    def read(self, run: Any) -> None:
        f, B = run.f, run.f.batch_size
        # Resume: seek past the first start_step batches when the stream is a plain function of the share. With a
        # shuffle buffer or skipped records it is not (which records came first depends on what was read and
        # rejected), so the reader replays the whole share and the parser drops the first start_step x B good rows.
        skip_front = 0 if run.replay else run.start_step * B
        need = (run.plan.steps if run.replay else run.target) * B
        G = f.group  # records per parse call (a multiple of B)
        pay: list[bytes] = []
        meta: list[tuple[str, np.ndarray, np.ndarray]] = []  # segments: (path, record indexes, byte offsets)
        emitted = 0  # records handed to the parser

        def remaining() -> int:
            with run.deficit_lock:
                return need + run.deficit - emitted - len(pay)

        def emit(pays: list[bytes], path: str, recs: np.ndarray, offs: np.ndarray) -> int:
            """Append records to the pending batch; hand full batches (or the last needed records) to the parser.
            Returns how many of ``pays`` were taken (all, unless no more were needed)."""
            nonlocal emitted, pay, meta
            i, n = 0, len(pays)
            while i < n:
                rem = remaining()
                if rem <= 0:
                    return i
                take = min(G - len(pay), rem, n - i)
                pay.extend(pays[i : i + take])
                meta.append((path, recs[i : i + take], offs[i : i + take]))
                i += take
                if len(pay) == G or remaining() <= 0:
                    run.put(run.raw, ("batch", pay, meta))
                    emitted += len(pay)
                    pay, meta = [], []
            return n

        # Only ``skip`` makes the parser ask for more records after the reader has emitted all it needed.
        more_may_be_wanted = f.on_corrupt == "skip"
        pending = None  # the part of an item that was not needed (yet)
        with closing(self._stream(run, skip_front, remaining)) as records:
            while True:
                while remaining() > 0:
                    item = pending if pending is not None else next(records)
                    pending = None
                    taken = emit(*item)
                    if taken < len(item[0]):
                        p_, path_, r_, o_ = item
                        pending = (p_[taken:], path_, r_[taken:], o_[taken:])
                if not more_may_be_wanted or run.parser_finished.is_set():
                    records.close()  # let the framing process go: nothing more will be read this epoch
                # Park (polling, noticing close) until the parser finishes or reports rejected records.
                run.reader_state = "done, waiting for the parser"
                while remaining() <= 0:
                    run.check_stop()
                    if run.parser_finished.is_set():
                        records.close()
                    time.sleep(POLL / 4)

    def _stream(self, run: Any, skip_front: int, remaining: Callable[[], int]) -> Generator[_Item, None, None]:
        """The records to emit, in order: the share (after ``skip_front``), then — only while more are wanted, to
        replace records rejected as corrupt — the share again from its start, as often as needed. Lazy: what is
        emitted is a prefix of this one sequence however late the parser's rejections arrive, so a resumed epoch
        replays exactly."""
        f, share = run.f, run.plan.shares[run.f.rank]
        sbuf = _ShuffleBuffer(f.shuffle_buffer, random.Random(f"{f.seed}|{run.epoch}|{f.rank}|shuffle"))
        for passes in itertools.count():
            if passes:
                run.reader_state = "re-reading the share to replace skipped records"
                log.info(
                    "worker %d epoch %d: %d records still needed after skips; re-reading the share (pass %d)",
                    f.rank,
                    run.epoch,
                    remaining(),
                    passes + 1,
                )
            ranges = advance(share, skip_front) if passes == 0 else list(share)
            good = 0
            with closing(self._chunks(run, ranges)) as chunks:  # closing early cancels the framing process's work
                for rr, chunk in chunks:
                    run.check_stop()
                    pays, recs, offs = _good_records(run, chunk)
                    good += len(pays)
                    if sbuf.size:
                        yield from sbuf.add(pays, rr.path, recs, offs)
                    else:
                        yield pays, rr.path, recs, offs
            yield from sbuf.drain()
            if good == 0:
                raise DataError(
                    f"worker {f.rank}, epoch {run.epoch}: no readable record in this worker's share "
                    f"({len(share)} ranges, first {share[0].path if share else '-'}); "
                    f"{f.skipped} records skipped as corrupt"
                )

    def _chunks(self, run: Any, ranges: list[RecordRange]) -> Generator[tuple[RecordRange, Chunk], None, None]:
        """The framed records of ``ranges`` in order: from the framing process (:mod:`framer`) once it is up, framed
        in this thread before that (range by range: nothing ever waits for the process to start), and always in this
        thread when the files are not reachable from another process (``memory://``) or ``framing="thread"``."""
        f = run.f
        jobs = [FrameJob.of(f.files[rr.path], rr.start, rr.stop) for rr in ranges]
        framer = f.framer
        for k, (rr, j) in enumerate(zip(ranges, jobs)):
            # auto: the process is started once the epoch's first batch is taken (see __next__); strict: now, and
            # chunks() waits for it
            if framer is not None and (f.framing_strict or framer.ready()):
                for index, chunk in framer.chunks(jobs[k:], run.check_stop):
                    rr = ranges[k + index]
                    run.reader_state = f"reading {rr.path} records {rr.start}..{rr.stop} (framing process {framer.pid})"
                    run.records_from_framer += len(chunk.payloads)
                    yield rr, chunk
                return
            run.reader_state = f"reading {rr.path} records {rr.start}..{rr.stop}"
            for chunk in j.chunks(f.frame_opts):
                yield rr, chunk

    def salvage(self, run: Any, parse: Callable, payloads: list[bytes], meta: list, msg: str) -> dict[str, np.ndarray]:
        """A batch failed to parse: find the bad records, fail with a precise message or skip them."""
        f = run.f
        good, bad = [], []
        meta = [(path, r, o) for path, recs, offs in meta for r, o in zip(recs.tolist(), offs.tolist())]
        p0, r0, o0 = meta[0]
        unparsable = f"{p0}: batch starting at record {r0} (byte offset {o0}) does not parse"
        for p, (path, rec, off) in zip(payloads, meta):
            problem = parse_mod.diagnose(p, f.fields)
            if problem is None:
                good.append(p)
                continue
            feature, what = problem
            err = DataError(
                f"{path}: record {rec} at byte offset {off}: {what}", path=path, offset=off, record=rec, feature=feature
            )
            if f.on_corrupt != "skip":
                raise err
            bad.append(err)
        if not bad:
            raise DataError(f"{unparsable}: {msg}", path=p0, offset=o0, record=r0)
        reject(run, bad, "no record of this worker's share fits the schema ({} rejected, on_corrupt: skip)")
        if not good:
            return empty(f.fields)
        try:
            return parse(good)
        except parse_mod.BatchParseError as exc:
            raise DataError(
                f"{unparsable} even without the records diagnosed as bad: {exc}", path=p0, offset=o0, record=r0
            ) from None


def index_file(
    url: str,
    size: int,
    mtime: str,
    compression: str = "auto",
    stride: int = DEFAULT_STRIDE,
    block_bytes: int = tfrecord.DEFAULT_BLOCK,
    on_corrupt: str = "fail",
) -> FileInfo:
    """Read one file once: count records, note every ``stride``-th boundary, check every length CRC (framing). Data
    CRCs are checked when records are read for training, not here: indexing must stay I/O bound.

    ``on_corrupt="skip"``: damaged framing becomes a *hole*, the bytes from the damage to the next valid record
    (:func:`tfrecord.find_resync`) or to the end of the file. Otherwise damage raises with the file, offset and record.
    """
    with open_read(url) as raw:
        head = raw.read(tfrecord.HEADER)
    STATS.add(bytes_read=len(head))
    gz = tfrecord.detect_gzip(url, compression, head)  # a wrong data.compression fails here, naming the file
    with tfrecord.open_records(url, gz) as f:
        ix = _Indexer(url, tfrecord.Window(f), stride, on_corrupt == "skip")
        ix.run(block_bytes)
    w = ix.w
    return FileInfo(url, size, mtime, ix.rec, gz, ix.stride, tuple(ix.offsets), w.base + w.pos, tuple(ix.holes))


class _Indexer:
    """:func:`index_file`'s pass over one file, a block at a time: ``rec`` records counted so far, ``offsets`` of
    every ``stride``-th, ``holes`` (``skip``) stepped over."""

    def __init__(self, url: str, w: tfrecord.Window, stride: int, skip: bool):
        self.url, self.w, self.stride, self.skip = url, w, stride, skip
        self.rec = 0
        self.offsets: list[int] = []
        self.holes: list[tuple[int, int]] = []

    def run(self, block_bytes: int) -> None:
        w = self.w
        while True:
            STATS.add(bytes_read=w.fill(block_bytes))  # decompressed bytes for gz: what was processed
            bad_at = self._count(tfrecord.scan(w.buf, w.pos, 1 << 62))
            if bad_at is None and len(w.buf) - w.pos >= tfrecord.HEADER and not tfrecord.header_ok(w.buf, w.pos):
                bad_at = w.pos  # a bad length: do not buffer to EOF
            if bad_at is not None:
                if not self.skip:
                    tfrecord._raise_bad_header(self.url, w.base + bad_at, self.rec)
                self._step_over(bad_at)
                continue
            if w.eof:
                self._truncated_end()
                return

    def _count(self, fr: tfrecord.Framed) -> int | None:
        """Count the records a scan framed, up to the first bad length CRC; its position in the buffer, or None."""
        w, bad_at = self.w, None
        if len(fr.offsets):
            offs = fr.offsets
            bad = tfrecord.check_headers(np.frombuffer(w.buf, dtype=np.uint8), offs)
            if bad >= 0:
                bad_at, offs = int(offs[bad]), offs[:bad]
            first = (-self.rec) % self.stride
            self.offsets.extend((offs[first :: self.stride] + w.base).tolist())
            self.rec += len(offs)
            while len(self.offsets) > MAX_OFFSETS:  # bounded size per file: keep every other one
                self.offsets, self.stride = self.offsets[::2], self.stride * 2
            w.pos = fr.end if bad_at is None else bad_at
        return bad_at

    def _step_over(self, bad_at: int) -> None:
        """``skip``: a hole from the damage at ``bad_at`` to the next valid record (or the end of the file); until
        one is found in the buffer, ``pos`` stays at the damage and the buffer grows."""
        w = self.w
        resync = tfrecord.find_resync(w.buf, bad_at + 1)
        if resync is None and not w.eof:
            w.pos = bad_at
            return  # look further (the buffer grows until found)
        end = resync if resync is not None else len(w.buf)
        self.holes.append((w.base + bad_at, w.base + end))
        log.debug(
            "%s: bytes %d..%d skipped (damaged record header at record %d); %s",
            self.url,
            w.base + bad_at,
            w.base + end,
            self.rec,
            "resumed at the next valid record" if resync is not None else "no valid record after it",
        )
        w.pos = end

    def _truncated_end(self) -> None:
        """At the end of the file: bytes left that are not a whole record raise, or (``skip``) are a last hole."""
        w = self.w
        if w.pos < len(w.buf):
            if not self.skip:
                tfrecord._raise_incomplete(self.url, w.buf, w.pos, w.base, self.rec)
            self.holes.append((w.base + w.pos, w.base + len(w.buf)))
            log.debug("%s: bytes %d..%d skipped (truncated last record)", self.url, w.base + w.pos, w.base + len(w.buf))
            w.pos = len(w.buf)
