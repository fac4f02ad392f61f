"""The YARN page's parts without a cluster: the status it serves from the in-app supervisor's
snapshot, the 90 % memory warning (once per task), and adding the page to skein's web UI (the
overview link dropped when skein's overview cannot render it)."""

import logging
from types import SimpleNamespace

from tfyarn.runner.yarn_app import page as yarn_page
from tfyarn.spec import load_spec_dict

SPEC = load_spec_dict(
    {
        "name": "j",
        "model": "m:f",
        "mode": "allreduce",
        "tags": ["nightly"],
        "data": {
            "train": "/x/*.tfrecord",
            "batch_size": 4,
            "features": {"label": {"dtype": "float32"}},
        },
        "roles": {"chief": {"instances": 1}, "worker": {"instances": 1, "memory": "1 GiB"}},
    }
)
TASKS = [
    {
        "task": "chief:0",
        "state": "RUNNING",
        "host": "n1",
        "memory_mib": 2048,
        "rss_mib": 400,
        "peak_rss_mib": 410,
        "cpu_percent": 99.0,
    },
    {
        "task": "worker:0",
        "state": "RUNNING",
        "host": "n2",
        "memory_mib": 1024,
        "rss_mib": 950,
        "peak_rss_mib": 960,
        "cpu_percent": 80.0,
    },
]


def _sup(tasks, outcome=None):
    return SimpleNamespace(
        snap={"tasks": tasks, "progress": {"global_step": 7}, "summary": None},
        sup=SimpleNamespace(summary=None),
        outcome=outcome,
        app_id="application_1_0001",
        spec=SPEC,
        started=100.0,
        attempt=0,
    )


def test_the_served_status_is_the_supervisors_snapshot():
    st = yarn_page.live_status(_sup(TASKS), rep=None).to_dict()
    assert (st["schema"], st["backend"], st["state"], st["tags"]) == (
        "tfyarn.status/1",
        "yarn",
        "RUNNING",
        ["nightly"],
    )
    assert [(t["task"], t["cpu_percent"], t["rss_mib"]) for t in st["tasks"]] == [
        ("chief:0", 99.0, 400),
        ("worker:0", 80.0, 950),
    ]
    assert st["progress"] == {"global_step": 7} and st["exit_code"] is None
    pending = [dict(TASKS[0]), dict(TASKS[1], state="PENDING")]
    assert yarn_page.live_status(_sup(pending), rep=None).state.value == "PENDING"
    ending = yarn_page.live_status(_sup(TASKS, outcome=("SUCCEEDED", "")), rep=None)
    assert ending.state.value == "SUCCEEDED"


def test_the_memory_warning_names_a_task_at_90_percent_once(caplog):
    watch = yarn_page.MemoryWatch()
    with caplog.at_level(logging.WARNING, logger=yarn_page.__name__):
        watch(TASKS)
        watch(TASKS)
    assert (
        caplog.text.count("worker:0 uses 950 MiB") == 1
        and "93% of its container's 1,024 MiB" in caplog.text
    )
    assert "chief:0" not in caplog.text


class FakeUI:
    def __init__(self, overview_status):
        self.address = "http://rm:8088/proxy/application_1_0001/"
        self.calls, self.overview_status = [], overview_status

    def add_page(self, route, target, link_name=None):
        self.calls.append(("add", route, target, link_name))
        return SimpleNamespace(address=f"{self.address}pages/{route}/")

    def remove_page(self, route):
        self.calls.append(("remove", route))


def test_the_overview_link_is_dropped_when_skeins_overview_fails(monkeypatch):
    import urllib.error
    import urllib.request

    class Ok:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def failing(url, timeout):
        assert url == "http://rm:8088/proxy/application_1_0001/overview"
        raise urllib.error.HTTPError(url, 500, "MustacheException", {}, None)

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: Ok())
    ui = FakeUI(200)
    assert (
        yarn_page.add_page(ui, "http://n1:4242")
        == "http://rm:8088/proxy/application_1_0001/pages/tfyarn/"
    )
    assert ui.calls == [("add", "tfyarn", "http://n1:4242", "tfyarn job")]

    monkeypatch.setattr(urllib.request, "urlopen", failing)
    ui = FakeUI(500)
    assert yarn_page.add_page(ui, "http://n1:4242").endswith("/pages/tfyarn/")
    assert ui.calls == [
        ("add", "tfyarn", "http://n1:4242", "tfyarn job"),
        ("remove", "tfyarn"),
        ("add", "tfyarn", "http://n1:4242", None),
    ]
