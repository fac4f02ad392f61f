"""Batch scoring speed (issue 38): ``python scripts/bench_predict.py [--rows N] [--reps K] [--write]``.

1. **One tfyarn worker vs a single process**: rows/s of ``tfyarn.predict``'s worker (the task's own code,
   :func:`tfyarn.predict.job.run`, in this process: reader thread → model → writer thread) against the plain way in
   one process: ``tf.saved_model.load`` + ``tf.data`` (``TFRecordDataset → batch → parse_example → prefetch``) → the
   signature → ``pyarrow.parquet.ParquetWriter``, on the same TFRecord files, same batch, same SavedModel. For
   Parquet input the plain way is ``pyarrow`` ``iter_batches`` → the signature → the writer (TF reads no Parquet).
   Both are timed from their first read to the output closed (model load and manifest excluded), alternating
   runs in one process (load drift hits both). Goal: tfyarn ≥ 1×.
2. **Scaling 1 → 3 workers** on the local backend (real processes): the job's wall time from submit to the end and
   the rows/s of the scoring itself (input rows / the longest worker's scoring time).

``--write`` replaces the section in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SECTION = "## Batch scoring (issue 38)"
FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}
INPUTS = {"user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}


def make_data(root: Path, rows: int) -> tuple[str, str, str]:
    """The recommender's SavedModel (tfyarn's export code), ``rows`` records as TFRecords and the same as Parquet."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    from tfyarn.data import build_manifest, write_synthetic
    from tfyarn.data.parse import default_parser, schema
    from tfyarn.data.tfrecord import iter_chunks
    from tfyarn.models.recommender import Recommender
    from tfyarn.spec import Feature
    from tfyarn.train.export import serving_module
    from tfyarn.train.model import build_model

    model = build_model(Recommender(num_users=100_000, num_items=100_000, dim=32))
    module, fn = serving_module(model, {k: Feature(**v) for k, v in FEATURES.items()}, "label")
    tf.saved_model.save(module, str(root / "model"), signatures={"serving_default": fn})
    files = write_synthetic(str(root / "tfrecord"), "recommender", files=8, records=rows, skew=2.0, seed=1,
                            users=100_000, items=100_000)
    parse = default_parser(schema(FEATURES))
    (root / "parquet").mkdir()
    import pyarrow as pa

    for fi in build_manifest(files).files:
        pays = [p for c in iter_chunks(fi.path, 0, fi.records) for p in c.payloads]
        cols = parse(pays)
        name = fi.path.rsplit("/", 1)[-1].replace(".tfrecord", "") + ".parquet"
        pq.write_table(pa.table(cols), root / "parquet" / name, row_group_size=65536)
    return str(root / "model"), str(root / "tfrecord"), str(root / "parquet")


def plain_tfdata(model: str, data: str, out: str, batch: int) -> tuple[int, float]:
    """The single-process way over TFRecords: tf.data → the signature → a Parquet writer."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    sig = tf.saved_model.load(model).signatures["serving_default"]
    files = sorted(str(p) for p in Path(data).iterdir() if not p.name.startswith((".", "_")))
    spec = {"user_id": tf.io.FixedLenFeature([], tf.int64), "item_id": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.TFRecordDataset(files).batch(batch).map(lambda s: tf.io.parse_example(s, spec))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    t0 = time.perf_counter()
    n, writer = 0, None
    for feats in ds:
        pred = sig(**feats)["predictions"].numpy()
        t = pa.table({"user_id": feats["user_id"].numpy(), "item_id": feats["item_id"].numpy(), "predictions": pred})
        writer = writer or pq.ParquetWriter(out, t.schema)
        writer.write_table(t)
        n += len(pred)
    writer.close()
    return n, time.perf_counter() - t0


def plain_pyarrow(model: str, data: str, out: str, batch: int) -> tuple[int, float]:
    """The single-process way over Parquet: pyarrow batches → the signature → a Parquet writer."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    sig = tf.saved_model.load(model).signatures["serving_default"]
    files = sorted(str(p) for p in Path(data).iterdir() if p.suffix == ".parquet")
    t0 = time.perf_counter()
    n, writer = 0, None
    for path in files:
        for b in pq.ParquetFile(path).iter_batches(batch_size=batch, columns=["user_id", "item_id"]):
            u, i = b.column(0).to_numpy(), b.column(1).to_numpy()
            pred = sig(user_id=tf.constant(u), item_id=tf.constant(i))["predictions"].numpy()
            t = pa.table({"user_id": u, "item_id": i, "predictions": pred})
            writer = writer or pq.ParquetWriter(out, t.schema)
            writer.write_table(t)
            n += len(pred)
    writer.close()
    return n, time.perf_counter() - t0


def tfyarn_worker(model: str, data: str, out: str, batch: int, workdir: Path) -> tuple[int, float]:
    """One tfyarn scoring worker, its own code in this process (KV in memory): rows and scoring seconds."""
    import shutil

    from tfyarn.predict.job import run
    from tfyarn.tasklib.context import TaskContext
    from tfyarn.tasklib.kv import MemoryKV
    from tfyarn.spec import load_spec_dict

    shutil.rmtree(out, ignore_errors=True)
    spec = load_spec_dict(_doc(model, data, out, batch, 1))
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(workdir / "model", ignore_errors=True)
    figures = run(TaskContext(spec=spec, role="worker", index=0, kv=MemoryKV(), workdir=workdir))
    return figures["rows_out"], figures["rows_out"] / figures["rows_per_sec"]


