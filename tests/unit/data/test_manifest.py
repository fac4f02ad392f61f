"""Manifest: counts, sparse offsets, globs/directories/hidden files, parallel build, caching (beside the data, else
local keyed by path+size+mtime, invalidated by changes), summary. No TensorFlow."""
from __future__ import annotations

import os
import sys
import time

import fsspec
import pytest

from tfyarn.data import build_manifest, summarize
from tfyarn.data.errors import NoDataError
from tfyarn.data.index_cache import _beside
from tfyarn.data.manifest import Manifest

from _datahelpers import job_spec, write_ids

#: every test twice: with the C loops and with the Python/numpy/TF ones (tfyarn.data.native)
pytestmark = pytest.mark.usefixtures("loops")


def test_counts_offsets_and_sorted_full_urls(mem, cache_dir):
    p1 = write_ids(f"{mem}/b.tfrecord", 0, 250)
    write_ids(f"{mem}/a.tfrecord", 0, 3)
    m = build_manifest(f"{mem}/*.tfrecord", cache_dir=cache_dir, stride=100)
    assert [f.path.rsplit("/", 1)[1] for f in m.files] == ["a.tfrecord", "b.tfrecord"]
    assert all(f.path.startswith("memory:///") for f in m.files)
    b = m.files[1]
    assert b.records == 250 and len(b.offsets) == 3
    assert b.offsets == tuple(sum(len(p) + 16 for p in p1[:k]) for k in (0, 100, 200))
    assert m.total_records == 253 and Manifest.from_json(m.to_json()) == m


def test_directories_and_hidden_files(local, cache_dir):
    root = local.removeprefix("file://")
    os.makedirs(f"{root}/d/sub")
    os.makedirs(f"{root}/d/_temporary/0")
    write_ids(f"{local}/d/part-0", 0, 5)
    write_ids(f"{local}/d/sub/part-1", 0, 6)
    write_ids(f"{local}/d/_temporary/0/part-2", 0, 7)          # a half-written job output: not data
    open(f"{root}/d/_SUCCESS", "w").close()
    open(f"{root}/d/.part-0.crc", "wb").write(b"junk")
    m = build_manifest([f"{local}/d"], cache_dir=cache_dir)
    assert [f.records for f in m.files] == [5, 6]


def test_index_is_cached_beside_the_data_and_reused(mem, cache_dir):
    url = f"{mem}/a.tfrecord"
    write_ids(url, 0, 50)
    m1 = build_manifest([url], cache_dir=cache_dir)
    full = m1.files[0].path
    fs = fsspec.filesystem("memory")
    assert fs.exists(_beside(full).removeprefix("memory://"))
    assert not os.path.exists(cache_dir)
    assert build_manifest([f"{mem}/*"], cache_dir=cache_dir) == m1          # the hidden index is not data
    # Prove the cache is used: a doctored cached count is believed while size and mtime match...
    path = _beside(full).removeprefix("memory://")
    fs.pipe_file(path, fs.cat_file(path).replace(b'"records": 50', b'"records": 49'))
    assert build_manifest([url], cache_dir=cache_dir).files[0].records == 49
    # ...and ignored once the data file changes (size differs).
    write_ids(url, 0, 60)
    assert build_manifest([url], cache_dir=cache_dir).files[0].records == 60


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_data_dir_uses_local_cache(local, cache_dir):
    root = local.removeprefix("file://")
    write_ids(f"{local}/a.tfrecord", 0, 40)
    os.chmod(root, 0o555)
    try:
        m = build_manifest([f"{local}/a.tfrecord"], cache_dir=cache_dir)
    finally:
        os.chmod(root, 0o755)
    assert m.files[0].records == 40 and len(os.listdir(cache_dir)) == 1


