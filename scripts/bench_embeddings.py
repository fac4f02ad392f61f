#!/usr/bin/env python
"""Embedding tables in ps mode (issue 37): examples/s and bytes on the ps's wire per step, by table size.

Jobs through the local backend (a process per task, gRPC over 127.0.0.1; 1 ps or 3 ps + a chief, no other
worker), async and sync, for each table size (rows x 64 dims):

* ``plain``: :func:`plain_twin`, the Keras recommender's network (user and item embeddings → concat → Dense relu →
  Dense 1) as a tfyarn ``Model`` with its tables declared by ``tfyarn.train.table``;
* ``keras``: ``tfyarn.models.keras_recommender`` (Keras 3), the same network compiled with the same optimizer.

Both use Adagrad (v1 ``AdagradOptimizer`` in ps mode), batch 1000, ids uniform over 10^7 (modulo the table size),
``ps.min_shard_size`` 64 MiB (the default: the 10^4-row tables stay whole, the 10^6 and 10^7 ones are split over
3 ps). The item table has ``ITEMS`` rows at every size, the user table the size's rows.

Measured per job: examples/s from its summary (train time from the first step); **bytes per step**: the TCP bytes
sent + received by the ps processes over every socket they hold (``ss -tinp``: the kernel's ``bytes_acked`` +
``bytes_received`` per socket of the processes listening on the ps ports; a ps also opens connections itself, to
pull gradients), sampled every 0.2 s, per global step between the chief's progress records (after step 5, before
its last record: no start-up, no final checkpoint). Everything that reaches a ps counts: lookups, gradients, the
step counters, the chief's session calls.

Usage: ``python scripts/bench_embeddings.py [--sizes 10000,1000000,10000000] [--steps 300] [--write]``;
``--before-after OLD_TREE [--repeats 2]``: bench_training's small-table ps and allreduce jobs run from a checkout of
tfyarn before this issue and from this tree, interleaved (examples/s).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Embedding tables in ps mode (issue 37)"
FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}
BATCH = 1000
DIM = 64
ITEMS = 10_000
ID_SPACE = 10_000_000


class PlainTwin:
    """keras_recommender's network as a plain tfyarn Model (same shapes and ops, v1 Adagrad)."""

    def __init__(self, num_users: int, num_items: int, dim: int = DIM, hidden: int = 16, learning_rate: float = 0.05):
        self.nu, self.ni, self.dim, self.hidden, self.lr = num_users, num_items, dim, hidden, learning_rate

    def build(self) -> None:
        import tensorflow as tf

        from tfyarn.train import table

        g = tf.random_uniform_initializer(-0.05, 0.05)
        self.users = table("user_embedding", [self.nu, self.dim], g)
        self.items = table("item_embedding", [self.ni, self.dim], g)
        self.w1 = tf.Variable(g([2 * self.dim, self.hidden]), name="w1")
        self.b1 = tf.Variable(tf.zeros([self.hidden]), name="b1")
        self.w2 = tf.Variable(g([self.hidden, 1]), name="w2")
        self.b2 = tf.Variable(tf.zeros([1]), name="b2")

    def __call__(self, features: dict[str, Any], training: bool) -> Any:
        import tensorflow as tf

        u = tf.nn.embedding_lookup(self.users, tf.math.floormod(features["user_id"], self.nu))
        i = tf.nn.embedding_lookup(self.items, tf.math.floormod(features["item_id"], self.ni))
        h = tf.nn.relu(tf.matmul(tf.concat([u, i], 1), self.w1) + self.b1)
        return tf.matmul(h, self.w2) + self.b2

    def loss(self, labels: Any, predictions: Any) -> Any:
        import tensorflow as tf

        return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.squeeze(predictions, -1))

    def optimizer(self) -> Any:
        import tensorflow as tf

        return tf.compat.v1.train.AdagradOptimizer(self.lr)


def plain_twin(**params: Any) -> PlainTwin:
    return PlainTwin(**params)


