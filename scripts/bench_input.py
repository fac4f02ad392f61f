#!/usr/bin/env python
"""Input benchmark for issue 3: tfyarn feeder vs native tf.data, and the epoch boundary under skew.

One run prints three markdown tables (paste them into BENCHMARKS.md, section "Input (issue 3)"):

1. records/s of native ``TFRecordDataset -> batch(1000) -> map(parse_example)`` vs the tfyarn ``Feeder`` (both with
   CRC checks on) over local files (``file://``) and memory (TF's ``ram://`` vs fsspec's ``memory://``);
2. the epoch boundary with 2 and 4 workers on 10x skewed files: steps per worker, records dropped, and how long the
   fastest worker would wait for the slowest at the boundary — tfyarn's plan vs round-robin file sharding;
3. a consumer doing a 2 ms step: does it ever wait on the feeder after warm-up?
4. (issue 28) a variable-length feature (``hist``: 0-10 int64 ids): CPU us/record of ``tf.data`` +
   ``parse_example`` with ``VarLenFeature`` vs the Feeder (C parser), on the same files;
5. (issue 28) the same rows as Parquet: pyarrow's own scan of the same columns
   (``pyarrow.dataset.dataset(...).to_batches(columns=...)``) vs the Feeder's ready batches vs the Feeder over the
   TFRecords; the feeder's memory (RSS growth while reading, and the bound from ``prefetch``).

``--sections speed,boundary,consumer,varlen,parquet`` picks tables (default: all).

Usage: ``python scripts/bench_input.py [--files 16 --records-per-file 50000 --reps 3 --dir /tmp/tfyarn-bench-input]``.
The machine load average is printed with every table: on a shared machine, read the ratios, not the absolutes.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfyarn.data import Feeder, build_manifest, native, plan, write_synthetic
from tfyarn.data.planner import round_robin_steps
from tfyarn.data.synth import SCHEMAS

BATCH = 1000


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def make(dirpath: str, files: int, per_file: int, skew: float, seed: int) -> str:
    marker = Path(dirpath) / f"_DONE_{files}_{per_file}_{skew}_{seed}"
    if not marker.exists():
        shutil.rmtree(dirpath, ignore_errors=True)
        write_synthetic(f"file://{dirpath}", "recommender", files=files, records=files * per_file, skew=skew,
                        seed=seed)
        marker.touch()
    return f"file://{dirpath}"


def native_rate(paths: list[str]) -> tuple[float, float]:
    import tensorflow as tf
    spec = {"label": tf.io.FixedLenFeature([], tf.float32), "user_id": tf.io.FixedLenFeature([], tf.int64),
            "item_id": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.TFRecordDataset(paths).batch(BATCH).map(lambda x: tf.io.parse_example(x, spec))
    t, c, n = time.perf_counter(), time.process_time(), 0
    for b in ds:
        n += int(b["label"].shape[0])
    return n / (time.perf_counter() - t), 1e6 * (time.process_time() - c) / n


_FEEDERS: dict = {}


@contextlib.contextmanager
def loops(python: bool):
    """The Feeder's per-record loops: C (``tfyarn.data.native``, the default) or, with ``python``, the Python/numpy
    loops and TF's parse op, in this process and in framing processes started meanwhile (``TFYARN_NATIVE=0``)."""
    saved = native.records
    if python:
        native.records = None
        os.environ["TFYARN_NATIVE"] = "0"
    try:
        yield
    finally:
        native.records = saved
        os.environ.pop("TFYARN_NATIVE", None)


def feeder_rate(manifest, rank: int = 0, workers: int = 1, epoch: int = 0,
                framing: str = "auto", python: bool = False) -> tuple[float, float, float]:
    """(records/s, seconds, CPU us per record over all threads *and the framing process*).

    One Feeder per (manifest, rank, workers, framing, loops) is kept across calls, as a training job keeps it across
    epochs: its framing process starts once (after a job's first batch), not inside the measured epoch. Each call
    reads the next epoch (a new plan over the same records).
    """
    with loops(python):
        return _feeder_rate(manifest, rank, workers, epoch, framing, python)


def _feeder_rate(manifest, rank: int, workers: int, epoch: int, framing: str,
                 python: bool) -> tuple[float, float, float]:
    key = (id(manifest), rank, workers, framing, python)
    if key not in _FEEDERS:
        _FEEDERS[key] = [Feeder(manifest, SCHEMAS["recommender"], BATCH, rank, workers, framing=framing), epoch]
    f, e = _FEEDERS[key]
    _FEEDERS[key][1] += 1
    it = f.epoch(e)
    first = next(it)                     # starts the framing process on the first call
    t, c = time.perf_counter(), time.process_time()
    c_child = f.framer.cpu_s() if f.framer else 0.0
    n = len(first["label"])
    for b in it:
        n += len(b["label"])
    dt = time.perf_counter() - t
    cpu = time.process_time() - c + (f.framer.cpu_s() if f.framer else 0.0) - c_child
    return n / dt, dt, 1e6 * cpu / n