def test_unwritable_beside_falls_back_to_local_cache(tmp_path, cache_dir):
    # Works as root too (root ignores directory permissions): a data file whose name leaves no room for the index
    # file's longer name (NAME_MAX is 255) cannot have its index beside it, so the local cache is used.
    name = "a" * 230 + ".tfrecord"
    write_ids(f"file://{tmp_path}/{name}", 0, 40)
    m = build_manifest([f"file://{tmp_path}/{name}"], cache_dir=cache_dir)
    assert m.files[0].records == 40
    assert sorted(os.listdir(tmp_path)) == sorted([name, "index-cache"])
    cached = os.listdir(cache_dir)
    assert len(cached) == 1 and cached[0].endswith(".json")
    # The next build reads the local cache (doctor it to prove it).
    p = os.path.join(cache_dir, cached[0])
    text = open(p).read()
    open(p, "w").write(text.replace('"records": 40', '"records": 39'))
    assert build_manifest([f"file://{tmp_path}/{name}"], cache_dir=cache_dir).files[0].records == 39


def test_parallel_build_many_files(mem, cache_dir):
    for i in range(24):
        write_ids(f"{mem}/p{i:02d}", 0, i + 1)
    m = build_manifest([f"{mem}/p*"], cache_dir=cache_dir, parallel=8)
    assert [f.records for f in m.files] == list(range(1, 25))


def test_summary(mem, cache_dir):
    for i, n in enumerate([10, 100, 30]):
        write_ids(f"{mem}/p{i}", 0, n)
    fsspec.filesystem("memory").pipe_file(f"{mem}/p3".removeprefix("memory://"), b"")
    m = build_manifest([f"{mem}/p*"], cache_dir=cache_dir)
    text = summarize(m)
    lines = text.splitlines()
    assert lines[0] == f"3 files, 140 records, {m.total_bytes:,} bytes"
    assert lines[1] == "records per file: min 10  median 30  max 100  (max/min 10.0x)"
    assert lines[-1] == f"warning: {mem.replace('memory://', 'memory:///')}/p3: empty file (0 bytes), skipped"
    assert len(lines) == 2 + 1 + 3 + 1      # totals, spread, table header, 3 files, 1 warning