def _doc(model: str, data: str, out: str, batch: int, workers: int) -> dict[str, Any]:
    return {"name": "bench-predict", "job": "predict",
            "predict": {"saved_model": model, "input": data, "output": out, "features": INPUTS,
                        "keep": ["user_id", "item_id"], "batch_size": batch, "part_rows": 250_000},
            "roles": {"worker": {"instances": workers, "memory": "2 GiB"}}}


def scaling(model: str, data: str, root: Path, batch: int, workers: int) -> dict[str, Any]:
    """A real local job of ``workers`` workers: wall time and the scoring's rows/s (from the workers' logs)."""
    from tfyarn import api
    from tfyarn.spec import load_spec_dict

    out = str(root / f"scale-{workers}")
    t0 = time.perf_counter()
    st = api.predict(load_spec_dict(_doc(model, data, out, batch, workers)), "local", overwrite=True, timeout=1800)
    wall = time.perf_counter() - t0
    assert st.state.value == "SUCCEEDED", st.diagnostics
    secs = []
    for t in st.tasks:
        text = Path(t.log).read_text() if t.log and Path(t.log).exists() else ""
        for m in re.finditer(r'tfyarn.predict: worker:\d+: (\{"task".*\})', text):
            d = json.loads(m.group(1))
            secs.append(d["rows_out"] / d["rows_per_sec"] if d["rows_per_sec"] else 0.0)
    rows = st.summary["rows_out"]
    return {"workers": workers, "rows": rows, "wall_s": round(wall, 2),
            "scoring_rows_per_s": round(rows / max(secs), 0) if secs else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    model, tfr, pqt = make_data(root, args.rows)
    load0 = os.getloadavg()[0]
    kinds = ("plain_tfdata", "tfyarn_tfrecord", "plain_pyarrow", "tfyarn_parquet")
    res: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(args.reps):
        for name, fn in (
            ("plain_tfdata", lambda: plain_tfdata(model, tfr, str(root / "plain.parquet"), args.batch)),
            ("tfyarn_tfrecord", lambda: tfyarn_worker(model, tfr, str(root / "o1"), args.batch, root / "w")),
            ("plain_pyarrow", lambda: plain_pyarrow(model, pqt, str(root / "plain2.parquet"), args.batch)),
            ("tfyarn_parquet", lambda: tfyarn_worker(model, pqt, str(root / "o2"), args.batch, root / "w")),
        ):
            n, s = fn()
            assert n == args.rows, (name, n)
            res[name].append(n / s)
            print(f"rep {rep} {name}: {n / s:,.0f} rows/s ({s:.2f} s)", flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    scale = [scaling(model, pqt, root, args.batch, w) for w in (1, 3)]
    load1 = os.getloadavg()[0]
    report = {"rows": args.rows, "batch": args.batch, "reps": args.reps, "median_rows_per_s": med,
              "ratio_tfrecord": med["tfyarn_tfrecord"] / med["plain_tfdata"],
              "ratio_parquet": med["tfyarn_parquet"] / med["plain_pyarrow"], "scaling": scale,
              "load": [round(load0, 1), round(load1, 1)]}
    print(json.dumps(report, indent=1))
    if args.write:
        write_section(report, res)


def write_section(r: dict[str, Any], res: dict[str, list[float]]) -> None:
    fmt = lambda v: ", ".join(f"{x:,.0f}" for x in v)  # noqa: E731
    m = r["median_rows_per_s"]
    s1, s3 = r["scaling"]
    lines = [
        SECTION,
        "",
        f"`scripts/bench_predict.py --rows {r['rows']} --batch {r['batch']} --reps {r['reps']}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}, load average {r['load'][0]} before / {r['load'][1]} after; the "
        f"built-in recommender's SavedModel, 100k x 32 embeddings; output Parquet with the two id columns kept).",
        "",
        "| one process, same files, same batch | rows/s (median) | each run |",
        "|---|---|---|",
        f"| plain: `tf.data` TFRecordDataset → parse_example → signature → ParquetWriter | {m['plain_tfdata']:,.0f} | "
        f"{fmt(res['plain_tfdata'])} |",
        f"| tfyarn worker, TFRecord input | {m['tfyarn_tfrecord']:,.0f} | {fmt(res['tfyarn_tfrecord'])} |",
        f"| plain: pyarrow iter_batches → signature → ParquetWriter | {m['plain_pyarrow']:,.0f} | "
        f"{fmt(res['plain_pyarrow'])} |",
        f"| tfyarn worker, Parquet input | {m['tfyarn_parquet']:,.0f} | {fmt(res['tfyarn_parquet'])} |",
        "",
        f"Ratio tfyarn / plain: **{r['ratio_tfrecord']:.2f}x** on TFRecords, **{r['ratio_parquet']:.2f}x** on Parquet "
        "(goal ≥ 1x).",
        "",
        "| local backend, Parquet input | job wall time (submit → end) | scoring rows/s (rows / the slowest worker) |",
        "|---|---|---|",
        f"| 1 worker | {s1['wall_s']} s | {s1['scoring_rows_per_s']:,.0f} |",
        f"| 3 workers | {s3['wall_s']} s | {s3['scoring_rows_per_s']:,.0f} |",
        "",
    ]
    path = REPO / "BENCHMARKS.md"
    text = path.read_text()
    block = "\n".join(lines)
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + block + ("\n" + text[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)
    print(f"wrote {SECTION!r} in {path}")


if __name__ == "__main__":
    main()
