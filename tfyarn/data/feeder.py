"""The feeder: this worker's share of an epoch as ready numpy batches, produced by background threads.

Pipeline per epoch (two threads, bounded queues; optionally a framing process)::

    [framing process ──chunks (socket)──▶] reader thread ──raw groups (≤ 2)──▶ parser thread
                                          ──ready batches (≤ prefetch + a group)──▶ consumer (training loop)

* The reader thread is the data set's record source's (:mod:`tfyarn.data.sources`: TFRecord, Parquet, ORC): it reads
  this worker's record ranges of the epoch's plan in order and hands groups of records to the parser. TFRecords are
  framed in the thread by the C loops of :mod:`native` (~0.02 us of CPU a record, mostly without the GIL), or without
  them by a framing process (:mod:`framer`: one per feeder, reused every epoch, started once the first batch has been
  taken so its start-up does not compete with the training process's own); tables are read by pyarrow.
* The parser thread turns a group into numpy arrays with the source's parser (TFRecord: one call of the C parser,
  :func:`parse.native_parser`, or of TF's ``ParseExampleV2``; both release the GIL), has the source diagnose a group
  that does not parse (fail naming the record, or skip it), and re-assembles exact batches after skips.
* Exactly ``steps(epoch) - start_step`` batches are yielded — the same on every worker: records lost to ``skip`` are
  made up by reading the start of the worker's own share again (a short epoch on one worker is the stall this layer
  exists to prevent).

Resuming mid-epoch (``start_step``) reproduces exactly the batches of the uninterrupted epoch (the sources' ``read``).

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
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from tfyarn.data import native, ragged, sources
from tfyarn.data import parse as parse_mod
from tfyarn.data.errors import DataError, NoDataError
from tfyarn.data.fileindex import describe_hole
from tfyarn.data.framer import Framer, protocol_shared
from tfyarn.data.manifest import Manifest
from tfyarn.data.planner import EpochPlan, plan
from tfyarn.data.sources.base import POLL as _POLL
from tfyarn.data.tfrecord import DEFAULT_BLOCK, FrameOptions
from tfyarn.errors import WaitTimeout

log = logging.getLogger(__name__)

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
        self.replay = (feeder.shuffle_buffer > 0 and feeder.source.shuffles) or feeder.on_corrupt == "skip"
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
                for fn, name in ((lambda: feeder.source.read(self), "reader"), (self._parse, "parser"))
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
                self.check_stop()
                try:
                    return op()
                except (queue.Full, queue.Empty):
                    continue
        finally:
            self.blocked_s[threading.current_thread().name.rsplit("-", 1)[-1]] += time.monotonic() - t0

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise _Stopped

    def put(self, q: queue.Queue, item: Any) -> None:
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
                self.put(self.ready, ("error", exc))
            except _Stopped:
                pass
        finally:
            setattr(self, f"{name}_state", "finished")

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
                out = self.f.source.salvage(self, parse, payloads, meta, str(exc))
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
                self.put(self.ready, ("batch", batch))
                produced += 1
                start += B
            if start < n:
                carry = {k: v[start:] for k, v in out.items()}
        self.parser_state = "finished"
        with self.deficit_lock:
            self.deficit = -(1 << 60)  # the reader sees nothing wanted and parks until stop
        self.parser_finished.set()

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


def _check_options(
    rank: int, num_workers: int, framing: str, on_corrupt: str, batch_size: int, prefetch: int, shuffle_buffer: int
) -> None:
    """The feeder's arguments a caller got wrong raise before anything is read."""
    if not 0 <= rank < num_workers:
        raise ValueError(f"rank {rank} is not in 0..{num_workers - 1}")
    if framing not in ("auto", "process", "thread"):
        raise ValueError(f"framing must be 'auto', 'process' or 'thread', not {framing!r}")
    if on_corrupt not in ("fail", "skip"):
        raise ValueError(f"on_corrupt must be 'fail' or 'skip', not {on_corrupt!r}")
    if batch_size <= 0 or prefetch <= 0 or shuffle_buffer < 0:
        raise ValueError("batch_size and prefetch must be positive, shuffle_buffer >= 0")


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
        framing = framing or os.environ.get("TFYARN_FRAMING", "auto")
        _check_options(rank, num_workers, framing, on_corrupt, batch_size, prefetch, shuffle_buffer)
        self.manifest = manifest
        self.files = {fi.path: fi for fi in manifest.files}
        self.fields = parse_mod.schema(features)
        #: the data set's format (:mod:`tfyarn.data.sources`): how its records are read and parsed; the features
        #: checked against it now, before any step
        self.source = sources.of_files(manifest.files)
        self.source.check(manifest.files, self.fields)
        self.batch_size, self.rank, self.num_workers = batch_size, rank, num_workers
        self.seed, self.shuffle_buffer, self.prefetch = seed, shuffle_buffer, prefetch
        self.on_corrupt, self.timeout = on_corrupt, timeout
        self.parser_factory = parser or self.source.parser
        #: records per parse call: a TF parse op costs ~0.5 ms per call on top of its per-record work, so parsing
        #: ~16k records at once (then slicing into batches, which is free) measured 1.05 us CPU/record for the whole
        #: feeder against 1.33 at 4k and 1.20 at 8k (32k: no further gain).
        self.group = batch_size * max(1, round(parse_group / batch_size))
        self._set_up_framing(framing, frame_records, check_crc, on_corrupt, block_bytes)
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

    def _set_up_framing(
        self, asked: str, frame_records: int | None, check_crc: bool, on_corrupt: str, block_bytes: int
    ) -> None:
        """How and where records are framed: ``process`` when asked, or under ``auto`` when the C loops are missing
        and the files are reachable from another process; else in the reader thread (always, for a source that
        frames nothing). The module docstring says why."""
        #: records framed per step of the reader. Python loops: 2048, so its GIL-holding stretches stay short (2 ms
        #: consumer steps took 2.45 ms at 2048 vs 2.83 at 8192). C loops: 8192, where a chunk holds the GIL only to
        #: create its payloads and the per-chunk Python is what is left to save (feeder CPU 0.19 vs 0.25 ms a batch).
        self.frame_records = frame_records or (8192 if native.records is not None else 2048)
        shared = all(protocol_shared(fi.path) for fi in self.manifest.files)
        if asked == "process" and not shared:
            raise ValueError("framing='process' cannot read memory:// files (they exist only in this process)")
        by_process = asked == "process" or (asked == "auto" and shared and native.records is None)
        self.framing = "process" if self.source.frames_in_process and by_process else "thread"
        #: ``framing="process"`` asked for explicitly: wait for the process to start instead of framing here until
        #: it is up (``auto``), so every record goes through it (tests, benchmarks).
        self.framing_strict = asked == "process"
        native.warn_if_missing()
        self.frame_opts = FrameOptions(check_crc, on_corrupt, block_bytes, self.frame_records)
        self.framer = Framer(self.frame_opts) if self.framing == "process" else None

    @classmethod
    def for_data(cls, manifest: Manifest, data: Any, rank: int, num_workers: int, **options: Any) -> "Feeder":
        """The feeder a spec's ``data:`` section describes (features, batch size, seed, shuffle buffer, prefetch,
        on_corrupt) over ``manifest``; ``options`` override or add to those (the evaluator reads in order)."""
        kw = dict(
            seed=data.shuffle_seed,
            shuffle_buffer=data.shuffle_buffer,
            prefetch=data.prefetch,
            on_corrupt=data.on_corrupt,
        )
        return cls(manifest, dict(data.features), data.batch_size, rank, num_workers, **{**kw, **options})

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
        run = _Run(self, epoch, start_step)
        self._active = run
        return run

    def record_skips(self, errors: list[DataError], run: _Run) -> None:
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
