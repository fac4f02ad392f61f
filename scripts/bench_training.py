#!/usr/bin/env python
"""Training benchmark (issue 4): fed vs in-graph step, examples/s by mode and workers, launch → first step,
epoch-boundary waits. One run; prints a table and (with ``--write``) replaces the ``## Training (issue 4)`` section of
BENCHMARKS.md.

What is measured, and why:

1. **Fed vs in-graph step, same model** (the built-in recommender, batch 1000), in one process per mode so the two
   loops share the model and alternate epoch by epoch (machine-load drift hits both equally):
   * ps-mode style (TF1 graph, ``Session``): placeholders fed with the Feeder's numpy batches vs the same graph reading
     ``TFRecordDataset → batch → parse_example`` in the graph.
   * allreduce style (TF2, MultiWorkerMirroredStrategy, 1 worker): tfyarn's fed ``tf.function`` step with a fixed
     input signature vs the same step pulling ``next(iterator)`` of the same tf.data pipeline inside the function.
   Step time = wall time of one loop iteration (fetch + step). Goal: fed ≤ 1.05× in-graph.
2. **Epoch boundaries**, over 5 epochs of skewed files (10× largest/smallest): how long the fed loop waits for the
   first batch of each new epoch, against the median step. Goal: no wait longer than one step.
3. **examples/s with 1 and 2 training workers in each mode**: real jobs through the local backend (a process per
   task, gRPC over 127.0.0.1), from each job's summary.json.
4. **Launch → first step** of a local ps + chief + 2 workers job (Launcher started → first progress record of any
   training task), against ``import tensorflow`` time measured on the same machine at the same time.
   Goal: ≤ TF import + 1.5 s. Measured with tasks forked from the forkserver (the default) and started as new
   processes (``TFYARN_FORKSERVER=0``: every task imports TF itself).

Usage: ``python scripts/bench_training.py [--records 200000] [--repeats 5] [--write] [--workdir DIR]``;
``--only launch`` measures only (4), forkserver on and off interleaved ``--repeats`` times, and prints the figures.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}
BATCH = 1000
EPOCHS = 5
SECTION = "## Training (issue 4)"


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------------------- micro (child)

#: (start, end) perf_counter of every parse call of the micro benchmark's Feeders (see :func:`_timed_parser`)
PARSE_WINDOWS: list[tuple[float, float]] = []


def _timed_parser(fields):
    """The Feeder's default parser, recording when each call ran: to tell the fed steps that ran beside a parse
    call (one TF parse op per ~16k records) from the others."""
    from tfyarn.data.parse import default_parser
    real = default_parser(fields)

    def parse(payloads):
        t0 = time.perf_counter()
        try:
            return real(payloads)
        finally:
            PARSE_WINDOWS.append((t0, time.perf_counter()))
    return parse


def _micro_common(data_dir: str):
    """The files and tfyarn's fed input: the allreduce loop's EpochPipeline (two Feeders, next epoch read ahead)."""
    from tfyarn.data import Feeder, build_manifest
    from tfyarn.spec import Feature
    from tfyarn.data.pipeline import EpochPipeline
    files = sorted(str(p) for p in Path(data_dir).glob("*.tfrecord"))
    feats = {k: Feature(**v) for k, v in FEATURES.items()}
    manifest = build_manifest(files)
    pipe = EpochPipeline(lambda: Feeder(manifest, feats, BATCH, 0, 1, seed=0, prefetch=4, parser=_timed_parser),
                         EPOCHS)
    for f in pipe.feeders:                        # steady state: both framing processes up before measuring (a job's
        f.prestart()                              # start-up takes seconds; these 5 epochs take ~1 s in all)
    deadline = time.monotonic() + 30
    while not all(f.framer is None or f.framer.ready() for f in pipe.feeders) and time.monotonic() < deadline:
        time.sleep(0.05)
    return files, feats, pipe


def _dataset(files: list[str]):
    """The in-graph input: native TFRecord reading and batched parsing, prefetched."""
    import tensorflow as tf
    spec = {"label": tf.io.FixedLenFeature([], tf.float32), "user_id": tf.io.FixedLenFeature([], tf.int64),
            "item_id": tf.io.FixedLenFeature([], tf.int64)}
    return (tf.data.TFRecordDataset(files).repeat().batch(BATCH, drop_remainder=True)
            .map(lambda s: tf.io.parse_example(s, spec)).prefetch(4))


def _cpu_s(pipeline) -> float:
    """CPU seconds used so far by this process (every thread: step, TF pools, tf.data, feeder threads) and by the
    feeders' framing processes."""
    return time.process_time() + sum(f.framer.cpu_s() for f in getattr(pipeline, "feeders", ())
                                     if f.framer is not None)


