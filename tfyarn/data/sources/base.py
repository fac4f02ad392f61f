"""What a record source is: the four things the manifest and the feeder need from a data format.

A source (one instance per format, registered in :mod:`tfyarn.data.sources`) says

* how to **index** a file (:meth:`Source.index`): count its records (TFRecord: read it once; a table: its footer's
  row group / stripe counts) and note where a worker may start reading;
* how to **check** a data set against ``data.features`` before any step (:meth:`Source.check`);
* how to **read** a worker's share of an epoch, record ranges in plan order, in the feeder's reader thread
  (:meth:`Source.read`), and one row range of one file for tests and tools (:meth:`Source.read_range`);
* how to **parse** what it read into the feeder's numpy columns (:meth:`Source.parser`), and what to do with a group
  that does not parse (:meth:`Source.salvage`: fail naming file and record, or skip and count).

Everything else (the plan, equal steps, threads, queues, resume, replacing skipped records, bounded waits) is the
feeder's, the same for every source. The reader talks to the feeder's epoch run (``run``) only through:
``run.f`` (the feeder: ``files``, ``fields``, ``rank``, ``batch_size``, ``group``, ``frame_records``, ``seed``,
``shuffle_buffer``, ``on_corrupt``, ``record_skips``), ``run.plan``, ``run.epoch``, ``run.start_step``,
``run.target``, ``run.replay``, ``run.raw`` (the parser's queue: ``("batch", items, meta)``), ``run.put``,
``run.check_stop``, ``run.deficit`` / ``run.deficit_lock`` (records the parser rejected: read that many more),
``run.parser_finished``, and its counters (``records_read``, ``rows_parsed``, ``rows_rejected``, ``first_rejected``,
``reader_state``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar

from tfyarn.data import ragged
from tfyarn.data.errors import DataError
from tfyarn.data.fileindex import DEFAULT_STRIDE, FileInfo

#: seconds between checks of the stop flag while a producer waits (the feeder's poll)
POLL = 0.1

Parse = Callable[[list[Any]], dict[str, Any]]


class Source(ABC):
    """One data format. Subclasses set the class attributes and implement the abstract methods; one instance is
    registered per format name (``data.format``)."""

    #: ``data.format``'s value for this source, and :attr:`FileInfo.format` of its files
    name: ClassVar[str]
    #: file name endings that mean this format under ``data.format: auto`` (lower case)
    extensions: ClassVar[tuple[str, ...]] = ()
    #: ``data.compression`` applies (TFRecord's GZIP); otherwise the format's own codecs do
    compressed: ClassVar[bool] = False
    #: the feeder's ``shuffle_buffer`` applies (else the plan's per-epoch order of ranges is the shuffle)
    shuffles: ClassVar[bool] = False
    #: records may be framed in the framing process (:mod:`tfyarn.data.framer`) when the C loops are missing
    frames_in_process: ClassVar[bool] = False
    #: indexing reads the whole file (else a footer): what preflight's counting budget charges
    index_reads_data: ClassVar[bool] = True

    @abstractmethod
    def index(
        self,
        url: str,
        size: int,
        mtime: str,
        *,
        compression: str = "auto",
        stride: int = DEFAULT_STRIDE,
        on_corrupt: str = "fail",
    ) -> FileInfo:
        """One file's index: its records and where a reader may start (damage raises, naming the file, unless
        ``on_corrupt="skip"`` and the format can step over it)."""

    def check(self, files: tuple[FileInfo, ...], fields: tuple[Any, ...]) -> None:  # noqa: B027 - most check nothing
        """Fail before any step when the data cannot give ``fields`` (a :class:`SchemaError`, exit 2); a source whose
        index knows no schema (TFRecord) checks nothing here (its parser names a bad record)."""

    def check_file(self, url: str, fields: tuple[Any, ...]) -> bool:
        """Preflight's schema check of one file without reading records (a footer); True when this source checked
        it (problems raise :class:`DataError`), False when records must be sampled (TFRecord)."""
        return False

    @abstractmethod
    def parser(self, fields: tuple[Any, ...]) -> Parse:
        """What the parser thread calls on each group the reader put: ``items -> {name: column}``; a group it cannot
        take raises :class:`tfyarn.data.parse.BatchParseError` (then :meth:`salvage`)."""

    @abstractmethod
    def read(self, run: Any) -> None:
        """The reader thread: ``run.plan.shares[rank]`` from ``start_step`` (or the whole share when
        ``run.replay``), then the share again while the parser asks for more, in groups to ``run.raw``."""

    @abstractmethod
    def salvage(self, run: Any, parse: Parse, items: list[Any], meta: list, msg: str) -> dict[str, Any]:
        """A group did not parse: raise naming the file and record, or (``on_corrupt: skip``) drop the bad records,
        count them (``run.f.record_skips``, ``run.deficit``) and return the rest parsed."""

    @abstractmethod
    def read_range(self, fi: FileInfo, start: int, stop: int, fields: tuple[Any, ...]) -> dict[str, Any]:
        """Records ``[start, stop)`` of one file, parsed (a bad record raises): the unit every reader is built of,
        for tests and tools."""


def reject(run: Any, bad: list[DataError], what: str) -> None:
    """Count the records a salvage dropped (``on_corrupt: skip``): the reader reads that many more. A whole share's
    worth rejected and not one row parsed raises (``what``, formatted with the count): re-reading the share again
    would loop until the consumer's timeout, with a message about waiting instead of the data."""
    run.f.record_skips(bad, run)
    with run.deficit_lock:
        run.deficit += len(bad)
    run.rows_rejected += len(bad)
    run.first_rejected = first = run.first_rejected or (bad[0] if bad else None)
    if first and run.rows_parsed == 0 and run.rows_rejected >= sum(len(r) for r in run.plan.shares[run.f.rank]):
        raise DataError(
            f"worker {run.f.rank}, epoch {run.epoch}: {what.format(run.rows_rejected)}; the first: {first}",
            path=first.path,
            offset=first.offset,
            record=first.record,
            feature=first.feature,
        )


def empty(fields: tuple[Any, ...]) -> dict[str, Any]:
    """Columns of no rows."""
    return {fl.name: fl.empty() for fl in fields}


def concat(parts: list[dict[str, Any]], fields: tuple[Any, ...]) -> dict[str, Any]:
    """Columns of consecutive parts as one (ragged columns too)."""

    if not parts:
        return empty(fields)
    if len(parts) == 1:
        return parts[0]
    return {fl.name: ragged.concat([p[fl.name] for p in parts]) for fl in fields}
