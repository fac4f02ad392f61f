#!/usr/bin/env python
"""ParameterServerStrategy data share (issue 39): examples/s of one tf_keras PSS ``fit`` script as a local tfyarn
job (1 ps, 2 workers, the chief coordinating), its ``dataset_fn`` either

* ``tfyarn``: ``tfyarn.data.train_dataset(worker=...)``: each worker's exact share, read by tfyarn's feeder in the
  worker's process and staged on its disk, TF ops reading the staged batches (:mod:`tfyarn.data.staging`);
* ``tfyarn-parquet``: the same, from the same rows as a Parquet table;
* ``tf.data``: the same script on the local TFRecords with TF's own ops (``TFRecordDataset`` → ``batch`` →
  ``parse_example`` → ``repeat``; every worker reads the files, as TF's PSS guide does).

Runs alternate (load drift hits every kind); examples/s counts the epochs after the first (tracing and the first
staged epoch excluded), the medians of ``--runs`` runs are printed as a markdown table, with every run's figure.

Usage: ``python scripts/bench_pss_share.py [--runs 3 --records 200000 --epochs 4 --dir /tmp/tfyarn-bench-pss]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BATCH = 1000
FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}

SCRIPT = """
import json, os, sys, time
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf
import tfyarn, tfyarn.data
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type == "worker":
    tf.distribute.Server(resolver.cluster_spec(), job_name="worker", task_index=resolver.task_id,
                         protocol="grpc", start=True).join()
strategy = tf.distribute.ParameterServerStrategy(resolver)
import tf_keras as keras
with strategy.scope():
    user = keras.Input(shape=(), dtype="int64", name="user_id")
    item = keras.Input(shape=(), dtype="int64", name="item_id")
    x = keras.layers.Concatenate()([keras.layers.Embedding(1000, 16)(user % 1000),
                                    keras.layers.Embedding(1000, 16)(item % 1000)])
    net = keras.Model({"user_id": user, "item_id": item}, keras.layers.Dense(1)(x))
    net.compile(optimizer=keras.optimizers.legacy.Adagrad(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True), steps_per_execution=1)
times = []
class Clock(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.t = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None):
        times.append(time.perf_counter() - self.t)
workers = resolver.cluster_spec().num_tasks("worker")
steps = tfyarn.data.steps_per_epoch() * workers
SPEC = {"label": tf.io.FixedLenFeature([], tf.float32), "user_id": tf.io.FixedLenFeature([], tf.int64),
        "item_id": tf.io.FixedLenFeature([], tf.int64)}
def by_tf(ctx):
    ds = tf.data.Dataset.from_tensor_slices(FILES).interleave(tf.data.TFRecordDataset, cycle_length=2)
    ds = ds.batch(BATCH, drop_remainder=True).map(lambda r: tf.io.parse_example(r, SPEC))
    return ds.map(lambda b: ({"user_id": b["user_id"], "item_id": b["item_id"]}, b["label"])).repeat().prefetch(2)
def by_tfyarn(ctx):
    return tfyarn.data.train_dataset(worker=ctx.input_pipeline_id).repeat()
fn = by_tf if KIND == "tf.data" else by_tfyarn
h = net.fit(keras.utils.experimental.DatasetCreator(fn), epochs=EPOCHS, steps_per_epoch=steps,
            callbacks=[Clock()], verbose=0)
tfyarn.progress(step=EPOCHS * steps, loss=h.history["loss"][-1])
later = times[1:] or times
json.dump({"epoch_s": [round(t, 3) for t in times], "steps_per_epoch": steps,
           "examples_per_sec": round(steps * BATCH / (sum(later) / len(later)), 1)}, open(sys.argv[1], "w"))
"""


def data(root: Path, records: int) -> tuple[list[str], list[str]]:
    """The recommender's TFRecords (8 files, skewed) and the same rows as Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tfyarn.data import Feeder, build_manifest
    from tfyarn.data.synth import write_synthetic

    tfr, pqd = root / "tfrecord", root / "parquet"
    if not (root / "_DONE").exists():
        shutil.rmtree(root, ignore_errors=True)
        write_synthetic(f"file://{tfr}", kind="recommender", files=8, records=records, skew=3, seed=1,
                        users=1000, items=1000)
        pqd.mkdir(parents=True)
        m = build_manifest(f"file://{tfr}/*.tfrecord")
        for k, fi in enumerate(m.files):
            with Feeder(build_manifest(fi.path), FEATURES, fi.records, 0, 1) as f:
                cols = next(iter(f.epoch(0)))
            pq.write_table(pa.table(cols), pqd / f"part-{k:05d}.parquet", row_group_size=8192)
        (root / "_DONE").touch()
    return sorted(str(p) for p in tfr.glob("*.tfrecord")), sorted(str(p) for p in pqd.glob("*.parquet"))


def job(kind: str, files: list[str], work: Path, epochs: int, run_job: Any) -> dict[str, Any]:
    from tfyarn.spec import load_spec_dict

    code, out = work / "code", work / "out.json"
    code.mkdir(parents=True, exist_ok=True)
    head = f"KIND = {kind!r}\nEPOCHS = {epochs}\nBATCH = {BATCH}\nFILES = {files!r}\n"
    (code / "pss_share_bench.py").write_text(head + SCRIPT)
    spec = load_spec_dict({
        "name": f"bench-pss-{kind.replace('.', '')}", "code": str(code), "entrypoint": f"pss_share_bench.py {out}",
        "mode": "ps", "data": {"train": files, "features": FEATURES, "batch_size": BATCH, "epochs": epochs},
        "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 2}},
        "timeouts": {"step": 300, "stall": 300, "rendezvous": 300, "shutdown": 60}})
    r = run_job(spec, work)
    return {"state": r["state"], **(json.loads(out.read_text()) if out.exists() else {})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--dir", default="/tmp/tfyarn-bench-pss")
    a = ap.parse_args()
    from bench_training import run_job

    root = Path(a.dir)
    tfr, pqf = data(root / "data", a.records)
    kinds = {"tfyarn": tfr, "tfyarn-parquet": pqf, "tf.data": tfr}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    load0 = os.getloadavg()
    for i in range(a.runs):
        for kind, files in kinds.items():
            work = root / f"{kind}-{i}"
            shutil.rmtree(work, ignore_errors=True)
            r = job(kind, files, work, a.epochs, run_job)
            runs[kind].append(r)
            print(kind, i, r, flush=True)
    load1 = os.getloadavg()
    print(f"\n### PSS fit, 1 ps + 2 workers + chief (local), {a.records:,} records, batch {BATCH}, {a.epochs} "
          f"epochs, {a.runs} runs alternating (load avg {load0[0]:.1f} → {load1[0]:.1f})\n")
    print("| dataset_fn | examples/s (median) | every run | vs tf.data |")
    print("|---|---:|---|---:|")
    med = {k: statistics.median(r.get("examples_per_sec", 0) for r in v) for k, v in runs.items()}
    for kind, v in runs.items():
        every = ", ".join(f"{r.get('examples_per_sec', 0):,.0f}" + ("" if r["state"] == "SUCCEEDED" else " (failed)")
                          for r in v)
        print(f"| {kind} | {med[kind]:,.0f} | {every} | {med[kind] / med['tf.data']:.2f}x |")


if __name__ == "__main__":
    main()