def _run_alternating(pipeline, fed_step, graph_step) -> dict:
    """5 epochs: each epoch fed, then as many in-graph steps, then the epoch's fed batches again from memory
    ("preloaded": the fed step with no input work running beside it, the floor the Feeder can approach).
    Returns per-step times, epoch-boundary waits and CPU seconds per loop."""
    fed, fed_start, ingraph, pre, boundary, fetch = [], [], [], [], [], []
    cpu = {"fed": 0.0, "ingraph": 0.0, "preloaded": 0.0}
    kept: list = []
    it = pipeline.run(0, 0)
    n, cur = 0, 0
    c0 = _cpu_s(pipeline)
    while True:
        t0 = time.perf_counter()
        try:
            epoch, batch = next(it)
        except StopIteration:
            epoch = None
        t1 = time.perf_counter()
        if epoch != cur:                       # an epoch ended: the same number of in-graph steps, then preloaded
            c1 = _cpu_s(pipeline)
            cpu["fed"] += c1 - c0
            for _ in range(n):
                g0 = time.perf_counter()
                graph_step()
                ingraph.append(time.perf_counter() - g0)
            c2 = _cpu_s(pipeline)
            cpu["ingraph"] += c2 - c1
            for b in kept:
                p0 = time.perf_counter()
                fed_step(b)
                pre.append(time.perf_counter() - p0)
            c0 = _cpu_s(pipeline)
            cpu["preloaded"] += c0 - c2
            kept = []
            if epoch is None:
                break
            boundary.append(t1 - t0)
            n, cur = 0, epoch
            t0 = time.perf_counter() - (t1 - t0)
        else:
            fetch.append(t1 - t0)
        fed_step(batch)
        fed.append(time.perf_counter() - t0)
        fed_start.append(t0)
        kept.append(batch)
        n += 1
    return {"fed": fed, "fed_start": fed_start, "ingraph": ingraph, "preloaded": pre, "boundary": boundary,
            "fetch": fetch, "parse_windows": sorted(PARSE_WINDOWS),
            "cpu_s": cpu, "steps_per_epoch": [pipeline.steps(e) for e in range(EPOCHS)]}


def micro_graph(data_dir: str, dim: int = 16) -> dict:
    """TF1 graph mode (what ps mode runs): placeholder-fed vs dataset-in-graph, same variables and optimizer."""
    import tensorflow as tf
    from tfyarn.models.recommender import model as make_model
    from tfyarn.train.model import build_model, split_features
    files, feats, feeder = _micro_common(data_dir)
    g = tf.Graph()
    with g.as_default():
        m = build_model(make_model(dim=dim))
        opt = m.optimizer()
        ph = {k: tf.compat.v1.placeholder(tf.float32 if v.dtype == "float32" else tf.int64, [BATCH], name=k)
              for k, v in feats.items()}

        def train_op(batch):
            x, y = split_features(batch, "label")
            return opt.minimize(tf.reduce_mean(m.loss(y, m(x, training=True))), var_list=m.trainable_variables)
        fed_op = train_op(ph)
        graph_op = train_op(tf.compat.v1.data.make_one_shot_iterator(_dataset(files)).get_next())
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=g)
    sess.run(init)
    # callables, as ps mode runs its step (tfyarn.train.ps: Session.make_callable with a feed list), for both loops
    names = list(ph)
    fed_fn = sess.make_callable(fed_op, feed_list=[ph[k] for k in names])
    graph_fn = sess.make_callable(graph_op)
    with feeder:
        r = _run_alternating(feeder, lambda b: fed_fn(*[b[k] for k in names]), graph_fn)
    sess.close()
    return r


