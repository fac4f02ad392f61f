"""A local job's page, opened in headless Chromium while the job runs: the tasks, the charts, the
JSON endpoint against ``tfyarn status --output json``; and the same page from the run report after
the end (``report --serve``)."""

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from browser import dom, screenshot
from opsutil import job_spec, tfyarn_cmd

from tfyarn import api
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(240)
#: Where the screenshots are kept (a test artefact): $TFYARN_ARTEFACTS or the test's tmp dir.
ARTEFACTS = os.environ.get("TFYARN_ARTEFACTS")


def _json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _wait_for(what, fn, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(0.3)


def _rows(html):
    return dict(re.findall(r'<tr data-task="([^"]+)">(.*?)</tr>', html))


def test_a_local_jobs_page_while_it_runs_and_from_its_report(tmp_path):
    stop = tmp_path / "stop"
    spec = load_spec_dict(
        job_spec(tmp_path, model="ops_jobs:until_file", params={"stop_file": str(stop)})
    )
    app_id = api.submit(spec, "local")
    try:
        st = _wait_for(
            "the page's URL and progress in status",
            lambda: (
                s
                if (s := api.status(app_id)).progress.get("page_url")
                and s.progress.get("global_step", 0) > 20
                else None
            ),
        )
        url = st.progress["page_url"]

        def measured():
            s = api.status(app_id)
            return s if all(t.cpu_percent is not None and t.rss_mib for t in s.tasks) else None

        st = _wait_for(
            "every task's CPU % and RSS in status (each publishes its own every 2 s)", measured
        )
        assert all(0 < t.rss_mib <= t.peak_rss_mib and t.cpu_percent >= 0 for t in st.tasks), (
            st.tasks
        )
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url)

        html = dom(url)
        assert 'data-loaded="1"' in html, html[-3000:]
        rows = _rows(html)
        assert sorted(rows) == ["chief:0", "worker:0"]
        assert all("RUNNING" in r and "127.0.0.1" in r for r in rows.values())
        assert re.search(r"/ 2,048 MiB", rows["chief:0"])  # RSS against its role's memory
        cpu = re.findall(r"<td>([^<]*)</td>", rows["worker:0"])[
            5
        ]  # role, #, restarts, step, ex/s, CPU %
        assert re.fullmatch(r"[\d.,]+", cpu), rows["worker:0"]
        assert 'href="/log?task=chief%3A0"' in rows["chief:0"]
        for chart in ("chart-loss", "chart-rate"):  # one line per training task
            svg = html.split(f'id="{chart}"')[1].split("</svg>")[0]
            assert sorted(re.findall(r'class="series" data-task="([^"]+)"', svg)) == [
                "chief:0",
                "worker:0",
            ]
        assert re.search(r"global step [\d,]+", html) and "refreshing every 2 s" in html
        shot = screenshot(url, Path(ARTEFACTS or tmp_path) / "local-page-running.png")
        assert shot.stat().st_size > 10_000

        page = _json(url + "status.json")
        cli = json.loads(
            subprocess.run(
                tfyarn_cmd("status", app_id, "--output", "json"),
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        )
        assert set(page) == set(cli) and page["schema"] == "tfyarn.status/1"
        for key in (
            "app_id",
            "backend",
            "name",
            "state",
            "started",
            "tags",
            "attempt",
            "tracking_url",
        ):
            assert page[key] == cli[key], key
        assert [(t["task"], t["state"], t["log"]) for t in page["tasks"]] == [
            (t["task"], t["state"], t["log"]) for t in cli["tasks"]
        ]
        assert page["progress"]["page_url"] == cli["progress"]["page_url"] == url
        with urllib.request.urlopen(url + "log?task=worker:0", timeout=10) as r:
            assert "worker:0" in r.read().decode()
    finally:
        stop.touch()
    final = api.wait(app_id, timeout=90)
    assert final.state.value == "SUCCEEDED", final.diagnostics

    served = subprocess.Popen(
        tfyarn_cmd("report", app_id, "--serve", "--port", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = served.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert m, f"report --serve printed no URL: {line!r}"
        html = dom(m.group(1))
        assert 'data-ended="1"' in html and "SUCCEEDED" in html and "the job has ended" in html
        assert sorted(_rows(html)) == ["chief:0", "worker:0"]
        svg = html.split('id="chart-loss"')[1].split("</svg>")[0]
        assert sorted(re.findall(r'class="series" data-task="([^"]+)"', svg)) == [
            "chief:0",
            "worker:0",
        ]
        doc = _json(m.group(1) + "status.json")
        assert (doc["app_id"], doc["state"], doc["schema"]) == (
            app_id,
            "SUCCEEDED",
            "tfyarn.status/1",
        )
        screenshot(m.group(1), Path(ARTEFACTS or tmp_path) / "local-page-report.png")
    finally:
        served.terminate()
        served.wait(10)
