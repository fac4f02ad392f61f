"""skein's lost container requests, noticed and requested again by the in-app supervisor.

Why: skein 0.8.2's application master gives each container request its own YARN priority and, after
every allocation round with news, restarts its numbering at ``priorities.lastKey() + 1``. YARN's
``Priority`` sorts in reverse (``compareTo`` is ``other - this``), so ``lastKey()`` is the *lowest*
pending priority: with two requests pending (priorities p and p+1) the next one gets p+1 again.
The newer request then replaces the older one in skein's priority → instance map, the RM is asked
for two containers at p+1, the first is matched to the newer instance, and the second, having no
entry left, is released ("due to canceled request"). The older instance stays REQUESTED for ever
with nothing pending at the ResourceManager (issue 30: a preempted async job's replacement never
started; tests/cluster/yarn/test_cluster_lostreq.py drives that sequence on a real cluster).

What this does: a task container REQUESTED longer than ``timeouts.rerequest`` while the RM holds
fewer pending containers for the app than skein has REQUESTED (or, when the RM lists no requests,
while the cluster and queue have room for it), seen twice :data:`CONFIRM_S` apart, is killed
(skein then withdraws its request) and a fresh one is added to its service — at most
:data:`MAX_PER_TASK` times per task, each said in one log line. Past that, ``timeouts.allocation``
ends the job naming the task.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from tfyarn.backends.yarn.appspec import SUPERVISOR_SERVICE
from tfyarn.backends.yarn.states import _by_task
from tfyarn.backends.yarn import rest as rm_rest

log = logging.getLogger(__name__)

#: A request is looked at only this long after skein said REQUESTED: its ask reaches the RM on
#: the application master's next heartbeat (1 s while requests are pending).
GRACE_S = 5.0
#: A shortfall must still be there this long after it was first seen: an allocated container
#: reaches skein on its next heartbeat (up to 5 s when it thinks nothing is pending).
CONFIRM_S = 6.0
#: Re-requests per task; past these the allocation timeout decides.
MAX_PER_TASK = 3


@dataclass(frozen=True)
class Waiting:
    """A REQUESTED task container: skein id (``worker_3``), its task, how long it waited (s)."""

    cid: str
    task: str
    waited: float


@dataclass(frozen=True)
class RmView:
    """What the ResourceManager says: containers pending for the app (None: it listed no request,
    which Hadoop also does when there are none), and whether the cluster has room for one."""

    pending: int | None
    room: bool


def lost_count(waiting: list[Waiting], rm: RmView) -> int:
    """How many of ``waiting`` the RM is not asked for: REQUESTED past :data:`GRACE_S` minus the
    RM's pending containers; with no list from the RM, all of them when the cluster has room."""
    settled = sum(w.waited >= GRACE_S for w in waiting)
    if rm.pending is not None:
        return max(0, settled - rm.pending)
    return settled if rm.room else 0


def choose(waiting: list[Waiting], lost: int, bound: float, tries: dict[str, int]) -> list[Waiting]:
    """The ``lost`` longest-waiting containers past ``bound`` whose task has re-requests left."""
    past = sorted((w for w in waiting if w.waited >= bound), key=lambda w: -w.waited)
    return [w for w in past if tries.get(w.task, 0) < MAX_PER_TASK][:lost]


def rm_view(rest: Any, app_id: str, queue: str, memory_mib: int, vcores: int) -> RmView:
    """The RM's pending asks of ``app_id`` (``resourceRequests`` of ``*``); only when it lists none,
    whether a RUNNING node and ``queue`` have ``memory_mib``/``vcores`` free (``rest``: RmRest)."""
    app = (rest.get(f"apps/{app_id}") or {}).get("app") or {}
    asks = app.get("resourceRequests")
    if asks:
        anywhere = [r for r in asks if r.get("resourceName") == "*"]
        pending = sum(int(r.get("numContainers") or 0) for r in anywhere)
        return RmView(pending, False)
    nodes = ((rest.get("nodes") or {}).get("nodes") or {}).get("node") or []
    fits = any(
        n.get("state") == "RUNNING"
        and int(n.get("availMemoryMB") or 0) >= memory_mib
        and int(n.get("availableVirtualCores") or 0) >= vcores
        for n in nodes
    )
    return RmView(None, fits and _queue_room(rest, queue) >= memory_mib)


