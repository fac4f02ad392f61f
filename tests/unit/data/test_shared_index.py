"""Shared indexing (tfyarn.data.shared_index): N tasks (threads here, one MemoryKV as the job's KV) each index ~1/N of
the files not indexed yet and all end with the manifest one task alone would build; a second run reads no data."""
from __future__ import annotations

import json
import os
import threading
import time
import uuid

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _datahelpers import write_ids
from tfyarn.data import manifest as mf, tfrecord
from tfyarn.data.index_cache import cached_or_indexed
from tfyarn.data.listing import mtime_of
from tfyarn.data.manifest import build_manifest
from tfyarn.data.shared_index import IndexAborted, Exchange, plan_work, shared_manifest
from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.kv import MemoryKV

TASKS = ["chief:0", "worker:0", "worker:1", "worker:2", "worker:3", "worker:4", "worker:5", "worker:6"]


def run_tasks(urls, n, *, kv=None, ranks=None, app="app-1", timeout=60.0, **kw):
    """shared_manifest on ``ranks`` (default all of ``n``) at once, one thread each: {rank: Manifest or exception}."""
    kv = kv if kv is not None else MemoryKV()
    out: dict[int, object] = {}

    def task(rank):
        try:
            out[rank] = shared_manifest(urls, kv=kv, tasks=TASKS[:n], rank=rank, app_id=app, **kw)
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            out[rank] = exc

    threads = [threading.Thread(target=task, args=(r,), daemon=True) for r in (ranks if ranks is not None
                                                                                 else range(n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a task's shared_manifest did not return within the timeout"
    return out, kv


def parts(kv, n, attempt=0):
    """File ids each task indexed (what it published in part/<rank>)."""
    ex = Exchange(kv, TASKS[:n], 0, "x", attempt, None)
    got = {}
    for r in range(n):
        v = ex.get("part", r)
        got[r] = sorted(int(i) for i in v["files"]) if v is not None else None
    return got


def long_name_dir(tmp_path, sizes):
    """Files whose names leave no room for an index beside them (NAME_MAX): the data dir refuses the index, as a
    read-only directory does — and unlike chmod, also when the tests run as root."""
    urls = []
    for i, n in enumerate(sizes):
        url = f"file://{tmp_path}/data/{'r' * 225}-{i:03d}.tfrecord"
        os.makedirs(f"{tmp_path}/data", exist_ok=True)
        write_ids(url, i * 10_000, n)
        urls.append(url)
    return f"file://{tmp_path}/data/*.tfrecord", urls


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=10), n=st.integers(1, 5),
       cached=st.sets(st.integers(0, 9)), data=st.data())
def test_shared_manifest_equals_the_one_a_single_task_builds(counts, n, cached, data, tmp_path):
    if not any(counts):
        counts = counts + [3]
    root = f"memory://si-{uuid.uuid4().hex[:10]}"
    for i, c in enumerate(counts):
        if c:
            write_ids(f"{root}/p{i:02d}", i * 100, c)
        else:
            fsspec.filesystem("memory").pipe_file(f"{root.removeprefix('memory://')}/p{i:02d}", b"")
    cache = str(tmp_path / f"cache-{uuid.uuid4().hex[:6]}")
    listing = mf.list_data(f"{root}/p*")
    for i in sorted(cached):            # some files already indexed by an earlier run
        if i < len(listing.files):
            cached_or_indexed(*listing.files[i], stride=4, cache_dir=cache)
    want = build_manifest(f"{root}/p*", stride=4, use_cache=False, log_warnings=False)
    got, kv = run_tasks(f"{root}/p*", n, stride=4, cache_dir=cache, stall=30)
    for r in range(n):
        assert got[r] == want, f"{TASKS[r]} built another manifest"
    if n > 1:
        done = [i for ids in parts(kv, n).values() for i in ids or []]
        assert len(done) == len(set(done)), "a file was indexed by two tasks"
        missing = {i for i in range(len(listing.files)) if i not in cached}
        assert set(done) == missing          # each file not cached before indexed once, cached ones by none


def test_bytes_split_by_n_then_a_second_run_reads_no_data(tmp_path):
    sizes = [20 + (i * 37) % 180 for i in range(48)]          # 9x skew between files
    glob, urls = long_name_dir(tmp_path, sizes)
    cache = str(tmp_path / "cache")
    n = 4
    got, kv = run_tasks(glob, n, cache_dir=cache)
    listing = mf.list_data(glob)
    total = listing.total_bytes
    per_task = {r: sum(listing.files[i][1] for i in ids) for r, ids in parts(kv, n).items()}
    assert sum(per_task.values()) == total                     # everything read once, split among the tasks
    assert max(per_task.values()) <= total / n * 1.1, per_task
    assert not [p for p in os.listdir(tmp_path / "data") if p.startswith(".")]   # nothing written beside the data
    assert len([p for p in os.listdir(cache) if p.endswith(".json")]) == len(urls)
    assert os.listdir(f"{cache}/manifests") and not os.path.exists(f"{cache}/exchange/app-1-0-train")
    before = mf.STATS.snapshot()
    again, kv2 = run_tasks(glob, n, cache_dir=cache, app="app-2")
    after = mf.STATS.snapshot()
    assert after["bytes_read"] == before["bytes_read"] and after["files_indexed"] == before["files_indexed"]
    assert all(again[r] == got[0] for r in range(n))
    assert kv2.items("index/0/train/part/") == {}               # nobody had anything to index


@pytest.mark.parametrize("change", ["size", "mtime"])
def test_a_changed_file_is_reindexed_and_only_it(change, tmp_path):
    glob, urls = long_name_dir(tmp_path, [30, 40, 50, 60])
    cache = str(tmp_path / "cache")
    first, _ = run_tasks(glob, 2, cache_dir=cache)
    path = urls[2].removeprefix("file://")
    if change == "size":
        write_ids(urls[2], 5_000, 70)
    else:
        st_ = os.stat(path)
        os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 5_000_000_000))
    before = mf.STATS.snapshot()
    second, kv = run_tasks(glob, 2, cache_dir=cache, app="app-2")
    after = mf.STATS.snapshot()
    assert after["files_indexed"] - before["files_indexed"] == 1
    # the file once, plus its first 12 bytes read apart (what says whether it is gzip)
    assert after["bytes_read"] - before["bytes_read"] == os.path.getsize(path) + tfrecord.HEADER
    want = build_manifest(glob, use_cache=False)
    assert second[0] == second[1] == want
    assert [f.records for f in want.files] == [30, 40, 70 if change == "size" else 50, 60]
    assert want.files[2].mtime == mtime_of(fsspec.filesystem("file").info(path))