def micro_allreduce(data_dir: str, dim: int = 16) -> dict:
    """TF2 MWMS (1 worker, what allreduce mode runs): tfyarn's fed step vs the same step reading tf.data in-graph."""
    import tensorflow as tf
    from tfyarn.models.recommender import model as make_model
    from tfyarn.train.allreduce import make_step
    from tfyarn.train.model import build_model, input_signature, split_features
    os.environ.pop("TF_CONFIG", None)
    files, feats, feeder = _micro_common(data_dir)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        m = build_model(make_model(dim=dim))
        opt = m.optimizer()
        gs = tf.Variable(0, dtype=tf.int64, trainable=False)
    fed = make_step(strategy, m, opt, gs, input_signature(feats, BATCH), "label", BATCH)
    it = iter(_dataset(files))

    def replica(batch):
        x, y = split_features(batch, "label")
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(m.loss(y, m(x, training=True)), global_batch_size=BATCH)
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables), global_step=gs)
        return loss

    @tf.function
    def ingraph_fn():
        return strategy.experimental_local_results(strategy.run(replica, args=(next(it),)))[0]
    ingraph = ingraph_fn.get_concrete_function()   # called like tfyarn's fed step: the concrete function

    with feeder:
        r = _run_alternating(feeder, fed, ingraph)
    r["traces"] = int(fed.experimental_get_tracing_count())
    return r


def input_cost(data_dir: str) -> dict:
    """CPU seconds per batch of each input path alone (no training): what the producer takes from the step's cores."""
    import importlib
    importlib.import_module("tensorflow")  # before measuring: the Feeder's parser would import it in epoch 0
    files, feats, pipe = _micro_common(data_dir)
    out = {}
    with pipe:                                   # (_micro_common started both framing processes and waited)
        c0, w0, n = _cpu_s(pipe), time.perf_counter(), 0   # the framing processes' CPU counts as the Feeder's
        for _ in pipe.run(0, 0):
            n += 1
        out["feeder_cpu_ms_per_batch"] = 1e3 * (_cpu_s(pipe) - c0) / n
        out["feeder_wall_ms_per_batch"] = 1e3 * (time.perf_counter() - w0) / n
    it = iter(_dataset(files))
    next(it)
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        next(it)
    out["tfdata_cpu_ms_per_batch"] = 1e3 * (time.process_time() - c0) / n
    out["tfdata_wall_ms_per_batch"] = 1e3 * (time.perf_counter() - w0) / n
    out["batches"] = n
    return out


def _during_parse(starts: list[float], durations: list[float], windows: list[tuple[float, float]]) -> list[bool]:
    """For each step (start, duration): did any parse call (windows sorted by start) run during it? A window
    overlaps a step when it began before the step ended and ended after it began: the latest end among the windows
    that began before the step ended tells (the two feeders' windows may overlap each other)."""
    import bisect
    import itertools
    begins = [w[0] for w in windows]
    latest_end = list(itertools.accumulate((w[1] for w in windows), max))
    out = []
    for s, d in zip(starts, durations):
        i = bisect.bisect_left(begins, s + d)
        out.append(i > 0 and latest_end[i - 1] > s)
    return out


def summarize_micro(r: dict) -> dict:
    skip = 10                                   # warm-up (tracing, first batches)
    fed, ing = r["fed"][skip:], r["ingraph"][skip:]
    med = statistics.median(fed)
    during = _during_parse(r["fed_start"][skip:], fed, r["parse_windows"])
    beside = [d for d, p in zip(fed, during) if p]
    other = [d for d, p in zip(fed, during) if not p]
    return {"parse_overlap": {"steps": len(beside), "of": len(fed),
                              "mean_ms": 1e3 * statistics.fmean(beside) if beside else 0.0,
                              "other_mean_ms": 1e3 * statistics.fmean(other) if other else 0.0,
                              "parses": len(r["parse_windows"])},
            "fed_mean_ms": 1e3 * statistics.fmean(fed), "fed_median_ms": 1e3 * med,
            "ingraph_mean_ms": 1e3 * statistics.fmean(ing), "ingraph_median_ms": 1e3 * statistics.median(ing),
            "ratio_mean": statistics.fmean(fed) / statistics.fmean(ing),
            "preloaded_mean_ms": 1e3 * statistics.fmean(r["preloaded"][skip:]),
            "preloaded_ratio_mean": statistics.fmean(r["preloaded"][skip:]) / statistics.fmean(ing),
            "cpu_ms_per_step": {k: 1e3 * v / len(r["fed"]) for k, v in r["cpu_s"].items()},
            "ratio_median": med / statistics.median(ing),
            "fetch_mean_ms": 1e3 * statistics.fmean(r["fetch"][skip:]) if r["fetch"][skip:] else 0.0,
            "boundary_max_ms": 1e3 * max(r["boundary"], default=0.0),
            "boundary_ms": [round(1e3 * b, 2) for b in r["boundary"]],
            "steps": len(r["fed"]), "steps_per_epoch": r["steps_per_epoch"]}