def to_memory(manifest_url: str, paths: list[str]) -> tuple[str, list[str]]:
    """Copy the files into fsspec's memory:// and TF's ram:// (each pipeline's in-memory filesystem)."""
    import fsspec
    import tensorflow as tf
    mem, ram = [], []
    for p in paths:
        data = open(p, "rb").read()
        name = p.rsplit("/", 1)[1]
        fsspec.filesystem("memory").pipe_file(f"/bench/{name}", data)
        with tf.io.gfile.GFile(f"ram://bench/{name}", "wb") as g:
            g.write(data)
        mem.append(f"memory:///bench/{name}")
        ram.append(f"ram://bench/{name}")
    return "memory:///bench/*", ram


def speed_table(url: str, reps: int) -> None:
    m = build_manifest([f"{url}/part-*"])
    paths = [f.path.removeprefix("file://") for f in m.files]
    mem_glob, ram = to_memory(url, paths)
    mm = build_manifest([mem_glob], use_cache=False)
    native_rate(paths[:1])
    rows = []
    for label, nat_src, man, framing, python in (
            ("file:// (C loops, reader thread: the default)", paths, m, "auto", False),
            ("file:// (Python loops + TF parse, framing process: without the C extension)", paths, m, "auto", True),
            ("memory:// (TF: ram://; C loops)", ram, mm, "auto", False)):
        feeder_rate(man, framing=framing, python=python)   # warm-up: TF import, page cache, parser, framing process
        nat, ours = [], []
        for _ in range(reps):            # interleaved so both see the same machine load
            nat.append(native_rate(nat_src))
            r, _, cpu = feeder_rate(man, framing=framing, python=python)
            ours.append((r, cpu))
        rows.append((label, nat, ours))
    total = m.total_records
    print(f"\n### Throughput: {len(paths)} files x {total // len(paths):,} Examples (label float, user_id int64, "
          f"item_id int64), {m.total_bytes / 1e6:.1f} MB, batch {BATCH}, CRC checks on, median of {reps} "
          f"(load avg {load()})\n")
    print("| source | native tf.data rec/s median (best) | tfyarn Feeder rec/s median (best) | ratio of medians "
          "(of bests) | CPU us/record native / tfyarn |")
    print("|---|---:|---:|---:|---:|")
    for label, nat, ours in rows:
        nm, nb = statistics.median(r for r, _ in nat), max(r for r, _ in nat)
        om, ob = statistics.median(r for r, _ in ours), max(r for r, _ in ours)
        nc, oc = statistics.median(c for _, c in nat), statistics.median(c for _, c in ours)
        print(f"| {label} | {nm:,.0f} ({nb:,.0f}) | {om:,.0f} ({ob:,.0f}) | {om / nm:.2f}x ({ob / nb:.2f}x) | "
              f"{nc:.2f} / {oc:.2f} |")


def boundary_table(url: str) -> None:
    m = build_manifest([f"{url}/part-*"])
    counts = [f.records for f in m.files]
    print(f"\n### Epoch boundary: {len(counts)} files, sizes {min(counts):,}..{max(counts):,} records "
          f"({max(counts) / min(counts):.1f}x skew), {sum(counts):,} records, batch {BATCH} (load avg {load()})\n")
    print("| workers | sharding | steps per worker | records dropped | fastest worker waits at the boundary |")
    print("|---:|---|---|---:|---|")
    for w in (2, 4):
        p = plan(m, w, 0, 0, BATCH)
        times = [min(feeder_rate(m, r, w)[1] for _ in range(2)) for r in range(w)]   # best of 2: less load noise
        rate = p.steps * BATCH / statistics.mean(times)
        print(f"| {w} | tfyarn plan | {', '.join(str(p.steps) for _ in range(w))} | {p.dropped:,} | "
              f"{max(times) - min(times):.2f} s (input time per worker {min(times):.2f}..{max(times):.2f} s) |")
        rr = round_robin_steps(counts, w, BATCH)
        per = [sum(counts[i::w]) for i in range(w)]
        dropped = sum(n - s * BATCH for n, s in zip(per, rr))
        gap = (max(per) - min(per)) / rate
        print(f"| {w} | round-robin files | {', '.join(map(str, rr))} | {dropped:,} | {gap:.2f} s of input alone; "
              f"a synchronous job hangs (the short worker never joins the {max(rr) - min(rr)} extra steps) |")


