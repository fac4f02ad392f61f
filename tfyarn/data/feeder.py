"""The feeder: this worker's share of an epoch as ready numpy batches, produced by background threads.

Pipeline per epoch (two threads, bounded queues; optionally a framing process)::

    [framing process ──chunks (socket)──▶] reader thread ──raw groups (≤ 2)──▶ parser thread
                                          ──ready batches (≤ prefetch + a group)──▶ consumer (training loop)

* The reader thread frames records (:mod:`tfrecord`, both CRCs) itself when the C loops of :mod:`native` are built
  (~0.02 us of CPU a record, mostly without the GIL: measured, a separate process would only add pickling). Without
  them (``framing="auto"``) it takes chunks from a framing process (:mod:`framer`: one per feeder, reused every epoch,
  started once the first batch has been taken so its start-up does not compete with the training process's own) and
  frames ranges itself until that is up, so no step waits for it. ``memory://`` files exist only in this process:
  the reader always frames them. It also drops data-CRC-corrupt records (``on_corrupt="skip"``), applies the seeded
  shuffle buffer and groups records for the parser.
* The parser turns a group into numpy arrays with one call of the C parser (:func:`parse.native_parser`) or of TF's
  ``ParseExampleV2`` (both release the GIL), diagnoses bad records, and re-assembles exact batches after skips.
* Exactly ``steps(epoch) - start_step`` batches are yielded — the same on every worker: records lost to ``skip`` are
  made up by reading the start of the worker's own share again (a short epoch on one worker is the stall this layer
  exists to prevent).

Resuming mid-epoch (``start_step``) reproduces exactly the batches of the uninterrupted epoch (see ``_Run._read``).

Memory bound: serialized records of at most 4 parse groups (raw queue of 2, one being filled, one being parsed; ~16k
records each), the parsed arrays of ``prefetch`` batches plus two groups, one read block (8 MiB) and
``shuffle_buffer`` records. Nothing grows with the file or epoch size (recommender data, batch 1000: ≈ 14 MiB).

Every wait is bounded: the consumer waits at most ``timeout`` seconds for a batch and the error names the worker,
epoch, step and what each thread was doing; producers wait on full queues in short polls that notice ``close()``.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from contextlib import closing
from typing import Any, Callable, Generator, Iterator, Mapping, cast

import numpy as np

from tfyarn.data import native, parse as parse_mod, ragged
from tfyarn.data.errors import DataError, NoDataError
from tfyarn.data.manifest import Manifest, describe_hole
from tfyarn.data.planner import EpochPlan, RecordRange, plan
from tfyarn.data.framer import FrameJob, Framer, protocol_shared
from tfyarn.data.table import TABLE_FORMATS, check_columns
from tfyarn.data.tablefeed import make_run_class, table_parser
from tfyarn.data.tfrecord import DEFAULT_BLOCK, Chunk
from tfyarn.errors import WaitTimeout

log = logging.getLogger(__name__)

_POLL = 0.1  # seconds between checks of the stop flag while a producer waits on a full/empty queue
_RAW_DEPTH = 2
_MAX_ERRORS_KEPT = 100


class _Stopped(Exception):
    """The run was closed while a thread waited; the thread unwinds quietly."""


class _Run:
    """One epoch's threads and queues. Iterating yields the batches; closing stops and joins both threads."""

    def __init__(self, feeder: "Feeder", epoch: int, start_step: int):
        self.f = feeder
        self.epoch = epoch
        self.plan = feeder.plan(epoch)
        if not 0 <= start_step <= self.plan.steps:
            raise ValueError(f"start_step {start_step} is outside 0..{self.plan.steps} (steps of epoch {epoch})")
        self.start_step = start_step
        self.target = self.plan.steps - start_step
        self.replay = (feeder.shuffle_buffer > 0 and not feeder.tables) or feeder.on_corrupt == "skip"
        self.yielded = 0
        self.stop = threading.Event()
        self.raw: queue.Queue = queue.Queue(maxsize=_RAW_DEPTH)
        # prefetch + one parse group, so the parser starts the next group while this one is consumed (with only
        # `prefetch`, a 1 ms step found the queue empty once per group: waits of 1-15 ms)
        self.ready: queue.Queue = queue.Queue(maxsize=feeder.prefetch + feeder.group // feeder.batch_size)
        self.seen_bad: set[tuple[str | None, int | None]] = set()
        self.deficit = 0  # records the parser rejected; the reader reads that many more
        self.deficit_lock = threading.Lock()
        self.parser_finished = threading.Event()  # every batch parsed: the reader reads nothing more
        self.rows_parsed = 0  # rows the parser accepted (before a resume's replayed rows are dropped)
        self.rows_rejected = 0  # records it rejected (on_corrupt: skip)
        self.first_rejected: DataError | None = None
        self.reader_state = self.parser_state = "starting"
        self.wait_s = 0.0  # consumer time blocked on the ready queue after the first batch
        self.waits_over_1ms = 0
        self.max_wait_s = 0.0
        self.records_read = 0  # framed by the reader (for the memory-bound test and stats)
        self.records_from_framer = 0  # of which framed in the framing process (the rest in the reader thread)
        #: seconds each thread spent blocked on a queue: a reader that waits a lot means parsing is the bottleneck,
        #: a parser that waits a lot means reading is, both waiting means the consumer is (the healthy case).
        self.blocked_s = {"reader": 0.0, "parser": 0.0}
        self.threads: list[threading.Thread] = []
        if self.target > 0:
            tag = f"tfyarn-feeder-r{feeder.rank}-e{epoch}"
            self.threads = [
                threading.Thread(target=self._guard, args=(fn, name), name=f"{tag}-{name}", daemon=True)
                for fn, name in ((self._read, "reader"), (self._parse, "parser"))
            ]
            for t in self.threads:
                t.start()

    # ------------------------------------------------------------------------------------------------ thread helpers
    def _blocking(self, op: Callable[[], Any]) -> Any:
        """Retry a queue operation that times out after ``_POLL`` until it succeeds, noticing ``close`` in between;
        the time blocked is added to this thread's ``blocked_s``."""
        t0 = time.monotonic()
        try:
            while True:
                self._check_stop()
                try:
                    return op()
                except (queue.Full, queue.Empty):
                    continue
        finally:
            self.blocked_s[threading.current_thread().name.rsplit("-", 1)[-1]] += time.monotonic() - t0

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise _Stopped

    def _put(self, q: queue.Queue, item: Any) -> None:
        self._blocking(lambda: q.put(item, timeout=_POLL))

    def _get(self, q: queue.Queue) -> Any:
        return self._blocking(lambda: q.get(timeout=_POLL))

    def _guard(self, fn: Callable[[], None], name: str) -> None:
        try:
            fn()
        except _Stopped:
            pass
        except BaseException as exc:
            if not isinstance(exc, DataError):
                log.exception("feeder %s thread failed", name)
            try:
                self._put(self.ready, ("error", exc))
            except _Stopped:
                pass
        finally:
            setattr(self, f"{name}_state", "finished")

    # ------------------------------------------------------------------------------------------------------- reader
    def _read(self) -> None:  # noqa: PLR0915 - listed in tests/unit/test_code_habits.py
        f, B = self.f, self.f.batch_size
        share = self.plan.shares[f.rank]
        shuffle = f.shuffle_buffer > 0
        # Resume: seek past the first start_step batches when the stream is a plain function of the share. With a
        # shuffle buffer or skipped records it is not (which records came first depends on what was read and
        # rejected), so the reader replays the whole share and the parser drops the first start_step x B good rows.
        skip_front = 0 if self.replay else self.start_step * B
        need = (self.plan.steps if self.replay else self.target) * B
        G = f.group  # records per parse call (a multiple of B)
        rng = random.Random(f"{f.seed}|{self.epoch}|{f.rank}|shuffle")
        sbuf: list[tuple[bytes, str, int, int]] = []
        pay: list[bytes] = []
        meta: list[tuple[str, np.ndarray, np.ndarray]] = []  # segments: (path, record indexes, byte offsets)
        emitted = 0  # records handed to the parser

        def remaining() -> int:
            with self.deficit_lock:
                return need + self.deficit - emitted - len(pay)

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
                    self._put(self.raw, ("batch", pay, meta))
                    emitted += len(pay)
                    pay, meta = [], []
            return n

        def stream() -> Generator[tuple[list[bytes], str, np.ndarray, np.ndarray], None, None]:
            """The records to emit, in order: the share (after ``skip_front``), then — only while more are wanted,
            to replace records rejected as corrupt — the share again from its start, as often as needed. Lazy: what
            is emitted is a prefix of this one sequence however late the parser's rejections arrive, so a resumed
            epoch replays exactly."""
            nonlocal sbuf
            passes = 0
            while True:
                if passes:
                    self.reader_state = "re-reading the share to replace skipped records"
                    log.info(
                        "worker %d epoch %d: %d records still needed after skips; re-reading the share (pass %d)",
                        f.rank,
                        self.epoch,
                        remaining(),
                        passes + 1,
                    )
                ranges = _advance(share, skip_front) if passes == 0 else list(share)
                good = 0
                with closing(self._chunks(ranges)) as chunks:  # closing early cancels the framing process's work
                    for rr, chunk in chunks:
                        self._check_stop()
                        got, offs = chunk.payloads, chunk.offsets
                        self.records_read += len(got)
                        recs = np.arange(chunk.first, chunk.first + len(got))
                        if chunk.skipped:
                            f._record_skips(chunk.skipped, self)
                            keep = np.array([p is not None for p in got])
                            pays = [p for p in got if p is not None]
                            recs, offs = recs[keep], offs[keep]
                        else:
                            pays = cast("list[bytes]", got)  # (None marks only a skipped record)
                        good += len(pays)
                        if not shuffle:
                            yield pays, rr.path, recs, offs
                            continue
                        for p, r, o in zip(pays, recs.tolist(), offs.tolist()):
                            if len(sbuf) < f.shuffle_buffer:
                                sbuf.append((p, rr.path, r, o))
                                continue
                            j = rng.randrange(f.shuffle_buffer)
                            out_p, out_path, out_r, out_o = sbuf[j]
                            sbuf[j] = (p, rr.path, r, o)
                            yield [out_p], out_path, np.array([out_r]), np.array([out_o])
                rng.shuffle(sbuf)
                rest, sbuf = sbuf, []
                for p, path, r, o in rest:
                    yield [p], path, np.array([r]), np.array([o])
                passes += 1
                if good == 0:
                    raise DataError(
                        f"worker {f.rank}, epoch {self.epoch}: no readable record in this worker's share "
                        f"({len(share)} ranges, first {share[0].path if share else '-'}); "
                        f"{f.skipped} records skipped as corrupt"
                    )

        # Only ``skip`` makes the parser ask for more records after the reader has emitted all it needed.
        more_may_be_wanted = f.on_corrupt == "skip"
        pending = None  # the part of an item that was not needed (yet)
        with closing(stream()) as records:
            while True:
                while remaining() > 0:
                    item = pending if pending is not None else next(records)
                    pending = None
                    taken = emit(*item)
                    if taken < len(item[0]):
                        p_, path_, r_, o_ = item
                        pending = (p_[taken:], path_, r_[taken:], o_[taken:])
                if not more_may_be_wanted or self.parser_finished.is_set():
                    records.close()  # let the framing process go: nothing more will be read this epoch
                # Park (polling, noticing close) until the parser finishes or reports rejected records.
                self.reader_state = "done, waiting for the parser"
                while remaining() <= 0:
                    self._check_stop()
                    if self.parser_finished.is_set():
                        records.close()
                    time.sleep(_POLL / 4)

    def _chunks(self, ranges: list[RecordRange]) -> Generator[tuple[RecordRange, Chunk], None, None]:
        """The framed records of ``ranges`` in order: from the framing process (:mod:`framer`) once it is up, framed
        in this thread before that (range by range: nothing ever waits for the process to start), and always in this
        thread when the files are not reachable from another process (``memory://``) or ``framing="thread"``."""
        f = self.f
        jobs = []
        for rr in ranges:
            off, first = f.files[rr.path].boundary(rr.start)
            jobs.append(FrameJob(rr.path, rr.start, rr.stop, off, first, f.files[rr.path].gz, f.holes.get(rr.path)))
        framer = f.framer
        for k, (rr, j) in enumerate(zip(ranges, jobs)):
            # auto: the process is started once the epoch's first batch is taken (see __next__); strict: now, and
            # chunks() waits for it
            if framer is not None and (f.framing_strict or framer.ready()):
                for index, chunk in framer.chunks(jobs[k:], self._check_stop):
                    rr = ranges[k + index]
                    self.reader_state = (
                        f"reading {rr.path} records {rr.start}..{rr.stop} (framing process {framer.pid})"
                    )
                    self.records_from_framer += len(chunk.payloads)
                    yield rr, chunk
                return
            self.reader_state = f"reading {rr.path} records {rr.start}..{rr.stop}"
            for chunk in j.chunks(f.frame_opts):
                yield rr, chunk

    # ------------------------------------------------------------------------------------------------------- parser
    def _parse(self) -> None:
        f, B = self.f, self.f.batch_size
        self.parser_state = "loading the parser"
        parse = f.parser_factory(f.fields)
        carry: dict[str, np.ndarray] | None = None
        produced = 0
        drop = self.start_step * B if self.replay else 0  # replayed rows before the resume point
        while produced < self.target:
            self.parser_state = f"waiting for records (batch {produced} of {self.target})"
            item = self._get(self.raw)
            if item[0] == "error":
                raise item[1]
            _, payloads, meta = item
            self.parser_state = f"parsing batch {produced} of {self.target}"
            try:
                out = parse(payloads)
            except parse_mod.BatchParseError as exc:
                out = self._salvage(parse, payloads, meta, str(exc))
            n = len(next(iter(out.values()))) if out else 0
            self.rows_parsed += n
            if drop:
                cut = min(drop, n)
                out = {k: v[cut:] for k, v in out.items()}
                drop -= cut
                n -= cut
            if carry is not None:
                out = {k: ragged.concat([carry[k], out[k]]) for k in out}
                n += len(next(iter(carry.values())))
                carry = None
            start = 0
            while n - start >= B and produced < self.target:
                batch = out if (start == 0 and n == B) else {k: v[start : start + B] for k, v in out.items()}
                batch = {k: ragged.finish(v) for k, v in batch.items()}
                self._put(self.ready, ("batch", batch))
                produced += 1
                start += B
            if start < n:
                carry = {k: v[start:] for k, v in out.items()}
        self.parser_state = "finished"
        with self.deficit_lock:
            self.deficit = -(1 << 60)  # the reader sees nothing wanted and parks until stop
        self.parser_finished.set()

    def _salvage(self, parse: Callable, payloads: list[bytes], meta: list, tf_msg: str) -> dict[str, np.ndarray]:
        """A batch failed to parse: find the bad records, fail with a precise message or skip them."""
        f = self.f
        good, bad = [], []
        meta = [(path, r, o) for path, recs, offs in meta for r, o in zip(recs.tolist(), offs.tolist())]
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
            path, rec, off = meta[0]
            raise DataError(
                f"{path}: batch starting at record {rec} (byte offset {off}) does not parse: {tf_msg}",
                path=path,
                offset=off,
                record=rec,
            )
        f._record_skips(bad, self)
        with self.deficit_lock:
            self.deficit += len(bad)
        self.rows_rejected += len(bad)
        self.first_rejected = self.first_rejected or bad[0]
        share_records = sum(len(r) for r in self.plan.shares[f.rank])
        if self.rows_parsed == 0 and self.rows_rejected >= share_records:
            # a whole share's worth rejected and not one row parsed: re-reading it again would loop until the
            # consumer's timeout, with a message about waiting instead of the data
            first = self.first_rejected
            raise DataError(
                f"worker {f.rank}, epoch {self.epoch}: no record of this worker's share fits the schema "
                f"({self.rows_rejected} rejected, on_corrupt: skip); the first: {first}",
                path=first.path,
                offset=first.offset,
                record=first.record,
                feature=first.feature,
            )
        if not good:
            return {fl.name: fl.empty() for fl in f.fields}
        try:
            return parse(good)
        except parse_mod.BatchParseError as exc:
            path, rec, off = meta[0]
            raise DataError(
                f"{path}: batch starting at record {rec} (byte offset {off}) does not parse even "
                f"without the records diagnosed as bad: {exc}",
                path=path,
                offset=off,
                record=rec,
            ) from None

    # ----------------------------------------------------------------------------------------------------- consumer
    def __iter__(self) -> "_Run":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.yielded >= self.target:
            self.close()
            raise StopIteration
        t0 = time.monotonic()
        deadline = t0 + self.f.timeout
        while True:
            try:
                kind, val = self.ready.get(timeout=min(_POLL * 5, max(0.0, deadline - time.monotonic())) or 1e-3)
                break
            except queue.Empty:
                if self.stop.is_set():
                    raise DataError(f"worker {self.f.rank} epoch {self.epoch}: the feeder was closed") from None
                if time.monotonic() >= deadline:
                    msg = (
                        f"feeder (worker {self.f.rank}, epoch {self.epoch}): no batch ready within "
                        f"{self.f.timeout:g}s at step {self.start_step + self.yielded} of {self.plan.steps} "
                        f"(reader: {self.reader_state}; parser: {self.parser_state})"
                    )
                    self.close()
                    raise WaitTimeout(msg) from None
        waited = time.monotonic() - t0
        if self.yielded > 0:
            self.wait_s += waited
            self.waits_over_1ms += waited > 1e-3
            self.max_wait_s = max(self.max_wait_s, waited)
        if kind == "error":
            self.close()
            raise val
        self.yielded += 1
        if self.yielded == 1:
            self.f.start_framer_soon()
        if self.yielded >= self.target:
            self.close()
        return val

    def close(self) -> None:
        self.stop.set()
        deadline = time.monotonic() + max(5.0, 10 * _POLL)
        for t in self.threads:
            if t is threading.current_thread():
                continue
            t.join(timeout=max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning(
                    "feeder thread %s did not stop within 5s (blocked in a read?); it is a daemon and "
                    "will exit after its current operation",
                    t.name,
                )
        self.f._finished(self)


def _check_tables(manifest: Manifest, fields: tuple) -> bool:
    """Whether the data are tables (all files, or none); their columns checked against ``fields``."""
    formats = {fi.format for fi in manifest.files}
    if not formats & set(TABLE_FORMATS):
        return False
    if len(formats) > 1:
        raise NoDataError(
            f"one data set mixes file formats ({', '.join(sorted(formats))}); give each format its own job, or convert"
        )
    for fi in manifest.files:
        check_columns(fi.path, fi.columns, fields)
    return True


_TABLE_RUN: list[type] = []


def _table_run() -> type:
    if not _TABLE_RUN:
        _TABLE_RUN.append(make_run_class(_Run, _advance))
    return _TABLE_RUN[0]


def _advance(share: tuple[RecordRange, ...], n: int) -> list[RecordRange]:
    """The share without its first ``n`` records (resume mid-epoch by seeking, not by reading)."""
    out = []
    for r in share:
        if n >= len(r):
            n -= len(r)
            continue
        out.append(RecordRange(r.path, r.start + n, r.stop))
        n = 0
    return out


#: Skipped records and damaged ranges named (with file and offset) in a task's final progress and the run summary;
#: the rest are counted, and each is in its task's log.
SKIPS_REPORTED = 10


def skip_report(feeders: list[Any], manifest: Any) -> dict[str, Any]:
    """:meth:`Feeder.skip_report` of one or more feeders over ``manifest`` (an epoch pipeline has two; a stand-in
    without skip counts or manifest counts as none)."""
    holes = [describe_hole(fi, a, b) for fi in getattr(manifest, "files", ()) for a, b in fi.holes]
    errors = [str(e) for f in feeders for e in getattr(f, "skipped_errors", ())]
    return {
        "skipped_records": sum(getattr(f, "skipped", 0) for f in feeders),
        "skipped_at": errors[:SKIPS_REPORTED],
        "damaged": holes[:SKIPS_REPORTED],
        "damaged_count": len(holes),
    }


class Feeder:
    """This worker's batches, epoch by epoch (the module docstring has the pipeline and its memory bound).

    ``features``: ``{name: spec.Feature}``. Batches are ``{name: array}`` with leading dimension ``batch_size``:
    shape () → (B,), (k,) → (B, k); string → str objects, bytes → bytes objects; a variable-length feature → a
    :class:`ragged.SparseValue` (TF's VarLenFeature layout), with ``pad_to: N`` → (B, N). ``parser``: factory
    ``fields -> (list[bytes] -> dict)``, called once per epoch in the parser thread (:func:`parse.default_parser`).
    """

    def __init__(
        self,
        manifest: Manifest,
        features: Mapping[str, Any],
        batch_size: int,
        rank: int,
        num_workers: int,
        seed: int = 0,
        shuffle_buffer: int = 0,
        prefetch: int = 4,
        on_corrupt: str = "fail",
        *,
        check_crc: bool = True,
        timeout: float = 300.0,
        block_bytes: int = DEFAULT_BLOCK,
        parse_group: int = 16384,
        frame_records: int | None = None,
        parser: Callable[[tuple], Callable[[list[bytes]], dict[str, np.ndarray]]] | None = None,
        framing: str | None = None,
    ):
        if not 0 <= rank < num_workers:
            raise ValueError(f"rank {rank} is not in 0..{num_workers - 1}")
        framing = framing or os.environ.get("TFYARN_FRAMING", "auto")
        if framing not in ("auto", "process", "thread"):
            raise ValueError(f"framing must be 'auto', 'process' or 'thread', not {framing!r}")
        if on_corrupt not in ("fail", "skip"):
            raise ValueError(f"on_corrupt must be 'fail' or 'skip', not {on_corrupt!r}")
        if batch_size <= 0 or prefetch <= 0 or shuffle_buffer < 0:
            raise ValueError("batch_size and prefetch must be positive, shuffle_buffer >= 0")
        self.manifest = manifest
        self.files = {fi.path: fi for fi in manifest.files}
        self.holes = {fi.path: dict(fi.holes) for fi in manifest.files if fi.holes}
        self.fields = parse_mod.schema(features)
        #: Parquet / ORC rows instead of TFRecords (tablefeed.py): columns checked now, before any step
        self.tables = _check_tables(manifest, self.fields)
        self.batch_size, self.rank, self.num_workers = batch_size, rank, num_workers
        self.seed, self.shuffle_buffer, self.prefetch = seed, shuffle_buffer, prefetch
        self.on_corrupt, self.timeout = on_corrupt, timeout
        self.parser_factory = parser or (table_parser if self.tables else parse_mod.default_parser)
        #: records per parse call: a TF parse op costs ~0.5 ms per call on top of its per-record work, so parsing
        #: ~16k records at once (then slicing into batches, which is free) measured 1.05 us CPU/record for the whole
        #: feeder against 1.33 at 4k and 1.20 at 8k (32k: no further gain).
        self.group = batch_size * max(1, round(parse_group / batch_size))
        #: records framed per step of the reader. Python loops: 2048, so its GIL-holding stretches stay short (2 ms
        #: consumer steps took 2.45 ms at 2048 vs 2.83 at 8192). C loops: 8192, where a chunk holds the GIL only to
        #: create its payloads and the per-chunk Python is what is left to save (feeder CPU 0.19 vs 0.25 ms a batch).
        self.frame_records = frame_records or (8192 if native.records is not None else 2048)
        #: where records are framed (the module docstring says why)
        shared = all(protocol_shared(fi.path) for fi in manifest.files)
        if framing == "process" and not shared:
            raise ValueError("framing='process' cannot read memory:// files (they exist only in this process)")
        self.framing = (
            "process"
            if not self.tables and (framing == "process" or (framing == "auto" and shared and native.records is None))
            else "thread"
        )
        #: ``framing="process"`` asked for explicitly: wait for the process to start instead of framing here until
        #: it is up (``auto``), so every record goes through it (tests, benchmarks).
        self.framing_strict = framing == "process"
        native.warn_if_missing()
        self.frame_opts = dict(
            check_crc=check_crc, on_corrupt=on_corrupt, block_bytes=block_bytes, max_records=self.frame_records
        )
        self.framer = Framer(self.frame_opts) if self.framing == "process" else None
        self.skipped = 0
        self.skipped_errors: list[DataError] = []
        self._lock = threading.Lock()
        self._starter: threading.Thread | None = None  # start_framer_soon's thread
        self._plans: dict[int, EpochPlan] = {}
        self._active: _Run | None = None
        self._last: _Run | None = None
        if manifest.total_records < num_workers * batch_size:
            raise NoDataError(
                f"{manifest.total_records} records are fewer than one global batch "
                f"({num_workers} workers x batch {batch_size}): no step can be planned"
            )

    def plan(self, epoch: int) -> EpochPlan:
        p = self._plans.get(epoch)
        if p is None:
            p = plan(self.manifest, self.num_workers, epoch, self.seed, self.batch_size)
            self._plans = {epoch: p, **{k: v for k, v in list(self._plans.items())[-3:]}}
        return p

    def steps(self, epoch: int) -> int:
        """Steps of ``epoch`` — identical on every worker (computed from the manifest, no communication)."""
        return self.plan(epoch).steps

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Exactly ``steps(epoch) - start_step`` batches. Starting another epoch closes the previous one."""
        if self._active is not None:
            self._active.close()
        run = (_table_run() if self.tables else _Run)(self, epoch, start_step)
        self._active = run
        return run

    def _record_skips(self, errors: list[DataError], run: _Run) -> None:
        """Count each corrupt record once per epoch (a refill pass meets the same bad records again)."""
        with self._lock:
            errors = [e for e in errors if (e.path, e.record) not in run.seen_bad]
            run.seen_bad.update((e.path, e.record) for e in errors)
            self.skipped += len(errors)
            for e in errors:
                log.warning("skipped corrupt record: %s", e)
            room = _MAX_ERRORS_KEPT - len(self.skipped_errors)
            self.skipped_errors.extend(errors[: max(0, room)])

    def skip_report(self) -> dict[str, Any]:
        """What a training task publishes with its final progress: the records it skipped as corrupt and where, and
        the data set's damaged byte ranges (the manifest's holes: the same on every task, counted once)."""
        return skip_report([self], self.manifest)

    def _finished(self, run: _Run) -> None:
        if self._active is run:
            self._active = None
            self._last = run

    def stats(self) -> dict[str, Any]:
        """Skipped records; for the current (or last) epoch: how long the consumer waited on the feeder after the
        first batch, and how long the reader and parser threads waited on each other (which stage limits)."""
        run = self._active or self._last
        return {
            "skipped": self.skipped,
            "skipped_examples": [str(e) for e in self.skipped_errors[:10]],
            "consumer_wait_s": run.wait_s if run else 0.0,
            "waits_over_1ms": run.waits_over_1ms if run else 0,
            "max_wait_s": run.max_wait_s if run else 0.0,
            "records_read": run.records_read if run else 0,
            "records_from_framing_process": run.records_from_framer if run else 0,
            "reader_blocked_s": run.blocked_s["reader"] if run else 0.0,
            "parser_blocked_s": run.blocked_s["parser"] if run else 0.0,
            "native_loops": native.records is not None,
        }

    def prestart(self) -> None:
        """Start the framing process now (non-blocking; no-op when framing in a thread) instead of once the first
        batch has been taken: for a steady-state measurement, or when nothing else is starting on the machine."""
        if self.framer is not None:
            self.framer.start()

    def start_framer_soon(self) -> None:
        """Start the framing process (if it is not running) from a short-lived thread, once an epoch's first batch
        has been taken: its start-up (~0.25 s of CPU) during the training process's own delayed each local task's
        first step by ~1 s on 2 cores, and ``Popen`` (~1.3 ms of Python) stays off the training thread."""
        framer = self.framer
        if framer is None or self.framing_strict or framer.running():  # (strict: the reader starts it and waits;
            return  # not ready(): it reads the reader's socket)
        with self._lock:
            if self._starter is not None and self._starter.is_alive():
                return
            self._starter = threading.Thread(target=framer.start, name="tfyarn-framer-start", daemon=True)
            self._starter.start()

    def close(self) -> None:
        """Stop every thread of the current epoch and the framing process (idempotent; a later epoch restarts it)."""
        if self._active is not None:
            self._active.close()
        starter = self._starter
        if starter is not None:
            starter.join(timeout=30.0)  # Popen of an interpreter: milliseconds (bounded all the same)
        if self.framer is not None:
            self.framer.close()

    def __enter__(self) -> "Feeder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