# --------------------------------------------------------------------------------------------------- jobs (parent)

def job_spec(data: list[str], work: Path, mode: str, workers: int, ps: int = 0, epochs: int = EPOCHS):
    from tfyarn.spec import load_spec_dict
    roles = {"chief": {"instances": 1, "memory": "1 GiB"}}
    if workers > 1:
        roles["worker"] = {"instances": workers - 1, "memory": "1 GiB"}
    if ps:
        roles["ps"] = {"instances": ps, "memory": "1 GiB"}
    return load_spec_dict({
        "name": f"bench-{mode}-{workers}", "model": "tfyarn.models.recommender:model", "params": {"dim": 16},
        "mode": mode, "data": {"train": data, "features": FEATURES, "batch_size": BATCH, "epochs": epochs},
        "roles": roles, "checkpoint": {"dir": str(work / "ckpt"), "every_secs": 3600},
        "timeouts": {"step": 120, "stall": 120, "rendezvous": 120, "shutdown": 60}})


def run_job(spec, work: Path, forkserver: bool | None = None) -> dict:
    """Run one local job in this process (the lead's Launcher), watching the KV for each task's first step.

    ``forkserver``: the Launcher's switch (None: its default, on unless TFYARN_FORKSERVER=0)."""
    from tfyarn.runner.attempts import run_attempts
    from tfyarn.runner.local_app import Launcher
    from tfyarn.runner.supervisor import Supervisor
    work.mkdir(parents=True, exist_ok=True)
    sup = Supervisor(spec, started=time.time())
    # the local backend's application master in this process, minus its preflight (as `tfyarn run` starts it)
    launchers = [Launcher(spec, work / "app", f"local-bench-{work.name}", forkserver=forkserver, supervisor=sup)]

    first: dict[str, float] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            kv = launchers[-1].kv if launchers else None
            if kv is not None:
                for key, val in kv.store.items("progress/").items():
                    task = key.split("/", 1)[1]
                    if task not in first and (json.loads(val).get("step") or 0) >= 1:
                        first[task] = json.loads(val)["time"]   # published right after that task's first step
            stop.wait(0.02)

    th = threading.Thread(target=watch, daemon=True)
    t0 = time.time()
    th.start()
    status = run_attempts(launchers[0], sup)
    stop.set()
    th.join()
    out = {"state": str(getattr(status.state, "value", status.state)), "wall_s": time.time() - t0,
           "diagnostics": getattr(status, "diagnostics", "")}
    try:
        out["summary"] = json.loads((work / "ckpt" / "summary.json").read_text())
    except OSError:
        out["summary"] = None
    if first:
        out["launch_to_first_step_s"] = min(first.values()) - t0
        out["launch_to_all_first_step_s"] = max(first.values()) - t0
    return out


def tf_import_s(n: int = 3) -> float:
    code = "import time; t = time.perf_counter(); import tensorflow; print(time.perf_counter() - t)"
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}).stdout.split()[-1])
             for _ in range(n)]
    return statistics.median(times)


def concurrent_tf_imports(n: int = 4) -> float:
    """Wall time for ``n`` processes importing TF at once: what a local 4-task job pays before any rendezvous."""
    code = "import tensorflow"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(n)]
    for p in procs:
        p.wait(timeout=300)
    return time.perf_counter() - t0


def _variant(v: str) -> None:
    """``python``: the Feeder without its C loops (TFYARN_NATIVE=0: Python framing in the framing process, TF's
    parse op), as before they existed; ``thread`` / ``process``: where the Feeder frames (TFYARN_FRAMING)."""
    if v == "python":
        os.environ["TFYARN_NATIVE"] = "0"
    elif v:
        os.environ["TFYARN_FRAMING"] = v


def child(kind: str, data_dir: str) -> dict:
    if kind.startswith("input"):                 # "input", "input-python"
        _variant(kind.partition("-")[2])
        return input_cost(data_dir)
    name, _, rest = kind.partition("-")
    dim, _, variant = rest.partition("-")
    _variant(variant)                            # "graph-256-python"
    r = (micro_graph if name == "graph" else micro_allreduce)(data_dir, dim=int(dim or 16))
    return summarize_micro(r) | ({"traces": r["traces"]} if "traces" in r else {})


def run_child(kind: str, data_dir: str) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", kind, data_dir], capture_output=True, text=True,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"micro benchmark {kind} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------- report

