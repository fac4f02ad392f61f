"""What a task's process tree uses (CPU % and resident memory), published by the task itself every
few seconds.

Why the task measures itself: on YARN nobody else can (the NodeManager measures but does not tell
the app; the supervisor runs in another container, often on another node), so ``peak_rss_mib`` was
``null`` there and "how close to its memory limit is the ps" had no answer before YARN killed the
container. Every role publishes (the ps too, which reports no progress): ``resources/<task>`` =
``{cpu_percent, rss_mib, peak_rss_mib, memory_mib, time}``. The tree is the task's process and its
descendants (the framing processes of its feeders), as YARN counts a container; CPU % is of one core
(top's convention: 200 = two cores busy)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

import psutil

from tfyarn.contracts.kv_keys import resources_key
from tfyarn.tasklib.kv import KV, KVUnavailable

log = logging.getLogger("tfyarn.task.resources")

#: Seconds between two samples (each costs ~0.2 ms: /proc reads of the tree, no process-table scan).
INTERVAL_S = 2.0
#: Share of its role's memory above which a task is warned about (YARN kills it at 100 %).
MEMORY_WARN = 0.9


def _children(pid: int) -> list[int]:
    """Direct children from ``/proc/<pid>/task/*/children`` (cheap: no scan of every process);
    psutil otherwise."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        return out
    except OSError:
        try:
            return [c.pid for c in psutil.Process(pid).children()]
        except psutil.Error:
            return []


def _high_water_mark(pid: int) -> int:
    """Peak resident bytes of ``pid`` so far (``VmHWM``), 0 where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


class TreeMeter:
    """CPU % (since the previous sample) and resident bytes of a process and its descendants."""

    def __init__(self, pid: int | None = None, clock=time.monotonic):

        self.psutil, self.clock = psutil, clock
        self.root = psutil.Process(pid or os.getpid())
        self._procs: dict[int, Any] = {}
        self._last: tuple[float, float] | None = None  # (time, CPU seconds of the tree)
        self.peak_rss = 0

    def _tree(self) -> list[Any]:
        pids, todo = [], [self.root.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo += _children(pid)
        procs = []
        for pid in pids:
            p = self._procs.get(pid) or (self.root if pid == self.root.pid else self.psutil.Process(pid))
            procs.append(p)
        self._procs = {p.pid: p for p in procs}
        return procs

    def sample(self) -> dict[str, Any]:
        cpu = rss = 0.0
        for p in self._tree():
            try:
                t = p.cpu_times()
                cpu += t.user + t.system + (t.children_user + t.children_system if p is self.root else 0.0)
                rss += p.memory_info().rss
            except self.psutil.Error:  # ended between the listing and the read
                continue
        now = self.clock()
        percent = None
        if self._last is not None and now > self._last[0]:
            percent = round(max(0.0, cpu - self._last[1]) / (now - self._last[0]) * 100, 1)
        self._last = (now, cpu)
        # (the kernel's high-water mark of the task's own process: a peak between two samples, as a ps's while it
        # initialises its variables, is not missed)
        self.peak_rss = max(self.peak_rss, int(rss), _high_water_mark(self.root.pid))
        return {"cpu_percent": percent, "rss_mib": int(rss) >> 20, "peak_rss_mib": self.peak_rss >> 20}


class ResourcePublisher:
    """A daemon thread: every ``interval`` s a :class:`TreeMeter` sample to ``resources/<task>``,
    and one warning in the task's log when it crosses :data:`MEMORY_WARN` of ``memory_mib`` (its
    container's size)."""

    def __init__(self, kv: KV, task: str, memory_mib: int | None, interval: float = INTERVAL_S):
        self.kv, self.task, self.memory_mib, self.interval = kv, task, memory_mib, interval
        self.meter = TreeMeter()
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="tfyarn-resources", daemon=True)

    def start(self) -> "ResourcePublisher":
        self._thread.start()
        return self

    def publish(self) -> dict[str, Any]:
        rec = self.meter.sample() | {"memory_mib": self.memory_mib, "time": round(time.time(), 3)}
        if self.memory_mib and not self._warned and rec["rss_mib"] >= MEMORY_WARN * self.memory_mib:
            self._warned = True
            log.warning(
                "%s uses %d MiB of resident memory, %.0f%% of its container's %d MiB: YARN kills it above 100%%",
                self.task,
                rec["rss_mib"],
                100 * rec["rss_mib"] / self.memory_mib,
                self.memory_mib,
            )
        self.kv.put(resources_key(self.task), json.dumps(rec, separators=(",", ":")))
        return rec

    def _run(self) -> None:
        failed = False
        while True:
            try:
                self.publish()
            except (KVUnavailable, OSError) as exc:  # advisory: never the task's failure
                if not failed:
                    log.info("%s: cannot publish resource use: %s", self.task, exc)
                failed = True
            except Exception:
                log.debug("resource sample failed", exc_info=True)
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()


def start_publisher(kv: KV, task: str, memory_mib: int | None) -> ResourcePublisher | None:
    """Start publishing this task's resource use (``TFYARN_RESOURCES=0``: not at all)."""
    if os.environ.get("TFYARN_RESOURCES", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        return ResourcePublisher(kv, task, memory_mib).start()
    except Exception as exc:  # noqa: BLE001 - (psutil missing or refused): the task runs on
        log.info("%s: no resource publishing: %s", task, exc)
        return None
