"""Issue 32 on the real cluster, as a person would look: the job's page through the
ResourceManager's proxy, in headless Chromium, while the job runs (tasks with CPU % and RSS, the
charts) and after it ends (from its report: ``tfyarn report --serve``); the JSON endpoint against
``tfyarn status --output json``. Screenshots are kept in $TFYARN_ARTEFACTS (else the test's tmp
dir)."""

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from clusterutil import JOB_S, ROOT, job_doc, needs_yarn, tfyarn, unique, wait_until
from tfyarn import runner
from tfyarn.backends.yarn.rest import RmRest
from tfyarn.spec import load_spec_dict

from browser import dom, screenshot

pytestmark = [*needs_yarn, pytest.mark.timeout(3 * JOB_S)]


def _json(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _rows(html):
    return dict(re.findall(r'<tr data-task="([^"]+)">(.*?)</tr>', html))


def _series(html, chart):
    svg = html.split(f'id="{chart}"')[1].split("</svg>")[0]
    return sorted(re.findall(r'class="series" data-task="([^"]+)"', svg))


def test_the_page_at_the_tracking_url_while_running_and_after(yarn, dataset, hdfs_root, tmp_path):
    artefacts = Path(os.environ.get("TFYARN_ARTEFACTS") or tmp_path)
    artefacts.mkdir(parents=True, exist_ok=True)
    stop = tmp_path / "stop"  # the NodeManagers run on this machine: the tasks see this file
    doc = job_doc(
        dataset,
        unique("page"),
        mode="allreduce",
        model="ops_jobs:until_file",
        code=str(ROOT / "tests" / "functional" / "ops" / "jobs"),
        params={"stop_file": str(stop)},
        ckpt=f"{hdfs_root}/page/ckpt",
    )
    app_id = yarn.submit(load_spec_dict(doc))
    try:

        def measured():
            st = yarn.status(app_id)
            ok = (
                st.progress.get("page_url")
                and (st.progress.get("global_step") or 0) > 20
                and all(t.cpu_percent is not None and t.rss_mib for t in st.tasks)
            )
            return st if ok else None

        st = wait_until(
            measured, JOB_S, f"{app_id}'s page URL, progress and every task's CPU/RSS in status"
        )
        rep = RmRest(yarn.conf, yarn.user).report(app_id)
        assert rep.tracking_url.rstrip("/").endswith(
            f"/proxy/{app_id}"
        )  # the RM's link: skein's web UI
        url = st.progress["page_url"]
        assert (
            url == rep.tracking_url.rstrip("/") + "/pages/tfyarn/"
        )  # under it, through the RM's proxy
        text = tfyarn("status", app_id).stdout
        assert f"page: {url}" in text and re.search(
            r"chief:0 .* cpu=\d+% rss=\d+/1,024MiB peak=\d+MiB", text
        ), text
        # the RM's link: skein's overview, whose "Service Pages" menu links the page
        with urllib.request.urlopen(rep.tracking_url, timeout=30) as r:
            assert r.status == 200
            overview = r.read().decode()
        assert re.search(r'class="dropdown-item" href="\./pages/tfyarn/">tfyarn job<', overview)

        html = dom(url, budget_ms=5000)
        assert 'data-loaded="1"' in html, html[-3000:]
        rows = _rows(html)
        assert sorted(rows) == ["chief:0", "worker:0"] and all(
            "RUNNING" in r for r in rows.values()
        )
        for r in rows.values():
            cells = re.findall(r"<td[^>]*>(.*?)</td>", r)
            assert re.fullmatch(r"[\d.,]+", cells[7]), r  # CPU %
            assert re.search(r"[\d,]+ / 1,024 MiB", cells[8]), r  # RSS against the container's
            assert re.search(r'href="http://[^"]+/node/containerlogs/container_', cells[9]), (
                r
            )  # live log
        assert _series(html, "chart-loss") == ["chief:0", "worker:0"]
        assert _series(html, "chart-rate") == ["chief:0", "worker:0"]
        assert (
            screenshot(url, artefacts / "yarn-page-running.png", budget_ms=5000).stat().st_size
            > 10_000
        )

        page = _json(url + "status.json")
        cli = json.loads(tfyarn("status", app_id, "--output", "json").stdout)
        assert set(page) == set(cli) and page["schema"] == "tfyarn.status/1"
        for key in (
            "app_id",
            "backend",
            "name",
            "state",
            "tags",
            "tracking_url",
            "attempt",
            "exit_code",
        ):
            assert page[key] == cli[key], key
        assert page["started"] == pytest.approx(cli["started"], abs=1)
        assert [(t["task"], t["state"], t["host"], t["log"]) for t in page["tasks"]] == [
            (t["task"], t["state"], t["host"], t["log"]) for t in cli["tasks"]
        ]
        assert set(page["tasks"][0]) == set(cli["tasks"][0])
    finally:
        stop.touch()
    final = runner.wait(yarn, app_id, timeout=JOB_S)
    assert final.state.value == "SUCCEEDED", final.diagnostics
    assert all(t.peak_rss_mib for t in final.tasks), final.tasks

    # after the end: the page from the run report
    wait_until(
        lambda: tfyarn("report", app_id, "--output", "json").returncode == 0,
        120,
        f"{app_id}'s report",
    )
    served = subprocess.Popen(
        [sys.executable, "-m", "tfyarn.cli", "report", app_id, "--serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = served.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert m, f"report --serve printed no URL: {line!r}"
        html = dom(m.group(1))
        assert 'data-ended="1"' in html and "SUCCEEDED" in html
        assert sorted(_rows(html)) == ["chief:0", "worker:0"]
        assert _series(html, "chart-loss") == ["chief:0", "worker:0"]
        doc = _json(m.group(1) + "status.json")
        assert (doc["app_id"], doc["state"]) == (app_id, "SUCCEEDED")
        assert all(t["peak_rss_mib"] for t in doc["tasks"]), doc["tasks"]
        screenshot(m.group(1), artefacts / "yarn-page-report.png")
    finally:
        served.terminate()
        served.wait(10)
