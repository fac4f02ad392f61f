"""The re-request of a container skein lost (tfyarn.runner.yarn_app.rerequest) without a cluster:
real skein Container objects, the RM's JSON as Hadoop 3.3.6 answers it, a fake clock;
tests/cluster/yarn/test_cluster_lostreq.py reproduces the loss on a real cluster and runs the same
code there."""

from datetime import datetime

import pytest
from skein.model import Container

from tfyarn.runner.yarn_app import rerequest
from tfyarn.runner.yarn_app.rerequest import (
    CONFIRM_S,
    GRACE_S,
    MAX_PER_TASK,
    Rerequest,
    RmView,
    Waiting,
)
from tfyarn.runner.yarn_app.rerequest import choose, lost_count, rm_view
from tfyarn.runner.yarn_app.supervise import InAppSupervisor
from tfyarn.tasklib.kv import MemoryKV
from yarnutil import make_spec

APP = "application_1700000000000_0007"
ROLES = {"ps": {"instances": 1, "memory": 1024}, "worker": {"instances": 2, "memory": 2048}}


def _container(cid, state):
    service, instance = cid.rsplit("_", 1)
    return Container(
        service_name=service,
        instance=int(instance),
        state=state,
        yarn_container_id=f"container_1700000000000_0007_01_{int(instance) + 10:06d}"
        if state != "REQUESTED"
        else "",
        yarn_node_http_address="node1:8042" if state != "REQUESTED" else "",
        start_time=datetime(2026, 1, 1) if state != "REQUESTED" else None,
        finish_time=datetime(2026, 1, 1) if state == "KILLED" else None,
        exit_message="",
    )


class App:
    """skein.ApplicationClient's surface: containers by id, kill_container, add_container."""

    def __init__(self, states):
        self.states = dict(states)
        self.killed, self.added = [], []

    def get_containers(self, services=None, states=None):
        return [
            _container(cid, st)
            for cid, st in self.states.items()
            if (states is None or st in states)
            and (services is None or cid.rsplit("_", 1)[0] in services)
        ]

    def kill_container(self, cid):
        assert self.states[cid] == "REQUESTED", f"{cid} killed while {self.states[cid]}"
        self.states[cid] = "KILLED"
        self.killed.append(cid)

    def add_container(self, service):
        n = max(int(c.rsplit("_", 1)[1]) for c in self.states if c.startswith(service + "_")) + 1
        self.states[f"{service}_{n}"] = "REQUESTED"
        self.added.append(f"{service}_{n}")
        return _container(f"{service}_{n}", "REQUESTED")


class Rest:
    """RmRest.get with the RM's JSON: the app's pending asks (None: the key left out, as Hadoop
    does when there are none), the nodes' free memory and the queue's use."""

    def __init__(self, asks=None, free_mib=(0, 0), queue_max=32768, queue_used=0):
        self.asks, self.free_mib, self.queue_max, self.queue_used = (
            asks,
            free_mib,
            queue_max,
            queue_used,
        )
        self.calls = []

    def get(self, path):
        self.calls.append(path)
        if path.startswith("apps/"):
            app = {"id": APP, "state": "RUNNING"}
            if self.asks is not None:
                app["resourceRequests"] = [
                    row
                    for prio, n in self.asks.items()
                    for row in (
                        {"priority": prio, "resourceName": "*", "numContainers": n},
                        {"priority": prio, "resourceName": "/default-rack", "numContainers": n},
                    )
                ]
            return {"app": app}
        if path == "nodes":
            return {
                "nodes": {
                    "node": [
                        {
                            "state": "RUNNING",
                            "nodeHostName": f"n{i}",
                            "availMemoryMB": m,
                            "availableVirtualCores": 8,
                        }
                        for i, m in enumerate(self.free_mib)
                    ]
                }
            }
        if path == "scheduler":
            leaf = {
                "queueName": "ml",
                "maxEffectiveCapacity": {"memory": self.queue_max},
                "resourcesUsed": {"memory": self.queue_used},
            }
            return {
                "scheduler": {"schedulerInfo": {"queueName": "root", "queues": {"queue": [leaf]}}}
            }
        raise AssertionError(path)


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def _w(cid, waited, task=None):
    return Waiting(cid, task or cid, waited)