def write_data(root: Path, records: int) -> list[str]:
    import numpy as np

    from tfyarn.data import TFRecordWriter
    from tfyarn.data.example import encode_example

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    urls = []
    per = records // 4
    for f in range(4):
        url = str(root / f"part-{f:05d}.tfrecord")
        u, i = rng.integers(0, ID_SPACE, per), rng.integers(0, ID_SPACE, per)
        lab = ((u + i) % 3 == 0).astype("float32")
        with TFRecordWriter(url, compression="none") as w:
            for a, b, c in zip(u.tolist(), i.tolist(), lab.tolist()):
                w.write(
                    encode_example(
                        {
                            "user_id": np.array([a], np.int64),
                            "item_id": np.array([b], np.int64),
                            "label": np.array([c], np.float32),
                        }
                    )
                )
        urls.append(url)
    return urls


def job_spec(files: list[str], work: Path, kind: str, rows: int, ps: int, sync: bool) -> Any:
    from tfyarn.spec import load_spec_dict

    if kind == "plain":
        model, params = "bench_embeddings:plain_twin", {"num_users": rows, "num_items": ITEMS}
    else:
        model = "tfyarn.models.keras_recommender:model"
        params = {"num_users": rows, "num_items": ITEMS, "dim": DIM, "optimizer": "Adagrad", "learning_rate": 0.05}
    mem = "2 GiB" if rows < 5_000_000 else "6 GiB"
    doc = {
        "name": f"emb-{kind}-{rows}-{ps}ps-{'sync' if sync else 'async'}",
        "model": model,
        "params": params,
        "code": str(REPO / "scripts"),
        "mode": "ps",
        "sync": sync,
        "data": {"train": files, "features": FEATURES, "batch_size": BATCH, "epochs": 1},
        # no checkpoint: TF1's Saver gathers every variable on the chief (GBs at 10^7 rows), not what is measured
        "roles": {"ps": {"instances": ps, "memory": mem}, "chief": {"instances": 1, "memory": mem}},
        "timeouts": {"step": 600, "rendezvous": 600},
    }
    return load_spec_dict(doc)


def ps_pids(ports: list[int]) -> set[int]:
    """The processes listening on the ps ports."""
    filt = " or ".join(f"sport = :{p}" for p in ports)
    out = subprocess.run(["ss", "-tlnpH", f"( {filt} )"], capture_output=True, text=True, check=False).stdout
    return {int(x) for x in re.findall(r"pid=(\d+)", out)}


_SEEN: dict[str, int] = {}  # socket (local, peer) → its highest byte count seen: a closed socket keeps its bytes


def ps_bytes(pids: set[int]) -> int:
    """Bytes sent + received by the ps processes over every TCP socket they held so far (both the connections
    workers open to them and those they open to workers: a ps pulls gradients with RecvTensor); a socket closed
    since it was last seen keeps its last count."""
    out = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True, check=False).stdout
    lines = out.splitlines()
    for head, info in zip(lines[::2], lines[1::2]):
        owners = {int(x) for x in re.findall(r"pid=(\d+)", head)}
        if owners & pids:
            key = " ".join(head.split()[2:4]) + str(sorted(owners))
            n = sum(int(x) for x in re.findall(r"bytes_(?:acked|received):(\d+)", info))
            _SEEN[key] = max(_SEEN.get(key, 0), n)
    return sum(_SEEN.values())


