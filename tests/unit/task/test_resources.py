"""Resource use per task (issue 32): each task measures its own process tree and publishes it;
status, the summary and the page show it; a task at 90 % of its container's memory is warned about.
"""

import json
import logging
import subprocess
import sys
import time

import pytest

from tfyarn.contracts.status import AppState, AppStatus, TaskStatus
from tfyarn.contracts.progress import apply_resources, memory_warnings
from tfyarn.display import status_text, summary_text
from tfyarn.tasklib.kv import MemoryKV
from tfyarn.contracts.kv_keys import resources_key
from tfyarn.task.resources import ResourcePublisher, TreeMeter

CHILD = (
    "import time; b = bytearray(120 << 20); b[::4096] = b'x' * len(b[::4096]); t = time.time()\n"
    "while time.time() - t < 30: pass"
)  # 120 MiB resident and one core busy, until killed


PARENT = (
    f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {CHILD!r}]); "
    "time.sleep(60)"
)


@pytest.fixture
def busy_child():
    proc = subprocess.Popen([sys.executable, "-c", CHILD])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def busy_tree():
    """A process that sleeps, with the busy child under it: a tree of its own (pytest's other
    children aside)."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True)
    yield proc
    for p in psutil.Process(proc.pid).children(recursive=True):
        p.kill()
    proc.kill()
    proc.wait()


def test_the_tree_counts_a_child_process_memory_and_cpu(busy_tree):
    import psutil

    meter = TreeMeter(busy_tree.pid)
    deadline = time.monotonic() + 20
    while True:  # the child has allocated and touched its pages
        first = meter.sample()
        if first["rss_mib"] >= 120:
            break
        assert time.monotonic() < deadline, f"the child's 120 MiB never showed in the tree: {first}"
        time.sleep(0.2)
    child = psutil.Process(busy_tree.pid).children()[0]
    c0, t0 = sum(child.cpu_times()[:2]), time.monotonic()
    meter.sample()
    time.sleep(1.5)
    rec = meter.sample()
    c1, t1 = sum(child.cpu_times()[:2]), time.monotonic()
    assert rec["rss_mib"] >= 120 and rec["peak_rss_mib"] >= rec["rss_mib"]
    # the busy child's CPU as psutil sees it over (nearly) the same window; its sleeping parent
    # adds ~0
    child_percent = (c1 - c0) / (t1 - t0) * 100
    assert (
        child_percent > 5
        and 0.7 * child_percent - 5 <= rec["cpu_percent"] <= 1.3 * child_percent + 5
    ), (rec, child_percent)
    alone = TreeMeter(child.pid).sample()
    assert (
        alone["rss_mib"] >= 120 and alone["cpu_percent"] is None
    )  # no rate before a second sample


def test_the_publisher_puts_its_record_and_warns_at_90_percent(busy_child, caplog):
    kv = MemoryKV()
    pub = ResourcePublisher(kv, "ps:0", memory_mib=100)
    deadline = time.monotonic() + 20
    with caplog.at_level(logging.WARNING, logger="tfyarn.task.resources"):
        while (rec := pub.publish())["rss_mib"] < 120:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        pub.publish()
    stored = json.loads(kv.get(resources_key("ps:0")))
    assert stored["memory_mib"] == 100 and stored["rss_mib"] >= 120 and stored["time"] > 0
    assert caplog.text.count("ps:0 uses") == 1 and "of its container's 100 MiB" in caplog.text
    assert rec["peak_rss_mib"] >= 120


def test_status_and_summary_show_the_records():
    tasks = [
        TaskStatus("ps:0", "RUNNING", memory_mib=1024),
        TaskStatus("worker:0", "RUNNING", memory_mib=2048),
        TaskStatus("worker:1", "PENDING", memory_mib=2048),
    ]
    kv = {
        resources_key("ps:0"): json.dumps(
            {"cpu_percent": 12.5, "rss_mib": 950, "peak_rss_mib": 990}
        ),
        resources_key("worker:0"): json.dumps(
            {"cpu_percent": 180.0, "rss_mib": 400, "peak_rss_mib": 410}
        ),
        resources_key("worker:9"): "not json",
        "progress/worker:0": "{}",
    }
    apply_resources(tasks, kv)
    assert [(t.cpu_percent, t.rss_mib, t.peak_rss_mib) for t in tasks] == [
        (12.5, 950, 990),
        (180.0, 400, 410),
        (None, None, None),
    ]
    assert memory_warnings(tasks) == [
        "ps:0 uses 950 MiB of resident memory, 93% of its container's 1,024 MiB (roles.ps.memory)"
    ]
    st = AppStatus(
        app_id="application_1_0001", backend="yarn", name="j", state=AppState.RUNNING, tasks=tasks
    )
    text = status_text(st)
    assert "  memory: ps:0 uses 950 MiB" in text
    assert "ps:0" in text and "cpu=12% rss=950/1,024MiB peak=990MiB" in text
    assert "cpu=180% rss=400/2,048MiB peak=410MiB" in text
    st.state = AppState.SUCCEEDED
    summary = summary_text(st)
    assert (
        "memory: ps:0 peaked at 990 MiB resident, 97% of roles.ps.memory (1,024 MiB): "
        "YARN kills a container "
        "above it" in summary
    )
    assert "memory: worker:0" not in summary
