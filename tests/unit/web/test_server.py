"""The job's page server (tfyarn.web) on its own: routes, the JSON it is given, incremental history,
logs, errors."""

import json
import re
import urllib.error
import urllib.request

import pytest

from tfyarn.web import StatusPage
from tfyarn.web.server import file_tail

DOC = {
    "schema": "tfyarn.status/1",
    "app_id": "local-1",
    "name": "j",
    "state": "RUNNING",
    "tasks": [],
}
POINTS = [{"task": "chief:0", "time": 10.0 + i, "step": i, "loss": 1.0 / (i + 1)} for i in range(5)]


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type"), exc.read()


@pytest.fixture
def page(tmp_path):
    log = tmp_path / "task.log"
    log.write_text("line 1\nline 2\n")
    logs = {"chief:0": str(log)}
    with StatusPage(
        lambda: DOC, lambda: POINTS, log=lambda t: file_tail(logs[t]) if t in logs else None
    ) as p:
        yield p


def test_the_page_and_its_json(page):
    code, ctype, body = get(page.url)
    assert code == 200 and ctype.startswith("text/html")
    html = body.decode()
    assert 'id="tasks"' in html and 'id="chart-loss"' in html and "status.json" in html
    # fetches relative to the page's own path: it works under any proxy prefix
    # (/proxy/<app>/pages/tfyarn/)
    assert re.findall(r"fetch\(([^,]+),", html) == [
        'here + "status.json"',
        'here + "history.json?since=" + since',
    ]
    assert get(page.url + "index.html")[2] == body
    code, ctype, body = get(page.url + "status.json")
    assert (code, ctype, json.loads(body)) == (200, "application/json", DOC)


def test_history_is_incremental(page):
    assert json.loads(get(page.url + "history.json")[2])["points"] == POINTS
    newer = json.loads(get(page.url + "history.json?since=12")[2])["points"]
    assert [p["step"] for p in newer] == [3, 4]


def test_logs_and_unknown_routes(page):
    code, ctype, body = get(page.url + "log?task=chief:0")
    assert code == 200 and body.decode().splitlines() == ["line 1", "line 2"]
    code, _, body = get(page.url + "log?task=worker:7")
    assert code == 404 and b"worker:7" in body
    assert get(page.url + "nothing")[0] == 404


def test_a_failing_provider_is_a_500_and_the_page_serves_on():
    calls = []

    def status():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the KV is gone")
        return DOC

    with StatusPage(status) as p:
        code, _, body = get(p.url + "status.json")
        assert code == 500 and b"RuntimeError: the KV is gone" in body
        assert json.loads(get(p.url + "status.json")[2]) == DOC
        assert json.loads(get(p.url + "history.json")[2]) == {"points": []}


def test_a_long_history_is_thinned_and_ends_with_the_newest_point(monkeypatch):
    import tfyarn.web.server as server

    monkeypatch.setattr(server, "MAX_POINTS", 10)
    pts = [{"task": "chief:0", "time": float(i), "step": i} for i in range(1, 96)]
    with StatusPage(lambda: DOC, lambda: pts) as p:
        got = json.loads(get(p.url + "history.json")[2])["points"]
    assert (
        len(got) <= 10
        and got[-1]["step"] == 95
        and [q["step"] for q in got] == sorted(q["step"] for q in got)
    )


def test_file_tail(tmp_path):
    f = tmp_path / "big.log"
    f.write_bytes(b"x" * 100 + b"END")
    assert file_tail(str(f), limit=5) == "xxEND"
    assert file_tail(str(tmp_path / "missing")) is None
