"""The index cache: each file's :class:`FileInfo` kept where the next reader finds it without reading the data.

Why cached: counting records reads every byte once. Data on a shared filesystem (HDFS, viewfs, object stores) has
its indexes cached as a few segment files per run in the cache dir (:mod:`segments`: one file per data file was
HDFS's small-files problem); local and ``memory://`` data has its index beside each data file
(``.<name>.tfyidx.json``, hidden from listings), else, where the data is read-only, in the cache dir (on YARN
``data.index_cache`` on the cluster's filesystem, locally :func:`tfyarn.paths.index_cache_dir`), keyed by path + size +
mtime + stride + the source's cache option (:func:`sources.cache_option`): a rewritten file is re-indexed, never
mis-split. The whole manifest is cached there too (:func:`manifest_entry`, written by :mod:`manifest`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import asdict
from typing import Any

import fsspec  # noqa: TID253 - the data path reads through fsspec

from tfyarn.common import paths
from tfyarn.data import segments, sources
from tfyarn.data.errors import DataError
from tfyarn.data.fileindex import DEFAULT_STRIDE, INDEX_VERSION, STATS, FileInfo, fileinfo
from tfyarn.data.listing import side_file_hint
from tfyarn.common.fsio import replace

log = logging.getLogger(__name__)


def _beside(url: str) -> str:
    head, _, name = url.rpartition("/")
    return f"{head}/.{name}.tfyidx.json"


def cache_entry(url: str, size: int, mtime: str, stride: int, option: str, cache_dir: str | None) -> str:
    """Where the cache dir keeps ``url``'s index: one flat name per (path, size, mtime, stride, option)."""
    key = _cache_key(url, size, mtime, stride, option)
    return f"{(cache_dir or paths.index_cache_dir()).rstrip('/')}/{key}.json"


def read_text(url: str) -> str | None:
    """A small file's text, or None when it is missing or unreadable (a cache miss, never an error)."""
    try:
        with fsspec.open(url, "rt") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def read_json(url: str) -> Any:
    """A small JSON file's document, or None when it is missing, unreadable or not JSON (a cache miss)."""
    text = read_text(url)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def write_text(url: str, text: str) -> None:
    """Write-then-rename (readers never see half a file; a concurrent writer of the same content may win)."""
    fs, path = fsspec.core.url_to_fs(url)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    parent = path.rsplit("/", 1)[0]
    if parent and not fs.exists(parent):
        fs.makedirs(parent, exist_ok=True)
    try:
        with fs.open(tmp, "wt") as f:
            f.write(text)
        replace(fs, tmp, path)
        STATS.add(files_created=1)
    except BaseException:
        try:
            fs.rm(tmp)
        except Exception:  # noqa: BLE001 - the tmp file may not exist; the original error matters
            pass
        raise


def segment_store(cache_dir: str | None) -> segments.SegmentStore:
    """The segment files of the cache dir (indexes of data on shared filesystems)."""
    return segments.store_for(cache_dir or paths.index_cache_dir(), write_text, read_json)


def _cache_key(url: str, size: int, mtime: str, stride: int, option: str) -> str:
    return hashlib.sha1(f"{url}|{size}|{mtime}|{stride}|{option}".encode()).hexdigest()


def _load_cached(
    url: str, size: int, mtime: str, stride: int, option: str, cache_dir: str | None, on_corrupt: str = "fail"
) -> FileInfo | None:
    if segments.segmented(url):
        docs = [segment_store(cache_dir).get(_cache_key(url, size, mtime, stride, option))]
    else:
        docs = [read_json(loc) for loc in (_beside(url), cache_entry(url, size, mtime, stride, option, cache_dir))]
    # (the cache option's key is "compression" since version 1)
    want = dict(version=INDEX_VERSION, path=url, size=size, mtime=mtime, asked_stride=stride, compression=option)
    for doc in docs:
        if isinstance(doc, dict) and all(doc.get(k) == v for k, v in want.items()):
            fi = fileinfo({k: v for k, v in doc.items() if k not in ("version", "compression", "asked_stride")})
            if fi.holes and on_corrupt != "skip":
                return None  # indexed leniently before; now damage must fail: re-index to raise
            return fi
    return None


