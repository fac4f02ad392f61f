#!/usr/bin/env python
"""The job's page (issue 32): what it costs its server while nobody looks, and how fast it answers.

Goals: < 1 % of a core idle, < 200 ms per answer. Measured in one run:

* idle: a child process serving a page (the StatusPage the launcher and the in-app supervisor
  start) and doing nothing else, its CPU time over ``--idle`` seconds, against the same child
  without the page (the difference is the page's cost);
* answers: ``/``, ``/status.json`` and ``/history.json`` of a page whose status has ``--tasks``
  tasks and whose history has ``--points`` points (a long job's), ``--requests`` times each,
  median and max wall time;
* ``--url URL``: also the answer times of a live page (a YARN job's, through the RM's proxy).

    python scripts/bench_page.py [--idle 30] [--url http://RM:8088/proxy/<app>/pages/tfyarn/]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request

CHILD = r"""
import sys, time, json
with_page = sys.argv[1] == "1"
tasks, points = int(sys.argv[2]), int(sys.argv[3])
doc = {"schema": "tfyarn.status/1", "app_id": "bench", "backend": "local", "name": "bench",
       "state": "RUNNING", "diagnostics": "",
       "progress": {"global_step": 1000, "total_steps": 5000, "examples_per_sec": 1e5,
       "loss": 0.3, "eta_s": 40, "per_task": {f"worker:{i}": 1000 for i in range(tasks)}},
       "tasks": [{"task": f"worker:{i}", "state": "RUNNING", "host": "node-%d" % i, "restarts": 0,
                  "exit_code": None, "diagnostics": "",
                  "log": "http://node:8042/node/containerlogs/c/u",
                  "memory_mib": 2048, "peak_rss_mib": 700, "cpu_percent": 95.5, "rss_mib": 690}
                 for i in range(tasks)],
       "started": time.time(), "finished": None, "tracking_url": None,
       "summary": None, "tags": [], "attempt": 0, "exit_code": None}
pts = [{"task": f"worker:{i % tasks}", "time": 1e9 + i * 0.5, "step": i, "global_step": i,
        "epoch": 0,
        "loss": 1.0 / (i + 1), "examples_per_sec": 1000.0} for i in range(points)]
if with_page:
    from tfyarn.web import StatusPage
    page = StatusPage(lambda: doc, lambda: pts).start()
    print(page.url, flush=True)
else:
    print("-", flush=True)
sys.stdin.read()   # until the parent closes it
"""


def child(with_page: bool, tasks: int, points: int) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, "1" if with_page else "0", str(tasks), str(points)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return p, p.stdout.readline().strip()


def idle_cpu(with_page: bool, seconds: float, tasks: int, points: int) -> float:
    """CPU seconds per wall second (x100: % of a core) of the child over ``seconds`` once it is
    ready."""
    import psutil

    p, _ = child(with_page, tasks, points)
    try:
        time.sleep(1.0)  # its start-up is not idle
        proc = psutil.Process(p.pid)
        c0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        c1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        return (c1 - c0) / (t1 - t0) * 100
    finally:
        p.stdin.close()
        p.wait(10)


def answer_times(base: str, requests: int) -> dict[str, dict[str, float]]:
    out = {}
    for route in ("", "status.json", "history.json?since=0"):
        times, size = [], 0
        for _ in range(requests):
            t0 = time.perf_counter()
            with urllib.request.urlopen(base + route, timeout=30) as r:
                size = len(r.read())
            times.append((time.perf_counter() - t0) * 1000)
        out[route or "/"] = {
            "median_ms": round(statistics.median(times), 2),
            "max_ms": round(max(times), 2),
            "bytes": size,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--idle", type=float, default=30.0, help="seconds of idle measurement per variant"
    )
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--points", type=int, default=5000)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--url", help="a live page to time as well")
    a = ap.parse_args()
    res: dict = {"idle_pct_of_a_core": {}}
    for with_page in (False, True):  # alternating twice: a shared box's load drifts
        for _ in range(2):
            res["idle_pct_of_a_core"].setdefault(
                "with_page" if with_page else "without", []
            ).append(round(idle_cpu(with_page, a.idle, a.tasks, a.points), 3))
    p, url = child(True, a.tasks, a.points)
    try:
        res["synthetic"] = {"tasks": a.tasks, "points": a.points, **answer_times(url, a.requests)}
    finally:
        p.stdin.close()
        p.wait(10)
    if a.url:
        res["live"] = {
            "url": a.url,
            **answer_times(a.url.rstrip("/") + "/", max(5, a.requests // 5)),
        }
    try:
        import os

        res["load_avg"] = [round(x, 1) for x in os.getloadavg()]
    except OSError:
        pass
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