def eps(job: dict) -> str:
    s = job.get("summary") or {}
    if job.get("state") != "SUCCEEDED" or not s:
        return f"failed ({job.get('state')}: {str(job.get('diagnostics'))[:80]})"
    return f"{s.get('examples_per_sec', 0):,.0f}"


def lfs(job: dict) -> str:
    v = job.get("launch_to_first_step_s")
    return "-" if v is None else f"{v:.1f} s"


def report(res: dict) -> str:
    mi = res["micro"]
    lines = [SECTION, "",
             f"`python scripts/bench_training.py --write` — {res['date']}, {res['cpus']} cores, "
             f"load average {res['load_before']} before / {res['load_after']} after (the machine is shared with "
             f"other engineers' TF processes: figures are noisy; fed and in-graph are measured in one process, "
             f"alternating epoch by epoch, so load drift hits both). Data: {res['records']:,} recommender records in "
             f"16 files, 10x skew, batch {BATCH}, {EPOCHS} epochs.", "",
             "### Fed vs in-graph step (same model, same process)", "",
             "Step = one loop iteration (fetch + step). Fed: tfyarn's input (Feeder numpy batches, two feeders so the "
             "next epoch is read ahead; records framed, CRC-checked and parsed by the C loops of "
             "`tfyarn/data/_records.c` in the Feeder's threads; the *Python loops* rows run the Feeder as it was "
             "before them, `TFYARN_NATIVE=0`: Python framing in the framing process, TF's parse op). "
             "In-graph: `TFRecordDataset → batch → parse_example → prefetch` inside the "
             "graph. Both call a concrete function / `Session.run`. Each config ran "
             f"{len(mi['graph-16'].get('ratio_mean_runs', [0]))} times (interleaved); the row is the run with the "
             "median ratio of means, and all runs' ratios are listed: on this shared machine the spread between "
             "runs of the same config is larger than the effect measured.", "",
             "Two more columns explain the ratios. *Preloaded*: after each epoch's in-graph steps, the same fed step "
             "runs again on that epoch's batches kept in memory — the fed step with no input work running beside it. "
             "*CPU per step*: CPU time of the process (every thread) and of the framing processes during each loop, "
             "per step: what the input path costs beside the step on these 2 cores, which the step uses fully. "
             "*During a parse*: the fed steps that ran while the Feeder's parser thread was in a parse call (one call "
             "per ~16k records), their mean step, and the mean of the other fed steps.", "",
             "| mode | model | fed step ms (mean / median) | in-graph step ms (mean / median) | fed / in-graph "
             "(mean, median) | ratio of means, every run | ≤1.05 (median run) | preloaded / in-graph | CPU ms per "
             "step: fed / in-graph / preloaded | fed steps during a parse: n, mean ms (other fed steps) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for kind, name in (("graph-16", "ps style: TF1 graph, placeholders"), ("allreduce-16", "allreduce: MWMS, fed "
                       "concrete fn"), ("graph-256", "ps style: TF1 graph, placeholders"),
                       ("allreduce-256", "allreduce: MWMS, fed concrete fn"),
                       ("graph-16-python", "ps style, *Python loops* (before the C loops)"),
                       ("graph-256-python", "ps style, *Python loops* (before the C loops)")):
        m = mi.get(kind)
        if m is None:
            continue
        ok = "met" if m["ratio_mean"] <= 1.05 else "NOT met"
        lines.append(f"| {name} | recommender dim {kind.split('-')[1]} | {m['fed_mean_ms']:.2f} / "
                     f"{m['fed_median_ms']:.2f} | {m['ingraph_mean_ms']:.2f} / {m['ingraph_median_ms']:.2f} | "
                     f"{m['ratio_mean']:.3f}, {m['ratio_median']:.3f} | "
                     f"{', '.join(f'{x:.2f}' for x in m.get('ratio_mean_runs', [m['ratio_mean']]))} | {ok} | "
                     + (f"{m['preloaded_ratio_mean']:.3f} | " + " / ".join(f"{m['cpu_ms_per_step'][k]:.2f}" for k in
                        ("fed", "ingraph", "preloaded")) + " |" if "cpu_ms_per_step" in m else " | |")
                     + (f" {po['steps']} of {po['of']}, {po['mean_ms']:.2f} ({po['other_mean_ms']:.2f}) |"
                        if (po := m.get("parse_overlap")) else " |"))
    ic, ip = mi["input"], mi.get("input-python")
    lines += ["", f"Input paths alone (no training), per batch of {BATCH}: Feeder {ic['feeder_cpu_ms_per_batch']:.2f} "
                  f"ms CPU and {ic['feeder_wall_ms_per_batch']:.2f} ms wall"
                  + (f"; with the Python loops {ip['feeder_cpu_ms_per_batch']:.2f} ms CPU (framing process "
                     f"included) and {ip['feeder_wall_ms_per_batch']:.2f} ms wall" if ip else "")
                  + f"; tf.data in graph {ic['tfdata_cpu_ms_per_batch']:.2f} ms CPU, "
                  f"{ic['tfdata_wall_ms_per_batch']:.2f} ms wall. The dim-256 step keeps both cores busy, so the "
                  f"input's CPU shows in its wall time: that is the gap the C loops closed.", "",
              notes_block("fed"), "",
              "### Epoch boundaries (fed loop, 5 epochs of skewed files)", "",
              "| mode | waits for the first batch of epochs 2–5 (ms) | longest | median step (ms) | ≤ one step |",
              "|---|---|---|---|---|"]
    for kind, name in (("graph-16", "ps style (TF1), dim 16"), ("allreduce-16", "allreduce (TF2), dim 16")):
        m = mi[kind]
        ok = "met" if m["boundary_max_ms"] <= m["fed_median_ms"] else "NOT met"
        lines.append(f"| {name} | {', '.join(f'{b:.2f}' for b in m['boundary_ms'])} | {m['boundary_max_ms']:.2f} | "
                     f"{m['fed_median_ms']:.2f} | {ok} |")
    j = res["jobs"]
    ar2 = (j.get("allreduce-2", {}).get("summary") or {}).get("chief", {})
    if ar2:
        lines += ["", f"In the 2-worker allreduce job the longest epoch-boundary wait measured inside the chief's "
                      f"training loop was {1e3 * ar2.get('max_epoch_boundary_wait_s', 0):.2f} ms."]
    lines += ["", "### examples/s, real local jobs (a process per task, gRPC over 127.0.0.1)", "",
              "| mode | 1 training worker | 2 training workers | launch → first step (1 / 2 workers) |",
              "|---|---|---|---|",
              f"| ps, async (1 ps) | {eps(j['ps-1'])} | {eps(j['ps-2'])} | {lfs(j['ps-1'])} / {lfs(j['ps-2'])} |",
              f"| allreduce (MWMS) | {eps(j['allreduce-1'])} | {eps(j['allreduce-2'])} | {lfs(j['allreduce-1'])} / "
              f"{lfs(j['allreduce-2'])} |", "",
              "Two workers on 2 shared cores cannot scale: every task competes for the same cores (and the "
              "other engineers' jobs). allreduce all-reduces small sparse (embedding) gradients densely: measured "
              "on the same model, 2 workers, 31 ms → 6 ms per step; before that change the 2-worker allreduce job "
              "ran ~36k examples/s.", "",
              "### Launch → first step (local ps + chief + 2 workers)", ""]
    ls = j["ps-launch"]
    if "launch_to_first_step_s" in ls:
        goal = res["tf_import_s"] + 1.5
        lines += [f"`import tensorflow`: {res['tf_import_s']:.2f} s (median of 3, same machine, same time). Goal: "
                  f"Launcher start → first step of any training task ≤ TF import + 1.5 s = {goal:.2f} s. Measured "
                  f"through the local backend's Launcher (`tfyarn.runner.local_app`, what `tfyarn run` uses).", "",
                  "| tasks start | launch → first step (any training task), median run | every run | → every training "
                  "task past step 1 | goal | state |", "|---|---|---|---|---|---|"]
        for key, how in (("ps-launch", "forked from the forkserver (default)"),
                         ("ps-launch-spawn", "as new processes (`TFYARN_FORKSERVER=0`)")):
            r = j.get(key)
            if r is None:
                lines.append(f"| {how} | not measured | | | | |")
            elif "launch_to_first_step_s" not in r:
                lines.append(f"| {how} | no step: {r.get('state')} ({str(r.get('diagnostics'))[:80]}) | | | | |")
            else:
                ok = "met" if r["launch_to_first_step_s"] <= goal else "NOT met"
                runs = ", ".join(f"{x:.2f}" for x in r.get("launch_runs_s", [r["launch_to_first_step_s"]]))
                lines.append(f"| {how} | **{r['launch_to_first_step_s']:.2f} s** | {runs} | "
                             f"{r['launch_to_all_first_step_s']:.2f} s | {ok} | {r['state']} |")
        if "tf_import_4_concurrent_s" in res:
            lines.append("")
            lines.append(f"Context: started as new processes, the job's 4 TF tasks import TensorFlow at the same "
                         f"time on {res['cpus']} shared cores; 4 concurrent `import tensorflow` (no job) took "
                         f"{res['tf_import_4_concurrent_s']:.2f} s in this run. Forked, they share one import made "
                         f"by the forkserver while the launcher starts.")
    else:
        lines.append(f"not measured: the job ended {ls.get('state')} ({ls.get('diagnostics')}) without a step")
    lines += ["", notes_block("launch")]
    return "\n".join(lines) + "\n"


