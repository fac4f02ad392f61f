"""The in-app supervisor's job attempts: when one ended and how the next starts in the same application.

Why: a job followed by no gateway (a bare ``submit``, ``wait`` from elsewhere, Airflow's deferrable
trigger) still gets its ``retry.max_attempts``: the supervisor (:mod:`.supervise`) ends the failed
attempt — every task container killed and waited for, the attempt's KV keys cleared
(:mod:`tfyarn.contracts.in_app`), its end recorded (``attempts/<n>``) — and starts every task container
again after ``retry.backoff``; the chief resumes from the latest checkpoint as on any attempt. The
decisions (triage, budgets, deadline) are :class:`tfyarn.runner.supervisor.Supervisor`'s, the runner's own.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterable

from tfyarn.backends.yarn.log_files import nm_container_state
from tfyarn.backends.yarn.rest import RestUnavailable
from tfyarn.cluster.webauth import SpnegoUnavailable
from tfyarn.contracts import in_app
from tfyarn.contracts.kv_keys import ATTEMPT_KEY, attempt_record_key
from tfyarn.runner.yarn_app import rm_relay
from tfyarn.spec import SIDECAR_ROLES, JobSpec
from tfyarn.backends.yarn.states import ALL_CONTAINER_STATES
from tfyarn.contracts.triage import attempt_cause, AttemptBudget

log = logging.getLogger(__name__)

ACTIVE = ("WAITING", "REQUESTED", "RUNNING")
#: How long the killed containers of an attempt are waited for (their NodeManagers stop them).
GONE_TIMEOUT_S = 60.0
#: NodeManager container states of a process that may still run (``/ws/v1/node/containers/<id>``).
_NM_ALIVE = frozenset(
    {"NEW", "LOCALIZING", "LOCALIZED", "SCHEDULED", "RUNNING", "KILLING", "RELAUNCHING", "REINITIALIZING"}
    | {"PAUSING", "PAUSED", "RESUMING"}
)


def lost_task(spec: JobSpec, containers: Iterable[Any], attempt: dict[str, Any] | None) -> list[Any]:
    """The attempt's FAILED containers of a role (not a side role) that is short of a task for good: skein
    did not replace them (no restart left) — the containers skein would fail the app for. Empty when
    none (a replacement pending or running, or the task done, keeps the role whole)."""
    by_role: dict[str, list[Any]] = {}
    for c in containers:
        if in_app.in_attempt(f"{c.service_name}_{c.instance}", attempt):
            by_role.setdefault(c.service_name, []).append(c)
    lost: list[Any] = []
    for role, cs in by_role.items():
        if role in SIDECAR_ROLES or role not in spec.roles:
            continue
        failed = [c for c in cs if str(c.state) == "FAILED"]
        whole = sum(1 for c in cs if str(c.state) in (*ACTIVE, "SUCCEEDED"))
        if failed and whole < spec.instances(role):
            lost += failed
    return lost


#: A NodeManager this process may not ask (a secure web UI and no Kerberos login here: a container has delegation
#: tokens only) is asked through the ResourceManager instead (:mod:`.rm_relay`, with the app's RM delegation token);
#: a killed container the RM cannot answer for is taken as stopped after this long (counted from its release when the
#: RM answers, else from the first refusal): past YARN's SIGTERM-to-SIGKILL delay (3 s on the test clusters, 250 ms
#: by default), instead of GONE_TIMEOUT_S of refused requests
REFUSED_GRACE_S = 5.0
_refused: dict[str, float] = {}  # container id -> when the grace started (its release, or the first refusal)
_said: set[tuple[str, str]] = set()  # (container id or NodeManager, what) said once in the log
_relay: list[rm_relay.RmRelay | None] = []  # this container's relay, built on the first refusal


def nm_container_gone(nm_http_address: str, container_id: str, timeout: float = 2.0) -> bool:
    """Has the NodeManager stopped ``container_id``? Asked as ``tfyarn logs`` asks it (log_files'
    NodeManager client: SPNEGO when the web UI wants it): a state past running, unknown, or the NodeManager
    gone with its node. A NodeManager that refuses this process (401/403, no Kerberos credentials) is said
    once in the log and asked through the ResourceManager (:func:`_refused_gone`)."""
    try:
        state = nm_container_state(nm_http_address, container_id, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code not in (401, 403):
            return False
        return _refused_gone(nm_http_address, container_id, f"HTTP {exc.code}")
    except SpnegoUnavailable as exc:
        return _refused_gone(nm_http_address, container_id, str(exc))
    except (OSError, ValueError):
        return True  # no NodeManager to ask: its node is gone, and its containers with it
    return state is None or state not in _NM_ALIVE


def _once(key: str, what: str) -> bool:
    if (key, what) in _said:
        return False
    _said.add((key, what))
    return True


def _refused_gone(nm: str, container_id: str, why: str) -> bool:
    """The NodeManager ``nm`` refused this process: the RM's relay of its answer (:mod:`.rm_relay`) when this
    container has an RM delegation token, else (or while the RM cannot tell) the grace."""
    if _once(nm, "refused"):
        log.warning("the NodeManager %s refuses this process (%s): asking the ResourceManager instead", nm, why)
    if not _relay:
        _relay.append(rm_relay.from_container())
    relay, said = _relay[0], None
    if relay is not None:
        try:
            said = relay.state(container_id, nm)
        except (RestUnavailable, ValueError) as exc:
            if _once(container_id, "rm"):
                log.warning("the ResourceManager cannot say whether %s stopped: %s", container_id, exc)
    now = time.monotonic()
    if said == rm_relay.STOPPED:
        log.info(
            "%s stopped: answered by the ResourceManager (its NodeManager %s reported it completed)", container_id, nm
        )
        return True
    if said == rm_relay.LIVE:
        return False  # the release not processed yet: the grace starts at the release
    if container_id not in _refused:
        _refused[container_id] = now
        log.warning(
            "%s: %s; taken as stopped %gs after %s unless answered sooner",
            container_id,
            "released by the ResourceManager, its node still counts containers beyond the app's live ones (it "
            "stopping, or another app's)"
            if said
            else "no answer from the ResourceManager",
            REFUSED_GRACE_S,
            "its release" if said else "the refusal",
        )
    if now - _refused[container_id] < REFUSED_GRACE_S:
        return False
    log.info("%s taken as stopped: the grace of %gs passed, unanswered", container_id, REFUSED_GRACE_S)
    return True


def wait_gone(
    containers: list[Any],
    timeout: float = GONE_TIMEOUT_S,
    gone: Callable[[str, str], bool] = nm_container_gone,
    poll: float = 0.5,
    beat: Callable[[], None] = lambda: None,
) -> list[str]:
    """Wait (bounded) until the NodeManagers have stopped these killed containers; the YARN ids of those
    still running at the timeout (logged, naming them: they may still write to the KV)."""
    left = {c.yarn_container_id: c.yarn_node_http_address for c in containers if c.yarn_container_id}
    deadline = time.monotonic() + timeout
    while left:
        left = {cid: nm for cid, nm in left.items() if nm and not gone(nm, cid)}
        if not left or time.monotonic() >= deadline:
            break
        beat()
        time.sleep(poll)
    if left:
        log.error(
            "timed out after %gs waiting for the NodeManagers to stop the ended attempt's containers %s",
            timeout,
            ", ".join(sorted(left)),
        )
    return sorted(left)


def kill_attempt(app: Any, services: list[str], rounds: int = 5) -> list[Any]:
    """Kill every active container of these services (skein ``kill_container``: no restart, no
    failure); again while any is left (one skein restarted meanwhile). The containers killed."""
    killed: list[Any] = []
    for _ in range(rounds):
        active = app.get_containers(services=services, states=ACTIVE)
        if not active:
            break
        for c in active:
            try:
                app.kill_container(c.id)
                killed.append(c)
            except Exception as exc:  # noqa: BLE001 - it may have ended meanwhile
                log.info("kill of %s: %s", c.id, exc)
    return killed


def next_first(app: Any, services: list[str]) -> dict[str, int]:
    """Per service, the instance number skein gives its next container (its containers are numbered in order)."""
    first = {s: 0 for s in services}
    for c in app.get_containers(services=services, states=ALL_CONTAINER_STATES):
        first[c.service_name] = max(first[c.service_name], c.instance + 1)
    return first


def attempt_record(attempt: int, diagnosis: str, started: float, ended: float, redone: dict[str, Any]) -> str:
    """``attempts/<n>``'s JSON: how in-app attempt ``attempt`` ended, and the steps the next one redoes."""
    cause = attempt_cause(diagnosis)
    return json.dumps(
        {
            "attempt": attempt,
            "diagnosis": diagnosis,
            "cause": cause.words if cause is not None else None,
            "started": round(started, 3),
            "ended": round(ended, 3),
            "wall_s": round(ended - started, 1),
            **{k: redone.get(k) for k in ("reached", "resumes_at", "lost_steps")},
        }
    )