def run_one(files: list[str], work: Path, kind: str, rows: int, ps: int, sync: bool) -> dict[str, Any]:
    """One job in this process (the local backend's Launcher), its ps bytes sampled beside it."""
    from tfyarn.runner.attempts import run_attempts
    from tfyarn.runner.local_app import Launcher
    from tfyarn.runner.supervisor import Supervisor

    spec = job_spec(files, work, kind, rows, ps, sync)
    sup = Supervisor(spec, started=time.time())
    # the local backend's application master in this process, minus its preflight
    launchers: list[Any] = [Launcher(spec, work / "app", f"local-bench-{work.name}", supervisor=sup)]

    _SEEN.clear()
    samples: list[tuple[float, int]] = []  # (time, ps bytes)
    summary: dict[str, Any] = {}
    progress: dict[float, int] = {}  # the chief's progress records: time → global step
    stop = threading.Event()

    def watch() -> None:
        pids: set[int] = set()
        while not stop.is_set():
            kv = launchers[-1].kv if launchers else None
            if kv is not None:
                if len(pids) < ps:
                    addrs = kv.store.items("addr/ps:")
                    ports = [int(a.rsplit(":", 1)[1]) for a in addrs.values()]
                    pids = ps_pids(ports) if len(ports) == ps else set()
                got = kv.store.items("summary")
                if got.get("summary"):
                    summary.update(json.loads(got["summary"]))
                rec = kv.store.items("progress/chief:0").get("progress/chief:0")
                if rec:
                    r = json.loads(rec)
                    progress[float(r["time"])] = int(r.get("global_step") or 0)
                if len(pids) == ps:
                    samples.append((time.time(), ps_bytes(pids)))
            stop.wait(0.2)

    th = threading.Thread(target=watch, daemon=True)
    t0 = time.time()
    th.start()
    status = run_attempts(launchers[0], sup)
    stop.set()
    th.join()
    kv = launchers[-1].kv if launchers else None
    if not summary and kv is not None and kv.store.items("summary").get("summary"):
        summary.update(json.loads(kv.store.items("summary")["summary"]))
    state = str(getattr(status.state, "value", status.state))
    return {
        "kind": kind,
        "rows": rows,
        "ps": ps,
        "sync": sync,
        "state": state,
        "wall_s": round(time.time() - t0, 1),
        "examples_per_s": summary.get("examples_per_sec"),
        **bytes_per_step(samples, progress),
        "diagnostics": "" if state == "SUCCEEDED" else str(getattr(status, "diagnostics", "")),
    }


def bytes_per_step(samples: list[tuple[float, int]], progress: dict[float, int]) -> dict[str, Any]:
    """ps bytes per global step between the chief's first progress record past step 5 and its last but one (the
    last is written at the end, next to the final checkpoint's reads), bytes interpolated at those times."""
    recs = sorted((t, gs) for t, gs in progress.items() if gs >= 5)
    if len(recs) >= 3:
        recs = recs[:-1]
    if len(recs) < 2 or len(samples) < 2 or recs[-1][1] <= recs[0][1]:
        return {"bytes_per_step": None, "steps_measured": None}

    def at(t: float) -> float:
        before = [s for s in samples if s[0] <= t] or samples[:1]
        after = [s for s in samples if s[0] >= t] or samples[-1:]
        (t0, b0), (t1, b1) = before[-1], after[0]
        return b0 if t1 == t0 else b0 + (b1 - b0) * (t - t0) / (t1 - t0)

    (ta, ga), (tb, gb) = recs[0], recs[-1]
    return {"bytes_per_step": (at(tb) - at(ta)) / (gb - ga), "steps_measured": [ga, gb]}


BEFORE_AFTER = """
import json, sys
from pathlib import Path
sys.path.insert(0, {scripts!r})
from bench_training import job_spec, run_job
data = json.loads({data!r})
work = Path({work!r})
job = run_job(job_spec(data, work, {mode!r}, {workers}, ps={ps}, epochs=2), work)
print(json.dumps({{"state": job["state"], "eps": (job.get("summary") or {{}}).get("examples_per_sec")}}))
"""