def notes_block(name: str, body: str = "") -> str:
    """Where a hand-written reading of the figures goes: ``write_section`` carries the block's text over from the
    section it replaces (the figures change each run; the history and the reasoning must not be lost)."""
    return f"<!-- notes:{name} (hand-written, kept by --write) -->\n{body}<!-- /notes:{name} -->"


_NOTES = re.compile(r"<!-- notes:(\w+) \(hand-written, kept by --write\) -->\n(.*?)<!-- /notes:\1 -->", re.S)


def write_section(text: str, path: Path) -> None:
    """Replace (or append) only the Training section; other engineers own the rest of the file."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    kept = {m.group(1): m.group(2) for m in _NOTES.finditer(old)}
    text = _NOTES.sub(lambda m: notes_block(m.group(1), kept.get(m.group(1), "")), text)
    start = old.find(SECTION)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = old.find("\n## ", start + len(SECTION))
        new = old[:start] + text + (old[nxt + 1:] if nxt >= 0 else "")
        if nxt >= 0 and not text.endswith("\n\n"):
            new = old[:start] + text + "\n" + old[nxt + 1:]
    path.write_text(new)


def launch_only(res: dict, data: list[str], work: Path, repeats: int) -> int:
    """``--only launch``: launch → first step with the forkserver on and off, interleaved; prints every run."""
    res["tf_import_s"] = tf_import_s()
    print(f"import tensorflow: {res['tf_import_s']:.2f}s (median of 3)", flush=True)
    runs: dict[str, list[dict]] = {"forkserver": [], "spawn": []}
    for i in range(repeats):
        for kind, fs in (("forkserver", True), ("spawn", False)):
            name = f"launch-{kind}-{i}"
            r = run_job(job_spec(data, work / name, "ps", 3, ps=1, epochs=1), work / name, forkserver=fs)
            runs[kind].append(r)
            print(f"{kind:>10} run {i}: launch → first step {lfs(r)}, → all "
                  f"{r.get('launch_to_all_first_step_s', 0):.2f} s, {r['state']}, load {loadavg()}", flush=True)
    res["launch_runs"] = runs
    res["load_after"] = loadavg()
    (work / "results-launch.json").write_text(json.dumps(res, indent=1, default=str))
    goal = res["tf_import_s"] + 1.5
    for kind, rs in runs.items():
        firsts = [r["launch_to_first_step_s"] for r in rs if "launch_to_first_step_s" in r]
        alls = [r["launch_to_all_first_step_s"] for r in rs if "launch_to_all_first_step_s" in r]
        if firsts:
            print(f"{kind}: launch → first step median {statistics.median(firsts):.2f} s "
                  f"({', '.join(f'{x:.2f}' for x in firsts)}); → all median {statistics.median(alls):.2f} s; "
                  f"goal ≤ {goal:.2f} s", flush=True)
    return 0


def keras_only(res: dict, data: list[str], work: Path, repeats: int, write: bool) -> int:
    """The Keras section (issue 27): scripts/bench_keras.py's figures, printed, and written with ``write``."""
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_keras
    k = bench_keras.measure(data, work, run_job, repeats)
    header = (f"`python scripts/bench_training.py --only keras --repeats {repeats} --write` — {res['date']}, "
              f"{res['cpus']} cores, load average {res['load_before']} before / {loadavg()} after (a machine shared "
              f"with other engineers' TF processes). Data: {res['records']:,} recommender records in 16 files, batch "
              f"{bench_keras.BATCH}; model `tfyarn.models.keras_recommender` (Keras 3, functional: embeddings, a "
              f"custom layer, Dense) with its params {bench_keras.PARAMS}.")
    (work / "keras-results.json").write_text(json.dumps(k, indent=1, default=str))
    text = bench_keras.report(k, header)
    print("\n" + text)
    if write:
        bench_keras.write_section(text, REPO / "BENCHMARKS.md")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--repeats", type=int, default=5,
                    help="runs of each fed/in-graph config and of each launch (the median run is shown): on a shared "
                         "2-core machine one run's ratio can be 5-10%% off the next one's")
    ap.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    ap.add_argument("--from-results", default=None, help="re-render a previous run's results.json (no measuring)")
    ap.add_argument("--only", choices=["launch", "keras"], default=None,
                    help="launch: only launch → first step, forkserver on and off interleaved --repeats times; "
                         "keras: only the Keras section (scripts/bench_keras.py), written with --write")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "DATA_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only == "launch" and (args.write or args.from_results):
        ap.error("--only measures one part: it neither writes BENCHMARKS.md nor re-renders results")
    if args.child:
        logging.basicConfig(level=logging.WARNING)
        print(json.dumps(child(*args.child)))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.from_results:
        text = report(json.loads(Path(args.from_results).read_text()))
        print(text)
        if args.write:
            write_section(text, REPO / "BENCHMARKS.md")
        return 0
    from tfyarn.data import write_synthetic
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tfyarn-bench-"))
    data_dir = work / "data"
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "load_before": loadavg(),
                 "records": args.records, "micro": {}, "jobs": {}}
    data = write_synthetic(str(data_dir), "recommender", files=16, records=args.records, skew=10.0, seed=0,
                           overwrite=True)          # a reused --workdir: the same data set again, never a mix
    print(f"data: {len(data)} files in {data_dir}; load {res['load_before']}", flush=True)
    if args.only == "launch":
        return launch_only(res, data, work, args.repeats)
    if args.only == "keras":
        return keras_only(res, data, work, args.repeats, args.write)
    kinds = ("graph-16", "allreduce-16", "graph-256", "allreduce-256", "graph-16-python", "graph-256-python")
    runs: dict[str, list] = {k: [] for k in kinds}
    for _ in range(args.repeats):                 # interleaved repeats: load bursts spread over every config
        for kind in kinds:
            runs[kind].append(run_child(kind, str(data_dir)))
            print(kind, json.dumps(runs[kind][-1]), flush=True)
    for kind in kinds:                            # the run with the median fed/in-graph ratio represents the config
        ordered = sorted(runs[kind], key=lambda r: r["ratio_mean"])
        res["micro"][kind] = ordered[len(ordered) // 2] | {"ratio_mean_runs": [r["ratio_mean"] for r in runs[kind]]}
    res["micro"]["input"] = run_child("input", str(data_dir))
    res["micro"]["input-python"] = run_child("input-python", str(data_dir))
    res["tf_import_s"] = tf_import_s()
    res["tf_import_4_concurrent_s"] = concurrent_tf_imports(4)
    print(f"import tensorflow: {res['tf_import_s']:.2f}s; 4 at once: {res['tf_import_4_concurrent_s']:.2f}s",
          flush=True)
    launches: dict[str, list[dict]] = {"ps-launch": [], "ps-launch-spawn": []}
    for i in range(args.repeats):                 # interleaved: forked and spawned see the same load
        for name, fs in (("ps-launch", None), ("ps-launch-spawn", False)):
            r = run_job(job_spec(data, work / f"{name}-{i}", "ps", 3, ps=1, epochs=1), work / f"{name}-{i}",
                        forkserver=fs)
            launches[name].append(r)
            print(name, i, {k: v for k, v in r.items() if k != "summary"}, flush=True)
    for name, rs in launches.items():             # the run with the median launch → first step represents it
        timed = sorted((r for r in rs if "launch_to_first_step_s" in r), key=lambda r: r["launch_to_first_step_s"])
        rep = timed[len(timed) // 2] if timed else rs[0]
        res["jobs"][name] = rep | {"launch_runs_s": [round(r.get("launch_to_first_step_s", -1), 2) for r in rs]}
    for mode, workers in (("ps", 1), ("ps", 2), ("allreduce", 1), ("allreduce", 2)):
        name = f"{mode}-{workers}"
        res["jobs"][name] = run_job(job_spec(data, work / name, mode, workers, ps=1 if mode == "ps" else 0),
                                    work / name)
        print(name, eps(res["jobs"][name]), res["jobs"][name]["state"], flush=True)
    res["load_after"] = loadavg()
    (work / "results.json").write_text(json.dumps(res, indent=1, default=str))
    text = report(res)
    print("\n" + text)
    if args.write:
        write_section(text, REPO / "BENCHMARKS.md")
        print(f"wrote the section to {REPO / 'BENCHMARKS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
