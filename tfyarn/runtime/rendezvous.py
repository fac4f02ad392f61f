"""Rendezvous: every cluster task publishes its address and learns everyone else's, with a bounded wait.

The cluster roles (chief, worker, ps) each reserve a port, publish ``addr/<task> = host:port`` in the KV, then wait for
all their peers. The wait is bounded by ``timeouts.rendezvous`` and its error names the tasks that never showed up
(a container YARN never allocated, a process that hung before starting) instead of hanging like a bare gRPC connect.
Evaluator and tensorboard are outside the TF cluster: they publish nothing and need no addresses.
"""
from __future__ import annotations

import logging
import os
import socket

from tfyarn.errors import WaitTimeout
from tfyarn.runtime.context import addr_key
from tfyarn.runtime.kv import KV
from tfyarn.spec import CLUSTER_ROLES, JobSpec

log = logging.getLogger(__name__)


def task_host() -> str:
    """The address peers use to reach this task: TFYARN_HOST, else YARN's NM_HOST, else this host's FQDN."""
    return os.environ.get("TFYARN_HOST") or os.environ.get("NM_HOST") or socket.getfqdn()


def reserve_port(host: str) -> int:
    """A free TCP port on ``host``. The socket is closed before the TF server binds it (a small, accepted race)."""
    bind_host = "127.0.0.1" if host in ("localhost", "127.0.0.1") else ""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((bind_host, 0))
        return s.getsockname()[1]


def cluster_tasks(spec: JobSpec) -> list[str]:
    return [t for t in spec.tasks() if t.split(":")[0] in CLUSTER_ROLES]


def build_cluster(spec: JobSpec, addrs: dict[str, str]) -> dict[str, list[str]]:
    """TF cluster spec from published addresses; roles with no instances are left out (TF rejects empty jobs)."""
    cluster: dict[str, list[str]] = {}
    for role in CLUSTER_ROLES:
        n = spec.instances(role)
        if n:
            cluster[role] = [addrs[addr_key(f"{role}:{i}")] for i in range(n)]
    return cluster


def rendezvous(spec: JobSpec, role: str, index: int, kv: KV, host: str) -> tuple[dict[str, list[str]], int | None]:
    """Publish this task's address (cluster roles) and wait for every cluster task's. Returns (cluster, port)."""
    if role not in CLUSTER_ROLES:
        return {}, None
    port = reserve_port(host)
    me = f"{role}:{index}"
    kv.put(addr_key(me), f"{host}:{port}")
    log.info("published %s at %s:%d; waiting for %d peers (timeout %gs)", me, host, port,
             len(cluster_tasks(spec)) - 1, spec.timeouts.rendezvous)
    keys = [addr_key(t) for t in cluster_tasks(spec)]
    try:
        addrs = kv.wait_all(keys, spec.timeouts.rendezvous, what="peers to publish their addresses")
    except WaitTimeout:
        missing = [t for t in cluster_tasks(spec) if kv.get(addr_key(t)) is None]
        raise WaitTimeout(f"rendezvous timed out after {spec.timeouts.rendezvous:g}s: "
                          f"{', '.join(missing)} never started (no address published)") from None
    return build_cluster(spec, addrs), port
