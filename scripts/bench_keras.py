"""Keras models in tfyarn (issue 27), run by ``scripts/bench_training.py --only keras [--write]``:

1. **Adapter cost per mode**: the same network (user and item embeddings → concat → Dense relu → Dense 1,
   Adam) as a compiled Keras 3 model through tfyarn's adapter and as a plain ``tfyarn.train.Model`` (v1
   Adam), stepped by tfyarn's own fed steps on the same in-memory batches, alternating blocks of steps in
   one process per mode (load drift hits both): ps style (TF1 graph, placeholders, ``Session`` callable;
   the Keras optimizer's v1 twin), ps with tfyarn's real graph (``ps.graph.build_graph``, a ps server in
   another process) and allreduce (MultiWorkerMirroredStrategy, 1 worker, tfyarn's ``make_step``; the
   Keras optimizer itself). Goal: ≤ 1.1×.
2. **examples/s**: tfyarn jobs (local backend, 1 training worker, allreduce and ps) training the Keras
   model against Keras 3's own single-process ``model.fit`` on ``TFRecordDataset → batch → parse_example
   → prefetch`` over the same files, same batch. Goal: tfyarn ≥ fit. Both exclude start-up and tracing
   (tfyarn: the summary's train time; fit: epochs after the first). For ps mode, Keras's own ps mode too:
   tf_keras ``ParameterServerStrategy`` ``fit`` on the same model and files (:data:`PSS_SCRIPT`).
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}
BATCH = 1000
PARAMS = {"num_users": 1000, "num_items": 1000, "dim": 16, "hidden": 16, "learning_rate": 0.01}
SECTION = "## Keras models (issue 27)"
PASSES = 4          # a block = 4 passes over the 60 batches: ~0.25 s, long enough that one scheduling hiccup is noise


class PlainTwin:
    """The Keras model's network as a plain tfyarn Model (same shapes, same ops, Adam)."""

    def __init__(self, num_users: int, num_items: int, dim: int, hidden: int, learning_rate: float):
        self.nu, self.ni, self.dim, self.hidden, self.lr = num_users, num_items, dim, hidden, learning_rate

    def build(self) -> None:
        import tensorflow as tf
        g = tf.random_normal_initializer(stddev=0.05, seed=1)
        self.users = tf.Variable(g([self.nu, self.dim]), name="users")
        self.items = tf.Variable(g([self.ni, self.dim]), name="items")
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
        return tf.compat.v1.train.AdamOptimizer(self.lr, epsilon=1e-7)    # the plain contract: v1, both modes


def _spec(files: list[str]) -> Any:
    from tfyarn.spec import load_spec_dict
    return load_spec_dict({"name": "bench-keras", "model": "tfyarn.models.keras_recommender:model",
                           "params": PARAMS, "mode": "allreduce",
                           "data": {"train": files, "features": FEATURES, "batch_size": BATCH}})


def _batches(files: list[str], n: int) -> list[dict[str, Any]]:
    from tfyarn.data import Feeder, build_manifest
    with Feeder(build_manifest(files), FEATURES, BATCH, 0, 1) as feeder:
        out = []
        for b in feeder.epoch(0):
            out.append(b)
            if len(out) == n:
                return out
    return out