def test_a_dead_worker_is_covered_by_the_leader(tmp_path):
    glob, _ = long_name_dir(tmp_path, [10, 20, 30, 40, 50, 60])
    kv = MemoryKV()
    kv.put("failure/worker:1", "killed while indexing")          # worker:1 never publishes anything
    got, kv = run_tasks(glob, 3, kv=kv, ranks=[0, 1], cache_dir=str(tmp_path / "cache"), stall=30)
    want = build_manifest(glob, use_cache=False)
    assert got[0] == got[1] == want


def test_a_silent_worker_is_covered_after_the_stall_timeout(tmp_path):
    glob, _ = long_name_dir(tmp_path, [10, 20, 30])
    t0 = time.monotonic()
    got, _ = run_tasks(glob, 2, ranks=[0], cache_dir=str(tmp_path / "cache"), stall=1.5)
    assert got[0] == build_manifest(glob, use_cache=False)
    assert 1.5 <= time.monotonic() - t0 < 20


def test_a_dead_leader_fails_the_wait_naming_it(tmp_path):
    glob, _ = long_name_dir(tmp_path, [10, 20])
    t0 = time.monotonic()
    got, _ = run_tasks(glob, 2, ranks=[1], cache_dir=str(tmp_path / "cache"), stall=1.5)
    assert isinstance(got[1], WaitTimeout) and "chief:0" in str(got[1]) and "silent" in str(got[1])
    assert time.monotonic() - t0 < 20


def test_damaged_data_fails_every_task_with_the_file(tmp_path):
    glob, urls = long_name_dir(tmp_path, [10, 20, 30, 40])
    with open(urls[3].removeprefix("file://"), "r+b") as f:
        f.seek(3)
        f.write(b"\xff\xff\xff")                                 # the first record's length is now wrong
    got, _ = run_tasks(glob, 3, cache_dir=str(tmp_path / "cache"), stall=30)
    for r in range(3):
        assert isinstance(got[r], Exception) and "-003.tfrecord" in str(got[r]), got[r]


