#!/usr/bin/env python
"""Benchmark of issue 22: what indexing costs each task before its first step, cold and cached, and the planner and
manifest at production scale.

Part 1 (needs a cluster: HADOOP_CONF_DIR): ``--files`` TFRecord files (uneven sizes) written to HDFS and made
read-only for the job's user (owned by another HDFS user, mode 0555; where the cluster does not enforce permissions, a
full namespace quota refuses writes instead — checked before anything is measured). For each backend and each task
count N, a job of N training tasks (chief + N-1 workers, a custom train function that takes one batch) runs twice
against a fresh index cache: cold, then cached. Each task writes its own account: data bytes read indexing, files
indexed, seconds from its process start to the manifest and to its first batch. The gateway's own reads (preflight
counts the records of the smallest files) are reported apart.

Part 0 (needs a cluster's HDFS; issue 28): ``--files`` small files on HDFS indexed cold by this process (8 threads,
as one task does) into a fresh cache dir: the time against the time to read the same bytes (8 threads), the HDFS files
the index cache created (segments + the whole manifest, not one per data file), then a second process's cached build
(no data read). ``--parts 0`` runs it alone.

Part 2 (no cluster): a manifest of ``--plan-files`` files (realistic per-file offsets) planned for ``--plan-workers``
workers: plan time per epoch (CPU and wall), manifest JSON bytes per file, memory of the parsed manifest.

    python scripts/bench_index.py [--files 400] [--tasks 1,2,4,8] [--backends local,yarn] [--json out.json]
    python scripts/bench_index.py --backends none          # part 2 only

Figures depend on the machine's load; byte counts and ratios do not.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

JOB_CODE = '''
import json, os, time
import fsspec, psutil
import tfyarn.train


@tfyarn.train.custom_train
def first_batch(ctx, helpers):
    """Take one batch, then say what it cost (bytes read indexing, seconds from this process's start)."""
    from tfyarn.data.manifest import STATS
    started = psutil.Process().create_time()
    t0 = time.time()
    feeder = helpers.feeder()
    manifest_at = time.time()
    try:
        next(iter(feeder.epoch(0)))
    finally:
        feeder.close()
    first_at = time.time()
    rec = {"task": ctx.task_id, **STATS.snapshot(), "started": started, "train_called": t0,
           "manifest_at": manifest_at, "first_batch_at": first_at,
           "rss_mb": psutil.Process().memory_info().rss / 2**20}
    with fsspec.open(f"{ctx.spec.params['out']}/{ctx.task_id.replace(':', '-')}.json", "wt") as f:
        json.dump(rec, f)
'''

OWNER = "datateam"


def hdfs_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([f"{os.environ['HADOOP_HOME']}/bin/hdfs", *args], capture_output=True, text=True,
                          timeout=120, check=True)


def refuses_writes(fs, path: str) -> bool:
    probe = f"{path}/.probe-{os.getpid()}"
    try:
        with fs.open(probe, "wb") as f:
            f.write(b"x")
    except Exception:  # noqa: BLE001 - refused: what we want
        return True
    fs.rm(probe)
    return False


def write_read_only_data(root: str, files: int, seed: int = 3) -> tuple[str, int]:
    """``files`` recommender shards with sizes spread 1..8x, uploaded, then made read-only. (glob, total bytes)."""
    import fsspec
    from tfyarn.data.synth import write_synthetic
    local = Path(tempfile.mkdtemp(prefix="bench-index-"))
    try:
        write_synthetic(f"file://{local}", kind="recommender", files=files, records=files * 300, skew=8,
                        seed=seed, users=1000, items=1000)
        fs, path = fsspec.core.url_to_fs(root)
        fs.makedirs(path, exist_ok=True)
        fs.put([str(p) for p in sorted(local.glob("*.tfrecord"))], path + "/")
    finally:
        shutil.rmtree(local, ignore_errors=True)
    hdfs_cli("dfs", "-chown", "-R", OWNER, path)
    hdfs_cli("dfs", "-chmod", "-R", "555", path)
    how = "permissions"
    if not refuses_writes(fs, path):
        hdfs_cli("dfsadmin", "-setQuota", str(1 + files), path)
        how = "namespace quota (the cluster does not enforce permissions)"
    if not refuses_writes(fs, path):
        sys.exit(f"bench_index: {root} stays writable; cannot measure a read-only data set")
    total = sum(info["size"] for info in fs.ls(path, detail=True) if info["type"] == "file")
    print(f"data: {files} files, {total:,} bytes in {root}, read-only by {how}", flush=True)
    return f"{root}/*.tfrecord", total


def job_spec(glob: str, n: int, code: str, out: str, cache: str, name: str):
    from tfyarn.spec import load_spec_dict
    roles = {"chief": {"instances": 1, "memory": "1 GiB"}}
    if n > 1:
        roles["worker"] = {"instances": n - 1, "memory": "1 GiB"}
    return load_spec_dict({
        "name": name, "model": "bench_job:first_batch", "mode": "allreduce", "code": code,
        "params": {"out": out},
        "data": {"train": [glob], "batch_size": 1, "epochs": 1, "index_cache": cache,
                 "features": {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"},
                              "item_id": {"dtype": "int64"}}},
        "roles": roles, "environment": {"python": sys.executable},
        "timeouts": {"rendezvous": 600, "stall": 600, "step": 300, "allocation": 600},
        "tags": ["tfyarn-bench-index"]})


def run_case(backend: str, glob: str, total: int, n: int, phase: str, root: str, code: str) -> dict:
    import fsspec
    from tfyarn import api
    from tfyarn.data.manifest import STATS
    out = f"{root}/out/{backend}-{n}-{phase}"
    spec = job_spec(glob, n, code, out, f"{root}/cache-{backend}-{n}", f"bench-index-{backend}-{n}-{phase}")
    before = STATS.snapshot()
    submitted = time.time()
    st = api.run(spec, backend=backend, timeout=1800)
    gateway = STATS.snapshot()["bytes_read"] - before["bytes_read"]
    if st.state.name != "SUCCEEDED":
        raise SystemExit(f"bench_index: {backend} n={n} {phase}: {st.state.name} {st.diagnostics}")
    fs, path = fsspec.core.url_to_fs(out)
    recs = [json.loads(fs.cat_file(p)) for p in fs.ls(path, detail=False) if p.endswith(".json")]
    if len(recs) != n:
        raise SystemExit(f"bench_index: {backend} n={n} {phase}: {len(recs)} task records, not {n}")
    per = [r["bytes_read"] for r in recs]
    res = {
        "backend": backend, "tasks": n, "phase": phase, "app_id": st.app_id, "total_bytes": total,
        "gateway_bytes": gateway, "bytes_per_task_max": max(per), "bytes_per_task_min": min(per),
        "bytes_all_tasks": sum(per), "files_indexed": sum(r["files_indexed"] for r in recs),
        "ratio_max_to_share": round(max(per) / (total / n), 3) if total else None,
        "first_batch_from_task_start_s": sorted(round(r["first_batch_at"] - r["started"], 2) for r in recs),
        "manifest_from_train_call_s": sorted(round(r["manifest_at"] - r["train_called"], 2) for r in recs),
        "first_batch_from_submit_s_max": round(max(r["first_batch_at"] for r in recs) - submitted, 2),
        "rss_mb_max": round(max(r["rss_mb"] for r in recs)),
    }
    print(json.dumps(res), flush=True)
    return res


def part1(args, results: list) -> None:
    import fsspec
    from tfyarn.cluster import hdfs
    from tfyarn.backends.yarn.backend import YarnBackend
    root = hdfs.join(YarnBackend().staging_dir, "bench-index", f"r{time.time_ns() % 10**10}")
    code = tempfile.mkdtemp(prefix="bench-index-code-")
    Path(code, "bench_job.py").write_text(JOB_CODE)
    glob, total = write_read_only_data(f"{root}/data", args.files)
    try:
        for backend in args.backends:
            for n in args.tasks:
                for phase in ("cold", "cached"):
                    results.append(run_case(backend, glob, total, n, phase, root, code))
    finally:
        fs, path = fsspec.core.url_to_fs(root)
        try:
            hdfs_cli("dfsadmin", "-clrQuota", f"{path}/data")
        except subprocess.CalledProcessError:
            pass
        fs.rm(path, recursive=True)
        shutil.rmtree(code, ignore_errors=True)


def part0(files: int) -> dict:
    """Cold index vs reading the bytes, and files created, on the cluster's HDFS (this process, 8 threads)."""
    import fsspec
    from concurrent.futures import ThreadPoolExecutor
    from tfyarn.cluster import hdfs
    from tfyarn.backends.yarn.backend import YarnBackend
    from tfyarn.data import segments
    from tfyarn.data.manifest import STATS, build_manifest
    from tfyarn.data.synth import write_synthetic
    root = hdfs.join(YarnBackend().staging_dir, "bench-index0", f"r{time.time_ns() % 10**10}")
    local = Path(tempfile.mkdtemp(prefix="bench-index0-"))
    fs, path = fsspec.core.url_to_fs(root)
    try:
        write_synthetic(f"file://{local}", kind="recommender", files=files, records=files * 300, skew=8, seed=3,
                        users=1000, items=1000)
        fs.makedirs(f"{path}/data", exist_ok=True)
        fs.put([str(p) for p in sorted(local.glob("*.tfrecord"))], f"{path}/data/")
        urls = sorted(fs.unstrip_protocol(p) for p in fs.ls(f"{path}/data", detail=False))
        total = sum(i["size"] for i in fs.ls(f"{path}/data", detail=True))

        def read_all() -> float:
            t = time.perf_counter()
            with ThreadPoolExecutor(8) as ex:
                got = sum(ex.map(lambda u: len(fsspec.open(u, "rb").open().read()), urls))
            assert got == total
            return time.perf_counter() - t
        read_all()                                           # warm: connections, NameNode, page cache
        t_read = statistics.median(read_all() for _ in range(3))
        cases = {}
        for run in ("cold", "cached"):
            segments._STORES.clear()                         # as a new process would start
            before = STATS.snapshot()
            t = time.perf_counter()
            m = build_manifest(f"{root}/data/*.tfrecord", cache_dir=f"{root}/cache", whole=(run == "cold"))
            dt = time.perf_counter() - t
            took = {k: v - before[k] for k, v in STATS.snapshot().items()}
            cases[run] = {"seconds": round(dt, 2), **took}
            assert m.total_records == files * 300
        res = {"files": files, "bytes": total, "read_bytes_s": round(t_read, 3), "cold": cases["cold"],
               "cached": cases["cached"], "cold_over_read": round(cases["cold"]["seconds"] / t_read, 2),
               "segments": len(fs.ls(f"{path}/cache/segments", detail=False))}
        print(json.dumps(res), flush=True)
        return res
    finally:
        shutil.rmtree(local, ignore_errors=True)
        fs.rm(path, recursive=True)


def part2(files: int, workers: int) -> dict:
    """Planner and manifest at scale, from a synthetic manifest whose files look like real ones."""
    from tfyarn.data.manifest import DEFAULT_STRIDE, MAX_OFFSETS, FileInfo, Manifest
    from tfyarn.data.planner import plan
    rng = random.Random(0)
    infos = []
    for i in range(files):
        records = rng.randint(2_000, 60_000)           # 0.1-4 MB files of ~70-byte records
        rec_bytes = 70
        stride = DEFAULT_STRIDE
        while records // stride + 1 > MAX_OFFSETS:
            stride *= 2
        offsets = tuple(j * stride * rec_bytes for j in range(records // stride + 1) if j * stride < records)
        infos.append(FileInfo(f"hdfs://nameservice1/data/day=2026-11-23/part-{i:06d}.tfrecord", records * rec_bytes,
                              repr(1795500000.0 + i), records, False, stride, offsets, records * rec_bytes))
    m = Manifest(tuple(infos))
    text = m.to_json()
    tracemalloc.start()
    parsed = Manifest.from_json(text)
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert parsed == m
    cpu, wall = [], []
    for epoch in range(3):
        c0, w0 = time.process_time(), time.perf_counter()
        p = plan(m, workers, epoch, 0, 256)
        cpu.append(round(time.process_time() - c0, 3))
        wall.append(round(time.perf_counter() - w0, 3))
    ranges = [len(s) for s in p.shares]
    biggest = max(infos, key=lambda f: f.records)
    res = {"files": files, "workers": workers, "records": m.total_records, "steps_per_epoch": p.steps,
           "plan_cpu_s_per_epoch": cpu, "plan_wall_s_per_epoch": wall,
           "ranges_per_worker_median": statistics.median(ranges), "ranges_per_worker_max": max(ranges),
           "manifest_json_bytes": len(text), "manifest_json_bytes_per_file": round(len(text) / files),
           "largest_file_json_bytes": len(json.dumps(biggest.__dict__ | {"offsets": list(biggest.offsets)})),
           "max_offsets_per_file": MAX_OFFSETS,
           "manifest_parsed_mb": round(cur / 2**20, 1), "manifest_parse_peak_mb": round(peak / 2**20, 1)}
    print(json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--tasks", default="1,2,4,8")
    ap.add_argument("--backends", default="local,yarn", help="comma-separated: local, yarn; 'none' = part 2 only")
    ap.add_argument("--plan-files", type=int, default=100_000)
    ap.add_argument("--plan-workers", type=int, default=1000)
    ap.add_argument("--json", default=None, help="write every result here")
    ap.add_argument("--parts", default="0,1,2", help="which parts to run (0 and 1 need a cluster)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    args.tasks = [int(x) for x in args.tasks.split(",")]
    args.backends = [b for b in args.backends.split(",") if b and b != "none"]
    load = os.getloadavg()
    results: list = []
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)
    if parts & {"0", "1"} and args.backends and not os.environ.get("HADOOP_CONF_DIR"):
        sys.exit("bench_index: parts 0 and 1 need a cluster (HADOOP_CONF_DIR); --parts 2 runs part 2 only")
    index0 = part0(args.files) if "0" in parts and args.backends else None
    if "1" in parts and args.backends:
        part1(args, results)
    scale = part2(args.plan_files, args.plan_workers) if "2" in parts else None
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load, "index0": index0, "cases": results, "scale": scale},
                                              indent=1))


if __name__ == "__main__":
    main()
