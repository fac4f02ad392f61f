"""Issue 19 on the real cluster: the run report, TensorBoard's training scalars, the followers' view of failures, and
what ``status`` says while a job runs.

* One async ps job whose tensorboard role fails (no ``tensorboard`` package; submitted past preflight on purpose)
  and whose worker is killed with SIGKILL mid-run (restarted in place): training SUCCEEDS, the evaluator carries on
  to the final checkpoint, the report has real curves from the tasks' own history (many points per task, examples/s,
  the restart marked), the chief's ``train`` event files hold the loss, the report's location is found (and rebuilt
  when nobody followed), a fresh ``tfyarn status --output json`` has an ETA while it runs.
* The same spec through the CLI: preflight refuses it (``environment.python`` is this interpreter, which has no
  ``tensorboard``), exit 2, nothing submitted.
* A job with a working TensorBoard: ``tfyarn status`` (text) shows its URL, and it serves the ``train`` run's loss;
  its process killed after every other task reported done, the job still ends SUCCEEDED.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import fsspec
import pytest
import yaml

from clusterutil import (FAULT_JOBS, JOB_S, assert_clean, hdfs_exists, job_doc, needs_yarn,
                         read_json, task_process, tfyarn, unique, wait_for_step, wait_until)
from tfyarn import runner
from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_yarn, pytest.mark.timeout(3 * JOB_S)]


def _doc(dataset, hdfs_root, name, **over):
    """Async ps (1 ps, chief, worker), 120 steps each at 0.1 s, an evaluator and a tensorboard role."""
    doc = job_doc(dataset, name, sync=False, epochs=3, batch=50, ckpt=hdfs.join(hdfs_root, name, "ckpt"),
                  every_steps=30, model="fault_models:slow_recommender", code=str(FAULT_JOBS), **over)
    doc["params"]["step_delay_s"] = 0.1
    doc["data"]["eval"] = [dataset]
    doc["roles"]["worker"]["max_restarts"] = 1
    doc["roles"]["evaluator"] = {"instances": 1, "memory": "1 GiB"}
    doc["roles"]["tensorboard"] = {"instances": 1, "memory": "1 GiB"}
    return doc


def _event_scalars(url: str, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` in every TF event file under ``url`` (read with TF's own reader)."""
    import tempfile
    import tensorflow as tf
    fs, root = fsspec.core.url_to_fs(url)
    out = []
    with tempfile.TemporaryDirectory() as d:
        for i, path in enumerate(sorted(p for p in fs.ls(root, detail=False) if "tfevents" in p)):
            local = os.path.join(d, f"e{i}")
            fs.get_file(path, local)
            out += [(e.step, float(tf.make_ndarray(v.tensor))) for e in tf.compat.v1.train.summary_iterator(local)
                    for v in e.summary.value if v.tag == tag]
    return out


@pytest.fixture(scope="module")
def failing_tensorboard_job(yarn, dataset, hdfs_root):
    """Run the job once: submitted past preflight (the tensorboard role then fails in its container, as it did when
    preflight missed it), worker:0 SIGKILLed at step 30, followed to the end. Returns (spec, status, seen)."""
    name = unique("report")
    spec = load_spec_dict(_doc(dataset, hdfs_root, name))
    yarn.preflight = False
    try:
        app_id = yarn.submit(spec)
    finally:
        yarn.preflight = True
    seen = {}
    wait_for_step(yarn, app_id, "worker:0", 30)
    task_process(yarn, app_id, "worker:0").send_signal(signal.SIGKILL)
    seen["killed_at"] = time.time()
    # a fresh process reads the status once, as a user's `tfyarn status` does: it has an ETA while running
    proc = tfyarn("status", app_id, "--output", "json")
    seen["status_json"] = json.loads(proc.stdout) if proc.returncode == 0 else proc.stderr
    st = runner.wait(yarn, app_id, timeout=JOB_S)
    return spec, st, seen


