#!/usr/bin/env python
"""YARN latency benchmark (issue 21): where the wall time of ``tfyarn run`` goes, phase by phase, and how fast the
commands answer. Runs against the cluster named by ``HADOOP_CONF_DIR`` (e.g. the bundle in ../shared/hadoop).

The job is the issue's: 2 ps + chief + 2 workers, the built-in recommender, ~18 steps, synthetic data on HDFS under
a unique prefix (removed at the end). Measured, ``--runs`` times each (medians reported):

1. **node python** (``environment.python`` = this interpreter): ``tfyarn -v run --output json`` as a user runs it, a
   new process each time; the phases from the run report's ``phases`` (gateway, ResourceManager and tasks' own
   times: :mod:`tfyarn.backends.yarn.phases`), the CLI's exit from this script's clock.
2. **packed env** (``--pack``: this venv, venv-pack): cold = a fresh staging dir and local archive cache (pack +
   upload), then cached runs (0 bytes uploaded); the NodeManagers' user filecache is counted before and after to show
   the archive is localized once per node, not per application (``visibility: private``).
3. **commands** on a running app: ``status``, ``list``, ``logs`` (first line), ``kill`` (returns once KILLED), each
   a new CLI process: its CPU seconds and whether it started a skein driver JVM (``driver JVM started``, also per
   run above: the first ``run`` starts tfyarn's shared driver, later ones reuse it).

The machine's load (load average, other running YARN apps) is printed with the figures: the box is shared.
Usage: ``python scripts/bench_yarn.py [--runs 3] [--pack] [--write]``; ``--write`` replaces the
``## YARN latency (issue 21)`` section of BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tfyarn.backends.yarn.phases import PHASES  # noqa: E402

SECTION = "## YARN latency (issue 21)"
TOTALS = ("start → app end", "start → exit", "submit → app end", "CLI CPU s", "driver JVM started")


def load() -> str:
    la = os.getloadavg()
    from tfyarn.cluster import hdfs
    rm = hdfs.load_hadoop_conf().get("yarn.resourcemanager.webapp.address", "127.0.0.1:8088")
    try:
        with urllib.request.urlopen(f"http://{rm}/ws/v1/cluster/apps?states=RUNNING,ACCEPTED", timeout=5) as r:
            apps = (json.loads(r.read()).get("apps") or {}).get("app") or []
    except OSError:
        apps = []
    return f"load average {la[0]:.1f}/{la[1]:.1f}, {os.cpu_count()} cores, {len(apps)} other YARN apps running"


def job_doc(data: str, name: str, env: dict, tag: str) -> dict:
    feats = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}
    return {"name": name, "model": "tfyarn.models.recommender:model", "mode": "ps", "sync": True,
            "params": {"num_users": 100, "num_items": 100, "dim": 8, "learning_rate": 0.2},
            "data": {"train": [data], "features": feats, "batch_size": 100, "epochs": 1},
            "roles": {"ps": {"instances": 2, "memory": "1 GiB"}, "chief": {"instances": 1, "memory": "1 GiB"},
                      "worker": {"instances": 2, "memory": "1 GiB"}},
            "environment": env, "tags": [tag, "tfyarn-bench"],
            "timeouts": {"rendezvous": 180, "stall": 180, "step": 120, "allocation": 300}}


def cli(args: list[str], env: dict, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "tfyarn.cli", *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    return p, time.time() - t0


def driver_pids() -> set[int]:
    """Skein driver JVMs on the box, read from /proc (no child process: it would count in the commands' CPU s)."""
    pids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"com.anaconda.skein.Driver" in (d / "cmdline").read_bytes():
                    pids.add(int(d.name))
            except OSError:
                pass
    return pids


def java_count() -> int:
    return len(driver_pids())


class JvmWatch:
    """Which skein driver JVMs appear while a command runs (sampled every 0.2 s: a private driver is stopped before
    the command exits, a shared one outlives it); ``started`` says whether the command started one."""

    def __init__(self):
        self.before, self.new, self._stop = driver_pids(), set(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.new |= driver_pids() - self.before

    def stop(self) -> bool:
        self._stop.set()
        self._t.join(5)
        self.new |= driver_pids() - self.before
        return bool(self.new)


def filecache_entries() -> int:
    """Directories in every NodeManager's user filecache (private resources: the env archive once per node)."""
    base = Path(os.environ.get("TFYARN_BENCH_NM_ROOT", Path(os.environ["HADOOP_CONF_DIR"]).parent))
    return sum(d.is_dir() for pat in ("*/usercache/*/filecache/*", "*/*/usercache/*/filecache/*")
               for d in base.glob(pat))


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_job(spec_path: Path, env: dict) -> dict:
    watch = JvmWatch()
    t0, c0 = time.time(), _cpu()
    p = subprocess.Popen([sys.executable, "-m", "tfyarn.cli", "-v", "run", str(spec_path), "--output", "json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = p.communicate(timeout=900)
    t_exit, cpu = time.time(), _cpu() - c0
    jvm = watch.stop()
    if p.returncode != 0:
        raise SystemExit(f"run failed ({p.returncode}):\n{err[-3000:]}\n{out[-2000:]}")
    st = json.loads(out)
    # The in-app supervisor writes the report next to the checkpoints; `tfyarn report` finds it wherever it is.
    rep = subprocess.run([sys.executable, "-m", "tfyarn.cli", "report", st["app_id"], "--output", "json"],
                         capture_output=True, text=True, env=env, timeout=180)
    if rep.returncode != 0:
        raise SystemExit(f"no run report for {st['app_id']} ({rep.returncode}):\n{rep.stderr[-3000:]}")
    report = json.loads(rep.stdout)
    ph = dict(report.get("phases") or {})
    ph["CLI exit"] = round(t_exit - st["finished"], 3)
    ph["start → exit"] = round(t_exit - t0, 3)
    ph["CLI CPU s"] = round(cpu, 3)       # the gateway's own work: all but this was waiting (cluster, a core)
    ph["driver JVM started"] = int(jvm)   # 0: a running driver (tfyarn's shared one, or `skein driver start`) reused
    ph["CLI start → run()"] = round((ph.get("start → exit") or 0) - (ph.get("start → app end") or 0)
                                    - ph["CLI exit"], 3)
    env_line = [ln for ln in err.splitlines() if "submitted" in ln and " as " in ln]
    return {"app_id": st["app_id"], "phases": ph, "submit_line": env_line[-1] if env_line else ""}


def median_table(runs: list[dict], title: str) -> list[str]:
    names = [n for n, _, _ in PHASES] + list(TOTALS)
    lines = [f"### {title}", "", "| phase | " + " | ".join(f"run {i + 1}" for i in range(len(runs)))
             + " | median |", "|---|" + "---|" * (len(runs) + 1)]
    for n in names:
        vals = [r["phases"].get(n) for r in runs]
        known = [v for v in vals if v is not None]
        med = f"{statistics.median(known):.2f}" if known else "-"
        lines.append(f"| {n} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in vals) + f" | {med} |")
    return lines + [""]


def commands(spec_path: Path, env: dict) -> list[str]:
    """Each command as a new CLI process on a running app: wall seconds, and the CPU seconds it used (on a loaded
    box the difference is time spent waiting for a core: the floor no code change removes)."""
    p, _ = cli(["submit", str(spec_path)], env)
    app_id = p.stdout.strip().splitlines()[-1]
    deadline = time.time() + 300               # every task running, so logs has lines to show
    while time.time() < deadline:
        doc = json.loads(cli(["status", app_id, "--output", "json"], env)[0].stdout)
        if doc["state"] == "RUNNING" and any(t["state"] == "RUNNING" for t in doc["tasks"]):
            break
        time.sleep(2)
    time.sleep(3)
    jvms0 = java_count()
    rows = []
    for name, args in (("status", ["status", app_id]), ("list", ["list", "--running"]),
                       ("logs (first line)", None), ("kill", ["kill", app_id])):
        c0, watch = _cpu(), JvmWatch()
        if args is None:
            t0 = time.time()
            proc = subprocess.Popen([sys.executable, "-m", "tfyarn.cli", "logs", app_id], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, env=env)
            first = proc.stdout.readline()
            dt = time.time() - t0
            proc.kill()
            proc.wait()
            rows.append((name, dt, _cpu() - c0, watch.stop(), "line: " + first.strip()[:60]))
            continue
        proc, dt = cli(args, env)
        rows.append((name, dt, _cpu() - c0, watch.stop(), (proc.stdout.strip().splitlines() or [""])[-1][:60]))
    state = json.loads(cli(["status", app_id, "--output", "json"], env)[0].stdout)["state"]
    lines = [f"### Commands on a running app (new CLI process each; skein driver JVMs on the box before/after: "
             f"{jvms0}/{java_count()}; state after kill returned: {state})", "",
             "| command | wall s | CPU s | driver JVM started | output |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {dt:.2f} | {cpu:.2f} | {'yes' if jvm else 'no'} | {o.replace('|', '/')} |"
              for n, dt, cpu, jvm, o in rows]
    return lines + [""]


def supervisor_ab(doc: dict, env: dict, pairs: int) -> list[str]:
    """The in-app supervisor's cost: the same job submitted with and without its service, alternating (same load
    for both), through ``dryrun`` → drop the service → ``schedule`` and followed by ``wait`` as ``run`` does.
    Figures from the ResourceManager: submit (app start) → app finished."""
    from tfyarn import runner
    from tfyarn.backends.yarn.backend import YarnBackend
    from tfyarn.backends.yarn.rest import RmRest
    from tfyarn.backends.yarn.appspec import SUPERVISED_TAG, SUPERVISOR_SERVICE
    from tfyarn.spec import load_spec_dict
    os.environ.update(env)
    spec = load_spec_dict(doc)
    times: dict[str, list[float]] = {"with": [], "without": []}
    with YarnBackend() as b:
        rm = RmRest(b.conf, b.user)
        for i in range(pairs):
            for kind in ("with", "without") if i % 2 == 0 else ("without", "with"):
                req = b.dryrun(spec)
                if kind == "without":
                    del req.app.services[SUPERVISOR_SERVICE]
                    req.app.tags = set(req.app.tags) - {SUPERVISED_TAG}
                app_id = b.schedule(req)
                st = runner.wait(b, app_id, timeout=600)
                rep = rm.report(app_id)
                dt = (rep.finish_time - rep.start_time).total_seconds()
                times[kind].append(dt)
                print(f"supervisor a/b {kind}: {app_id} {st.state.value} submit → app end {dt:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return [f"### The in-app supervisor's cost ({pairs} pairs, alternating; RM submit → app finished)", "",
            "| | " + " | ".join(f"pair {i + 1}" for i in range(pairs)) + " | median |",
            "|---|" + "---|" * (pairs + 1),
            *(f"| {k} supervisor | " + " | ".join(f"{v:.2f}" for v in times[k]) + f" | {med[k]:.2f} |"
              for k in ("with", "without")),
            "", f"cost of the supervisor: **{med['with'] - med['without']:+.2f} s** (median difference)", ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pack", action="store_true", help="also a packed env: cold, then cached runs")
    ap.add_argument("--no-commands", action="store_true")
    ap.add_argument("--no-node", action="store_true", help="skip the node-python runs (e.g. with --pack)")
    ap.add_argument("--supervisor-ab", type=int, default=0, metavar="PAIRS",
                    help="also PAIRS runs of the node-python job with and without the in-app supervisor")
    ap.add_argument("--write", action="store_true", help="record the tables in BENCHMARKS.md")
    a = ap.parse_args()
    if not os.environ.get("HADOOP_CONF_DIR"):
        raise SystemExit("set HADOOP_CONF_DIR (e.g. . ../shared/hadoop/env.sh DIR)")
    from tfyarn.data.synth import write_synthetic
    import fsspec

    tag = f"tfyarn-bench-{uuid.uuid4().hex[:8]}"
    from tfyarn.cluster import hdfs
    prefix = f"{hdfs.default_fs(hdfs.load_hadoop_conf())}/tmp/{tag}"   # the cluster of HADOOP_CONF_DIR
    work = Path(tempfile.mkdtemp(prefix="tfyarn-bench-"))
    # the benchmark's own shared skein driver (the first run starts it, later ones reuse it), stopped at the end
    env = {**os.environ, "TFYARN_HOME": str(work / "home"), "PYTHONPATH": str(ROOT),
           "TFYARN_DRIVER_DIR": str(work / "driver")}
    # 3 training workers × batch 100: 6 steps each = 18 global steps
    write_synthetic(f"{prefix}/data", "recommender", files=6, records=1900, skew=1.0, users=100, items=100)
    out = [f"{time.strftime('%Y-%m-%d %H:%M')}, before: {load()}", ""]
    print(out[0], flush=True)
    try:
        node = job_doc(f"{prefix}/data/*.tfrecord", "bench-node", {"python": sys.executable}, tag)
        spec = work / "node.yaml"
        spec.write_text(json.dumps(node))
        runs = []
        for i in range(0 if a.no_node else a.runs):
            r = run_job(spec, env)
            runs.append(r)
            print(f"node run {i + 1}: {r['app_id']}: " + ", ".join(f"{k} {v}" for k, v in r["phases"].items()),
                  flush=True)
        if runs:
            out += median_table(runs, f"node python, {a.runs} runs")
        if a.pack:
            penv = {**env, "TFYARN_STAGING_DIR": f"{prefix}/staging", "TFYARN_CACHE_DIR": str(work / "cache")}
            doc = job_doc(f"{prefix}/data/*.tfrecord", "bench-pack", {"pack": "venv"}, tag)
            spec = work / "pack.yaml"
            spec.write_text(json.dumps(doc))
            fc0 = filecache_entries()
            c0 = _cpu()
            p, dt = cli(["pack", str(spec)], penv, timeout=1800)
            out += [f"### Packed env ({sys.prefix})", "",
                    f"cold pack + upload (`tfyarn pack`, empty staging dir and local cache): **{dt:.1f} s** "
                    f"({_cpu() - c0:.1f} CPU s); "
                    f"{(p.stdout.strip().splitlines() or [''])[-1]}", ""]
            print(out[-2], flush=True)
            pruns = []
            for i in range(a.runs):
                r = run_job(spec, penv)
                r["filecache"] = filecache_entries()
                pruns.append(r)
                print(f"pack run {i + 1}: {r['app_id']}: {r['submit_line'][-90:]} filecache {r['filecache']} "
                      + ", ".join(f"{k} {v}" for k, v in r["phases"].items()), flush=True)
            out += [f"NodeManager user filecache entries: {fc0} before, then "
                    + ", ".join(str(r["filecache"]) for r in pruns) + " after each run", ""]
            out += median_table(pruns, f"packed env (first run localizes, then cached), {a.runs} runs")
            # the same env as a plain tar (TFYARN_PACK_LEVEL=0): no gzip at pack time nor at localization
            zenv = {**penv, "TFYARN_PACK_LEVEL": "0", "TFYARN_STAGING_DIR": f"{prefix}/staging0",
                    "TFYARN_CACHE_DIR": str(work / "cache0")}
            c0 = _cpu()
            p, dt = cli(["pack", str(spec)], zenv, timeout=1800)
            out += [f"cold pack + upload at `TFYARN_PACK_LEVEL=0` (a plain .tar): **{dt:.1f} s** "
                    f"({_cpu() - c0:.1f} CPU s); {(p.stdout.strip().splitlines() or [''])[-1]}", ""]
            print(out[-2], flush=True)
            r = run_job(spec, zenv)["phases"]
            out += [f"its first run (every node localizes the .tar): containers start **{r.get('containers start')} s**"
                    f", start → exit {r.get('start → exit')} s", ""]
            print(out[-2], flush=True)
        if a.supervisor_ab:
            out += supervisor_ab(node, env, a.supervisor_ab)
        if not a.no_commands:
            out += commands(work / "node.yaml", env)
        out.append(f"after: {load()}")
    finally:
        from tfyarn.backends.yarn import driver
        driver.stop_all(work / "driver")
        fs, path = fsspec.core.url_to_fs(prefix)
        if fs.exists(path):
            fs.rm(path, recursive=True)
    text = "\n".join(out)
    print(text)
    if a.write:
        bm = ROOT / "BENCHMARKS.md"
        doc = bm.read_text()
        head, sep, rest = doc.partition(SECTION)
        tail = rest[rest.find("\n## "):] if sep and "\n## " in rest else ""
        body = f"{SECTION}\n\nMeasured by `scripts/bench_yarn.py` on the shared dev cluster.\n\n{text}\n"
        bm.write_text(head.rstrip() + "\n\n" + body + tail if sep else doc.rstrip() + "\n\n" + body)


if __name__ == "__main__":
    main()