#: Directories found not writable in this process: the next file's index goes straight to the cache dir (on a
#: read-only HDFS data set, one refused write per directory instead of one per file).
_UNWRITABLE: set[str] = set()


def _store(info: FileInfo, option: str, cache_dir: str | None, stride: int) -> None:
    doc = {"version": INDEX_VERSION, "compression": option, "asked_stride": stride, **asdict(info)}
    if segments.segmented(info.path):  # a shared filesystem: into this run's segment (few files per run)
        segment_store(cache_dir).add(_cache_key(info.path, info.size, info.mtime, stride, option), doc)
        return
    text = json.dumps(doc)
    beside = _beside(info.path)
    folder = beside.rsplit("/", 1)[0]
    if folder not in _UNWRITABLE:
        try:  # write-then-rename: concurrent workers indexing the same file never read a half-written index
            write_text(beside, text)
            return
        except Exception as exc:  # noqa: BLE001 - any failure to write beside the data means "use the cache dir"
            _UNWRITABLE.add(folder)
            log.debug("cannot write index beside %s (%s); using the cache dir", info.path, exc)
    entry = cache_entry(info.path, info.size, info.mtime, stride, option, cache_dir)
    try:
        write_text(entry, text)
    except Exception as exc:  # noqa: BLE001 - an unwritable cache costs the next run a re-index, nothing more
        log.warning(
            "cannot cache the index of %s in %s (%s); it will be rebuilt next time",
            info.path,
            entry.rsplit("/", 1)[0],
            exc,
        )


def manifest_entry(cache_dir: str | None, digest: str) -> str:
    """Where the cache dir keeps the whole manifest of a listing (:meth:`Listing.digest`)."""
    return f"{(cache_dir or paths.index_cache_dir()).rstrip('/')}/manifests/{digest}.json"


def cached_or_indexed(
    url: str,
    size: int,
    mtime: str,
    compression: str = "auto",
    cache_dir: str | None = None,
    *,
    format: str = "auto",
    stride: int = DEFAULT_STRIDE,
    use_cache: bool = True,
    on_corrupt: str = "fail",
    listed: bool = False,
    read: bool = True,
) -> FileInfo | None:
    """One file's index: the cached one when it still fits the file, else read now (and cached for the next reader).

    ``listed``: found by a listing or a glob, so an error about a file that is not TFRecord says how to leave such a
    side file out (:func:`side_file_hint`). ``format``: ``data.format`` (``auto``: by each file's name,
    :func:`sources.for_file`). ``read=False``: only a cached index, else None (a cheap check)."""
    option = sources.cache_option(format, compression)
    if use_cache:
        hit = _load_cached(url, size, mtime, stride, option, cache_dir, on_corrupt)
        if hit is not None:
            STATS.add(cache_hits=1)
            log.debug("%s: %d records (cached index)", url, hit.records)
            return hit
    if not read:
        return None
    t0 = time.monotonic()
    try:
        source = sources.for_file(url, format)
        fi = source.index(url, size, mtime, compression=compression, stride=stride, on_corrupt=on_corrupt)
    except DataError as exc:
        hint = side_file_hint(url, exc) if listed else ""
        if not hint:
            raise
        raise type(exc)(
            f"{exc}{hint}", path=exc.path, offset=exc.offset, record=exc.record, feature=exc.feature
        ) from None
    STATS.add(files_indexed=1)
    log.debug("%s: %d records (indexed in %.2fs)", url, fi.records, time.monotonic() - t0)
    if use_cache:
        _store(fi, option, cache_dir, stride)
    return fi
