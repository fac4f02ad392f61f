"""TfyarnOperator with REAL Airflow (``dag.test()`` on SQLite, in a subprocess) against the local backend.

No mocks: the DAGs in tests/functional/ops/dags run the operator in Airflow's own task runner; the jobs are real local
apps.
Airflow is an optional extra: without it these tests skip — unless ``TFYARN_REQUIRE_AIRFLOW=1`` (CI sets it), where a
missing Airflow is a failure, not a silent skip.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from airflowutil import migrated_airflow_env
from opsutil import DAGS, job_spec, write_spec
from tfyarn import api
from tfyarn.airflow.tags import airflow_tags, matches, normalise_tag
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

if os.environ.get("TFYARN_REQUIRE_AIRFLOW") != "1":
    pytest.importorskip("airflow", reason="apache-airflow is not installed (pip install 'tfyarn[airflow]')")

RUN_ID = "manual__2026-01-01T00:00:00+00:00"  # what dag.test(logical_date=run_after=2026-01-01) names the run


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    """An AIRFLOW_HOME with a migrated SQLite DB whose DAG folder is tests/functional/ops/dags (one per module:
    ~5 s)."""
    return migrated_airflow_env(tmp_path_factory.mktemp("airflow"), DAGS)


def _run_dag(env, dag_id, tmp_path, spec_path, on_line=None, timeout=240):
    """Run ``dag.test()`` of ``dag_id`` in a subprocess; returns (task states, XComs recorded, output lines)."""
    out_file = tmp_path / f"{dag_id}-xcom.json"
    env = {**env, "TFYARN_TEST_SPEC": str(spec_path), "TFYARN_TEST_OUT": str(out_file),
           "TFYARN_HOME": os.environ["TFYARN_HOME"]}
    proc = subprocess.Popen([sys.executable, str(DAGS / "ops_dags.py"), dag_id], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def pump():
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line.rstrip("\n"))
            if on_line:
                on_line(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"dag.test() of {dag_id} did not finish within {timeout}s; last output:\n" + "\n".join(lines[-40:]))
    reader.join(timeout=10)
    states = [ln for ln in lines if ln.startswith("TI_STATES ")]
    assert states, f"dag.test() of {dag_id} exited {proc.returncode} without task states:\n" + "\n".join(lines[-60:])
    xcoms = json.loads(out_file.read_text()) if out_file.exists() else {}
    return json.loads(states[-1].split(" ", 1)[1]), xcoms, lines


def _app_with_tags(task_id, dag_id):
    tags = airflow_tags(dag_id, task_id, RUN_ID)
    return [a for a in api.list_apps("local") if matches(a.tags, tags)]


@pytest.mark.timeout(300)
def test_operator_in_real_airflow(airflow_env, tmp_path):
    spec_path = write_spec(tmp_path, job_spec(tmp_path, params={"steps": 40, "dt": 0.05}, tags=["ctr"]))
    t0 = time.monotonic()
    states, xcoms, lines = _run_dag(airflow_env, "tfyarn_ops", tmp_path, spec_path)
    log = "\n".join(lines)
    assert states == {"train": "success", "train_deferred": "success", "train_fail": "failed",
                      "train_timeout": "failed", "record": "success"}, log[-4000:]

    # success, polling and deferrable: app id and final metrics in XCom; the app is tagged with dag/task/run ids
    for task in ("train", "train_deferred"):
        x = xcoms[task]
        st = api.status(x["app_id"])
        assert st.state is AppState.SUCCEEDED
        assert x["result"]["app_id"] == x["app_id"] and x["result"]["state"] == "SUCCEEDED"
        assert x["summary"]["global_step"] == 40 and x["summary"]["last_loss"] < x["summary"]["first_loss"]
        assert x["result"]["report"] == str(Path(st.tracking_url) / "report.json")
        assert st.tags[0] == "ctr" and matches(st.tags, airflow_tags("tfyarn_ops", task, RUN_ID))
        # progress streamed into the task log (the trigger's lines, in deferrable mode)
        progress = [ln for ln in lines if re.search(rf"tfyarn {x['app_id']} running · .*step \d+/40", ln)]
        assert progress, f"no progress lines for {task}"
    assert any("Pausing task as DEFERRED" in ln for ln in lines)

    # a failed job fails the task with the job's diagnosis
    fail_id = xcoms["train_fail"]["app_id"]
    assert api.status(fail_id).state is AppState.FAILED
    assert re.search(rf"AirflowException: tfyarn app {fail_id} FAILED: worker:0 exited with code 1: "
                     r"RuntimeError: loss became NaN at step 10 on worker:0", log), log[-4000:]

    # execution_timeout → Airflow calls on_kill → the app is killed, not left running
    timeout_id = xcoms["train_timeout"]["app_id"]
    assert api.status(timeout_id).state is AppState.KILLED
    assert f"killing tfyarn app {timeout_id}: the Airflow task was killed" in log
    print(f"tfyarn_ops DAG took {time.monotonic() - t0:.1f}s")


@pytest.mark.timeout(300)
def test_retry_adopts_or_kills_the_running_app_of_an_earlier_try(airflow_env, tmp_path):
    """An earlier try's app is still running (its worker died): 'adopt' follows it, 'kill' replaces it."""
    stop = tmp_path / "stop-adopted"
    base = job_spec(tmp_path, model="ops_jobs:until_file", params={"stop_file": str(stop)})
    spec_path = write_spec(tmp_path, job_spec(tmp_path, params={"steps": 30, "dt": 0.05}))
    # what the earlier tries left behind: real apps with the task instances' tags, still running
    earlier_adopt = api.submit(load_spec_dict({**base, "tags": airflow_tags("tfyarn_retry", "adopt", RUN_ID)}),
                               "local")
    earlier_replace = api.submit(load_spec_dict({**base, "model": "ops_jobs:long",
                                                 "tags": airflow_tags("tfyarn_retry", "replace", RUN_ID)}), "local")

    def on_line(line):  # let the adopted app finish only once the operator says it adopted it
        if f"adopting tfyarn app {earlier_adopt}" in line:
            stop.write_text("done")

    states, xcoms, lines = _run_dag(airflow_env, "tfyarn_retry", tmp_path, spec_path, on_line=on_line)
    log = "\n".join(lines)
    assert states == {"adopt": "success", "replace": "success", "record": "success"}, log[-4000:]

    assert xcoms["adopt"]["app_id"] == earlier_adopt            # followed, not duplicated
    assert api.status(earlier_adopt).state is AppState.SUCCEEDED
    assert [a.app_id for a in _app_with_tags("adopt", "tfyarn_retry")] == [earlier_adopt]

    new = xcoms["replace"]["app_id"]                            # killed and started afresh
    assert new != earlier_replace
    assert api.status(earlier_replace).state is AppState.KILLED
    assert api.status(new).state is AppState.SUCCEEDED
    assert sorted(a.app_id for a in _app_with_tags("replace", "tfyarn_retry")) == sorted([earlier_replace, new])
    assert "on_existing='kill': an earlier try's app is still running" in log


