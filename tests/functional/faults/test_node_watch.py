"""A lost node noticed in seconds (runner/yarn_app/node_watch.py): a real NodeManager-like web server
answers, then stops; the watch names the silent task once both signs (no answer, no progress) last
``timeouts.node_lost``, and the attempt's diagnosis reads as the cluster's doing (contracts.triage:
free of retry.max_attempts)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

from tfyarn.runner.yarn_app.node_watch import NodeWatch, last_heard, probe
from tfyarn.contracts.triage import attempt_cause


class NodeInfo(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"nodeInfo": {"nodeHealthy": true}}'
        self.send_response(200 if self.path == "/ws/v1/node/info" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def running(service, instance, addr):
    return SimpleNamespace(
        service_name=service, instance=instance, state="RUNNING", yarn_node_http_address=addr
    )


def test_a_task_silent_on_a_node_that_stopped_answering_is_lost_within_the_bound():
    server = ThreadingHTTPServer(("127.0.0.1", 0), NodeInfo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    good = f"127.0.0.1:{server.server_address[1]}"
    assert probe(good)
    server.shutdown()
    server.server_close()
    assert not probe(good, timeout=1)  # the NodeManager is gone: refused
    now = [1000.0]
    watch = NodeWatch(15, clock=lambda: now[0])
    cs = [running("chief", 0, "127.0.0.1:1"), running("worker", 1, good)]
    taskmap = {"worker_1": "worker:1", "chief_0": "chief:0"}
    alive = {"127.0.0.1:1": True, good: False}
    watch.prober = lambda addr: alive[addr]
    heard = last_heard(
        {"progress/worker:1": '{"step": 5, "time": 1000.0}', "progress/chief:0": '{"time": 1000}'}
    )
    assert heard == {"worker:1": 1000.0, "chief:0": 1000.0}
    assert watch.check(cs, taskmap, heard) is None  # not answering, but only since now
    now[0] = 1010.0
    assert watch.check(cs, taskmap, heard) is None  # 10 s < 15 s
    now[0] = 1016.0
    diag = watch.check(cs, taskmap, heard)
    assert diag is not None and diag.startswith(
        f"worker:1 lost with its node 127.0.0.1 (its NodeManager {good} has not answered for 16s"
    )
    assert "chief:0" not in diag and "\n" not in diag
    assert attempt_cause(diag).cause == "node_lost" and attempt_cause(diag).free
    # a task still reporting progress is not lost (a NodeManager slow to answer, a task busy)
    watch2 = NodeWatch(15, prober=lambda addr: addr != good, clock=lambda: now[0])
    watch2.check(cs, taskmap, {"worker:1": 1000.0})
    now[0] = 1040.0
    assert watch2.check(cs, taskmap, {"worker:1": 1039.0}) is None
    # the node answers again: the clock starts over
    alive[good] = True
    assert watch.check(cs, taskmap, heard) is None and watch._down_since == {}


def test_the_supervisors_own_container_is_never_a_task_lost_with_its_node():
    """Issue 40, under a CPU hog (load 56): a NodeManager slow to answer for 18 s while every task kept reporting
    progress ended an attempt as "tfyarn-supervisor:0 lost with its node": the supervisor's container (no task, never
    heard through progress/, the one asking) was counted. It is not."""
    from tfyarn.backends.yarn.appspec import SUPERVISOR_SERVICE

    now = [1000.0]
    watch = NodeWatch(15, prober=lambda addr: False, clock=lambda: now[0])
    cs = [running("worker", 0, "127.0.0.2:1"), running(SUPERVISOR_SERVICE, 0, "127.0.0.2:1")]
    assert watch.check(cs, {"worker_0": "worker:0"}, {"worker:0": 1000.0}) is None
    now[0] = 1020.0
    assert watch.check(cs, {"worker_0": "worker:0"}, {"worker:0": 1019.0}) is None  # the worker still heard
    assert "worker:0 lost" in watch.check(cs, {"worker_0": "worker:0"}, {"worker:0": 1000.0})
