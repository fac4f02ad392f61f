"""Chaos trials: N real local ps jobs (1 ps + chief + 1 worker), each hit by one random fault, and a table of how
they ended. Why: the fault-tolerance claims of issue 6 (a killed worker rejoins and the job ends at the planned global
step; a killed ps or chief costs at most one checkpoint interval) are only as good as their worst random trial.

Faults: ``worker_kill`` (SIGKILL worker:0 at a random step, restarted in place, rejoins), ``chief_kill`` and
``ps_kill`` (SIGKILL, the job restarts as attempt 2 from the latest checkpoint).

    .venv/bin/python scripts/chaos.py 20 --faults worker_kill
    .venv/bin/python scripts/chaos.py 6 --faults chief_kill,ps_kill

A trial *completes* when the job SUCCEEDED with the planned global step and every worker ran its planned steps.
Recovery time: kill → the victim's first step after the restart (worker), or → the first step of the next attempt.
Lost steps: worker kill — the in-flight steps the restarted worker reported; ps/chief kill — global steps between the
last observed step before the kill and the checkpoint the next attempt resumed from (work done twice).
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "faults")]

from faultutil import fault_spec, planned_steps, task_process, task_step  # noqa: E402
from tfyarn import runner  # noqa: E402
from tfyarn.backends.base import AppState  # noqa: E402
from tfyarn.backends.local.backend import LocalBackend  # noqa: E402

log = logging.getLogger("chaos")
FAULTS = ("worker_kill", "chief_kill", "ps_kill")
EVERY = 6


def wait_until(pred, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


def trial(i: int, fault: str, rng: random.Random, work: Path) -> dict:
    tmp = work / f"trial-{i:03d}"
    tmp.mkdir(parents=True)
    os.environ["TFYARN_HOME"] = str(tmp / "home")
    spec = fault_spec(tmp, worker={"max_restarts": 2, "restart": "exit_code"}, checkpoint_every=EVERY,
                      delay=0.1, epochs=3,
                      retry={"max_attempts": 2, "backoff": "0.5s"})
    steps = planned_steps(spec)
    per_worker, total = sum(steps), 2 * sum(steps)
    victim = {"worker_kill": "worker:0", "chief_kill": "chief:0", "ps_kill": "ps:0"}[fault]
    watch = "worker:0" if fault == "worker_kill" else "chief:0"
    kill_at = rng.randint(2, per_worker - 20)  # progress lags ~1.5 s
    backend = LocalBackend()
    t0 = time.monotonic()
    app_id = backend.submit(spec)
    row = {"trial": i, "fault": fault, "kill_at": kill_at, "app": app_id}
    try:
        def done_or_at():
            st = backend.status(app_id)
            return st.state.is_terminal or task_step(backend, app_id, watch) >= kill_at
        wait_until(done_or_at, 120, f"{watch} step {kill_at}")
        st = backend.status(app_id)
        if st.state.is_terminal:
            return {**row, "ok": False, "why": f"ended before the kill: {st.state.value} {st.diagnostics}"}
        seen_gs = int(st.progress.get("global_step") or 0)
        seen_step = task_step(backend, app_id, watch)
        task_process(app_id, victim).send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        if fault == "worker_kill":
            wait_until(lambda: backend.status(app_id).state.is_terminal
                       or task_step(backend, app_id, "worker:0") > seen_step + 1, 120, "the worker's rejoin")
        else:
            wait_until(lambda: backend.status(app_id).state.is_terminal or (
                backend.status(app_id).attempt >= 1 and task_step(backend, app_id, "chief:0") > 0),
                150, "the next attempt's first step")
        recovery = time.monotonic() - t_kill
        st = runner.wait(backend, app_id, timeout=240, poll=0.2)
    except Exception as exc:  # noqa: BLE001 - a trial that breaks is a failed trial, with the reason
        try:
            backend.kill(app_id, timeout=30)
        except Exception:  # noqa: BLE001
            pass
        return {**row, "ok": False, "why": f"{type(exc).__name__}: {exc}"}
    s = st.summary or {}
    ok = (st.state is AppState.SUCCEEDED and s.get("global_step") == total
          and s.get("steps_per_worker") == {"chief:0": per_worker, "worker:0": per_worker})
    if fault == "worker_kill":
        lost = sum((s.get("lost_steps") or {}).values())
        ok = ok and (s.get("rejoins") or {}).get("worker:0") == 1 and st.attempt == 0
    else:
        chief_log = "\n".join(backend.logs(app_id, task="chief:0"))
        m = re.search(r"resuming from \S+ \(global step (\d+)\)", chief_log)
        resumed = int(m.group(1)) if m else 0
        lost = max(0, seen_gs - resumed)
        ok = ok and st.attempt == 1 and m is not None
    return {**row, "ok": ok, "recovery_s": recovery, "lost_steps": lost, "global_step": s.get("global_step"),
            "target": total, "elapsed_s": time.monotonic() - t0,
            "why": "" if ok else f"{st.state.value} {st.diagnostics} attempt={st.attempt} summary={s}"}


def table(rows: list[dict]) -> str:
    out = ["| fault | trials | completed (planned global step) | mean recovery (s) | max recovery (s) | "
           "lost steps (total / max per trial) |", "|---|---|---|---|---|---|"]
    for fault in FAULTS + ("all",):
        rs = [r for r in rows if fault in ("all", r["fault"])]
        if not rs:
            continue
        rec = [r["recovery_s"] for r in rs if "recovery_s" in r]
        lost = [r.get("lost_steps", 0) for r in rs if "lost_steps" in r]
        out.append(f"| {fault} | {len(rs)} | {sum(r['ok'] for r in rs)}/{len(rs)} | "
                   f"{statistics.mean(rec):.1f} | {max(rec):.1f} | {sum(lost)} / {max(lost)} |" if rec else
                   f"| {fault} | {len(rs)} | {sum(r['ok'] for r in rs)}/{len(rs)} | - | - | - |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", type=int, help="number of trials")
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset of " + ", ".join(FAULTS))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", default=None, help="keep the trials' app dirs and logs under this directory")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        ap.error(f"unknown fault(s) {bad}; choose from {FAULTS}")
    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfyarn-chaos-") as tmp:
        work = args.keep or tmp
        for i in range(args.n):
            fault = rng.choice(faults)
            r = trial(i, fault, rng, Path(work))
            rows.append(r)
            log.info("trial %d %s kill_at=%s: %s recovery=%.1fs lost=%s %s", i, fault, r["kill_at"],
                     "completed" if r["ok"] else "FAILED", r.get("recovery_s", float("nan")),
                     r.get("lost_steps"), r["why"])
    print(table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