def test_tasks_that_listed_different_files_refuse_to_plan(tmp_path):
    glob, urls = long_name_dir(tmp_path, [10, 20, 30])
    kv = MemoryKV()
    out: dict[int, object] = {}

    def task(rank, what):
        try:
            out[rank] = shared_manifest(what, kv=kv, tasks=TASKS[:2], rank=rank, app_id="a",
                                        cache_dir=str(tmp_path / "cache"), stall=30)
        except Exception as exc:  # noqa: BLE001
            out[rank] = exc
    ts = [threading.Thread(target=task, args=(0, glob)), threading.Thread(target=task, args=(1, urls[:2]))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert all(isinstance(out[r], IndexAborted) and "listed other files" in str(out[r]) for r in (0, 1)), out


def test_a_restarted_task_gets_the_published_manifest_without_reading(tmp_path):
    glob, _ = long_name_dir(tmp_path, [10, 20, 30])
    got, kv = run_tasks(glob, 2, cache_dir=str(tmp_path / "cache"), stall=30)
    os.rename(tmp_path / "cache", tmp_path / "cache-gone")       # not even the cache: the KV has it
    before = mf.STATS.snapshot()
    again, _ = run_tasks(glob, 2, kv=kv, ranks=[1], cache_dir=str(tmp_path / "cache"), stall=30)
    assert again[1] == got[0] and mf.STATS.snapshot() == before


def test_large_values_go_through_files_and_the_exchange_is_removed(tmp_path):
    glob, _ = long_name_dir(tmp_path, [3000] * 4)                 # offsets every record: ~12 KB per file
    cache = str(tmp_path / "cache")
    kv = MemoryKV()
    got, kv = run_tasks(glob, 8, kv=kv, cache_dir=cache, stride=1, stall=30)
    assert all(got[r] == got[0] for r in range(8)) and got[0].total_records == 12000
    refs = [json.loads(v) for k, v in kv.items("index/").items() if "/beat/" not in k]
    assert any("file" in r for r in refs) and any("inline" in r for r in refs)
    assert not os.path.exists(f"{cache}/exchange/app-1-0-train")


def test_plan_work_balances_bytes_deterministically():
    sizes = [100, 90, 80, 70, 60, 50, 40, 30, 20, 10]
    a = plan_work(list(range(10)), sizes, 3)
    assert a == plan_work(list(reversed(range(10))), sizes, 3)
    loads = sorted(sum(sizes[i] for i in ids) for ids in a.values())
    assert sorted(i for ids in a.values() for i in ids) == list(range(10)) and loads[-1] - loads[0] <= 10


def test_offsets_per_file_are_bounded(mem):
    write_ids(f"{mem}/big", 0, 5000)
    fi = build_manifest(f"{mem}/big", stride=1, use_cache=False).files[0]
    assert len(fi.offsets) <= mf.MAX_OFFSETS and fi.stride == 4 and fi.records == 5000
    fsize = fsspec.filesystem("memory").info(fi.path.removeprefix("memory://"))["size"]
    assert fi.boundary(4999) == (fi.offsets[-1], (len(fi.offsets) - 1) * 4) and fi.offsets[-1] < fsize


def test_preflight_says_how_much_is_not_indexed_yet(tmp_path):
    from _datahelpers import job_spec
    from tfyarn.gateway import preflight
    glob, urls = long_name_dir(tmp_path, [10, 20, 30, 40])
    cache = str(tmp_path / "cache")
    spec = job_spec([glob], {"rid": {"dtype": "int64"}}, index_cache=cache)
    cached_or_indexed(*mf.list_data(glob).files[0], cache_dir=cache)        # one file indexed by an earlier run
    total = sum(os.path.getsize(u.removeprefix("file://")) for u in urls)
    left = total - os.path.getsize(urls[0].removeprefix("file://"))
    notes = preflight.index_notes(spec, preflight.list_data(spec))
    assert len(notes) == 1 and f"{left / 1e6:,.1f} MB of {total / 1e6:,.1f} MB (4 files) not indexed" in notes[0]
    assert "the 1 training tasks read" in notes[0] and cache in notes[0]
    build_manifest(glob, cache_dir=cache, whole=True)                        # e.g. `tfyarn data index`
    assert preflight.index_notes(spec, preflight.list_data(spec)) == []


def test_cli_data_index_fills_the_cache_a_job_then_reads(tmp_path):
    from click.testing import CliRunner
    from tfyarn.cli import cli
    glob, _ = long_name_dir(tmp_path, [10, 20, 30])
    cache = str(tmp_path / "cache")
    res = CliRunner().invoke(cli, ["data", "index", glob, "--cache-dir", cache])
    assert res.exit_code == 0, res.output
    assert "3 files, 60 records" in res.output and "indexed 3 files" in res.output
    before = mf.STATS.snapshot()
    got, _ = run_tasks(glob, 3, cache_dir=cache, stall=30)
    assert mf.STATS.snapshot()["bytes_read"] == before["bytes_read"] and got[0].total_records == 60
