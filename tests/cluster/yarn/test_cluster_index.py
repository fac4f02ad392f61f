"""Issue 22 on the real cluster: a read-only data set (another HDFS user's, not writable by the job's user) is indexed
once, shared between the training tasks, cached in the cluster-wide cache (<staging dir>/index), and reused by the next
job with 0 data bytes read; a file rewritten by its owner is re-indexed, and only it.

The data is written through WebHDFS as another user (``user.name=datateam``) into a 0555 directory. Where the cluster
does not enforce permissions (the bundle's dev cluster: dfs.permissions.enabled=false), a namespace quota that leaves
no room for another file makes the directory refuse writes instead (quotas are enforced regardless); either way the
test first proves that the job's user cannot write there.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import fsspec
import pytest

from clusterutil import JOB_S, job, needs_yarn, unique, wait_until
from tfyarn import runner
from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState

pytestmark = [*needs_yarn, pytest.mark.timeout(4 * JOB_S)]

OWNER = "datateam"
LINE = re.compile(r"(\w+:\d+): manifest of (\d+) files ready in ([\d.]+)s; this task read (\d+) data bytes "
                  r"indexing (\d+) files")


def webhdfs(method: str, path: str, op: str, data: bytes | None = None, **params: str) -> bytes:
    """One WebHDFS call as ``OWNER`` (CREATE: the NameNode names the DataNode, which takes the bytes)."""
    conf = hdfs.load_hadoop_conf()
    web = conf.get("dfs.namenode.http-address", "127.0.0.1:9870").replace("0.0.0.0", "127.0.0.1")
    q = urllib.parse.urlencode({"op": op, "user.name": OWNER, **params})
    url = f"http://{web}/webhdfs/v1{path}?{q}"
    if op == "CREATE":
        with urllib.request.urlopen(urllib.request.Request(url + "&noredirect=true", method="PUT"), timeout=30) as r:
            url = json.loads(r.read())["Location"]
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=30) as r:
        return r.read()


def dfsadmin(*args: str) -> None:
    subprocess.run([f"{os.environ['HADOOP_HOME']}/bin/hdfs", "dfsadmin", *args], check=True, capture_output=True,
                   timeout=60)


def write_as_owner(path: str, local: Path) -> None:
    webhdfs("PUT", path, "CREATE", local.read_bytes(), overwrite="true", permission="444")


def refuses_our_writes(fs, path: str) -> bool:
    probe = f"{path}/.probe-{os.getpid()}"
    try:
        with fs.open(probe, "wb") as f:
            f.write(b"x")
    except Exception:  # noqa: BLE001 - any refusal is what we want
        return True
    fs.rm(probe)
    return False


def index_lines(yarn, app_id: str, tasks=("chief:0", "worker:0")) -> dict[str, tuple[int, int, float]]:
    """Each training task's own account: {task: (data bytes read, files indexed, seconds to the manifest)}, once
    every task's log has it (aggregated logs of an app that just ended may still be on their way)."""
    def read():
        out = {}
        for line in yarn.logs(app_id):
            m = LINE.search(line)
            if m:
                out[m.group(1)] = (int(m.group(4)), int(m.group(5)), float(m.group(3)))
        return out if set(out) >= set(tasks) else None
    return wait_until(read, 90, f"the index lines of {', '.join(tasks)} in the logs of {app_id}", poll=3)


@pytest.fixture(scope="module")
def read_only_data(yarn, hdfs_root, tmp_path_factory):
    """4 skewed recommender files owned by OWNER in a directory the job's user cannot write to."""
    from tfyarn.data.synth import write_synthetic
    local = tmp_path_factory.mktemp("ro-data")
    write_synthetic(f"file://{local}", kind="recommender", files=4, records=3000, skew=3, seed=7, users=100,
                    items=100)
    url = hdfs.join(hdfs_root, unique("ro-data"))
    fs, path = fsspec.core.url_to_fs(url)
    webhdfs("PUT", path, "MKDIRS", permission="755")
    names = sorted(p.name for p in local.glob("*.tfrecord"))
    for name in names:
        write_as_owner(f"{path}/{name}", local / name)
    webhdfs("PUT", path, "SETPERMISSION", permission="555")
    quota = None
    if not refuses_our_writes(fs, path):                 # permissions off: a full namespace quota refuses instead
        quota = str(1 + len(names))
        dfsadmin("-setQuota", quota, path)
    assert refuses_our_writes(fs, path), f"{url} is writable by the job's user: the test would prove nothing"
    assert fs.info(f"{path}/{names[0]}")["owner"] == OWNER
    yield url, path, local, names, quota
    dfsadmin("-clrQuota", path)


