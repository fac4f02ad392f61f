"""What preflight's resource checks ask of a YARN cluster (:class:`tfyarn.gateway.preflight.ClusterInfo`): its queues
and its largest container, from the RM's scheduler REST API, else through a skein client and the client's config.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tfyarn.cluster import hdfs, webauth
from tfyarn.backends.yarn.rest import rm_webapp_urls
from tfyarn.gateway.preflight import QueueInfo

log = logging.getLogger(__name__)


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class SkeinClusterInfo:
    """Queues through a skein ``Client``; maxima from the RM scheduler REST API, else from the client config."""

    def __init__(self, client: Any, conf: dict[str, str] | None = None, http_timeout: float = 5.0):
        self.client = client
        self.conf = hdfs.load_hadoop_conf() if conf is None else conf
        self.http_timeout = http_timeout
        self._sched: dict[str, Any] | None = None

    def _scheduler(self) -> dict[str, Any]:
        if self._sched is None:
            self._sched = {}
            for base in rm_webapp_urls(self.conf):
                try:
                    with webauth.urlopen(f"{base}/ws/v1/cluster/scheduler", timeout=self.http_timeout) as r:
                        self._sched = json.loads(r.read()).get("scheduler", {}).get("schedulerInfo", {})
                        break
                except (OSError, ValueError) as exc:
                    log.debug("RM scheduler API at %s: %s", base, exc)
        return self._sched

    def _rest_queue(self, name: str) -> dict[str, Any] | None:
        def walk(q: dict[str, Any]) -> dict[str, Any] | None:
            if q.get("queueName") == name:
                return q
            children = (q.get("queues") or {}).get("queue") or []
            for c in children if isinstance(children, list) else [children]:
                hit = walk(c)
                if hit:
                    return hit
            return None

        s = self._scheduler()
        return walk(s) if s else None

    def queue(self, name: str) -> QueueInfo | None:
        rq = self._rest_queue(name) or {}
        ma = rq.get("maximumAllocation") or {}
        mem, vc = _int(ma.get("memory")), _int(ma.get("vCores"))
        if rq.get("state"):  # the RM's REST answer is enough: the skein driver may still be starting
            return QueueInfo(name, str(rq["state"]), mem, vc, tuple(rq.get("nodeLabels") or ()) or None)
        try:
            q = self.client.get_queue(name)
        except Exception as exc:
            if any(word in str(exc).lower() for word in ("not", "unknown", "exist")):
                return None
            raise
        if mem is None:
            for k, v in self.conf.items():
                if k.endswith(f".{name}.maximum-allocation-mb") and k.startswith("yarn.scheduler.capacity."):
                    mem = _int(v)
                if k.endswith(f".{name}.maximum-allocation-vcores") and k.startswith("yarn.scheduler.capacity."):
                    vc = _int(v)
        return QueueInfo(q.name, str(q.state), mem, vc, tuple(getattr(q, "node_labels", ()) or ()) or None)

    def max_allocation(self) -> tuple[int | None, int | None]:
        ma = self._scheduler().get("maximumAllocation") or {}
        return (
            _int(ma.get("memory")) or _int(self.conf.get("yarn.scheduler.maximum-allocation-mb", 8192)),
            _int(ma.get("vCores")) or _int(self.conf.get("yarn.scheduler.maximum-allocation-vcores", 4)),
        )
