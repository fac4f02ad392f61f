"""``tfyarn status APP --output json`` (schema ``tfyarn.status/1``, documented in the README) on real local apps.

The key sets and types are pinned here on purpose: a change to the schema must break this test and bump the version.
"""
import json
import re
import subprocess
import time

import pytest

from opsutil import job_spec, tfyarn_cmd
from tfyarn import api
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(180)

TOP = {"schema": str, "app_id": str, "backend": str, "name": str, "state": str, "exit_code": (int, type(None)),
       "diagnostics": str, "tasks": list, "progress": dict, "started": (float, type(None)),
       "finished": (float, type(None)), "tracking_url": (str, type(None)), "summary": (dict, type(None)),
       "tags": list, "attempt": int, "causes": list}
OPTIONAL: dict = {}
TASK = {"task": str, "state": str, "host": (str, type(None)), "restarts": int, "exit_code": (int, type(None)),
        "diagnostics": str, "log": (str, type(None)), "memory_mib": (int, type(None)),
        "peak_rss_mib": (int, type(None)), "cpu_percent": (float, type(None)), "rss_mib": (int, type(None))}
PROGRESS = {"global_step": int, "total_steps": int, "examples_per_sec": float, "loss": (float, type(None)),
            "epoch": (int, type(None)), "eta_s": (float, type(None)), "per_task": dict}
STATES = {"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "KILLED", "TIMED_OUT"}


def _status_json(app_id):
    proc = subprocess.run(tfyarn_cmd("status", app_id, "--output", "json"), capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, json.loads(proc.stdout)


def _check_types(d, schema, where):
    assert set(d) >= set(schema), f"{where}: missing {set(schema) - set(d)}"
    for k, t in schema.items():
        assert isinstance(d[k], t), f"{where}.{k}: {d[k]!r} is not {t}"


def _check(d):
    assert set(d) - set(OPTIONAL) == set(TOP), f"top-level keys changed: {(set(d) - set(OPTIONAL)) ^ set(TOP)}"
    _check_types(d, TOP, "status")
    _check_types(d, {k: t for k, t in OPTIONAL.items() if k in d}, "status")
    assert d["schema"] == "tfyarn.status/1" and d["backend"] == "local" and d["state"] in STATES
    for t in d["tasks"]:
        assert set(t) == set(TASK), f"task keys changed: {set(t) ^ set(TASK)}"
        _check_types(t, TASK, "task")


def test_status_json_schema_while_running_and_after(tmp_path):
    spec = load_spec_dict(job_spec(tmp_path, params={"steps": 100, "dt": 0.05}, tags=["nightly"]))
    app_id = api.submit(spec, "local")
    deadline = time.monotonic() + 60
    while True:
        code, d = _status_json(app_id)
        if d["state"] == "RUNNING" and d["progress"].get("global_step", 0) > 0 and d["progress"].get("total_steps"):
            break
        assert time.monotonic() < deadline, f"app {app_id} never reported progress while running: {d}"
        time.sleep(0.3)
    _check(d)
    assert code == 0 and d["exit_code"] is None and d["finished"] is None and d["tags"] == ["nightly"]
    assert [t["task"] for t in d["tasks"]] == ["chief:0", "worker:0"]
    _check_types(d["progress"], PROGRESS, "progress")
    assert d["progress"]["total_steps"] == 100

    api.wait(app_id, timeout=90)
    code, d = _status_json(app_id)
    _check(d)
    assert (code, d["state"], d["exit_code"]) == (0, "SUCCEEDED", 0)
    assert isinstance(d["finished"], float) and d["finished"] >= d["started"]
    assert d["summary"]["global_step"] == 100 and d["summary"]["last_loss"] < d["summary"]["first_loss"]


def test_status_json_of_a_failed_app_exits_1_with_the_diagnosis(tmp_path):
    spec = load_spec_dict(job_spec(tmp_path, model="ops_jobs:fail_after_progress"))
    app_id = api.submit(spec, "local")
    api.wait(app_id, timeout=90)
    code, d = _status_json(app_id)
    _check(d)
    assert (code, d["state"], d["exit_code"]) == (1, "FAILED", 1)
    assert "loss became NaN at step 10 on worker:0" in d["diagnostics"]
    failed = [t for t in d["tasks"] if t["state"] == "FAILED"]
    assert [t["task"] for t in failed] == ["worker:0"] and failed[0]["exit_code"] == 1


def test_a_local_task_over_its_roles_memory_is_named_with_its_peak(tmp_path, caplog):
    """Local tasks have no memory limit; YARN kills a container over its role's memory. The launcher samples each
    task's resident memory (with its children) and names the one that went over, while it runs and at the end."""
    from tfyarn.display import summary_text
    doc = job_spec(tmp_path, params={"steps": 20, "dt": 0.05})
    doc["roles"] = {"chief": {"instances": 1}, "worker": {"instances": 1, "memory": "64 MiB"}}
    with caplog.at_level("WARNING", logger="tfyarn.runner.local_app"):
        st = api.run(load_spec_dict(doc), backend="local")
    assert st.state.value == "SUCCEEDED", st.diagnostics
    tasks = {t.task: t for t in st.tasks}
    assert tasks["worker:0"].memory_mib == 64 and tasks["chief:0"].memory_mib == 2048
    assert tasks["worker:0"].peak_rss_mib > 64 and 0 < tasks["chief:0"].peak_rss_mib < 2048
    assert re.search(r"worker:0 uses \d+ MiB of resident memory, more than roles.worker.memory \(64 MiB\)", caplog.text)
    assert "chief:0 uses" not in caplog.text
    text = summary_text(st)
    assert f"memory: worker:0 peaked at {tasks['worker:0'].peak_rss_mib:,} MiB resident, over roles.worker.memory " \
           f"(64 MiB): on YARN its container would be killed" in text
    assert "memory: chief:0" not in text