def test_no_tensorflow_imported():
    # Gateways have no TF: indexing, planning and the package import must not pull it in.
    import subprocess
    code = ("import sys, tfyarn.data as d; from tfyarn.data import synth;"
            "d.write_synthetic('memory://x', files=2, records=20);"
            "m = d.build_manifest('memory://x/*'); d.plan(m, 2, 0, 0, 3); print(d.summarize(m));"
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_build_is_bounded_by_a_timeout(mem, monkeypatch):
    from tfyarn.data.sources import tfrecords
    from tfyarn.errors import WaitTimeout
    for i in range(4):
        write_ids(f"{mem}/p{i:02d}", 0, 20)
    real = tfrecords.index_file

    def slow(*args, **kw):                       # a slow filesystem (indexing itself is too fast to outrun)
        time.sleep(0.5)
        return real(*args, **kw)
    monkeypatch.setattr(tfrecords, "index_file", slow)
    with pytest.raises(WaitTimeout, match=r"^indexing 4 files: \d+ not finished within 0.1s \(e\.g\. memory:///"):
        build_manifest([f"{mem}/p*"], use_cache=False, parallel=2, timeout=0.1)


# ------------------------------------------------- what is data: hidden files, Hadoop's files, our own cached indexes

def _hadoop_output(url):
    """Data files plus everything Hadoop (and tfyarn) leaves beside them; returns the data files' full URLs."""
    fs, root = fsspec.core.url_to_fs(url)
    urls = [f"{url}/part-00000", f"{url}/part-00001.tfrecord"]
    for i, u in enumerate(urls):
        write_ids(u, 0, 5 + i)
    fs.pipe_file(f"{root}/_SUCCESS", b"")
    fs.pipe_file(f"{root}/.part-00000.crc", b"crc!")
    fs.makedirs(f"{root}/_logs/history", exist_ok=True)
    fs.pipe_file(f"{root}/_logs/history/job.jhist", b"{}")
    return sorted(fs.unstrip_protocol(f"{root}/{u.rsplit('/', 1)[1]}") for u in urls)


@pytest.mark.parametrize("where", ["file", "memory"])
@pytest.mark.parametrize("form", ["{}", "{}/", "{}/*"])
def test_directory_and_glob_skip_hidden_files_also_once_the_cache_is_beside_the_data(where, form, local, mem,
                                                                                     cache_dir):
    """The bug: a directory worked once, then the cached ``.<name>.tfyidx.json`` beside the data was read as data."""
    root = f"{local}/fresh" if where == "file" else f"{mem}/fresh"
    data = _hadoop_output(root)
    for run in range(2):                       # the second run finds the indexes the first one cached beside the data
        m = build_manifest(form.format(root), cache_dir=cache_dir)
        assert [f.path for f in m.files] == data and [f.records for f in m.files] == [5, 6], run
    fs, _ = fsspec.core.url_to_fs(root)
    assert all(fs.exists(fs._strip_protocol(_beside(u))) for u in data)           # the cache really was there


def test_a_glob_does_not_reach_into_hidden_directories(local, cache_dir):
    write_ids(f"{local}/d/day1/part-0", 0, 5)
    write_ids(f"{local}/d/_temporary/part-0", 0, 7)      # half-written job output that the wildcard also matches
    assert [f.records for f in build_manifest(f"{local}/d/*/part-*", cache_dir=cache_dir).files] == [5]


def test_a_file_named_explicitly_is_data_whatever_its_name(mem, cache_dir):
    """Only listings and wildcards are filtered: what the user spelled out (file or directory) is what they meant."""
    write_ids(f"{mem}/_staging/.part-0", 0, 4)
    write_ids(f"{mem}/_staging/part-1", 0, 3)
    assert [f.records for f in build_manifest([f"{mem}/_staging/.part-0"], cache_dir=cache_dir).files] == [4]
    assert [f.records for f in build_manifest([f"{mem}/_staging/*"], cache_dir=cache_dir).files] == [3]
    assert [f.records for f in build_manifest([f"{mem}/_staging"], cache_dir=cache_dir).files] == [3]
    with pytest.raises(NoDataError, match=r"_staging/\.p\*: matches no data file \(only directories or hidden"):
        build_manifest([f"{mem}/_staging/.p*"], cache_dir=cache_dir)        # what a wildcard matched: Hadoop's rule


def test_data_files_is_the_one_listing_rule(mem):
    """``data_files(fs, path)``: what every listing of data (manifest, preflight, synth) uses."""
    from tfyarn.data.listing import data_files, hidden
    data = _hadoop_output(f"{mem}/out")
    build_manifest(f"{mem}/out")                                 # caches indexes beside the data
    fs, root = fsspec.core.url_to_fs(f"{mem}/out")
    assert sorted(fs.unstrip_protocol(p) for p in data_files(fs, root)) == data
    assert sorted(fs.unstrip_protocol(p) for p in data_files(fs, f"{root}/*")) == data
    assert data_files(fs, f"{root}/_SUCCESS") == {f"{root}/_SUCCESS": fs.info(f"{root}/_SUCCESS")}
    assert data_files(fs, f"{root}/nope") == {} and data_files(fs, f"{root}/nope*") == {}
    assert [hidden(r) for r in ("part-0", "a/part-0", "_SUCCESS", ".x.crc", "_temporary/0/part-0", "a/.b/c")] == \
        [False, False, True, True, True, True]


def test_preflight_samples_data_not_the_cached_index(local, cache_dir):
    """The user-visible failure (exit 2 from preflight on the second run) through the same listing."""
    from tfyarn.data.synth import SCHEMAS
    from tfyarn.gateway.preflight import check_data_schema
    from tfyarn.data import write_synthetic
    write_synthetic(f"{local}/fresh", files=2, records=20)
    spec = job_spec([f"{local}/fresh"], SCHEMAS["recommender"])
    assert check_data_schema(spec) == []
    build_manifest(f"{local}/fresh", cache_dir=cache_dir)       # the first run caches its indexes
    assert check_data_schema(spec) == []