def run_job(yarn, data_url: str, caplog) -> tuple[object, list[str], dict[str, int]]:
    """The job, preflight's notes about indexing, and what this gateway indexed itself (preflight counts the records
    of the smallest files: those indexes are cached for the tasks too)."""
    from tfyarn.data.manifest import STATS
    spec = job(f"{data_url}/*.tfrecord", unique("index"), mode="allreduce", workers=1, epochs=1, batch=100)
    caplog.clear()
    before = STATS.snapshot()
    with caplog.at_level(logging.WARNING, logger="tfyarn.gateway.preflight"):
        st = runner.run(yarn, spec, timeout=JOB_S)
    gateway = {k: v - before[k] for k, v in STATS.snapshot().items()}
    notes = [r.getMessage() for r in caplog.records if "not indexed yet" in r.getMessage()]
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    return st, notes, gateway


def test_read_only_data_is_indexed_once_shared_then_reused_and_a_changed_file_reindexed(yarn, read_only_data,
                                                                                         caplog):
    from tfyarn.data.manifest import DEFAULT_STRIDE, list_data, manifest_entry
    url, path, local, names, quota = read_only_data
    fs, _ = fsspec.core.url_to_fs(url)
    sizes = {n: fs.info(f"{path}/{n}")["size"] for n in names}
    cache = hdfs.join(yarn.staging_dir, "index")

    # 1. cold: the two training tasks split the files, nothing is written beside the data
    st, notes, gw = run_job(yarn, url, caplog)
    assert len(notes) == 1 and "not indexed yet" in notes[0] and f"{cache}" in notes[0], notes
    got = index_lines(yarn, st.app_id)
    assert set(got) == {"chief:0", "worker:0"}, got
    assert sum(files for _, files, _ in got.values()) + gw["files_indexed"] == len(names), (got, gw)
    assert all(files >= 1 for _, files, _ in got.values()), got        # shared: each task indexed some
    read = sum(b for b, _, _ in got.values()) + gw["bytes_read"]
    assert read == sum(sizes.values()) + 12 * len(names), (got, gw)    # each file read once, by one reader
    assert [p for p in fs.ls(path, detail=False) if p.rsplit("/", 1)[-1].startswith(".")] == []
    listing = list_data(f"{url}/*.tfrecord")
    entry = manifest_entry(cache, listing.digest(DEFAULT_STRIDE, "auto", "fail"))
    assert fs.exists(fsspec.core.url_to_fs(entry)[1]), f"no whole-manifest cache at {entry}"

    # 2. cached: a second job reads 0 data bytes before its first step, and preflight has nothing to say
    st2, notes2, gw2 = run_job(yarn, url, caplog)
    got2 = index_lines(yarn, st2.app_id)
    assert got2 and {t: (b, f) for t, (b, f, _) in got2.items()} == {"chief:0": (0, 0), "worker:0": (0, 0)}, got2
    assert notes2 == [] and gw2["bytes_read"] == 0

    # 3. the owner rewrites one file (more records): the next job re-indexes that file only
    from tfyarn.data.synth import write_synthetic
    again = local / "again"
    write_synthetic(f"file://{again}", kind="recommender", files=1, records=900, skew=1, seed=9, users=100,
                    items=100)
    changed = names[1]
    if quota:
        dfsadmin("-clrQuota", path)
    webhdfs("PUT", path, "SETPERMISSION", permission="755")
    write_as_owner(f"{path}/{changed}", next(again.glob("*.tfrecord")))
    webhdfs("PUT", path, "SETPERMISSION", permission="555")
    if quota:
        dfsadmin("-setQuota", quota, path)
    assert refuses_our_writes(fs, path)
    new_size = fs.info(f"{path}/{changed}")["size"]
    assert new_size != sizes[changed]
    st3, _, gw3 = run_job(yarn, url, caplog)
    got3 = index_lines(yarn, st3.app_id)
    assert sum(f for _, f, _ in got3.values()) + gw3["files_indexed"] == 1, (got3, gw3)
    assert sum(b for b, _, _ in got3.values()) + gw3["bytes_read"] == new_size + 12, (got3, gw3)