def restart(
    app: Any,
    kv: Any,
    spec: JobSpec,
    attempt: int,
    diagnosis: str,
    started: float,
    redone: dict[str, Any],
    backoff: Callable[[], bool],
    gone: Callable[[str, str], bool] | None = None,
    beat: Callable[[], None] = lambda: None,
) -> bool:
    """End in-app attempt ``attempt - 1`` (failed with ``diagnosis``, started at ``started``) and start
    ``attempt``: its containers killed and waited for, ``control/attempt`` bumped (a late exit report of
    an old container sees it is not the running attempt's), its keys cleared, its end recorded, the
    backoff, every task container started again. False when the backoff was cut short (nothing started).
    ``beat``: the supervisor's heartbeat, kept fresh while it waits (a task or follower sees it alive)."""
    services: list[str] = [r for r in spec.roles if spec.instances(r) > 0]  # the tasks' (not the supervisor's)
    t0 = time.monotonic()
    killed = kill_attempt(app, services)
    wait_gone(killed, gone=gone or nm_container_gone, beat=beat)
    first = next_first(app, services)
    now = time.time()
    # the record first: whoever sees the new attempt number can read how the one before ended
    kv.put(attempt_record_key(attempt - 1), attempt_record(attempt - 1, diagnosis, started, now, redone))
    kv.put(ATTEMPT_KEY, json.dumps({"attempt": attempt, "first": first, "time": round(time.time(), 3)}))
    cleared = in_app.clear_attempt(list(kv.items()), kv.delete)
    log.info(
        "attempt %d ended: %d containers killed and gone, %d keys cleared in %.1fs",
        attempt - 1,
        len(killed),
        len(cleared),
        time.monotonic() - t0,
    )
    if not backoff():
        return False
    for s in services:
        app.scale(s, count=spec.instances(s))
    log.info("attempt %d: %s started again", attempt, ", ".join(f"{s} x{spec.instances(s)}" for s in services))
    return True


def absorb(sup: Any, snap: dict[str, Any], label: str) -> None:
    """A run's supervisor (``tfyarn run``, or a restarted in-app supervisor) takes in the attempts the app
    ``label`` ran itself (its snapshot's ``attempts``): numbered on from them, each counted in the budget, its
    diagnosis kept for the final one and its redone steps in the totals — as if the run had started them."""
    ended = snap.get("attempts") or []
    n = snap.get("attempt")
    if isinstance(n, int):
        sup.attempt = max(sup.attempt, n)
    if not ended or sup.spec is None:
        return
    if sup.budget is None:
        sup.budget = AttemptBudget(sup.spec.retry.max_attempts, sup.spec.retry.cluster_faults)
    for r in ended:
        diag = str(r.get("diagnosis") or "")
        sup.budget.next(diag)
        sup.earlier.append(f"{label} attempt {r.get('attempt')}: {diag}")
        sup.redone.append({k: int(r.get(k) or 0) for k in ("attempt", "reached", "resumes_at", "lost_steps")})