@pytest.mark.timeout(300)
def test_the_operator_runs_a_predict_job_over_what_an_earlier_try_left(airflow_env, tmp_path):
    """predict=True scores the spec's predict.input; overwrite=True replaces the output an earlier try left."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("pyarrow")
    from predictutil import predict_doc, read_output, write_model, write_parquet
    model = write_model(tmp_path / "models")
    total = write_parquet(tmp_path / "in", [1500, 700])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "part-00000.parquet").write_text("what a failed earlier try left")
    doc = predict_doc(f"{model.parent}/latest", str(tmp_path / "in"), str(tmp_path / "out"), workers=2)
    del doc["job"]   # the operator's predict=True makes it a scoring job
    spec_path = write_spec(tmp_path, doc)
    states, xcoms, lines = _run_dag(airflow_env, "tfyarn_predict", tmp_path, spec_path)
    assert states == {"score": "success", "record": "success"}, "\n".join(lines)[-4000:]
    x = xcoms["score"]
    assert api.status(x["app_id"]).state is AppState.SUCCEEDED
    assert (x["summary"]["rows_in"], x["summary"]["rows_out"]) == (total, total)
    assert read_output(str(tmp_path / "out"))["row"].to_pylist() == list(range(total))


@pytest.mark.timeout(120)
def test_trigger_serializes_and_its_on_kill_kills_the_app(tmp_path):
    from tfyarn.airflow import TfyarnTrigger
    app_id = api.submit(load_spec_dict(job_spec(tmp_path, model="ops_jobs:long")), "local")
    trigger = TfyarnTrigger(app_id=app_id, poll_interval=0.2, timeout=1.0)
    path, kwargs = trigger.serialize()
    assert path == "tfyarn.airflow.trigger.TfyarnTrigger" and kwargs["app_id"] == app_id

    async def first_event():
        return await anext(trigger.run())

    event = asyncio.run(first_event())   # the app runs 'forever': the trigger's own timeout fires
    assert event.payload["status"] == "timeout" and app_id in event.payload["message"]
    asyncio.run(trigger.on_kill())
    assert api.status(app_id).state is AppState.KILLED


def test_tags_are_yarn_safe_and_match_case_insensitively():
    tags = airflow_tags("My_DAG", "train", "manual__2026-01-01T00:00:00+00:00", map_index=3)
    assert tags == ["airflow-dag=my_dag", "airflow-task=train[3]", "airflow-run=manual__2026-01-01t00:00:00+00:00"]
    long = normalise_tag("airflow-run=" + "x" * 300)
    assert len(long) == 100 and long != normalise_tag("airflow-run=" + "x" * 299 + "y")
    assert matches(["CTR", *[t.upper() for t in tags]], tags)
    assert not matches(tags[:2], tags)
