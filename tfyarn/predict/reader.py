"""A scoring part's rows as batches: the model's features (numpy) and the columns carried through (arrow).

Unlike training's feeder (:mod:`tfyarn.data.feeder`), nothing is shuffled, replayed or dropped: a part's records
are read once, in order, and cut into batches of ``batch_size`` with a short last one. The same readers serve
(:mod:`tfyarn.data.tfrecord` framing and the C/TF parsers; :mod:`tfyarn.data.table` for Parquet and ORC), in groups
of ~16k rows per parse call as the feeder measured best. A corrupt record, or a null in a column without default,
fails the task naming file and record, or under ``on_corrupt: skip`` is left out, counted and listed for the part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from tfyarn.data import parse as parse_mod, sources, table
from tfyarn.data.errors import DataError
from tfyarn.data.manifest import Manifest
from tfyarn.data.planner import Part
from tfyarn.data.framer import FrameJob
from tfyarn.data.tfrecord import FrameOptions

#: rows per parse call (a multiple of the batch size)
GROUP_ROWS = 16384


def to_arrow(values: Any) -> Any:
    """A numpy column → an arrow array (a [n, k] array as fixed-size lists of k; objects as strings or bytes)."""
    import pyarrow as pa

    arr = np.asarray(values)
    if arr.ndim <= 1:
        return pa.array(arr) if arr.dtype != object else pa.array(arr.tolist())
    flat = arr.reshape(len(arr), -1)
    return pa.FixedSizeListArray.from_arrays(to_arrow(flat.reshape(-1)), flat.shape[1])


def _slice(kept: Any, start: int, n: int) -> Any:
    return None if kept is None else kept.slice(start, n)


@dataclass
class PartStats:
    rows_in: int = 0
    skipped: int = 0
    skipped_at: list[str] = field(default_factory=list)

    def skip(self, errors: list[DataError]) -> None:
        self.skipped += len(errors)
        self.skipped_at.extend(str(e) for e in errors[: max(0, 10 - len(self.skipped_at))])


class PartReader:
    """Batches of one part at a time (:meth:`batches`), for ``features`` and the ``keep`` columns."""

    def __init__(
        self,
        manifest: Manifest,
        features: dict[str, Any],
        keep: list[str] | str,
        batch_size: int,
        on_corrupt: str = "fail",
    ):
        self.files = {fi.path: fi for fi in manifest.files}
        self.fields = parse_mod.schema(features)
        formats = {fi.format for fi in manifest.files}
        self.tables = bool(formats - {sources.DEFAULT})  # (Parquet / ORC: read with pyarrow below)
        if self.tables and len(formats) > 1:
            raise DataError(f"predict.input mixes file formats ({', '.join(sorted(formats))}); score each alone")
        if self.tables:
            sources.of_files(manifest.files).check(manifest.files, self.fields)
        elif keep == "all":
            keep = list(features)
        elif set(keep) - set(features):
            missing = sorted(set(keep) - set(features))
            raise DataError(
                f"predict.keep: {', '.join(missing)} not among predict.features: TFRecord input carries through "
                f"only features (add them to predict.features)"
            )
        self.keep = keep
        self.batch_size, self.on_corrupt = batch_size, on_corrupt
        self.group = batch_size * max(1, round(GROUP_ROWS / batch_size))
        self._parse = None if self.tables else parse_mod.default_parser(self.fields)

    def keep_columns(self, path: str) -> list[str]:
        return list(self.keep) if self.keep != "all" else [name for name, _ in self.files[path].columns]

    def batches(self, part: Part, stats: PartStats) -> Iterator[tuple[dict[str, Any], Any, int]]:
        """``(features, kept columns or None, rows)`` for every batch of ``part`` in order; ``stats`` counts its
        rows in and the rows skipped as corrupt."""
        import pyarrow as pa

        B = self.batch_size
        carry: tuple[dict[str, Any], Any] | None = None
        groups = self._table_groups(part, stats) if self.tables else self._record_groups(part, stats)
        for feats, kept in groups:
            if carry is not None:
                feats = {k: np.concatenate([carry[0][k], v]) for k, v in feats.items()}
                kept = None if kept is None else pa.concat_tables([carry[1], kept])
                carry = None
            n = len(next(iter(feats.values())))
            start = 0
            while n - start >= B:
                yield {k: v[start : start + B] for k, v in feats.items()}, _slice(kept, start, B), B
                start += B
            if start < n:
                carry = ({k: v[start:] for k, v in feats.items()}, _slice(kept, start, n - start))
        if carry is not None:
            yield carry[0], carry[1], len(next(iter(carry[0].values())))

    # ---------------------------------------------------------------------------------------------------- TFRecord
    def _record_groups(self, part: Part, stats: PartStats) -> Iterator[tuple[dict[str, Any], Any]]:
        """Groups of ~``group`` parsed records. No per-record Python: payload lists are taken a chunk at a time and
        where each record came from is kept per chunk (path, first record, offsets), expanded only to name a record
        that does not parse."""
        import pyarrow as pa

        pays: list[bytes] = []
        meta: list[tuple[str, np.ndarray, np.ndarray]] = []  # (path, record numbers, byte offsets) per segment
        for rr in part.ranges:
            stats.rows_in += len(rr)
            framing = FrameOptions(on_corrupt=self.on_corrupt, max_records=8192)
            for chunk in FrameJob.of(self.files[rr.path], rr.start, rr.stop).chunks(framing):
                got: list[Any] = chunk.payloads
                recs = np.arange(chunk.first, chunk.first + len(got))
                offs = np.asarray(chunk.offsets)
                if chunk.skipped:
                    stats.skip(chunk.skipped)
                    keep = np.array([x is not None for x in got])
                    got, recs, offs = [x for x in got if x is not None], recs[keep], offs[keep]
                i = 0
                while i < len(got):
                    take = min(self.group - len(pays), len(got) - i)
                    pays.extend(got[i : i + take])
                    meta.append((rr.path, recs[i : i + take], offs[i : i + take]))
                    i += take
                    if len(pays) == self.group:
                        yield self._parsed(pays, meta, stats, pa)
                        pays, meta = [], []
        if pays:
            yield self._parsed(pays, meta, stats, pa)

    def _parsed(self, pays: list[bytes], meta: list[tuple[str, Any, Any]], stats: PartStats, pa: Any) -> Any:
        assert self._parse is not None
        try:
            feats = self._parse(pays)
        except parse_mod.BatchParseError:
            where = [(path, int(r), int(o)) for path, recs, offs in meta for r, o in zip(recs, offs)]
            good, bad = [], []
            for p, (path, rec, off) in zip(pays, where):
                problem = parse_mod.diagnose(p, self.fields)
                if problem is None:
                    good.append(p)
                    continue
                err = DataError(f"{path}: record {rec} at byte offset {off}: {problem[1]}", path=path, record=rec)
                if self.on_corrupt != "skip":
                    raise err from None
                bad.append(err)
            stats.skip(bad)
            feats = self._parse(good) if good else {f.name: f.empty() for f in self.fields}
        return feats, pa.table({k: to_arrow(feats[k]) for k in self.keep}) if self.keep else None

    # -------------------------------------------------------------------------------------------------- Parquet/ORC
    def _table_groups(self, part: Part, stats: PartStats) -> Iterator[tuple[dict[str, Any], Any]]:
        import pyarrow as pa

        held: list[Any] = []
        rows = 0
        for rr in part.ranges:
            fi = self.files[rr.path]
            keep = self.keep_columns(rr.path)
            columns = list(dict.fromkeys([f.name for f in self.fields] + keep))
            stats.rows_in += len(rr)
            for g, first, batch in table.read_rows(
                rr.path, fi.format, fi.offsets, fi.records, rr.start, rr.stop, columns, 8192
            ):
                held.append((rr.path, g, first, batch, keep))
                rows += batch.num_rows
                if rows >= self.group:
                    yield self._columns(held, stats, pa)
                    held, rows = [], 0
        if held:
            yield self._columns(held, stats, pa)

    def _columns(self, held: list[Any], stats: PartStats, pa: Any) -> tuple[dict[str, Any], Any]:
        feats: list[dict[str, Any]] = []
        kept = []
        for path, g, first, batch, keep in held:
            while True:
                try:
                    cols = table.to_columns(batch, self.fields)
                    break
                except table.NullRows as exc:
                    err = DataError(
                        f"{path}: row group {g}, row {first + int(exc.rows[0])}: column {exc.column!r} is null and "
                        f"feature {exc.column!r} has no default ({len(exc.rows)} null rows in this batch)",
                        path=path,
                        record=first + int(exc.rows[0]),
                    )
                    if self.on_corrupt != "skip":
                        raise err from None
                    stats.skip(
                        [DataError(f"{path}: row {first + int(r)}: column {exc.column!r} is null") for r in exc.rows]
                    )
                    mask = np.ones(batch.num_rows, dtype=bool)
                    mask[exc.rows] = False
                    batch = batch.filter(pa.array(mask))
            feats.append(cols)
            if keep:
                kept.append(pa.Table.from_batches([batch.select(keep)]))
        out = {f.name: np.concatenate([c[f.name] for c in feats]) for f in self.fields}
        return out, pa.concat_tables(kept, promote_options="default") if kept else None