def _alternate(steps: dict[str, Any], batches: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    """Time blocks of steps of each model in turn; per model: step ms (mean over every block)."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    for fn in steps.values():                        # warm-up (first call, caches)
        for b in batches[:5]:
            fn(b)
    block = batches * PASSES
    for _ in range(rounds):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            for b in block:
                fn(b)
            times[name].append((time.perf_counter() - t0) / len(block) * 1000)
    means = {k: statistics.mean(v) for k, v in times.items()}
    medians = {k: statistics.median(v) for k, v in times.items()}    # robust to another process's load burst
    return {"step_ms": {k: round(v, 3) for k, v in medians.items()},
            "ratio": round(medians["keras"] / medians["plain"], 3),
            "ratio_of_means": round(means["keras"] / means["plain"], 3),
            "ratio_blocks": [round(k / p, 3) for k, p in zip(times["keras"], times["plain"])]}


def _fed(call: Any, names: list[str]) -> Any:
    """A Session callable fed one batch dict (placeholders in ``names`` order)."""
    def step(batch: dict[str, Any]) -> Any:
        return call(*[batch[n] for n in names])
    return step


def micro(mode: str, files: list[str], rounds: int = 10) -> dict[str, Any]:
    """In a child process: the adapter's step against the plain twin's, tfyarn's own fed step of ``mode``."""
    import tensorflow as tf

    from tfyarn.train.model import build_model, input_signature, load
    spec = _spec(files)
    batches = _batches(files, 60)
    steps: dict[str, Any] = {}
    if mode == "allreduce":
        from tfyarn.train.allreduce import make_step
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        sig = input_signature(spec.data.features, BATCH)
        for name in ("keras", "plain"):
            with strategy.scope():
                model = load(spec.model, spec.params, data=spec.data) if name == "keras" else PlainTwin(**PARAMS)
                build_model(model)
                opt = model.optimizer()
                gs = tf.Variable(0, dtype=tf.int64, trainable=False,
                                 aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            steps[name] = make_step(strategy, model, opt, gs, sig, "label", BATCH)
        return _alternate(steps, batches, rounds)
    sessions = []
    for name in ("keras", "plain"):
        model = load(spec.model, spec.params, data=spec.data) if name == "keras" else PlainTwin(**PARAMS)
        g = tf.Graph()
        with g.as_default():
            build_model(model)
            ph = {n: tf.compat.v1.placeholder(tf.int64 if n != "label" else tf.float32, [None], name=n)
                  for n in FEATURES}
            loss = tf.reduce_mean(model.loss(ph["label"], model({k: v for k, v in ph.items() if k != "label"},
                                                                 True)))
            train = model.optimizer().minimize(loss, var_list=model.trainable_variables)
            sess = tf.compat.v1.Session(graph=g)
            sess.run(tf.compat.v1.global_variables_initializer())
            names = list(ph)
            call = sess.make_callable([train, loss], feed_list=[ph[n] for n in names])
        sessions.append(sess)
        steps[name] = _fed(call, names)
    return _alternate(steps, batches, rounds)


def micro_ps_graph(files: list[str], rounds: int = 10) -> dict[str, Any]:
    """In a child process: tfyarn's real ps-mode graph (``ps.graph.build_graph``: placement on a ps, the train op,
    counters, metrics fetched with the loss) for each model, a ps server in another process (gRPC over 127.0.0.1),
    the step fed as the ps loop feeds it; blocks alternating as in :func:`micro`."""
    import os
    import socket
    import types

    from tfyarn.spec import load_spec_dict
    from tfyarn.train.inputs import feed_values
    from tfyarn.train.model import load
    from tfyarn.train.ps.graph import build_graph
    from tfyarn.train.ps.server import start_server
    from tfyarn.train.ps.session import open_session

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    cluster = {"ps": [f"127.0.0.1:{port()}"], "chief": [f"127.0.0.1:{port()}"]}
    ps = subprocess.Popen([sys.executable, "-c", "import tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec("
                           f"{cluster!r}), job_name='ps', task_index=0, start=True).join()"],
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        spec = load_spec_dict({"name": "bench-keras-ps", "model": "tfyarn.models.keras_recommender:model",
                               "params": PARAMS, "mode": "ps", "roles": {"chief": {"instances": 1},
                                                                        "ps": {"instances": 1}},
                               "data": {"train": files, "features": FEATURES, "batch_size": BATCH}})
        batches = _batches(files, 60)
        steps: dict[str, Any] = {}
        server = None
        for name in ("keras", "plain"):
            model = load(spec.model, spec.params, data=spec.data) if name == "keras" else PlainTwin(**PARAMS)
            ctx = types.SimpleNamespace(spec=spec, cluster=cluster, role="chief", index=0, num_data_workers=1,
                                        data_rank=0, task_id="chief:0", is_chief=True, kv=None)
            server = server or start_server(ctx)
            tg = build_graph(ctx, model)
            with tg.graph.as_default():
                sess = open_session(ctx, tg, server, None)
            names = list(tg.placeholders)
            call = sess.make_callable([tg.train_op, tg.loss, *tg.metrics.values()],
                                      feed_list=[p for n in names for p in tg.feeds[n]])
            steps[name] = (lambda c, ns, fs: lambda b: c(*feed_values(b, ns, fs)))(call, names, tg.feeds)
        return _alternate(steps, batches, rounds)
    finally:
        ps.kill()
        ps.wait()


def keras_fit(files: list[str], epochs: int = 3) -> dict[str, Any]:
    """In a child process: Keras 3's own single-process fit on tf.data over ``files``."""
    import tensorflow as tf

    from tfyarn.models.keras_recommender import model as make
    spec = {"label": tf.io.FixedLenFeature([], tf.float32), "user_id": tf.io.FixedLenFeature([], tf.int64),
            "item_id": tf.io.FixedLenFeature([], tf.int64)}

    def split(b: Any) -> Any:
        p = tf.io.parse_example(b, spec)
        return {"user_id": p["user_id"], "item_id": p["item_id"]}, p["label"]

    ds = (tf.data.TFRecordDataset(files).batch(BATCH, drop_remainder=True).map(split)
          .prefetch(tf.data.AUTOTUNE))
    net = make(**PARAMS)
    import keras
    times: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            times.append(time.perf_counter() - self.t)

    net.fit(ds, epochs=epochs, verbose=0, callbacks=[Clock()])
    steps = sum(1 for _ in ds)
    later = times[1:] or times
    return {"epoch_s": [round(t, 3) for t in times], "steps_per_epoch": steps,
            "examples_per_sec": round(steps * BATCH / statistics.mean(later), 1)}


#: tf_keras's own ps mode (ParameterServerStrategy ``fit``, the docs' pss_fit.py) on the same model and data,
#: timing its epochs after the first as :func:`keras_fit` does; argv: the JSON file to write its figures to.
PSS_SCRIPT = """
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
from tfyarn.models.keras_recommender import model as make
with strategy.scope():
    net = make(**PARAMS, keras="tf_keras")
times = []
class Clock(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.t = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None):
        times.append(time.perf_counter() - self.t)
steps = tfyarn.data.steps_per_epoch() * resolver.cluster_spec().num_tasks("worker")
fn = lambda ctx: tfyarn.data.train_dataset(worker=ctx.input_pipeline_id).repeat()
h = net.fit(keras.utils.experimental.DatasetCreator(fn), epochs=EPOCHS, steps_per_epoch=steps,
            callbacks=[Clock()], verbose=0)
tfyarn.progress(step=EPOCHS * steps, loss=h.history["loss"][-1])
later = times[1:] or times
json.dump({"epoch_s": [round(t, 3) for t in times], "steps_per_epoch": steps,
           "examples_per_sec": round(steps * BATCH / (sum(later) / len(later)), 1)}, open(sys.argv[1], "w"))
"""


def pss_job(files: list[str], work: Path, run_job: Any, epochs: int = 3) -> dict[str, Any]:
    """tf_keras's ParameterServerStrategy ``fit`` as a tfyarn entrypoint job: 1 ps, 1 worker, the chief
    coordinating (3 processes; PSS has no fewer), each worker reading its share of the same files."""
    from tfyarn.spec import load_spec_dict
    code, out = work / "pss-code", work / "pss.json"
    code.mkdir(parents=True, exist_ok=True)
    (code / "pss_bench.py").write_text(f"PARAMS = {PARAMS!r}\nEPOCHS = {epochs}\nBATCH = {BATCH}\n" + PSS_SCRIPT)
    spec = load_spec_dict({
        "name": "bench-keras-pss", "code": str(code), "entrypoint": f"pss_bench.py {out}", "mode": "ps",
        "data": {"train": files, "features": FEATURES, "batch_size": BATCH, "epochs": epochs},
        "roles": {r: {"instances": 1, "memory": "1 GiB"} for r in ("ps", "chief", "worker")},
        "timeouts": {"step": 120, "stall": 120, "rendezvous": 120, "shutdown": 60}})
    r = run_job(spec, work)
    return {"state": r["state"], **(json.loads(out.read_text()) if out.exists() else {})}


def job_spec(files: list[str], work: Path, mode: str, epochs: int = 3) -> Any:
    from tfyarn.spec import load_spec_dict
    roles: dict[str, Any] = {"chief": {"instances": 1, "memory": "1 GiB"}}
    if mode == "ps":
        roles["ps"] = {"instances": 1, "memory": "1 GiB"}
    return load_spec_dict({
        "name": f"bench-keras-{mode}", "model": "tfyarn.models.keras_recommender:model", "params": PARAMS,
        "mode": mode, "data": {"train": files, "features": FEATURES, "batch_size": BATCH, "epochs": epochs},
        "roles": roles, "checkpoint": {"dir": str(work / "ckpt"), "every_secs": 3600},
        "timeouts": {"step": 120, "stall": 120, "rendezvous": 120, "shutdown": 60}})


def run_child(kind: str, files: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, kind, json.dumps(files)], check=False, capture_output=True,
                         text=True,
                         timeout=1200, env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if out.returncode != 0:
        raise RuntimeError(f"bench child {kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["examples_per_sec"])[len(runs) // 2]


def measure(files: list[str], work: Path, run_job: Any, repeats: int = 1) -> dict[str, Any]:
    """Every figure of this section (``run_job``: bench_training's local job runner)."""
    res: dict[str, Any] = {"micro": {}, "jobs": {}}
    for mode in ("ps", "ps-graph", "allreduce"):
        runs = [run_child(mode, files) for _ in range(repeats)]
        res["micro"][mode] = sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2] | {
            "ratio_runs": [r["ratio"] for r in runs]}
        print("keras micro", mode, res["micro"][mode], flush=True)
    # fit and the jobs interleaved, --repeats rounds (each a single ~1-2 s run: load swings them), medians kept
    fits: list[dict[str, Any]] = []
    jobs: dict[str, list[dict[str, Any]]] = {"allreduce": [], "ps": []}
    for i in range(repeats):
        fits.append(run_child("fit", files))
        print("keras fit", fits[-1], flush=True)
        for mode in jobs:
            w = work / f"keras-{mode}-{i}"
            r = run_job(job_spec(files, w, mode), w)
            s = r.get("summary") or {}
            jobs[mode].append({"state": r["state"], "examples_per_sec": s.get("examples_per_sec") or 0,
                               "train_s": s.get("train_s"), "global_step": s.get("global_step")})
            print("keras job", mode, jobs[mode][-1], flush=True)
    res["fit"] = _median_run(fits) | {"runs": [f["examples_per_sec"] for f in fits]}
    res["jobs"] = {m: _median_run(js) | {"runs": [j["examples_per_sec"] for j in js]} for m, js in jobs.items()}
    res["pss"] = pss_job(files, work / "keras-pss", run_job)
    print("keras pss", res["pss"], flush=True)
    return res


def report(res: dict[str, Any], header: str) -> str:
    fit = res["fit"]["examples_per_sec"]
    rows = {"ps": "ps style (one process: TF1 graph, placeholders, no ps)",
            "ps-graph": "ps, tfyarn's real graph (a ps process, gRPC)", "allreduce": "allreduce"}
    lines = [SECTION, "", header, "",
             "### A Keras network in tfyarn's fed loop vs the same network as a plain `tfyarn.train.Model`", "",
             ("Same batches in memory, tfyarn's own fed step, 10 rounds of 240-step blocks alternating in one process "
              "per row (Keras: Adam, the Keras optimizer in allreduce, its v1 twin in ps; plain: v1 Adam). *ps style*: "
              "the TF1 graph in one process, the issue-4 micro-benchmark's setting; *ps, real graph*: "
              "`tfyarn.train.ps.graph.build_graph` (variables on a ps server in another process, the train op with "
              "its counters, the Keras metrics fetched with the loss), fed as the ps loop feeds it. Step ms = median "
              "block; the ratio is of the medians (of the means beside it). Runs: the child process was run once "
              "per --repeats, median shown."),
             "", "| mode | Keras step ms | plain step ms | Keras / plain (medians) | of means | every run | ≤ 1.1 |",
             "|---|---|---|---|---|---|---|"]
    for mode, r in res["micro"].items():
        lines.append(f"| {rows.get(mode, mode)} | {r['step_ms']['keras']} | {r['step_ms']['plain']} | {r['ratio']} | "
                     f"{r['ratio_of_means']} | {', '.join(map(str, r['ratio_runs']))} | "
                     f"{'met' if r['ratio'] <= 1.1 else 'NOT met'} |")
    lines += ["", "### examples/s: tfyarn training a Keras model vs Keras's own single-process fit", "",
              (f"Keras 3 `model.fit` on `TFRecordDataset → batch({BATCH}) → parse_example → prefetch`, one process: "
               f"**{fit:,.0f} examples/s** (median run; epochs after the first: {res['fit']['epoch_s']} s per epoch; "
               f"every run: {', '.join(f'{x:,.0f}' for x in res['fit'].get('runs', [fit]))}). tfyarn: the "
               "summary's examples/s (its train time, from the first step: that step's graph partitioning "
               "included). fit and the jobs ran interleaved, once per --repeats; medians shown."), "",
              "| tfyarn job (1 training worker, local backend) | processes | examples/s (median) | every run | "
              "/ fit | ≥ fit |", "|---|---|---|---|---|---|"]
    procs = {"allreduce": "1 (chief)", "ps": "2 (ps, chief)"}
    for mode, j in res["jobs"].items():
        e = j.get("examples_per_sec") or 0
        every = ", ".join(f"{x:,.0f}" for x in j.get("runs", [e]))
        lines.append(f"| {mode} ({j['state']}, global step {j['global_step']}) | {procs.get(mode, '?')} | {e:,.0f} | "
                     f"{every} | {e / fit:.2f} | {'met' if e >= fit else 'NOT met'} |")
    pss = res.get("pss") or {}
    if pss.get("examples_per_sec"):
        e = pss["examples_per_sec"]
        ps_e = (res["jobs"].get("ps") or {}).get("examples_per_sec") or 0
        lines += ["", (f"Keras's own ps mode for comparison: tf_keras `ParameterServerStrategy` `fit` (the same model "
                       f"in tf_keras, Adam; 1 ps, 1 worker, the chief coordinating: 3 processes; run as a tfyarn "
                       f"entrypoint job, {pss['state']}), epochs after the first: **{e:,.0f} examples/s** "
                       f"({pss['epoch_s']} s per epoch of {pss['steps_per_epoch']} steps); tfyarn's ps job / it: "
                       f"**{ps_e / e:.2f}**.")]
    return "\n".join(lines) + "\n"


def write_section(text: str, path: Path) -> None:
    """Replace (or append) this section of BENCHMARKS.md."""
    doc = path.read_text()
    if SECTION in doc:
        head, rest = doc.split(SECTION, 1)
        nxt = rest.find("\n## ")
        notes = re.search(r"<!-- notes:keras .*?<!-- /notes:keras -->", rest[:nxt] if nxt >= 0 else rest, re.S)
        if notes:  # the hand-written reading stays under the new figures
            text = text.rstrip("\n") + "\n\n" + notes.group(0) + "\n"
        doc = head + text.rstrip("\n") + ("\n" + rest[nxt:] if nxt >= 0 else "\n")
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    path.write_text(doc)


if __name__ == "__main__":      # a child: KIND FILES_JSON → one JSON line
    sys.path.insert(0, str(REPO))
    kind, file_list = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(keras_fit(file_list) if kind == "fit" else micro_ps_graph(file_list) if kind == "ps-graph"
                     else micro(kind, file_list)))
