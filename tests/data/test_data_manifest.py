"""Manifest: counts, sparse offsets, globs/directories/hidden files, parallel build, caching (beside the data, else
local keyed by path+size+mtime, invalidated by changes), summary. No TensorFlow."""
from __future__ import annotations

import os
import sys

import fsspec
import pytest

from tfyarn.data import build_manifest, summarize
from tfyarn.data.manifest import Manifest, _beside

from _datahelpers import write_ids


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


def test_build_is_bounded_by_a_timeout(mem):
    from tfyarn.errors import WaitTimeout
    for i in range(40):
        write_ids(f"{mem}/p{i:02d}", 0, 2000)
    with pytest.raises(WaitTimeout, match=r"^indexing 40 files: \d+ not finished within 1e-06s \(e\.g\. memory:///"):
        build_manifest([f"{mem}/p*"], use_cache=False, parallel=2, timeout=1e-6)
