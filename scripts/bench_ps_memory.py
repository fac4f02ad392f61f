#!/usr/bin/env python
"""Resident memory of each ps over a ps-mode job's life (issue 37): where a ps's peak comes from.

One job through the local backend (a process per task, the same task runtime as on YARN) with the built-in
recommender (``tfyarn.models.recommender``: two tables of ``--rows`` x ``--dim`` floats, their biases, Adagrad) or
``--model plain``: bench_embeddings' plain twin (a user table of ``--rows`` x 64 initialised by an unseeded
``tf.random_uniform_initializer``, an item table of 10,000 rows, a small MLP) or ``--model keras``: its
Keras original (``tfyarn.models.keras_recommender``, Adagrad). Each task's process tree (the chief too) is sampled
every ``--interval`` s (psutil) beside the job, and its kernel high-water mark (``VmHWM`` of /proc, the true peak of
the process: no sample can miss it) read while it lives. Printed: a JSON line per task (its peak, its RSS when the
chief's session was ready, at the first step, at the end) and the job's outcome, and with ``--timeline`` each
sample. The phases come from the chief's KV records (progress) and its log (``session ready``).

Usage: ``python scripts/bench_ps_memory.py [--rows 1600000] [--ps 3] [--memory "1 GiB"] [--records 4000]
[--batch 100] [--model recommender|plain|keras] [--max-shards N] [--checkpoint] [--timeline]``. The issue-37 YARN test's
job is the default (2 x 1.6M x 64 tables over 3 ps of 1 GiB); the 2 GB whole-table case is
``--model plain --rows 9000000 --ps 1 --memory "8 GiB" --records 3000 --batch 1000``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from tfyarn.backends.local.process_memory import tree_rss
from tfyarn.data.synth import write_synthetic
from tfyarn.runner.attempts import run_attempts
from tfyarn.runner.local_app import Launcher
from tfyarn.runner.supervisor import Supervisor
from tfyarn.spec import load_spec_dict

REPO = Path(__file__).resolve().parents[1]
FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}


def hwm_bytes(pid: int) -> int:
    """The kernel's peak resident set of ``pid`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def job_spec(args: argparse.Namespace, data: str, work: Path) -> Any:
    if args.model == "plain":
        model, params = "bench_embeddings:plain_twin", {"num_users": args.rows, "num_items": 10_000}
    elif args.model == "keras":  # the plain twin's Keras original (bench_embeddings' other kind)
        model = "tfyarn.models.keras_recommender:model"
        params = {"num_users": args.rows, "num_items": 10_000, "dim": 64, "optimizer": "Adagrad", "learning_rate": 0.05}
    else:
        model = "tfyarn.models.recommender:model"
        params = {"num_users": args.rows, "num_items": args.rows, "dim": args.dim, "learning_rate": 0.1}
    doc: dict[str, Any] = {
        "name": f"psmem-{args.model}-{args.rows}-{args.ps}ps",
        "model": model,
        "params": params,
        "code": str(REPO / "scripts"),
        "mode": "ps",
        "sync": False,
        "data": {"train": [data], "features": FEATURES, "batch_size": args.batch, "epochs": 1},
        "roles": {"ps": {"instances": args.ps, "memory": args.memory}, "chief": {"instances": 1, "memory": "8 GiB"}},
        "ps": {"max_shards": args.max_shards},
        "timeouts": {"step": 900, "rendezvous": 900, "stall": 900},
    }
    if args.checkpoint:
        doc["checkpoint"] = {"dir": str(work / "ckpt"), "every_steps": None, "every_secs": 600, "keep": 1}
    return load_spec_dict(doc)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    write_synthetic(
        str(work / "data"),
        kind="recommender",
        files=4,
        records=args.records,
        seed=1,
        users=100,
        items=100,
        overwrite=True,
    )
    spec = job_spec(args, str(work / "data" / "*.tfrecord"), work)
    sup = Supervisor(spec, started=time.time())
    # the local backend's application master in this process, minus its preflight (measured here, not asked)
    launchers = [Launcher(spec, work / "app", f"local-psmem-{work.name}", supervisor=sup)]

    samples: list[tuple[float, str, int, int]] = []  # (time, task, tree RSS bytes, pid)
    hwm: dict[str, int] = {}
    first_step: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            tasks = launchers[-1].tasks if launchers else {}
            live = {t.proc.pid: name for name, t in tasks.items() if t.proc is not None}  # every task: the chief too
            now = time.time()
            for pid, rss in tree_rss(live).items():
                if rss:
                    samples.append((now, live[pid], rss, pid))
                    hwm[live[pid]] = max(hwm.get(live[pid], 0), hwm_bytes(pid))
            kv = launchers[-1].kv if launchers else None
            if kv is not None and not first_step and kv.store.items("progress/chief:0"):
                first_step.append(now)
            stop.wait(args.interval)

    th = threading.Thread(target=watch, daemon=True)
    t0 = time.time()
    th.start()
    status = run_attempts(launchers[0], sup)
    stop.set()
    th.join()
    ready = session_ready_time(work / "app")
    out: dict[str, Any] = {
        "state": str(getattr(status.state, "value", status.state)),
        "wall_s": round(time.time() - t0, 1),
        "diagnostics": "" if status.state.value == "SUCCEEDED" else status.diagnostics[-2000:],
        "summary_steps": (status.summary or {}).get("global_step"),
        "tasks": {},
    }
    mib = 2**20
    for name in sorted({s[1] for s in samples}):
        mine = [(t, r) for t, n, r, _ in samples if n == name]

        def at(when: float | None, mine: list = mine) -> int | None:
            before = [r for t, r in mine if when is not None and t <= when]
            return before[-1] // mib if before else None

        out["tasks"][name] = {
            "peak_mib_vmhwm": hwm.get(name, 0) // mib,
            "peak_mib_sampled": max(r for _, r in mine) // mib,
            "at_session_ready_mib": at(ready),
            "at_first_step_mib": at(first_step[0] if first_step else None),
            "last_mib": mine[-1][1] // mib,
            "peak_at_s": round(max(mine, key=lambda s: s[1])[0] - t0, 1),
        }
    out["session_ready_s"] = round(ready - t0, 1) if ready else None
    out["first_step_s"] = round(first_step[0] - t0, 1) if first_step else None
    if args.timeline:
        out["timeline"] = [(round(t - t0, 2), n, r // mib, pid) for t, n, r, pid in samples]
    return out


def session_ready_time(app_dir: Path) -> float | None:
    """When the chief logged ``session ready`` (its log's timestamp), None if not found."""
    for log in app_dir.glob("**/chief_0*/task.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "session ready" in line:
                try:
                    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                except ValueError:
                    return None
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_600_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--ps", type=int, default=3)
    ap.add_argument("--memory", default="1 GiB", help="roles.ps.memory (the local backend warns, kills nothing)")
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--model", choices=("recommender", "plain", "keras"), default="recommender")
    ap.add_argument("--max-shards", type=int, default=None)
    ap.add_argument("--checkpoint", action="store_true", help="with a checkpoint dir (the final save is measured)")
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--workdir")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "scripts"))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="psmem-"))
    print(json.dumps(run(args, work)), flush=True)


if __name__ == "__main__":
    main()
