"""The feeder's epoch over Parquet / ORC files: the same threads, queues, plan and guarantees as
TFRecords (:class:`tfyarn.data.feeder._Run`), with rows read by pyarrow instead of records framed
and parsed.

* The reader thread reads this worker's row ranges (only the features' columns, from the row group
  holding the range's first row, :func:`table.read_rows`) in arrow batches of at most
  ``frame_records`` rows, and hands groups of ``group`` rows to the parser: memory is bounded by
  ``prefetch`` like TFRecords, whatever the row group size (Parquet is streamed inside a row group;
  an ORC stripe is read whole).
* The parser thread turns a group into numpy columns (:func:`table.to_columns`) and cuts exact
  batches. A null in a column without ``default`` fails naming the file, row group, row and column,
  or under ``on_corrupt: skip`` drops the row, counts it, and the reader reads that many more rows
  (the start of the share again), so every worker still yields exactly ``steps`` batches.
* ``shuffle_buffer`` is not applied to tables: the plan's per-epoch order of row ranges is the
  shuffle.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from tfyarn.data import parse as parse_mod, ragged, table
from tfyarn.data.errors import DataError


def table_parser(fields: tuple[Any, ...]) -> Callable[[list[Any]], dict[str, Any]]:
    """Arrow batches → one dict of columns; a null without default raises
    :class:`parse.BatchParseError`."""

    def parse(batches: list[Any]) -> dict[str, Any]:
        try:
            parts = [table.to_columns(b, fields) for b in batches]
        except table.NullRows as exc:
            raise parse_mod.BatchParseError(str(exc)) from None
        if len(parts) == 1:
            return parts[0]
        return {f.name: ragged.concat([p[f.name] for p in parts]) for f in fields}

    return parse


def make_run_class(base: type, _advance: Callable) -> type:
    """The table run as a subclass of the feeder's ``_Run`` and its ``_advance`` (passed in:
    feeder.py imports this module, not the other way round)."""

    class TableRun(base):
        first_rejected: DataError | None  # (``_Run``'s, which this module does not import)

        def _read(self) -> None:
            f, B = self.f, self.f.batch_size
            share = self.plan.shares[f.rank]
            skip_front = 0 if self.replay else self.start_step * B
            need = (self.plan.steps if self.replay else self.target) * B
            G = f.group
            columns = [fl.name for fl in f.fields]
            parts: list[Any] = []
            meta: list[tuple[str, int, int, int]] = []  # (path, row group, first row, rows) per part
            state = {"emitted": 0, "held": 0}

            def remaining() -> int:
                with self.deficit_lock:
                    return need + self.deficit - state["emitted"] - state["held"]

            def flush() -> None:
                nonlocal parts, meta
                if parts:
                    self._put(self.raw, ("batch", parts, meta))
                    state["emitted"] += state["held"]
                    parts, meta, state["held"] = [], [], 0

            def park() -> None:
                flush()
                self.reader_state = "done, waiting for the parser"
                while remaining() <= 0:
                    self._check_stop()
                    time.sleep(0.025)

            passes = 0
            while True:
                ranges = _advance(share, skip_front) if passes == 0 else list(share)
                good = 0
                for rr in ranges:
                    fi = f.files[rr.path]
                    self.reader_state = f"reading {rr.path} rows {rr.start}..{rr.stop}"
                    for g, first, batch in table.read_rows(
                        rr.path,
                        fi.format,
                        fi.offsets,
                        fi.records,
                        rr.start,
                        rr.stop,
                        columns,
                        f.frame_records,
                    ):
                        self._check_stop()
                        self.records_read += batch.num_rows
                        good += batch.num_rows
                        i = 0
                        while i < batch.num_rows:
                            if remaining() <= 0:
                                park()
                            take = min(G - state["held"], remaining(), batch.num_rows - i)
                            parts.append(batch.slice(i, take))
                            meta.append((rr.path, g, first + i, take))
                            state["held"] += take
                            i += take
                            if state["held"] >= G or remaining() <= 0:
                                flush()
                passes += 1
                if good == 0:
                    raise DataError(
                        f"worker {f.rank}, epoch {self.epoch}: no readable row in this worker's "
                        "share "
                        f"({len(share)} ranges, first {share[0].path if share else '-'})"
                    )
                if remaining() > 0:
                    continue  # rows were skipped: read the share again for more
                park()

        def _salvage(self, parse: Callable, batches: list[Any], meta: list, msg: str) -> dict[str, Any]:
            """A group has nulls: fail naming file, row group, row and column, or drop those rows
            (skip)."""
            f = self.f
            kept, bad = [], []
            for batch, (path, g, first, _) in zip(batches, meta):
                orig = np.arange(batch.num_rows)  # rows of the file's batch left after drops
                while True:
                    try:
                        table.to_columns(batch, f.fields)
                        break
                    except table.NullRows as exc:
                        row = int(orig[exc.rows[0]])
                        err = DataError(
                            f"{path}: row group {g}, row {first + row}: column {exc.column!r} is "
                            "null "
                            f"and feature {exc.column!r} has no default ({len(exc.rows)} null rows "
                            "in "
                            f"this batch)",
                            path=path,
                            record=first + row,
                            feature=exc.column,
                        )
                        if f.on_corrupt != "skip":
                            raise err from None
                        mask = np.ones(batch.num_rows, dtype=bool)
                        mask[exc.rows] = False
                        for r in orig[exc.rows].tolist():
                            bad.append(
                                DataError(
                                    f"{path}: row group {g}, row {first + r}: column {exc.column!r} is null",
                                    path=path,
                                    record=first + r,
                                    feature=exc.column,
                                )
                            )
                        keep_idx = np.flatnonzero(mask)
                        batch, orig = batch.take(keep_idx), orig[keep_idx]
                kept.append(batch)
            f._record_skips(bad, self)
            with self.deficit_lock:
                self.deficit += len(bad)
            self.rows_rejected += len(bad)
            self.first_rejected = self.first_rejected or (bad[0] if bad else None)
            share_rows = sum(len(r) for r in self.plan.shares[f.rank])
            if self.rows_parsed == 0 and self.rows_rejected >= share_rows:
                raise DataError(
                    f"worker {f.rank}, epoch {self.epoch}: every row of this worker's share has a "
                    "null "
                    f"without default ({self.rows_rejected} skipped); the first: "
                    f"{self.first_rejected}"
                )
            kept = [b for b in kept if b.num_rows]
            if not kept:
                return {fl.name: fl.empty() for fl in f.fields}
            return parse(kept)

    return TableRun
