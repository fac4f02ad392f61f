"""The index cache of data on a shared filesystem is a few segment files per run, not one file per data file
(HDFS's small-files problem): a cold index of 40 files creates 1 segment (+ the whole manifest), a second process
reads every index from it without reading data, a rewritten file is re-indexed, many segments are merged."""
from __future__ import annotations

import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from tfyarn.data import build_manifest, segments
from tfyarn.data.manifest import STATS

from _datahelpers import write_ids


class SharedMem(MemoryFileSystem):
    """memory:// under another name: what the index cache treats as a shared filesystem (like hdfs://)."""
    protocol = ("sharedmem",)

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(str(path).removeprefix("sharedmem://"))


fsspec.register_implementation("sharedmem", SharedMem, clobber=True)


@pytest.fixture
def shared():
    root = f"sharedmem://t-{uuid.uuid4().hex[:10]}"
    segments._STORES.clear()
    yield root
    segments._STORES.clear()
    try:
        fsspec.filesystem("sharedmem").rm(root.removeprefix("sharedmem://"), recursive=True)
    except FileNotFoundError:
        pass


def _delta(before):
    now = STATS.snapshot()
    return {k: now[k] - before[k] for k in now}


def test_a_cold_index_creates_one_segment_and_a_second_process_reads_it(shared):
    assert segments.segmented("hdfs://nn/x") and not segments.segmented("file:///x")
    urls = [f"{shared}/data/part-{i:03d}.tfrecord" for i in range(40)]
    for i, u in enumerate(urls):
        write_ids(u, 0, 10 + i)
    cache = f"{shared}/cache"
    before = STATS.snapshot()
    m = build_manifest(f"{shared}/data/*", cache_dir=cache, whole=True)
    took = _delta(before)
    assert m.total_records == sum(10 + i for i in range(40))
    assert took["files_indexed"] == 40 and took["files_created"] == 2      # one segment + the whole manifest
    fs = fsspec.filesystem("sharedmem")
    assert len(fs.ls(cache.removeprefix("sharedmem://") + "/segments")) == 1
    assert not [p for p in fs.find(shared.removeprefix("sharedmem://") + "/data") if "tfyidx" in p]
    segments._STORES.clear()                                                 # another process
    before = STATS.snapshot()
    again = build_manifest(f"{shared}/data/*", cache_dir=cache)              # per-file lookups, no whole manifest
    took = _delta(before)
    assert again == m and took["cache_hits"] == 40 and took["bytes_read"] == 0 and took["files_created"] == 0
    write_ids(urls[3], 0, 99)                                                # rewritten: re-indexed, never mis-split
    segments._STORES.clear()
    before = STATS.snapshot()
    assert build_manifest(f"{shared}/data/*", cache_dir=cache).files[3].records == 99
    assert _delta(before)["files_indexed"] == 1


def test_many_segments_are_merged(shared, monkeypatch):
    monkeypatch.setattr(segments, "COMPACT_AT", 3)
    cache = f"{shared}/cache"
    for run in range(5):
        write_ids(f"{shared}/data/part-{run}.tfrecord", 0, 5)
        build_manifest(f"{shared}/data/*", cache_dir=cache)
    fs = fsspec.filesystem("sharedmem")
    assert len(fs.ls(cache.removeprefix("sharedmem://") + "/segments")) <= 3
    segments._STORES.clear()
    before = STATS.snapshot()
    build_manifest(f"{shared}/data/*", cache_dir=cache)
    assert _delta(before)["cache_hits"] == 5
