"""Rendezvous: every cluster task (chief, worker, ps) publishes ``addr/<task> = host:port`` and waits for all its
peers', bounded by ``timeouts.rendezvous`` with an error naming the tasks that never showed up (instead of hanging
like a bare gRPC connect). Evaluator and tensorboard are outside the TF cluster: they publish nothing.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from pathlib import Path

from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.context import addr_key
from tfyarn.tasklib.kv import KV
from tfyarn.spec import CLUSTER_ROLES, JobSpec

log = logging.getLogger(__name__)


def task_host() -> str:
    """The address peers use to reach this task: TFYARN_HOST, else YARN's NM_HOST, else this host's FQDN."""
    return os.environ.get("TFYARN_HOST") or os.environ.get("NM_HOST") or socket.getfqdn()


#: A task's port is drawn from here up to just below the kernel's ephemeral range: it is published at once but TF's
#: server binds it only after the rendezvous and TF's import (seconds, a minute on a loaded node), and an ephemeral
#: port is by then often some outgoing connection's (seen on YARN: "Could not start gRPC server" for
#: 0.0.0.0:41985, the ps failing the job). Outgoing connections never take a port below that range.
PORT_FLOOR = 20000
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; other systems: the same idea


def _bind_all(port: int) -> int | None:
    """Bind ``port`` (0: any) on every interface, as TF's server will (``0.0.0.0``); the port, or None if taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return None
        return s.getsockname()[1]


def reserve_port(tries: int = 64) -> int:
    """A TCP port free on every interface (as TF binds it: not only on 127.0.0.1), chosen at random below the
    ephemeral range when it leaves room (else any free port). It is closed again before TF's server binds it: a race,
    made small by staying out of the range outgoing connections draw from."""
    top = _ephemeral_low() - 1
    if top - PORT_FLOOR >= 1000:
        pick = random.SystemRandom()  # forked tasks share the parent's `random` state
        for _ in range(tries):
            port = _bind_all(pick.randint(PORT_FLOOR, top))
            if port is not None:
                return port
    port = _bind_all(0)
    if port is None:
        raise OSError("no free TCP port for this task's TF server")
    return port


def build_cluster(spec: JobSpec, addrs: dict[str, str]) -> dict[str, list[str]]:
    """TF cluster spec from published addresses; roles with no instances are left out (TF rejects empty jobs)."""
    return {
        role: [addrs[addr_key(f"{role}:{i}")] for i in range(spec.instances(role))]
        for role in CLUSTER_ROLES
        if spec.instances(role)
    }


def rendezvous(spec: JobSpec, role: str, index: int, kv: KV, host: str) -> tuple[dict[str, list[str]], int | None]:
    """Publish this task's address (cluster roles) and wait for every cluster task's. Returns (cluster, port)."""
    if role not in CLUSTER_ROLES or spec.job == "predict":  # scoring workers never talk to each other
        return {}, None
    port, wait_s = reserve_port(), spec.timeouts.rendezvous
    me = f"{role}:{index}"
    kv.put(addr_key(me), f"{host}:{port}")
    tasks = [t for t in spec.tasks() if t.split(":")[0] in CLUSTER_ROLES]
    log.info("published %s at %s:%d; waiting for %d peers (timeout %gs)", me, host, port, len(tasks) - 1, wait_s)
    try:
        addrs = kv.wait_all([addr_key(t) for t in tasks], wait_s, what="peers to publish their addresses")
    except WaitTimeout:
        missing = [t for t in tasks if kv.get(addr_key(t)) is None]
        raise WaitTimeout(
            f"rendezvous timed out after {wait_s:g}s: {', '.join(missing)} never started (no address published)"
        ) from None
    return build_cluster(spec, addrs), port
