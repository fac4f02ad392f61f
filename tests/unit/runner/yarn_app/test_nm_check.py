"""The in-app attempts' NodeManager check asks as ``tfyarn logs`` does (log_files' client, SPNEGO when asked), on a
real HTTP server answering as a NodeManager does: a container's state, 404 for one it forgot, and a secure web UI's
``401 Negotiate``, which a process with no Kerberos login cannot pass (a container has delegation tokens only): the
check then says so once and takes the killed container as stopped after a short grace, not after 60 s of 401s."""

from __future__ import annotations

import json
from pathlib import Path
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tfyarn.runner.yarn_app import attempts as in_app_attempts
from tfyarn.runner.yarn_app.attempts import nm_container_gone

STATES = {"container_1_0001_01_000002": "RUNNING", "container_1_0001_01_000003": "DONE"}


class NodeManager(BaseHTTPRequestHandler):
    secure = False

    def do_GET(self):
        if self.secure and "Authorization" not in self.headers:
            self.send_response(401)
            self.send_header("WWW-Authenticate", "Negotiate")
            self.end_headers()
            return
        cid = self.path.rsplit("/", 1)[-1]
        if cid not in STATES:
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"container": {"id": cid, "state": STATES[cid]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture(params=[False, True], ids=["simple", "secure"])
def nm(request, monkeypatch):
    handler = type("NM", (NodeManager,), {"secure": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("KRB5CCNAME", "FILE:/nonexistent/tfyarn-no-ticket")  # this process has no Kerberos login
    yield f"127.0.0.1:{server.server_address[1]}", request.param
    server.shutdown()


def test_the_check_answers_at_once_on_either_kind_of_nodemanager(nm, monkeypatch, caplog):
    address, secure = nm
    if not secure:
        assert nm_container_gone(address, "container_1_0001_01_000002") is False   # RUNNING
        assert nm_container_gone(address, "container_1_0001_01_000003") is True    # DONE
        assert nm_container_gone(address, "container_1_0001_01_000009") is True    # forgotten: 404
        return
    monkeypatch.setattr(in_app_attempts, "REFUSED_GRACE_S", 0.5)
    t0 = time.monotonic()
    first = nm_container_gone(address, "container_1_0001_01_000002")
    asked = time.monotonic() - t0
    assert first is False and asked < 10, asked   # refused at once (SPNEGO impossible here), not a timeout
    assert any("refuses this process" in r.getMessage() for r in caplog.records)
    time.sleep(0.6)
    assert nm_container_gone(address, "container_1_0001_01_000002") is True   # past the grace: taken as stopped


# --- asked through the ResourceManager: a container's RM delegation token, the RM's relay of the NodeManager ---

DATA = Path(__file__).parents[2] / "cluster" / "data"
APP = "application_1795503544962_0007"
ATTEMPT = "appattempt_1795503544962_0007_000001"
AM, KILLED, SUPERVISOR = (f"container_e05_1795503544962_0007_01_00000{i}" for i in (1, 2, 3))


class SecureRM(BaseHTTPRequestHandler):
    """The RM's web API as a secure RM answers (RMAuthenticationFilter): the app's delegation token in the header
    (else 401 Negotiate); the attempt's live containers and the nodes' counts as the test sets them."""

    live: dict[str, str] = {}
    node: dict = {}
    token = ""
    asked: list = []

    def do_GET(self):
        type(self).asked.append(self.path)
        if self.headers.get("X-Hadoop-Delegation-Token") != self.token:
            self.send_response(401)
            self.send_header("WWW-Authenticate", "Negotiate")
            self.end_headers()
            return
        path = self.path.split("?")[0]
        if path == f"/ws/v1/cluster/apps/{APP}/appattempts/{ATTEMPT}/containers":
            rows = [{"containerId": c, "assignedNodeId": n, "containerState": "RUNNING"} for c, n in self.live.items()]
            body = {"container": rows}     # as Hadoop 3.3's RM answers
        elif path == "/ws/v1/cluster/nodes":
            body = {"nodes": {"node": [self.node]}}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def secure(tmp_path, monkeypatch):
    """A secure NodeManager (401 to this process) and a secure RM that takes the container's RM token; this process
    a container of the app: HADOOP_TOKEN_FILE_LOCATION (a token file Hadoop wrote), HADOOP_CONF_DIR naming the RM."""
    from tfyarn.cluster.tokens import RM_DELEGATION_TOKEN, container_token

    nm_server = ThreadingHTTPServer(("127.0.0.1", 0), type("NM", (NodeManager,), {"secure": True}))
    token = container_token(RM_DELEGATION_TOKEN, str(DATA / "tokens-protobuf.bin"))
    rm_handler = type("RM", (SecureRM,), {"live": {}, "node": {}, "token": token.url_string(), "asked": []})
    rm_server = ThreadingHTTPServer(("127.0.0.1", 0), rm_handler)
    for s in (nm_server, rm_server):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    nm = f"localhost:{nm_server.server_address[1]}"
    (tmp_path / "core-site.xml").write_text(
        "<configuration><property><name>hadoop.http.authentication.type</name><value>kerberos</value></property>"
        "</configuration>")
    (tmp_path / "yarn-site.xml").write_text(
        "<configuration><property><name>yarn.resourcemanager.webapp.address</name>"
        f"<value>127.0.0.1:{rm_server.server_address[1]}</value></property></configuration>")
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    monkeypatch.setenv("HADOOP_TOKEN_FILE_LOCATION", str(DATA / "tokens-protobuf.bin"))
    monkeypatch.setenv("KRB5CCNAME", "FILE:/nonexistent/tfyarn-no-ticket")
    for name in ("_relay", "_refused", "_said"):
        monkeypatch.setattr(in_app_attempts, name, type(getattr(in_app_attempts, name))())
    rm_handler.node = {"id": "localhost:45454", "nodeHTTPAddress": nm, "numContainers": 3}
    yield nm, rm_handler
    for s in (nm_server, rm_server):
        s.shutdown()


def test_the_rm_relays_the_nodemanagers_answer_with_the_containers_token(secure, monkeypatch, caplog):
    """Live at the RM (the release not processed): not stopped, and no grace yet; released while the node still counts
    it: not stopped; the node's count down to the app's live containers: stopped, answered (not by the grace)."""
    caplog.set_level("INFO")
    nm, rm = secure
    monkeypatch.setattr(in_app_attempts, "REFUSED_GRACE_S", 0.2)
    rm.live = {AM: "localhost:45454", KILLED: "localhost:45454", SUPERVISOR: "localhost:45454"}
    assert nm_container_gone(nm, KILLED) is False
    time.sleep(0.3)
    assert nm_container_gone(nm, KILLED) is False       # still live at the RM: past the grace, still not taken
    assert KILLED not in in_app_attempts._refused
    del rm.live[KILLED]                                  # released; its NodeManager has not reported it yet
    assert nm_container_gone(nm, KILLED) is False
    rm.node["numContainers"] = 2                         # the NodeManager reported it completed
    assert nm_container_gone(nm, KILLED) is True
    said = [r.getMessage() for r in caplog.records]
    assert any("refuses this process" in m for m in said), said
    assert any(f"{KILLED} stopped: answered by the ResourceManager" in m for m in said), said
    assert not any("grace" in m and "passed" in m for m in said), said
    assert all("X-Hadoop" not in m and "yAEA" not in m for m in said)   # the token never in the log


def test_a_node_shared_with_other_containers_keeps_the_grace_from_the_release(secure, monkeypatch, caplog):
    """Another app's container on the node: the RM cannot tell whose container it counts, so the killed one is taken
    as stopped the grace after its release; an RM that refuses the token: the grace from the refusal."""
    caplog.set_level("INFO")
    nm, rm = secure
    monkeypatch.setattr(in_app_attempts, "REFUSED_GRACE_S", 0.3)
    rm.live = {AM: "localhost:45454", SUPERVISOR: "localhost:45454"}
    rm.node["numContainers"] = 3                         # ours 2 + another app's 1, for good
    assert nm_container_gone(nm, KILLED) is False
    time.sleep(0.35)
    assert nm_container_gone(nm, KILLED) is True
    said = [r.getMessage() for r in caplog.records]
    assert any(f"{KILLED}: released by the ResourceManager, its node still counts" in m for m in said), said
    assert any(f"{KILLED} taken as stopped: the grace of 0.3s passed" in m for m in said), said
    rm.token = "another"                                 # the RM refuses this token: 401, no SPNEGO here
    other = AM.replace("000001", "000004")
    assert nm_container_gone(nm, other) is False
    assert any(f"cannot say whether {other} stopped" in m for m in (r.getMessage() for r in caplog.records))
    time.sleep(0.35)
    assert nm_container_gone(nm, other) is True