def before_after(old_tree: str, work: Path, repeats: int) -> list[dict[str, Any]]:
    """bench_training's jobs (the small-table recommender, 1000-row tables, batch 1000, 2 epochs of 200,000
    records) in ps and allreduce mode, run from ``old_tree`` (tfyarn before this issue) and from this tree,
    interleaved: examples/s of each from its summary."""
    from tfyarn.data import write_synthetic

    data = write_synthetic(str(work / "data"), "recommender", files=16, records=200_000, skew=10.0, overwrite=True)
    out = []
    for rep in range(repeats):
        for mode, workers, ps in (("ps", 1, 1), ("ps", 2, 1), ("allreduce", 1, 0), ("allreduce", 2, 0)):
            for label, tree in (("before", old_tree), ("after", str(REPO))):
                w = work / f"{label}-{mode}-{workers}-{rep}"
                code = BEFORE_AFTER.format(
                    scripts=f"{tree}/scripts", data=json.dumps(data), work=str(w), mode=mode, workers=workers, ps=ps
                )
                env = {**os.environ, "PYTHONPATH": tree}
                proc = subprocess.run(
                    [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tree, check=False
                )
                last = (proc.stdout.strip().splitlines() or ["{}"])[-1]
                r = {"tree": label, "mode": mode, "workers": workers, "rep": rep, **json.loads(last)}
                print(json.dumps(r), flush=True)
                out.append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before-after", metavar="OLD_TREE", help="compare bench_training's small-table jobs")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sizes", default="10000,1000000,10000000")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--kinds", default="plain,keras")
    ap.add_argument("--ps", default="1,3")
    ap.add_argument("--modes", default="async,sync")
    ap.add_argument("--workdir")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-emb-"))
    if a.before_after:
        rows_ba = before_after(a.before_after, work, a.repeats)
        (work / "before_after.json").write_text(json.dumps(rows_ba, indent=1))
        return
    files = write_data(work / "data", a.steps * BATCH)
    rows = []
    for size in [int(x) for x in a.sizes.split(",")]:
        for ps in [int(x) for x in a.ps.split(",")]:
            for mode in a.modes.split(","):
                for kind in a.kinds.split(","):
                    tag = f"{kind}-{size}-{ps}-{mode}"
                    r = run_one(files, work / tag, kind, size, ps, mode == "sync")
                    r["load"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
                    print(json.dumps(r), flush=True)
                    rows.append(r)
    (work / "results.json").write_text(json.dumps(rows, indent=1))
    print(report(rows))
    if a.write:
        write_section(report(rows), REPO / "BENCHMARKS.md")


def report(rows: list[dict[str, Any]]) -> str:
    def key(r: dict[str, Any]) -> tuple:
        return (r["kind"], r["ps"], r["sync"])

    base = {key(r): r for r in rows if r["rows"] == min(x["rows"] for x in rows)}
    plain = {(r["rows"], r["ps"], r["sync"]): r for r in rows if r["kind"] == "plain"}
    lines = [
        "| model | ps | mode | rows | examples/s | vs 10^4 | ps bytes/step | vs 10^4 | keras/plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["kind"], r["ps"], r["sync"], r["rows"])):
        b = base.get(key(r)) or {}
        eps, bps = r["examples_per_s"], r["bytes_per_step"]
        tw = plain.get((r["rows"], r["ps"], r["sync"])) or {}
        ratio = f"{eps / tw['examples_per_s']:.2f}" if r["kind"] != "plain" and eps and tw.get("examples_per_s") else ""
        lines.append(
            f"| {r['kind']} | {r['ps']} | {'sync' if r['sync'] else 'async'} | {r['rows']:,} | "
            f"{eps:,.0f} | {eps / b['examples_per_s']:.2f} | {bps:,.0f} | {bps / b['bytes_per_step']:.2f} | {ratio} |"
            if eps and bps and b.get("examples_per_s") and b.get("bytes_per_step")
            else f"| {r['kind']} | {r['ps']} | {'sync' if r['sync'] else 'async'} | {r['rows']:,} | "
            f"{r['state']}: {eps} | | {bps} | | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def write_section(table: str, path: Path) -> None:
    doc = path.read_text()
    text = f"{SECTION}\n\n{table}"
    if SECTION in doc:
        head, rest = doc.split(SECTION, 1)
        nxt = rest.find("\n## ")
        notes = re.search(r"<!-- notes:emb .*?<!-- /notes:emb -->", rest[:nxt] if nxt >= 0 else rest, re.S)
        if notes:
            text = text.rstrip("\n") + "\n\n" + notes.group(0) + "\n"
        doc = head + text.rstrip("\n") + ("\n" + rest[nxt:] if nxt >= 0 else "\n")
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    path.write_text(doc)


if __name__ == "__main__":
    main()
