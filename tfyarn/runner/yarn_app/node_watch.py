"""A lost node noticed in seconds: a task silent past ``timeouts.node_lost`` while its host's
NodeManager does not answer is lost with its node, and the in-app supervisor ends the attempt at
once naming it.

Why: YARN itself declares a node lost only after ``yarn.nm.liveness-monitor.expiry-interval-ms`` (10
minutes by default); until then skein shows the dead node's containers RUNNING, TF raises nothing (a
ps worker waits on its peer for ``timeouts.step``) and status said ``tasks 5/5 running``. Both signs
are needed: a busy NodeManager that answers slowly, or a task in a long step, alone is not a loss.
The NodeManager is probed on its web address (``/ws/v1/node/info``, the address skein gives each
container), with a short timeout."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tfyarn.contracts.kv_keys import PROGRESS_PREFIX
from tfyarn.backends.yarn.appspec import SUPERVISOR_SERVICE

PROBE_TIMEOUT_S = 2.0


def probe(nm_http_address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Does the NodeManager at ``host:port`` answer its web API?"""
    url = nm_http_address if "://" in nm_http_address else f"http://{nm_http_address}"
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/ws/v1/node/info", timeout=timeout) as r:
            return 200 <= r.status < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500  # it answered (an auth refusal is an answer)
    except OSError:
        return False


class NodeWatch:
    """One attempt's watch of its tasks' nodes. :meth:`check` with the app's containers and the
    tasks' last progress times returns a diagnosis once a task is lost with its node, else None."""

    def __init__(self, bound_s: float, prober: Callable[[str], bool] = probe, clock: Callable[[], float] = time.time):
        self.bound_s, self.prober, self.clock = bound_s, prober, clock
        self._down_since: dict[str, float] = {}  # NodeManager address → first failed probe (wall time)

    def check(self, containers: list[Any], taskmap: dict[str, str], last_heard: dict[str, float]) -> str | None:
        """``containers``: skein's (RUNNING ones are looked at); ``taskmap``: skein id → task;
        ``last_heard``: task → wall time of its newest progress record (or its start). None while
        every node answers."""
        now = self.clock()
        nodes: dict[str, list[str]] = {}
        for c in containers:
            # not the supervisor's own container: it is no task (never heard through progress/) and it is the one
            # asking; a NodeManager slow to answer under load made it "lost with its node" (issue 40's CPU hog)
            if str(c.state) == "RUNNING" and c.yarn_node_http_address and c.service_name != SUPERVISOR_SERVICE:
                task = taskmap.get(f"{c.service_name}_{c.instance}", f"{c.service_name}:{c.instance}")
                nodes.setdefault(c.yarn_node_http_address, []).append(task)
        for addr in list(self._down_since):
            if addr not in nodes:
                del self._down_since[addr]
        for addr, tasks in sorted(nodes.items()):
            if self.prober(addr):
                self._down_since.pop(addr, None)
                continue
            since = self._down_since.setdefault(addr, now)
            silent = [t for t in tasks if now - last_heard.get(t, since) >= self.bound_s]
            if now - since >= self.bound_s and silent:
                host = addr.split("://")[-1].rsplit(":", 1)[0]
                return (
                    f"{', '.join(silent)} lost with its node {host} (its NodeManager {addr} has "
                    f"not answered "
                    f"for {now - since:.0f}s and the task{'s' * (len(silent) > 1)} went silent, "
                    f"timeouts.node_lost {self.bound_s:g}s)"
                )
        return None


def last_heard(kv: dict[str, str]) -> dict[str, float]:
    """Task → wall time of its newest progress record (``progress/<task>``'s ``time``) in a KV
    snapshot."""
    out = {}
    for k, v in kv.items():
        if k.startswith(PROGRESS_PREFIX):
            try:
                out[k[len(PROGRESS_PREFIX) :]] = float(json.loads(v).get("time") or 0)
            except (ValueError, TypeError, AttributeError):
                continue
    return out