def consumer_table(url: str, step_ms: float = 2.0) -> None:
    m = build_manifest([f"{url}/part-*"])
    with Feeder(m, SCHEMAS["recommender"], BATCH, 0, 1) as f:
        it = f.epoch(0)
        for _ in range(3):               # warm-up: TF import is done, but the first parse groups fill the queue
            next(it)
        run = f._active
        run.wait_s, run.waits_over_1ms, run.max_wait_s = 0.0, 0, 0.0
        t, n = time.perf_counter(), 0
        for _ in it:
            time.sleep(step_ms / 1000)
            n += 1
        dt = time.perf_counter() - t
        st = f.stats()
    print(f"\n### Consumer with a {step_ms:g} ms step (load avg {load()})\n")
    print("| steps after warm-up | epoch time | ideal (steps x step) | waits > 1 ms | longest wait | total wait |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {n} | {dt:.2f} s | {n * step_ms / 1000:.2f} s | {st['waits_over_1ms']} | "
          f"{st['max_wait_s'] * 1000:.2f} ms | {st['consumer_wait_s'] * 1000:.1f} ms |")


VARLEN = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"},
          "hist": {"dtype": "int64", "shape": [None]}}


def make_varlen(dirpath: str, files: int, per_file: int) -> tuple[list[str], list[str]]:
    """The same rows as TFRecords and as Parquet (row groups of 64k rows): (tfrecord paths, parquet paths)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tfyarn.data import TFRecordWriter
    from tfyarn.data.example import encode_example
    root = Path(dirpath)
    marker = root / f"_DONE_{files}_{per_file}"
    tf_paths = [str(root / f"part-{k:03d}.tfrecord") for k in range(files)]
    pq_paths = [str(root / "pq" / f"part-{k:03d}.parquet") for k in range(files)]
    if marker.exists():
        return tf_paths, pq_paths
    shutil.rmtree(root, ignore_errors=True)
    (root / "pq").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for tp, pp in zip(tf_paths, pq_paths):
        n = per_file
        label = (rng.random(n) < 0.5).astype(np.float32)
        users, items = rng.integers(0, 100_000, n), rng.integers(0, 100_000, n)
        lengths = rng.integers(0, 11, n)
        values = rng.integers(0, 100_000, int(lengths.sum()))
        splits = np.concatenate([[0], np.cumsum(lengths)])
        with TFRecordWriter(f"file://{tp}") as w:
            for i in range(n):
                w.write(encode_example({"label": label[i], "user_id": users[i], "item_id": items[i],
                                        "hist": values[splits[i]:splits[i + 1]]}, {"hist": "int64"}))
        hist = pa.ListArray.from_arrays(pa.array(splits, pa.int32()), pa.array(values, pa.int64()))
        pq.write_table(pa.table({"label": label, "user_id": users, "item_id": items, "hist": hist}), pp,
                       row_group_size=65536)
    marker.touch()
    return tf_paths, pq_paths


def _feeder_pass(manifest, features, epoch: int) -> tuple[float, float, int]:
    """(rows/s, CPU us per row, RSS growth in bytes) of one epoch read by a fresh Feeder (first batch included)."""
    import psutil
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    peak = rss0
    with Feeder(manifest, features, BATCH, 0, 1) as f:
        t, c, n = time.perf_counter(), time.process_time(), 0
        for i, b in enumerate(f.epoch(epoch)):
            n += len(b["label"])
            if i % 50 == 0:
                peak = max(peak, proc.memory_info().rss)
        dt, cpu = time.perf_counter() - t, time.process_time() - c
    return n / dt, 1e6 * cpu / n, peak - rss0


def varlen_table(tf_paths: list[str], reps: int) -> None:
    import tensorflow as tf
    spec = {"label": tf.io.FixedLenFeature([], tf.float32), "user_id": tf.io.FixedLenFeature([], tf.int64),
            "item_id": tf.io.FixedLenFeature([], tf.int64), "hist": tf.io.VarLenFeature(tf.int64)}

    def native() -> tuple[float, float]:
        ds = tf.data.TFRecordDataset(tf_paths).batch(BATCH).map(lambda x: tf.io.parse_example(x, spec))
        t, c, n = time.perf_counter(), time.process_time(), 0
        for b in ds:
            n += int(b["label"].shape[0])
        return n / (time.perf_counter() - t), 1e6 * (time.process_time() - c) / n

    m = build_manifest([f"file://{p}" for p in tf_paths])
    native()
    _feeder_pass(m, VARLEN, 0)                      # warm-up
    nat, ours = [], []
    for e in range(reps):
        nat.append(native())
        ours.append(_feeder_pass(m, VARLEN, e + 1)[:2])
    nr, nc = statistics.median(r for r, _ in nat), statistics.median(c for _, c in nat)
    orr, oc = statistics.median(r for r, _ in ours), statistics.median(c for _, c in ours)
    print(f"\n### Variable-length feature: {len(tf_paths)} files, {m.total_records:,} Examples (label, user_id, "
          f"item_id, hist: 0-10 int64), batch {BATCH}, median of {reps} (load avg {load()})\n")
    print("| path | rec/s | CPU us/record |\n|---|---:|---:|")
    print(f"| tf.data + parse_example (VarLenFeature) | {nr:,.0f} | {nc:.2f} |")
    print(f"| tfyarn Feeder (C parser, SparseValue batches) | {orr:,.0f} | {oc:.2f} |")
    print(f"\nCPU ratio (native / tfyarn): **{nc / oc:.1f}x**; rate ratio {orr / nr:.2f}x")


def parquet_table(tf_paths: list[str], pq_paths: list[str], reps: int) -> None:
    import pyarrow.dataset as ds
    cols = list(VARLEN)

    def arrow_scan() -> tuple[float, float]:
        t, c, n = time.perf_counter(), time.process_time(), 0
        for b in ds.dataset(pq_paths, format="parquet").to_batches(columns=cols):
            n += b.num_rows
        return n / (time.perf_counter() - t), 1e6 * (time.process_time() - c) / n

    mp = build_manifest([f"file://{p}" for p in pq_paths])
    mt = build_manifest([f"file://{p}" for p in tf_paths])
    arrow_scan()
    _feeder_pass(mp, VARLEN, 0)
    _feeder_pass(mt, VARLEN, 0)
    scan, ours, tfr, mem = [], [], [], []
    for e in range(reps):
        scan.append(arrow_scan())
        r, c, grow = _feeder_pass(mp, VARLEN, e + 1)
        ours.append((r, c))
        mem.append(grow)
        tfr.append(_feeder_pass(mt, VARLEN, e + 1)[:2])
    sr, sc = statistics.median(r for r, _ in scan), statistics.median(c for _, c in scan)
    pr, pc = statistics.median(r for r, _ in ours), statistics.median(c for _, c in ours)
    tr, tc = statistics.median(r for r, _ in tfr), statistics.median(c for _, c in tfr)
    row_bytes = 3 * 8 + 5 * 8 * 2 + 8                 # label/ids, ~5 hist ids (values + sparse indices)
    group = BATCH * max(1, round(16384 / BATCH))
    bound = (4 + group // BATCH) * BATCH * row_bytes + 3 * group * row_bytes
    print(f"\n### Parquet: the same {mp.total_records:,} rows, {len(pq_paths)} files, row groups of 65,536, "
          f"columns {', '.join(cols)}, batch {BATCH}, median of {reps} (load avg {load()})\n")
    print("| path | rows/s | CPU us/row | vs pyarrow scan |\n|---|---:|---:|---:|")
    print(f"| pyarrow.dataset to_batches (arrow batches, no numpy) | {sr:,.0f} | {sc:.2f} | 1.00x |")
    print(f"| tfyarn Feeder over Parquet (ready numpy batches) | {pr:,.0f} | {pc:.2f} | {pr / sr:.2f}x |")
    print(f"| tfyarn Feeder over the same rows as TFRecord | {tr:,.0f} | {tc:.2f} | {tr / sr:.2f}x |")
    print(f"\nParquet feeder vs TFRecord feeder: {pr / tr:.2f}x rows/s. Feeder RSS growth while reading "
          f"(median): {statistics.median(mem) / 2**20:.1f} MiB; bound from prefetch 4 and parse groups of {group:,} "
          f"rows: ~{bound / 2**20:.1f} MiB of rows + one arrow chunk per reader (8,192 rows), whatever the row "
          f"group size")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--records-per-file", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--dir", default="/tmp/tfyarn-bench-input")
    ap.add_argument("--sections", default="speed,boundary,consumer,varlen,parquet")
    a = ap.parse_args()
    sections = set(a.sections.split(","))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load avg at start {load()}")
    if sections & {"speed", "consumer"}:
        even = make(f"{a.dir}/even", a.files, a.records_per_file, 1.0, 0)
    if "speed" in sections:
        speed_table(even, a.reps)
    if "boundary" in sections:
        boundary_table(make(f"{a.dir}/skew10", a.files, a.records_per_file, 10.0, 1))
    if "consumer" in sections:
        consumer_table(even)
    if sections & {"varlen", "parquet"}:
        tf_paths, pq_paths = make_varlen(f"{a.dir}/varlen", max(2, a.files // 2), a.records_per_file)
        if "varlen" in sections:
            varlen_table(tf_paths, a.reps)
        if "parquet" in sections:
            parquet_table(tf_paths, pq_paths, a.reps)


if __name__ == "__main__":
    main()
