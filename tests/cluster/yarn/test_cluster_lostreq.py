"""skein's lost container request (issue 30) on the real cluster; the in-app supervisor asks again.

skein 0.8.2's application master restarts its request priorities at the *lowest* pending one + 1
(YARN's ``Priority`` sorts in reverse): with two requests of a service pending, the next gets the
second one's priority, replaces it in skein's map, the RM is asked for two containers there and
skein releases the second it gets. The older instance then stays REQUESTED with nothing pending at
the RM (tfyarn/runner/yarn_app/rerequest.py). This test drives that sequence in one bare skein app
whose services are named as a tfyarn job's roles — ``worker`` sized so that one fits on the node
it is pinned to, ``ps`` small (keeps the app alive and makes the allocation that renumbers) —
shows the instance stuck while the node has room, then runs the real :class:`InAppSupervisor`
rounds against that app until the task runs again. Only on a cluster of one's own: it fills a node.
"""

from __future__ import annotations

import getpass
import os
import time

import pytest
from clusterutil import SESSION_TAG, needs_yarn, unique, wait_until

from tfyarn.cluster import hdfs
from tfyarn.backends.yarn.rest import RmRest
from tfyarn.spec import load_spec_dict

pytestmark = [
    *needs_yarn,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        os.environ.get("TFYARN_BREAKABLE_CLUSTER") != "1",
        reason="fills a NodeManager: set TFYARN_BREAKABLE_CLUSTER=1 on a cluster of your own",
    ),
]
PS_MIB = 128


def _states(app) -> dict[str, str]:
    return {
        c.id: str(c.state) for c in app.get_containers(states=["REQUESTED", "RUNNING", "KILLED"])
    }


def _asks(rm: RmRest, app_id: str) -> dict[int, int]:
    """The RM's pending containers of ``app_id`` by priority (resource name ``*``)."""
    rows = rm.get(f"apps/{app_id}")["app"].get("resourceRequests") or []
    return {int(r["priority"]): int(r["numContainers"]) for r in rows if r["resourceName"] == "*"}


def _node(rm: RmRest, host: str) -> dict:
    return next(n for n in rm.get("nodes")["nodes"]["node"] if n["nodeHostName"] == host)


def test_skein_loses_a_request_and_the_supervisor_requests_it_again(yarn):
    from tfyarn.cluster._skein import skein
    from tfyarn.runner.yarn_app.supervise import InAppSupervisor
    from tfyarn.task.yarn.kv_yarn import SkeinKV

    sk = skein()
    rm = RmRest(hdfs.load_hadoop_conf(), getpass.getuser())
    node = max(rm.get("nodes")["nodes"]["node"], key=lambda n: n["availMemoryMB"])
    host = node["nodeHostName"]
    total = node["availMemoryMB"] + node["usedMemoryMB"]
    worker_mib = (total // 2 // 128 + 1) * 128  # one per node, never two
    assert node["availMemoryMB"] >= worker_mib, f"no node has {worker_mib} MiB free: {node}"
    name = unique("lostreq")
    spec = sk.ApplicationSpec(
        name=name,
        queue="default",
        tags={SESSION_TAG},
        master=sk.Master(resources=sk.Resources(memory=256, vcores=1)),
        services={
            "ps": sk.Service(resources=sk.Resources(memory=PS_MIB, vcores=1), script="sleep 600"),
            "worker": sk.Service(
                resources=sk.Resources(memory=worker_mib, vcores=1),
                nodes=[host],
                relax_locality=False,
                script="sleep 600",
            ),
        },
    )
    app_id = yarn.client().submit(spec)
    try:
        app = yarn.client().connect(app_id)
        wait_until(
            lambda: _states(app) == {"ps_0": "RUNNING", "worker_0": "RUNNING"},
            120,
            "ps_0, worker_0 running",
        )
        app.scale("worker", 3)  # worker_1, worker_2: priorities p, p+1, no room on the node
        app.scale("ps", 2)  # its allocation makes skein renumber from the lowest pending: p + 1
        wait_until(lambda: _states(app).get("ps_1") == "RUNNING", 60, "ps_1 running")
        assert app.add_container("worker").id == "worker_3"  # gets p + 1 too
        asks = wait_until(
            lambda: (a := _asks(rm, app_id)) and max(a.values()) == 2 and a,
            30,
            "2 asks at one priority",
        )
        assert sorted(asks.values()) == [1, 2], (
            asks
        )  # three instances REQUESTED, two share a priority

        # room for one worker at a time: each kill lets the RM allocate the next ask
        app.kill_container("worker_0")
        wait_until(lambda: _states(app).get("worker_1") == "RUNNING", 60, "worker_1 running")
        app.kill_container("worker_1")
        wait_until(
            lambda: _states(app).get("worker_3") == "RUNNING",
            60,
            "worker_3 running (the shared priority)",
        )
        app.kill_container(
            "worker_3"
        )  # the RM allocates the shared priority's second ask: skein releases it
        wait_until(
            lambda: not _asks(rm, app_id) and _node(rm, host)["availMemoryMB"] >= worker_mib,
            60,
            f"no ask left at the RM and {worker_mib} MiB free on {host}",
        )
        time.sleep(6)  # > skein's 5 s idle heartbeat: anything allocated would have reached it
        assert _states(app)["worker_2"] == "REQUESTED", _states(app)
        assert (
            not _asks(rm, app_id) and _node(rm, host)["availMemoryMB"] >= worker_mib
        )  # lost, with room

        # the in-app supervisor's rounds (as in the app's own container) ask for it again
        job = load_spec_dict(
            {
                "name": name,
                "model": "tfyarn.models.recommender:model",
                "data": {
                    "train": ["hdfs:///none"],
                    "features": {"label": {"dtype": "float32"}},
                    "batch_size": 8,
                },
                "mode": "ps",
                "sync": False,
                "roles": {
                    "ps": {"instances": 1, "memory": PS_MIB},
                    "worker": {"instances": 1, "memory": worker_mib},
                },
                "timeouts": {"rerequest": 2},
            }
        )
        sup = InAppSupervisor(job, app, SkeinKV(app.kv), app_id, started=time.time())
        t0 = time.monotonic()

        def recovered() -> bool:
            sup.round()
            return any(s == "RUNNING" for c, s in _states(app).items() if c.startswith("worker_"))

        wait_until(recovered, 60, "a worker running again after the supervisor's re-request")
        took = time.monotonic() - t0
        [line] = sup.requests.done
        states = _states(app)
        assert states["worker_2"] == "KILLED" and states["worker_4"] == "RUNNING", states
        assert "worker_2 REQUESTED" in line and "requested worker_4 (re-request 1 of 3)" in line, (
            line
        )
        assert sup.outcome is None and took < 30, (
            sup.outcome,
            took,
        )  # bound 2 s + 5 s settle + 6 s confirm
    finally:
        yarn.client().connect(app_id, wait=False).shutdown()
