"""Parquet and ORC tables: rows read by pyarrow over fsspec (:mod:`tfyarn.data.table`), the same threads, queues,
plan and guarantees as TFRecords.

* index: the footer alone (row counts per row group / stripe, the schema's columns; no data bytes).
* check: every feature is a column of a fitting type (:func:`table.check_columns`), before any step.
* read: the reader thread reads this worker's row ranges (only the features' columns, from the row group holding the
  range's first row, :func:`table.read_rows`) in arrow batches of at most ``frame_records`` rows, and hands groups of
  ``group`` rows to the parser: memory is bounded by ``prefetch`` whatever the row group size (Parquet is streamed
  inside a row group; an ORC stripe is read whole).
* parse: a group's arrow batches to numpy columns (:func:`table.to_columns`). A null in a column without
  ``default`` fails naming the file, row group, row and column, or under ``on_corrupt: skip`` drops the row, counts
  it, and the reader reads that many more rows (the start of the share again), so every worker still yields exactly
  ``steps`` batches.
* ``shuffle_buffer`` is not applied to tables: the plan's per-epoch order of row ranges is the shuffle.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable

import numpy as np

from tfyarn.data import parse as parse_mod, table
from tfyarn.data.errors import DataError
from tfyarn.data.fileindex import STATS, FileInfo
from tfyarn.data.planner import advance
from tfyarn.data.sources.base import POLL, Parse, Source, concat, empty, reject


class TableSource(Source):
    """A columnar table format pyarrow reads (``name``: "parquet" or "orc", :func:`table.read_rows`)."""

    index_reads_data = False

    def index(self, url: str, size: int, mtime: str, **_: Any) -> FileInfo:
        """The footer's row counts: the options are TFRecord's (a table has its own codecs, starts at each row
        group / stripe, and a damaged footer cannot be stepped over)."""
        rows, starts, columns, nbytes = table.index_table(url, size, mtime, self.name)
        STATS.add(bytes_read=nbytes)
        return FileInfo(url, size, mtime, rows, False, 0, starts, size, (), self.name, columns)

    def check(self, files: tuple[FileInfo, ...], fields: tuple[Any, ...]) -> None:
        for fi in files:
            table.check_columns(fi.path, fi.columns, fields)

    def check_file(self, url: str, fields: tuple[Any, ...]) -> bool:
        table.check_columns(url, table.index_table(url, 0, "", self.name)[2], fields)
        return True

    def parser(self, fields: tuple[Any, ...]) -> Parse:
        """Arrow batches → one dict of columns; a null without default raises :class:`parse.BatchParseError`."""

        def parse(batches: list[Any]) -> dict[str, Any]:
            try:
                return concat([table.to_columns(b, fields) for b in batches], fields)
            except table.NullRows as exc:
                raise parse_mod.BatchParseError(str(exc)) from None

        return parse

    def read_range(self, fi: FileInfo, start: int, stop: int, fields: tuple[Any, ...]) -> dict[str, Any]:
        columns = [fl.name for fl in fields]
        rows = table.read_rows(fi.path, self.name, fi.offsets, fi.records, start, stop, columns)
        return concat([table.to_columns(b, fields) for _, _, b in rows], fields)

    def read(self, run: Any) -> None:
        _RowReader(run).go()

    def salvage(self, run: Any, parse: Callable, batches: list[Any], meta: list, msg: str) -> dict[str, Any]:
        """A group has nulls: fail naming file, row group, row and column, or drop those rows (skip)."""
        f = run.f
        kept, bad = [], []
        for batch, (path, g, first, _) in zip(batches, meta):
            orig = np.arange(batch.num_rows)  # rows of the file's batch left after drops
            while True:
                try:
                    table.to_columns(batch, f.fields)
                    break
                except table.NullRows as exc:
                    col, rows = exc.column, [first + r for r in orig[exc.rows].tolist()]
                    at = f"{path}: row group {g}, row"
                    if f.on_corrupt != "skip":
                        raise DataError(
                            f"{at} {rows[0]}: column {col!r} is null and feature {col!r} has no default ({len(rows)} "
                            "null rows in this batch)",
                            path=path,
                            record=rows[0],
                            feature=col,
                        ) from None
                    bad += [
                        DataError(f"{at} {r}: column {col!r} is null", path=path, record=r, feature=col) for r in rows
                    ]
                    keep = np.setdiff1d(np.arange(batch.num_rows), exc.rows)
                    batch, orig = batch.take(keep), orig[keep]
            kept.append(batch)
        reject(run, bad, "every row of this worker's share has a null without default ({} skipped)")
        kept = [b for b in kept if b.num_rows]
        if not kept:
            return empty(f.fields)
        return parse(kept)


class ParquetSource(TableSource):
    name = "parquet"
    extensions = (".parquet", ".pq", ".parq")


class OrcSource(TableSource):
    name = "orc"
    extensions = (".orc",)


class _RowReader:
    """:meth:`TableSource.read`'s reader thread: this worker's row ranges as arrow slices, in groups of ``group``
    rows (``parts``, with where each came from in ``meta``) handed to the parser; Python per arrow batch and per
    group, never per row."""

    def __init__(self, run: Any):
        f, B = run.f, run.f.batch_size
        self.run, self.f = run, f
        self.share = run.plan.shares[f.rank]
        self.skip_front = 0 if run.replay else run.start_step * B
        self.need = (run.plan.steps if run.replay else run.target) * B
        self.columns = [fl.name for fl in f.fields]
        self.parts: list[Any] = []
        self.meta: list[tuple[str, int, int, int]] = []  # (path, row group, first row, rows) per part
        self.emitted = self.held = 0

    def remaining(self) -> int:
        with self.run.deficit_lock:
            return self.need + self.run.deficit - self.emitted - self.held

    def flush(self) -> None:
        if self.parts:
            self.run.put(self.run.raw, ("batch", self.parts, self.meta))
            self.emitted += self.held
            self.parts, self.meta, self.held = [], [], 0

    def park(self) -> None:
        self.flush()
        self.run.reader_state = "done, waiting for the parser"
        while self.remaining() <= 0:
            self.run.check_stop()
            time.sleep(POLL / 4)

    def go(self) -> None:
        """The share (after ``skip_front``), then the share again while rows skipped as null are to be replaced."""
        f, share = self.f, self.share
        for passes in itertools.count():
            ranges = advance(share, self.skip_front) if passes == 0 else list(share)
            good = sum(self._read(rr) for rr in ranges)
            if good == 0:
                raise DataError(
                    f"worker {f.rank}, epoch {self.run.epoch}: no readable row in this worker's share "
                    f"({len(share)} ranges, first {share[0].path if share else '-'})"
                )
            if self.remaining() > 0:
                continue  # rows were skipped: read the share again for more
            self.park()

    def _read(self, rr: Any) -> int:
        """One row range into groups; the rows read."""
        run, fi = self.run, self.f.files[rr.path]
        run.reader_state = f"reading {rr.path} rows {rr.start}..{rr.stop}"
        good = 0
        rows = table.read_rows(
            rr.path, fi.format, fi.offsets, fi.records, rr.start, rr.stop, self.columns, self.f.frame_records
        )
        for g, first, batch in rows:
            run.check_stop()
            run.records_read += batch.num_rows
            good += batch.num_rows
            self._group(rr.path, g, first, batch)
        return good

    def _group(self, path: str, g: int, first: int, batch: Any) -> None:
        """Slices of one arrow batch into the group being filled, handed over whenever it is full."""
        G, i = self.f.group, 0
        while i < batch.num_rows:
            if self.remaining() <= 0:
                self.park()
            take = min(G - self.held, self.remaining(), batch.num_rows - i)
            self.parts.append(batch.slice(i, take))
            self.meta.append((path, g, first + i, take))
            self.held += take
            i += take
            if self.held >= G or self.remaining() <= 0:
                self.flush()