def test_lost_count_is_skeins_settled_requests_minus_the_rms_pending():
    ws = [
        _w("worker_2", 40),
        _w("worker_3", 40),
        _w("worker_4", GRACE_S - 1),
    ]  # worker_4: ask maybe in flight
    assert lost_count(ws, RmView(pending=1, room=False)) == 1
    assert lost_count(ws, RmView(pending=2, room=False)) == 0
    assert lost_count(ws, RmView(pending=3, room=True)) == 0
    # no list from the RM (none pending, or an RM that does not give it): only with room for one
    assert lost_count(ws, RmView(pending=None, room=True)) == 2
    assert lost_count(ws, RmView(pending=None, room=False)) == 0


def test_choose_takes_the_longest_waiting_past_the_bound_with_tries_left():
    ws = [
        _w("worker_2", 50, "worker:0"),
        _w("worker_3", 90, "worker:1"),
        _w("worker_4", 10, "worker:0"),
    ]
    assert [w.cid for w in choose(ws, 1, 30, {})] == ["worker_3"]
    assert [w.cid for w in choose(ws, 5, 30, {})] == ["worker_3", "worker_2"]
    assert [w.cid for w in choose(ws, 5, 30, {"worker:1": MAX_PER_TASK})] == ["worker_2"]


def test_rm_view_reads_asks_of_any_host_else_node_and_queue_room():
    assert rm_view(Rest(asks={2: 1, 3: 2}), APP, "ml", 2048, 1) == RmView(3, False)
    rest = Rest(asks=None, free_mib=(1024, 4096))
    assert rm_view(rest, APP, "ml", 2048, 1) == RmView(None, True)
    assert rest.calls == [f"apps/{APP}", "nodes", "scheduler"]
    assert rm_view(Rest(free_mib=(1024, 1024)), APP, "ml", 2048, 1).room is False  # no node fits it
    assert (
        rm_view(Rest(free_mib=(4096,), queue_used=31744), APP, "ml", 2048, 1).room is False
    )  # queue full


def _watch(states, rest, bound=30):
    spec = make_spec(roles=ROLES, mode="ps", sync=False, timeouts={"rerequest": bound})
    app, clock = App(states), Clock()
    return Rerequest(spec, app, APP, rest=rest, clock=clock), app, clock


def test_a_lost_request_is_killed_and_requested_again_once_confirmed_at_most_three_times_per_task():
    w, app, clock = _watch(
        {"ps_0": "RUNNING", "worker_0": "RUNNING", "worker_1": "KILLED", "worker_2": "REQUESTED"},
        Rest(asks=None, free_mib=(8192,)),
    )
    assert w.check(app.get_containers(), {"worker_0": "worker:0"}) == []  # first seen now
    clock.t += 30
    assert (
        w.check(app.get_containers(), {}) == [] and app.killed == []
    )  # a shortfall seen once: confirm it
    clock.t += CONFIRM_S
    [line] = w.check(app.get_containers(), {"worker_0": "worker:0"})
    assert app.killed == ["worker_2"] and app.added == ["worker_3"]
    assert (
        line.startswith("worker:1: container worker_2 REQUESTED 36s")
        and "skein lost its request" in line
    )
    assert line.endswith("requested worker_3 (re-request 1 of 3)") and w.done == [line]
    for n in (
        2,
        3,
    ):  # the new one is lost too (the RM still lists nothing): asked again, up to the cap
        assert w.check(app.get_containers(), {}) == []  # first seen
        clock.t += 30
        assert w.check(app.get_containers(), {}) == []  # past the bound, short: confirm
        clock.t += CONFIRM_S
        [line] = w.check(app.get_containers(), {"worker_0": "worker:0"})
        assert line.startswith("worker:1: ") and line.endswith(f"(re-request {n} of 3)")
    w.check(app.get_containers(), {})
    clock.t += 30
    w.check(app.get_containers(), {})
    clock.t += CONFIRM_S
    assert (
        w.check(app.get_containers(), {}) == [] and len(app.killed) == 3
    )  # the allocation timeout decides now