def test_a_failed_tensorboard_does_not_stop_the_evaluator_and_training_succeeds(yarn, failing_tensorboard_job):
    spec, st, _ = failing_tensorboard_job
    assert st.state is AppState.SUCCEEDED and st.state.exit_code == 0, st.diagnostics
    tasks = {t.task: t for t in st.tasks}
    assert tasks["tensorboard:0"].state == "FAILED", {t: x.state for t, x in tasks.items()}
    assert tasks["evaluator:0"].state == "SUCCEEDED"
    s = st.summary
    assert s["global_step"] == s["total_steps"], s
    # the evaluator went on past tensorboard's failure to the final checkpoint (it stopped at once before)
    assert s["eval"]["checkpoint"] == s["last_checkpoint"] and s["eval"]["global_step"] == s["global_step"]
    with fsspec.open(f"{spec.checkpoint.dir}/eval/metrics.jsonl", "rt") as f:
        evals = [json.loads(line) for line in f.read().splitlines() if line.strip()]
    assert evals[-1]["checkpoint"] == s["last_checkpoint"]
    assert_clean(yarn, st.app_id, tag=spec.name)


def test_the_report_has_curves_from_the_tasks_and_marks_the_restart(yarn, failing_tensorboard_job):
    spec, st, seen = failing_tensorboard_job
    ckpt = spec.checkpoint.dir
    rep = read_json(f"{ckpt}/report.json")
    assert rep["app_id"] == st.app_id and rep["state"] == "SUCCEEDED"
    assert rep["recorded_by_tasks"] == ["chief:0", "worker:0"]
    for task in ("chief:0", "worker:0"):
        t = rep["tasks"][task]
        # ~12 s of training: a point every 0.25 s at first (the follower's 2 s samples gave one point per task)
        assert t["points"] >= 15, (task, t)
        assert t["mean_examples_per_sec"] is not None and t["mean_examples_per_sec"] > 0, (task, t)
    restarts = [(r["task"], r["kind"]) for r in rep["restarts"]]
    assert restarts == [("worker:0", "restart")], rep["restarts"]
    assert rep["restarts"][0]["time"] > seen["killed_at"] - 1
    assert rep["plot"] == "report.png" and hdfs_exists(f"{ckpt}/report.png")
    fs, hist = fsspec.core.url_to_fs(f"{ckpt}/history/{st.app_id}")
    files = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(hist, detail=False))
    files = [f for f in files if not f.startswith(".tmp-")]     # an upload the SIGKILL cut short (never read)
    assert len(files) == 3 and sum(f.startswith("worker-0.a0.") for f in files) == 2, files   # 2 worker processes


def test_tensorboard_gets_the_chiefs_training_scalars_on_hdfs(failing_tensorboard_job):
    spec, st, _ = failing_tensorboard_job
    losses = _event_scalars(f"{spec.checkpoint.dir}/train", "loss")
    assert len(losses) >= 15, losses
    steps = [s for s, _ in losses]
    # at the global step of the chief's last step (async: the worker, restarted, goes on to the planned total)
    assert steps == sorted(steps) and steps[-1] >= st.summary["steps_per_worker"]["chief:0"], steps[-5:]
    assert len(_event_scalars(f"{spec.checkpoint.dir}/train", "examples_per_sec")) >= 10


def test_status_json_has_an_eta_while_running(failing_tensorboard_job):
    _, _, seen = failing_tensorboard_job
    st = seen["status_json"]
    assert isinstance(st, dict), st
    assert st["state"] == "RUNNING" and st["progress"]["total_steps"], st["progress"]
    assert st["progress"]["eta_s"] is not None and st["progress"]["eta_s"] > 0, st["progress"]


