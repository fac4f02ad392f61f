"""The index cache of data on a shared filesystem (HDFS, viewfs, object stores) as a few segment files per run.

Why: one small index file per data file (beside it or in the cache dir) made a 100,000-file data set add 100,000 files
to the NameNode (HDFS's small-files problem), and creating each cost more than reading the data file (385 ms measured
under load against 0.7 ms to read a 22 KB file). Here each indexing call (one per task of a shared index, one per
``tfyarn data index``) writes its new indexes as one segment, ``<cache dir>/segments/<time>-<id>.json`` (every
:data:`FLUSH_EVERY` indexes or :data:`FLUSH_S` seconds too, so a task that dies mid-work leaves most of it), and a
reader lists the segments once and reads the new ones. Past :data:`COMPACT_AT` segments the writer merges them into
one. Keys are path + size + mtime + stride + compression, so a rewritten file is never mis-split.

Local (``file://``) and ``memory://`` data keep their index beside each file (:mod:`index_cache`): no NameNode there.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import fsspec  # noqa: TID253 - the data path reads through fsspec

log = logging.getLogger(__name__)

SEGMENT_VERSION = 1
FLUSH_EVERY = 512
FLUSH_S = 20.0
COMPACT_AT = 64


def segmented(url: str) -> bool:
    """Whether ``url``'s index goes to segments (a shared filesystem), not beside the file."""
    proto = url.split("://", 1)[0] if "://" in url else "file"
    return proto not in ("file", "local", "memory")


class SegmentStore:
    """The segments of one cache dir, as this process knows them (thread-safe)."""

    def __init__(self, cache_dir: str, write: Callable[[str, str], None], read: Callable[[str], Any]):
        self.dir = f"{cache_dir.rstrip('/')}/segments"
        self._write, self._read = write, read
        self.entries: dict[str, dict[str, Any]] = {}
        self.seen: set[str] = set()
        self.pending: dict[str, dict[str, Any]] = {}
        self.batches = 0  # index_files calls in progress: flush at their end, not per add
        self.loaded = False
        self.last_flush = time.monotonic()
        self.lock = threading.RLock()

    def refresh(self) -> None:
        """List the segments and read the ones not read yet (in parallel); a missing one is skipped."""
        fs, path = fsspec.core.url_to_fs(self.dir)
        try:
            names = [p for p in fs.ls(path, detail=False) if p.endswith(".json")]
        except (FileNotFoundError, NotADirectoryError):
            names = []
        new = [n for n in names if n not in self.seen]
        if new:
            with ThreadPoolExecutor(min(8, len(new)), thread_name_prefix="tfyarn-segments") as ex:
                docs = list(ex.map(lambda n: self._read(fs.unstrip_protocol(n)), new))
            with self.lock:
                for name, doc in zip(new, docs):
                    if isinstance(doc, dict) and doc.get("version") == SEGMENT_VERSION:
                        self.entries.update(doc.get("entries", {}))
                        self.seen.add(name)
        self.loaded = True

    def get(self, key: str) -> dict[str, Any] | None:
        if not self.loaded:
            self.refresh()
        with self.lock:
            return self.entries.get(key)

    def add(self, key: str, doc: dict[str, Any]) -> None:
        with self.lock:
            self.entries[key] = doc
            self.pending[key] = doc
            due = self.batches == 0 or len(self.pending) >= FLUSH_EVERY or time.monotonic() - self.last_flush > FLUSH_S
        if due:
            self.flush()

    def flush(self) -> str | None:
        """Write the pending indexes as one segment (merging every known segment once there are many)."""
        with self.lock:
            if not self.pending:
                return None
            pending, self.pending = self.pending, {}
            self.last_flush = time.monotonic()
            compact = len(self.seen) >= COMPACT_AT
            body = dict(self.entries) if compact else pending
            merged = set(self.seen) if compact else set()
        url = f"{self.dir}/{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:12]}.json"
        try:
            self._write(url, json.dumps({"version": SEGMENT_VERSION, "entries": body}, separators=(",", ":")))
        except Exception as exc:  # noqa: BLE001 - an unwritable cache costs the next run a re-index, nothing more
            log.warning("cannot write the index segment %s (%s); those files are re-indexed next time", url, exc)
            return None
        fs, path = fsspec.core.url_to_fs(url)
        with self.lock:
            self.seen.add(path)
        if merged:
            for name in merged:  # readers that listed them meanwhile just miss (re-index, rare)
                try:
                    fs.rm(name)
                except Exception:  # noqa: BLE001 - another writer compacted it first
                    pass
            with self.lock:
                self.seen -= merged
            log.info("index cache: %d segments merged into %s", len(merged), url)
        return url


_STORES: dict[str, SegmentStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(cache_dir: str, write: Callable[[str, str], None], read: Callable[[str], Any]) -> SegmentStore:
    with _STORES_LOCK:
        if cache_dir not in _STORES:
            _STORES[cache_dir] = SegmentStore(cache_dir, write, read)
        return _STORES[cache_dir]
