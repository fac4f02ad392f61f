"""Every RM read the in-app supervisor makes (its start time, its page's report, the re-request's look, the relay
of a killed container) goes through backends/yarn/rest.in_container: against a real HTTP server standing in for
the RM's web API, each carries the app's RM delegation token (a token file Hadoop's dtutil wrote) when the
container has one, as a secure RM's filter wants, and none, with ``user.name``, on a cluster without security.
tests/cluster/kerberos/test_kerberos_attempts.py proves the same against a Kerberized RM from a container."""

import getpass
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tfyarn.backends.yarn import rest
from tfyarn.cluster import tokens, webauth
from tfyarn.runner.yarn_app import rm_relay
from tfyarn.runner.yarn_app.page import rm_report
from tfyarn.runner.yarn_app.rerequest import Rerequest, RmView, rm_view
from tfyarn.runner.yarn_app.supervise import app_started
from yarnutil import make_spec

TOKEN_FILE = Path(__file__).parents[2] / "cluster" / "data" / "tokens-java.bin"
APP = "application_1700000000000_0007"
ATTEMPT = "appattempt_1700000000000_0007_000001"
KILLED = "container_1700000000000_0007_01_000003"
STARTED_MS = 1_700_000_000_123
NM = "node1:8042"


class FakeRm(BaseHTTPRequestHandler):
    """The RM's ``/ws/v1/cluster`` as Hadoop 3.3 answers these reads; refuses (401) a request without the
    delegation token when ``token`` is set (its RMAuthenticationFilter on a secure cluster)."""

    token: str | None = None
    seen: list[tuple[str, str | None, str]] = []  # (path, token header, user.name)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        path = url.path.removeprefix("/ws/v1/cluster/")
        user = urllib.parse.parse_qs(url.query).get("user.name", [""])[0]
        self.seen.append((path, self.headers.get(tokens.HEADER), user))
        if self.token is not None and self.headers.get(tokens.HEADER) != self.token:
            return self._answer(401, {"error": "Authentication required"})
        body = {
            f"apps/{APP}": {"app": {"id": APP, "startedTime": STARTED_MS, "state": "RUNNING", "queue": "ml"}},
            "nodes": {"nodes": {"node": [{"id": "node1:45454", "nodeHTTPAddress": NM, "numContainers": 1,
                                          "state": "RUNNING", "availMemoryMB": 4096, "availableVirtualCores": 4}]}},
            f"apps/{APP}/appattempts/{ATTEMPT}/containers": {"container": [
                {"containerId": "container_1700000000000_0007_01_000001", "assignedNodeId": "node1:45454"}]},
            "scheduler": {"scheduler": {"schedulerInfo": {}}},
        }.get(path)
        self._answer(200 if body is not None else 404, body or {})

    def _answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def rm(tmp_path, monkeypatch):
    FakeRm.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("HADOOP_CONF_DIR", str(conf))
    monkeypatch.setattr(webauth, "available", lambda: False)  # a container's Python without requests-gssapi
    yield conf, server.server_address[1]
    server.shutdown()
    server.server_close()


def _site(conf: Path, port: int, auth: str) -> None:
    def xml(props):
        return "<configuration>" + "".join(
            f"<property><name>{k}</name><value>{v}</value></property>" for k, v in props.items()) + "</configuration>"

    (conf / "yarn-site.xml").write_text(xml({"yarn.resourcemanager.webapp.address": f"127.0.0.1:{port}"}))
    (conf / "core-site.xml").write_text(xml({"hadoop.http.authentication.type": auth}))


def _every_in_app_read():
    """What each of the supervisor's RM reads got back (each through its own entry point)."""
    spec = make_spec(mode="ps", sync=False)
    relay = rm_relay.from_container()
    return {
        "start": app_started(APP),
        "page": rm_report(APP),
        "rerequest": rm_view(Rerequest(spec, None, APP)._rest(), APP, "ml", 1024, 1),
        "relay": relay.state(KILLED, f"http://{NM}/") if relay is not None else None,
    }


def test_on_a_secure_cluster_every_in_app_rm_read_carries_the_apps_rm_token(rm, monkeypatch):
    conf, port = rm
    _site(conf, port, "kerberos")
    monkeypatch.setenv("HADOOP_TOKEN_FILE_LOCATION", str(TOKEN_FILE))
    FakeRm.token = tokens.container_token(tokens.RM_DELEGATION_TOKEN, str(TOKEN_FILE)).url_string()
    got = _every_in_app_read()
    assert got["start"] == STARTED_MS / 1000
    assert got["page"] is not None and got["page"].queue == "ml"
    assert got["rerequest"] == RmView(None, True)   # no asks listed, room on node1 and in the queue
    assert got["relay"] == rm_relay.STOPPED          # released, its node counts only the app's live one
    paths = [p for p, _, _ in FakeRm.seen]
    assert paths.count(f"apps/{APP}") == 3 and "scheduler" in paths and paths.count("nodes") == 2, paths
    refused = [(p, h) for p, h, _ in FakeRm.seen if h != FakeRm.token]
    assert not refused, refused


def test_on_a_cluster_without_security_the_reads_go_as_before_without_a_token(rm, monkeypatch):
    conf, port = rm
    _site(conf, port, "simple")
    monkeypatch.delenv("HADOOP_TOKEN_FILE_LOCATION", raising=False)
    FakeRm.token = None
    got = _every_in_app_read()
    assert got["start"] == STARTED_MS / 1000 and got["page"] is not None and got["rerequest"] is not None
    assert got["relay"] is None                       # the relay is for a secure cluster's refusing NodeManager
    assert FakeRm.seen and {(h, u) for _, h, u in FakeRm.seen} == {(None, getpass.getuser())}


def test_a_secure_rm_without_the_token_refuses_and_the_reads_say_they_cannot(rm, monkeypatch):
    """Without the token file a secure container has no credential for the RM (no Kerberos login, no SPNEGO): each
    read says it cannot (the supervisor then counts from its own start, the re-request leaves every request alone)."""
    conf, port = rm
    _site(conf, port, "kerberos")
    monkeypatch.delenv("HADOOP_TOKEN_FILE_LOCATION", raising=False)
    FakeRm.token = "the app's token"
    assert app_started(APP) is None and rm_report(APP) is None and rm_relay.from_container() is None
    with pytest.raises(rest.RestUnavailable, match="SPNEGO"):
        rest.in_container()
