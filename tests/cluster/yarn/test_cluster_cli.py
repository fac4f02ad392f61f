"""The CLI on YARN as a user runs it (each command its own process and skein driver), with its exit codes:
submit, list, status (text and JSON), wait, logs after the end (aggregated, Hadoop 3.3 bucket layout) and kill.
``logs -f`` while running is tested in test_cluster_tasks.py."""
import json
import re
import time

import pytest
import yaml

from clusterutil import JOB_S, ROOT, assert_clean, job_doc, needs_yarn, planned_steps, tfyarn, unique
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_yarn, pytest.mark.timeout(3 * JOB_S)]


def test_submit_list_status_wait_logs_and_kill_with_their_exit_codes(yarn, dataset, hdfs_root, tmp_path):
    name = unique("cli-short")
    # usually ends before `wait` starts: nobody read its KV while it ran, so status finds the summary on HDFS
    short_doc = job_doc(dataset, name, epochs=1, ckpt=f"{hdfs_root}/{name}/ckpt")
    long_doc = job_doc(dataset, unique("cli-long"), mode="allreduce", model="custom_jobs:run_long",
                       code=str(ROOT / "tests" / "helpers" / "jobs"))
    (tmp_path / "short.yaml").write_text(yaml.safe_dump(short_doc))
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(long_doc))

    sub = tfyarn("-q", "submit", str(tmp_path / "short.yaml"), "--yarn")
    assert sub.returncode == 0 and re.fullmatch(r"application_\d+_\d+", sub.stdout.strip()), sub.stderr
    short = sub.stdout.strip()
    sub = tfyarn("-q", "submit", str(tmp_path / "long.yaml"), "--yarn", "--output", "json")
    assert sub.returncode == 0, sub.stderr
    long = json.loads(sub.stdout)["app_id"]

    listed = tfyarn("list", "--yarn", "--running", "--tag", long_doc["name"], "--output", "ids")
    assert listed.returncode == 0 and listed.stdout.split() == [long], listed.stdout + listed.stderr
    st = tfyarn("status", long, "--output", "json")
    assert st.returncode == 0, st.stderr                       # running: 0
    doc = json.loads(st.stdout)
    assert doc["schema"] == "tfyarn.status/1" and doc["app_id"] == long and doc["backend"] == "yarn"
    assert doc["state"] in ("PENDING", "RUNNING") and doc["exit_code"] is None
    assert long_doc["name"] in doc["tags"]

    t0 = time.monotonic()
    waited = tfyarn("wait", short, "--timeout", str(JOB_S), timeout=JOB_S + 60)
    assert waited.returncode == 0, waited.stdout + waited.stderr[-3000:]
    assert "SUCCEEDED" in waited.stdout
    per_worker = sum(planned_steps(load_spec_dict(short_doc)))
    text = tfyarn("status", short)
    assert text.returncode == 0 and "SUCCEEDED" in text.stdout, text.stdout + text.stderr
    st = tfyarn("status", short, "--output", "json")
    doc = json.loads(st.stdout)
    assert st.returncode == 0 and doc["state"] == "SUCCEEDED" and doc["exit_code"] == 0
    assert doc["summary"]["global_step"] == doc["summary"]["total_steps"] == per_worker
    assert doc["summary"]["steps_per_worker"] == {"chief:0": per_worker, "worker:0": per_worker}
    assert doc["summary"]["app_id"] == short

    # after the end: the aggregated logs on HDFS (Hadoop 3.3's bucket layout, which skein misses)
    t1 = time.monotonic()
    logs = tfyarn("logs", short, "--task", "chief:0")
    took = time.monotonic() - t1
    lines = logs.stdout.splitlines()
    assert logs.returncode == 0, logs.stderr
    assert lines and all(line.startswith("chief:0 | ") for line in lines), lines[:5]
    assert any("[tfyarn] container chief_0" in line for line in lines)
    assert any(f"training done: global step {per_worker}" in line for line in lines), lines[-20:]
    assert took < 60, f"logs after the end took {took:.0f}s"
    everyone = tfyarn("logs", short)
    assert {line.split(" | ", 1)[0] for line in everyone.stdout.splitlines()} == {"ps:0", "chief:0", "worker:0"}

    killed = tfyarn("kill", long)
    assert killed.returncode == 0 and f"killed {long}" in killed.stdout, killed.stdout + killed.stderr
    waited = tfyarn("wait", long, "--timeout", "120")
    assert waited.returncode == 3 and "KILLED" in waited.stdout, waited.stdout + waited.stderr[-2000:]
    assert tfyarn("status", long).returncode == 3
    again = tfyarn("kill", long)
    assert again.returncode == 0 and "had already ended: KILLED" in again.stdout, again.stdout + again.stderr
    listed = tfyarn("list", "--yarn", "--running", "--tag", long_doc["name"], "--output", "ids")
    assert listed.returncode == 0 and listed.stdout.strip() == ""
    unknown = tfyarn("status", "application_1_0001")
    assert unknown.returncode == 2 and "application_1_0001" in unknown.stderr, unknown.stdout + unknown.stderr
    assert_clean(yarn, short, long, tag=short_doc["name"])
    assert_clean(yarn, tag=long_doc["name"])
    print(f"CLI round trip: {time.monotonic() - t0:.0f}s from wait to the end")
