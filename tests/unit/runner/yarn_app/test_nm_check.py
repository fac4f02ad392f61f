"""The in-app attempts' NodeManager check asks as ``tfyarn logs`` does (log_files' client, SPNEGO when asked), on a
real HTTP server answering as a NodeManager does: a container's state, 404 for one it forgot, and a secure web UI's
``401 Negotiate``, which a process with no Kerberos login cannot pass (a container has delegation tokens only): the
check then says so once and takes the killed container as stopped after a short grace, not after 60 s of 401s."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tfyarn.runner.yarn_app import attempts as in_app_attempts
from tfyarn.runner.yarn_app.attempts import nm_container_gone

STATES = {"container_1_0001_01_000002": "RUNNING", "container_1_0001_01_000003": "DONE"}


class NodeManager(BaseHTTPRequestHandler):
    secure = False

    def do_GET(self):  # noqa: N802 - http.server's name
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
