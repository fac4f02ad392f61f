"""One data file's index (:class:`FileInfo`): what the planner and every reader of the file need to know about it,
made by the file's record source (:mod:`tfyarn.data.sources`) and cached by :mod:`tfyarn.data.index_cache`.

Why a module of its own: the sources make it, the cache stores it, the manifest gathers it; none of them owns it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

#: Version of the cached index and manifest documents (an older one is read as a cache miss).
INDEX_VERSION = 2
DEFAULT_STRIDE = 1024
#: Offsets kept per file at most: beyond it the stride doubles (the manifest's size per file stays bounded).
MAX_OFFSETS = 2048


class IndexStats:
    """This process's indexing cost (data bytes read, files indexed, cached indexes used): the tasks' log line and
    the benchmark show that a second run reads 0 data bytes before its first step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("bytes_read", "files_indexed", "cache_hits", "files_created"), 0)

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


STATS = IndexStats()


@dataclass(frozen=True)
class FileInfo:
    """One file's index. TFRecord: ``offsets[j]`` is the byte offset (decompressed, for GZIP) of record
    ``j * stride``. A table (``format`` "parquet", "orc"): ``records`` are rows, ``offsets`` the first row of each row
    group or stripe, ``columns`` the (name, arrow type) pairs of its schema (:mod:`tfyarn.data.table`)."""

    path: str
    size: int
    mtime: str
    records: int
    gz: bool
    stride: int
    offsets: tuple[int, ...]
    data_bytes: int = 0  # decompressed TFRecord bytes (== size unless gz)
    holes: tuple[tuple[int, int], ...] = ()  # damaged byte ranges skipped (on_corrupt="skip"): (start, resume)
    format: str = "tfrecord"  # the name of the file's record source (tfyarn.data.sources)
    columns: tuple[tuple[str, str], ...] = ()

    def boundary(self, record: int) -> tuple[int, int]:
        """(byte offset, record index) of the closest indexed record boundary at or before ``record``."""
        j = min(record // self.stride, len(self.offsets) - 1) if self.offsets else 0
        return (self.offsets[j], j * self.stride) if self.offsets else (0, 0)


def fileinfo(doc: dict[str, Any]) -> FileInfo:
    """A :class:`FileInfo` from its JSON form (``asdict``)."""
    holes, columns = (tuple(map(tuple, doc.get(k, ()))) for k in ("holes", "columns"))
    return FileInfo(**{**doc, "offsets": tuple(doc["offsets"]), "holes": holes, "columns": columns})


def describe_hole(fi: FileInfo, start: int, end: int) -> str:
    """Where a damaged byte range of ``fi`` is, for people: the file, the offsets, and whether it ran to the end."""
    what = (
        "to the end of the file: a truncated or damaged last record"
        if end >= fi.data_bytes
        else "damaged framing; reading resumed at the next valid record"
    )
    return f"{fi.path}: bytes {start}..{end} skipped ({what})"