def _queue_room(rest: Any, name: str) -> float:
    """Memory (MiB) ``name`` may still take (its maximum capacity minus its use); inf if unknown."""

    def walk(q: dict[str, Any]) -> dict[str, Any] | None:
        if q.get("queueName") == name:
            return q
        kids = (q.get("queues") or {}).get("queue") or []
        kids = kids if isinstance(kids, list) else [kids]
        return next((hit for k in kids if (hit := walk(k))), None)

    sched = ((rest.get("scheduler") or {}).get("scheduler") or {}).get("schedulerInfo") or {}
    q = walk(sched) or {}
    cap, used = (q.get("maxEffectiveCapacity") or {}).get("memory"), (q.get("resourcesUsed") or {})
    if cap is None:
        return float("inf")
    return float(cap) - float(used.get("memory") or 0)


class Rerequest:
    """One attempt's watch of its REQUESTED containers; :meth:`check` each supervisor round.

    ``app``: skein's ``ApplicationClient`` (``kill_container``, ``add_container``); ``rest``: a
    :class:`~tfyarn.backends.yarn.rest.RmRest` or None (made on first need; unreadable: no action).
    """

    def __init__(self, spec: Any, app: Any, app_id: str, rest: Any = None, clock: Callable[[], float] = time.time):
        self.spec, self.app, self.app_id, self.rest, self.clock = spec, app, app_id, rest, clock
        self.bound = float(spec.timeouts.rerequest)
        self.tries: dict[str, int] = {}  # task → re-requests made
        self.done: list[str] = []  # what it did, one line each (the log's text)
        self._seen: dict[str, float] = {}  # skein id → when first seen REQUESTED
        self._short_since: float | None = None
        self._errors = 0

    def _rest(self) -> Any:
        if self.rest is None:
            self.rest = rm_rest.in_container()  # the app's RM token on a secure cluster
        return self.rest

    def waiting(self, containers: list[Any], taskmap: dict[str, str]) -> list[Waiting]:
        """The app's REQUESTED task containers, with the task each is for (states._by_task)."""
        now = self.clock()
        tasks = [c for c in containers if c.service_name != SUPERVISOR_SERVICE]
        by_task = _by_task(tasks, taskmap, self.spec)
        owner = {f"{c.service_name}_{c.instance}": t for t, cs in by_task.items() for c in cs}
        ids = [f"{c.service_name}_{c.instance}" for c in tasks if str(c.state) == "REQUESTED"]
        self._seen = {cid: self._seen.get(cid, now) for cid in ids}
        return [Waiting(cid, owner.get(cid, cid), now - self._seen[cid]) for cid in ids]

    def check(self, containers: list[Any], taskmap: dict[str, str]) -> list[str]:
        """Re-request what skein lost; returns the lines it logged (none on most rounds). Never
        raises: an RM that cannot be read leaves every request as it is."""
        try:
            return self._check(containers, taskmap)
        except Exception as exc:  # noqa: BLE001 - a watch must never end the supervisor
            self._errors += 1  # said once, then every 60th round: an RM it cannot read stays so
            level = logging.WARNING if self._errors % 60 == 1 else logging.DEBUG
            log.log(level, "%s: could not check the container requests: %s", self.app_id, exc)
            return []

    def _check(self, containers: list[Any], taskmap: dict[str, str]) -> list[str]:
        waiting = self.waiting(containers, taskmap)
        past = [w for w in waiting if w.waited >= self.bound]
        if not past:
            self._short_since = None
            return []
        role = self.spec.role(_service(max(past, key=lambda w: w.waited).cid))
        rm = rm_view(self._rest(), self.app_id, self.spec.queue, role.memory_mib, role.vcores)
        lost, now = lost_count(waiting, rm), self.clock()
        if lost <= 0:
            self._short_since = None
            return []
        if self._short_since is None or now - self._short_since < CONFIRM_S:
            self._short_since = self._short_since or now
            return []
        self._short_since = None
        why = (
            f"the ResourceManager holds {rm.pending} of its {len(waiting)} requested containers"
            if rm.pending is not None
            else "the ResourceManager has no request pending while the cluster has room"
        )
        out = []
        for w in choose(waiting, lost, self.bound, self.tries):
            service = _service(w.cid)
            still = {
                f"{c.service_name}_{c.instance}"
                for c in self.app.get_containers(services=[service], states=["REQUESTED"])
            }
            if w.cid not in still:  # allocated meanwhile: a kill now would stop a running task
                continue
            self.tries[w.task] = n = self.tries.get(w.task, 0) + 1
            self.app.kill_container(w.cid)  # a REQUESTED one: skein withdraws its request
            new = self.app.add_container(service)
            line = (
                f"{w.task}: container {w.cid} REQUESTED {w.waited:.0f}s and {why} (skein lost its "
                f"request): killed it and requested {new.id} (re-request {n} of {MAX_PER_TASK})"
            )
            log.warning("%s: %s", self.app_id, line)
            out.append(line)
        self.done += out
        return out


def _service(cid: str) -> str:
    """``worker_3`` → ``worker``."""
    return cid.rsplit("_", 1)[0]