@pytest.mark.parametrize(
    "rest",
    [Rest(asks={4: 1}, free_mib=(8192,)), Rest(asks=None, free_mib=(1024,))],
    ids=["pending-at-the-rm", "no-room"],
)
def test_a_request_the_rm_holds_or_cannot_place_is_left_alone(rest):
    w, app, clock = _watch(
        {"ps_0": "RUNNING", "worker_0": "RUNNING", "worker_1": "REQUESTED"}, rest
    )
    for _ in range(5):
        assert w.check(app.get_containers(), {}) == []
        clock.t += 30
    assert app.killed == [] and app.added == []


def test_no_rm_call_while_nothing_waits_past_the_bound():
    rest = Rest(asks=None, free_mib=(8192,))
    w, app, clock = _watch(
        {"ps_0": "RUNNING", "worker_0": "RUNNING", "worker_1": "REQUESTED"}, rest
    )
    w.check(app.get_containers(), {})
    clock.t += 29
    w.check(app.get_containers(), {})
    assert rest.calls == []


def test_a_container_allocated_between_the_look_and_the_kill_is_not_killed():
    w, app, clock = _watch(
        {"ps_0": "RUNNING", "worker_0": "RUNNING", "worker_1": "REQUESTED"},
        Rest(asks=None, free_mib=(8192,)),
    )
    w.check(app.get_containers(), {})
    clock.t += 30
    w.check(app.get_containers(), {})
    clock.t += CONFIRM_S
    seen = app.get_containers()
    app.states["worker_1"] = "RUNNING"
    assert w.check(seen, {}) == [] and app.killed == [] and app.added == []


def test_an_rm_that_cannot_be_read_changes_nothing_and_raises_nothing():
    class Down:
        def get(self, path):
            raise OSError("connection refused")

    w, app, clock = _watch(
        {"ps_0": "RUNNING", "worker_0": "RUNNING", "worker_1": "REQUESTED"}, Down()
    )
    for _ in range(3):
        assert w.check(app.get_containers(), {}) == []
        clock.t += 40
    assert app.killed == []


def test_the_in_app_supervisors_round_re_requests_it(tmp_path, monkeypatch):
    rest = Rest(asks=None, free_mib=(8192,))
    monkeypatch.setattr(rerequest.Rerequest, "_rest", lambda self: rest)
    spec = make_spec(roles=ROLES, mode="ps", sync=False, timeouts={"rerequest": 10})
    app, clock = (
        App(
            {
                "tfyarn-supervisor_0": "RUNNING",
                "ps_0": "RUNNING",
                "worker_0": "RUNNING",
                "worker_1": "REQUESTED",
            }
        ),
        Clock(),
    )
    app.shutdown = lambda *a: pytest.fail("the supervisor ended the app")
    sup = InAppSupervisor(
        spec, app, MemoryKV(), APP, started=clock.t, clock=clock, report_dir=tmp_path
    )
    for _ in range(3):
        assert sup.round() is False
        clock.t += 10
    assert app.killed == ["worker_1"] and app.added == ["worker_2"]
    assert [t["state"] for t in sup.snap["tasks"]] == ["RUNNING", "RUNNING", "PENDING"]


def test_with_asks_listed_the_shortfall_picks_the_longest_waiting():
    w, app, clock = _watch({"ps_0": "RUNNING", "worker_0": "KILLED", "worker_1": "KILLED",
                            "worker_2": "REQUESTED"}, Rest(asks={3: 1}, free_mib=(0,)))
    w.check(app.get_containers(), {})
    clock.t += 20
    app.states["worker_3"] = "REQUESTED"  # a second replacement, the one the RM still holds
    w.check(app.get_containers(), {})
    clock.t += 10
    assert w.check(app.get_containers(), {}) == []  # worker_2 past the bound, 1 short: confirm
    clock.t += CONFIRM_S
    [line] = w.check(app.get_containers(), {})
    assert app.killed == ["worker_2"] and app.added == ["worker_4"]
    assert "the ResourceManager holds 1 of its 2 requested containers" in line, line
