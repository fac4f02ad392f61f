"""Operations against YARN: the Airflow operator in real Airflow (``dag.test()`` on SQLite, polling and deferrable)
and the Oozie example's shell action (specs/oozie/tfyarn-action.sh with the workflow's own arguments), each running
a real job on the cluster. Their local-backend versions are tests/functional/ops/test_airflow.py and test_oozie.py.

Airflow is an optional extra: these tests need it (CI installs it before the YARN suite; with TFYARN_REQUIRE_YARN=1
a missing Airflow fails the test instead of skipping it)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from airflowutil import migrated_airflow_env
from clusterutil import JOB_S, ROOT, assert_clean, hdfs_exists, job_doc, needs_yarn, planned_steps, unique
from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_yarn, pytest.mark.timeout(4 * JOB_S)]

DAGS = Path(__file__).resolve().parent / "dags"
OOZIE = ROOT / "specs" / "oozie"
RUN_ID = "manual__2026-01-01T00:00:00+00:00"  # what dag.test(logical_date=run_after=2026-01-01) names the run


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    """An AIRFLOW_HOME with a migrated SQLite DB whose DAG folder is tests/cluster/yarn/dags."""
    pytest.importorskip("airflow", reason="apache-airflow is not installed (pip install 'tfyarn[airflow]')")
    return migrated_airflow_env(tmp_path_factory.mktemp("airflow"), DAGS)


def test_airflow_operator_polling_and_deferrable_on_yarn(yarn, dataset, hdfs_root, airflow_env, tmp_path):
    from tfyarn.airflow.tags import airflow_tags, matches
    name = unique("airflow")
    doc = job_doc(dataset, name, epochs=1)
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    per_worker = sum(planned_steps(load_spec_dict(doc)))
    out = tmp_path / "xcom.json"
    env = {**airflow_env, "TFYARN_TEST_SPEC": str(spec_path), "TFYARN_TEST_OUT": str(out),
           "TFYARN_TEST_CKPT": hdfs.join(hdfs_root, name)}
    proc = subprocess.run([sys.executable, str(DAGS / "yarn_dags.py")], env=env, capture_output=True, text=True,
                          timeout=3 * JOB_S)
    lines = (proc.stdout + proc.stderr).splitlines()
    log = "\n".join(lines)
    states = [ln for ln in lines if ln.startswith("TI_STATES ")]
    assert states, f"dag.test() exited {proc.returncode} without task states:\n" + log[-6000:]
    assert json.loads(states[-1].split(" ", 1)[1]) == {"train": "success", "train_deferred": "success",
                                                        "record": "success"}, log[-6000:]
    assert any("Pausing task as DEFERRED" in ln for ln in lines), "train_deferred did not defer"
    xcoms = json.loads(out.read_text())
    apps = []
    for task in ("train", "train_deferred"):
        x = xcoms[task]
        app_id = x["app_id"]
        apps.append(app_id)
        assert re.fullmatch(r"application_\d+_\d+", app_id or ""), x
        st = yarn.status(app_id)
        assert st.state is AppState.SUCCEEDED, (task, st.diagnostics)
        assert matches(st.tags, airflow_tags("tfyarn_yarn", task, RUN_ID)) and name in st.tags, st.tags
        r = x["result"]
        assert (r["app_id"], r["state"], r["exit_code"]) == (app_id, "SUCCEEDED", 0), r
        s = x["summary"]
        assert s["app_id"] == app_id and s["global_step"] == s["total_steps"] == per_worker, s
        assert s["steps_per_worker"] == {"chief:0": per_worker, "worker:0": per_worker}, s
        # the run report next to this task's checkpoints (what the next task of a DAG, anywhere, can read)
        assert r["report"] and r["report"].startswith(hdfs.join(hdfs_root, name, task)), r
        assert hdfs_exists(r["report"]), r["report"]
        progress = [ln for ln in lines if re.search(rf"tfyarn {app_id} (running|pending)", ln)]
        assert progress, f"no progress lines for {task}"
    assert apps[0] != apps[1]
    assert_clean(yarn, *apps, tag=name)


def _workflow_arguments(wf_id: str) -> list[str]:
    """The shell action's <argument>s with the EL filled in from job.properties (wf:id() = ``wf_id``)."""
    props = {}
    for line in (OOZIE / "job.properties").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            props[k.strip()] = v.strip()
    ns = {"wf": "uri:oozie:workflow:0.5", "sh": "uri:oozie:shell-action:0.3"}
    shell = ET.parse(OOZIE / "workflow.xml").getroot().find("wf:action/sh:shell", ns)

    def fill(text):
        return re.sub(r"\$\{([^}]+)\}", lambda m: wf_id if m.group(1) == "wf:id()" else props[m.group(1)], text)

    return [fill(a.text) for a in shell.findall("sh:argument", ns)]


def test_the_oozie_action_runs_a_job_on_yarn_to_its_end(yarn, dataset, tmp_path):
    """What Oozie's launcher runs: tfyarn-action.sh with the workflow's arguments (its spec file replaced by a job on
    this cluster's data; epochs, queue and tags as the workflow sets them), TFYARN_BACKEND=--yarn."""
    wf_id = unique("oozie-wf")
    args = _workflow_arguments(wf_id)
    assert args[0] == "ctr.yaml" and f"oozie-wf={wf_id}" in " ".join(args), args
    epochs = int(re.search(r"data\.epochs=(\d+)", " ".join(args)).group(1))
    spec_path = tmp_path / "ctr.yaml"
    spec_path.write_text(yaml.safe_dump(job_doc(dataset, wf_id, epochs=1)))    # the workflow's --set decides
    expected = sum(planned_steps(load_spec_dict(job_doc(dataset, wf_id, epochs=epochs))))
    tfyarn_bin = tmp_path / "bin" / "tfyarn"
    tfyarn_bin.parent.mkdir()
    tfyarn_bin.write_text(f"#!/bin/sh\nexec {sys.executable} -m tfyarn.cli \"$@\"\n")
    tfyarn_bin.chmod(0o755)
    env = {**os.environ, "TFYARN": str(tfyarn_bin), "TFYARN_BACKEND": "--yarn",
           "TFYARN_ADOPT_TAG": f"oozie-wf={wf_id}"}
    try:
        proc = subprocess.run(["bash", str(OOZIE / "tfyarn-action.sh"), str(spec_path), *args[1:]], env=env,
                              capture_output=True, text=True, timeout=2 * JOB_S)
    finally:   # the workflow's tags replace the session tag: kill by the workflow's own
        for a in yarn.list():
            if f"oozie-wf={wf_id}" in a.tags:
                yarn.kill(a.app_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    captured = dict(line.split("=", 1) for line in proc.stdout.splitlines())   # Oozie's <capture-output/>
    assert set(captured) == {"app_id", "exit_code"} and captured["exit_code"] == "0", proc.stdout
    app_id = captured["app_id"]
    st = yarn.status(app_id)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert {"ctr", f"oozie-wf={wf_id}", "oozie-action=train"} <= set(st.tags), st.tags
    assert st.summary["global_step"] == st.summary["total_steps"] == expected, st.summary
    assert_clean(yarn, app_id, tag=f"oozie-wf={wf_id}")
