"""MLflow tracking (issue 32): ``tracking: {mlflow: URI, experiment: NAME}`` logs a real local job
as one MLflow run — params, the chief's per-step loss and examples/s, the summary and the run report
as artifacts, the outcome — against a local file store and against an ``mlflow server`` on
127.0.0.1."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from opsutil import job_spec

from tfyarn import api
from tfyarn.spec import load_spec_dict

mlflow = pytest.importorskip("mlflow", reason="the tracking extra (mlflow-skinny) is not installed")
pytestmark = pytest.mark.timeout(300)


def _run_job(tmp_path, uri):
    doc = job_spec(
        tmp_path,
        params={"steps": 60, "dt": 0.05, "lr": 0.5},
        tracking={"mlflow": uri, "experiment": "tfyarn-test"},
    )
    st = api.run(load_spec_dict(doc), backend="local")
    assert st.state.value == "SUCCEEDED", st.diagnostics
    return st


def _check_run(uri, st):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("tfyarn-test")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    rec = st.summary["mlflow"]
    assert rec["run_id"] == run.info.run_id and run.info.status == "FINISHED"
    assert run.data.tags["tfyarn.app_id"] == st.app_id
    p = run.data.params
    assert (p["model"], p["mode"], p["params.steps"], p["params.lr"]) == (
        "ops_jobs:short",
        "allreduce",
        "60",
        "0.5",
    )
    assert p["roles.worker"].startswith("1 x 2048 MiB")
    loss = client.get_metric_history(run.info.run_id, "loss")
    steps = [m.step for m in loss]
    assert (
        len(loss) >= 5 and steps == sorted(steps) and steps[-1] == 60
    )  # the chief's points, by global step
    assert loss[-1].value < loss[0].value
    assert client.get_metric_history(run.info.run_id, "examples_per_sec")
    assert run.data.metrics["final_loss"] == pytest.approx(st.summary["last_loss"])
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    report = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert (
        "summary.json" in top and "report/report.json" in report and "report/report.png" in report
    )


def test_a_local_job_logged_to_a_file_store(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "MLFLOW_ALLOW_FILE_STORE", "true"
    )  # MLflow 3 keeps its file store only on request
    uri = (tmp_path / "mlruns").as_uri()
    st = _run_job(tmp_path, uri)
    _check_run(uri, st)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` on 127.0.0.1 (sqlite store, served artifacts); skipped where it cannot run
    (the server needs more than mlflow-skinny) unless TFYARN_REQUIRE_MLFLOW_SERVER=1."""
    exe = shutil.which("mlflow") or str(Path(sys.executable).parent / "mlflow")
    port = _free_port()
    log = open(tmp_path / "mlflow-server.log", "wb")
    proc = subprocess.Popen(
        [
            exe,
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp_path}/mlflow.db",
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # no huey jobs
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (tmp_path / "mlflow-server.log").read_text(errors="replace")[-1500:]
                msg = (
                    f"mlflow server did not answer on {url}/health within 240 s "
                    f"(exit {proc.poll()}): {tail}"
                )
                if os.environ.get("TFYARN_REQUIRE_MLFLOW_SERVER") == "1":
                    pytest.fail(msg)
                pytest.skip(msg)
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
        log.close()


def test_a_local_job_logged_to_an_mlflow_server(tmp_path, mlflow_server):
    st = _run_job(tmp_path, mlflow_server)
    _check_run(mlflow_server, st)