def test_report_location_is_next_to_the_checkpoints_and_rebuilt_when_nobody_followed(
        yarn, failing_tensorboard_job, monkeypatch, tmp_path):
    """The Airflow operator's XCom `report` (api.report_location) was None on YARN; after a deferred wait (no
    follower sampled progress) it is built from the tasks' own history."""
    from tfyarn import api
    spec, st, _ = failing_tensorboard_job
    ckpt = spec.checkpoint.dir
    assert api.report_location(st, build=False) == f"{ckpt}/report.json"
    # another machine (its own TFYARN_HOME, no samples) after the report next to the checkpoints is gone
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "elsewhere"))
    fs, path = fsspec.core.url_to_fs(f"{ckpt}/report.json")
    fs.rm(path)
    assert api.report_location(st, build=False) is None
    assert api.report_location(st) == f"{ckpt}/report.json"
    rebuilt = read_json(f"{ckpt}/report.json")
    assert rebuilt["app_id"] == st.app_id and rebuilt["tasks"]["chief:0"]["points"] >= 15
    assert [r["task"] for r in rebuilt["restarts"]] == ["worker:0"]


def test_preflight_refuses_a_tensorboard_role_without_its_package_in_this_python(yarn, dataset, hdfs_root,
                                                                                   tmp_path):
    if subprocess.run([sys.executable, "-c", "import tensorboard"], capture_output=True).returncode == 0:
        pytest.fail("this test needs a Python without the tensorboard package (the test venv has none)")
    name = unique("nopkg")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_doc(dataset, hdfs_root, name)))
    proc = tfyarn("submit", str(path), "--yarn")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "roles.tensorboard" in proc.stderr and "tensorboard' package is not installed" in proc.stderr
    assert [a.app_id for a in yarn.list(all_states=True) if name in a.tags] == []


def test_text_status_shows_the_tensorboard_url_which_serves_training_loss(yarn, dataset, hdfs_root,
                                                                          tensorboard_dir, monkeypatch):
    monkeypatch.syspath_prepend(tensorboard_dir)      # preflight finds the package the tensorboard role will use
    name = unique("tb")
    doc = _doc(dataset, hdfs_root, name)
    doc["roles"]["tensorboard"]["env"] = {"PYTHONPATH": tensorboard_dir}
    del doc["roles"]["evaluator"], doc["data"]["eval"]
    spec = load_spec_dict(doc)
    app_id = yarn.submit(spec)
    seen = {}

    def url_in_text_status():
        proc = tfyarn("status", app_id)
        assert proc.returncode == 0, proc.stderr
        line = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("tensorboard: http")]
        return line and line[0].split("tensorboard: ", 1)[1].strip()

    url = wait_until(url_in_text_status, JOB_S, f"the TensorBoard URL in `tfyarn status {app_id}`", poll=2.0)

    def train_loss_served():
        st = yarn.status(app_id)
        assert not st.state.is_terminal, f"{app_id} ended before TensorBoard served training loss: {st.diagnostics}"
        try:
            with urllib.request.urlopen(f"{url}data/plugin/scalars/scalars?run=train&tag=loss", timeout=10) as r:
                seen["loss"] = json.loads(r.read())
        except Exception as exc:  # noqa: BLE001 - not loaded yet (TensorBoard reloads every few seconds)
            seen["error"] = repr(exc)
            return None
        return len(seen["loss"]) >= 2

    wait_until(train_loss_served, JOB_S, f"training loss served by TensorBoard at {url}", poll=2.0)
    # then its process fails once every other task has reported done (frozen until then: it never sees
    # control/done): the job trained, so it ends SUCCEEDED, the failure in its status (it ended FAILED before:
    # nothing ended the app, and skein's end had no end record)
    board = task_process(yarn, app_id, "tensorboard:0")
    board.send_signal(signal.SIGSTOP)

    def others_done():
        st = yarn.status(app_id)
        assert not st.state.is_terminal, f"{app_id} ended before its tensorboard failed: {st.diagnostics}"
        return all(t.state == "SUCCEEDED" for t in st.tasks if t.task != "tensorboard:0")

    wait_until(others_done, JOB_S, f"every task of {app_id} but tensorboard:0 done", poll=1.0)
    board.send_signal(signal.SIGKILL)
    st = runner.wait(yarn, app_id, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    board_status = next(t for t in st.tasks if t.task == "tensorboard:0")
    assert (board_status.state, board_status.exit_code) == ("FAILED", 137), board_status
    assert all(step > 0 and value > 0 for _, step, value in seen["loss"]), seen["loss"][:5]
    assert_clean(yarn, app_id, tag=name)
