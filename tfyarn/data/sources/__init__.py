"""The registry of record sources: the data formats tfyarn reads, by ``data.format`` name.

Each source (:class:`base.Source`) says how to index a file, check the features, read a worker's record ranges and
parse them; the manifest (:mod:`tfyarn.data.manifest`) and the one feeder (:mod:`tfyarn.data.feeder`) take whatever
source a file's format names. Adding a format: docs/ARCHITECTURE.md, "Adding a data format".

Importing this package imports neither TensorFlow nor pyarrow (gateways index TFRecords and submit without them).
"""

from __future__ import annotations

from typing import Any, Iterable

from tfyarn.data.errors import NoDataError
from tfyarn.data.sources.base import Source
from tfyarn.data.sources.tables import OrcSource, ParquetSource
from tfyarn.data.sources.tfrecords import TFRecordSource

#: ``data.format`` name → source; :data:`DEFAULT` reads any file no other source claims by its name
SOURCES: dict[str, Source] = {}
DEFAULT = "tfrecord"


def register(source: Source) -> Source:
    """Add a source under its name (a name taken twice is a programming error)."""
    if source.name in SOURCES or source.name == "auto":
        raise ValueError(f"a record source named {source.name!r} is already registered")
    SOURCES[source.name] = source
    return source


for _source in (TFRecordSource(), ParquetSource(), OrcSource()):
    register(_source)


def get(name: str) -> Source:
    """The source named ``name`` (``data.format``; ``auto`` is not a source: see :func:`for_file`)."""
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(f"unknown data format {name!r} (known: {', '.join(sorted(SOURCES))}, auto)") from None


def for_file(url: str, declared: str | None = "auto") -> Source:
    """The source of one file: ``declared`` (``data.format``) when given, else by its name's ending (``.parquet``,
    ``.orc``, also with ``.gz`` after it …), else :data:`DEFAULT`."""
    if declared not in ("auto", None):
        return get(declared)
    name = url.rstrip("/").rsplit("/", 1)[-1].lower()
    for source in SOURCES.values():
        if source.name != DEFAULT and any(name.endswith(e) or name.endswith(e + ".gz") for e in source.extensions):
            return source
    return SOURCES[DEFAULT]


def of_files(files: Iterable[Any]) -> Source:
    """The one source of a data set's files (:class:`FileInfo` ``format``); a set mixing formats is refused."""
    names = {fi.format for fi in files}
    if len(names) > 1:
        raise NoDataError(
            f"one data set mixes file formats ({', '.join(sorted(names))}); give each format its own job, or convert"
        )
    return get(names.pop() if names else DEFAULT)


def cache_option(format: str, compression: str) -> str:
    """The reading option an index is cached under (with path, size, mtime, stride): ``data.compression`` for a
    source it applies to or ``auto``, else the declared format's name (a file without an extension read as a table
    is not the same index as the same file read as TFRecords). The same strings as before the registry, so cached
    indexes stay valid."""
    if format in ("auto", None) or get(format).compressed:
        return compression
    return format


__all__ = ["DEFAULT", "SOURCES", "Source", "cache_option", "for_file", "get", "of_files", "register"]
