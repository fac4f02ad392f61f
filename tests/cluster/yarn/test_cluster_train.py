"""Training modes on the real cluster, each asserting the planned numbers and that nothing is left behind.

* sync ps (2 ps, chief, worker) on skewed HDFS data: equal steps per worker, global step = plan; checkpoints, summary,
  run report and SavedModel export written to HDFS;
* async ps warm-started from that job's HDFS checkpoint, with an evaluator and a TensorBoard whose URL answers over
  HTTP while the job runs;
* allreduce (MultiWorkerMirrored): chief + worker.
"""
import time
import urllib.request

import pytest

from clusterutil import (FAULT_JOBS, JOB_S, assert_clean, hdfs_exists, job, job_doc, needs_yarn, planned_steps,
                         read_json, unique, wait_until)
from tfyarn import runner
from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_yarn, pytest.mark.timeout(2 * JOB_S)]


@pytest.fixture(scope="module")
def sync_job(yarn, dataset, hdfs_root):
    """The sync ps job, run once: its status and spec serve the assertions below and the warm start."""
    name = unique("sync")
    ckpt = hdfs.join(hdfs_root, name, "ckpt")
    spec = job(dataset, name, ps=2, epochs=2, ckpt=ckpt, every_steps=10,
               export={"dir": hdfs.join(hdfs_root, name, "models")})
    st = runner.run(yarn, spec, timeout=JOB_S)
    return spec, st


def test_sync_ps_on_skewed_hdfs_data_trains_equal_steps_and_writes_everything_to_hdfs(yarn, sync_job):
    from tfyarn.data import build_manifest
    spec, st = sync_job
    assert st.state is AppState.SUCCEEDED and st.state.exit_code == 0, st.diagnostics
    sizes = sorted(f.records for f in build_manifest(spec.data.train).files)
    assert sizes[-1] >= 2 * sizes[0], sizes                      # the files really are skewed
    steps = planned_steps(spec)
    per_worker = sum(steps)
    s = st.summary
    assert s["mode"] == "ps" and s["sync"] is True and s["num_ps"] == 2 and s["num_workers"] == 2
    assert s["global_step"] == s["total_steps"] == per_worker      # sync: one global step per round
    assert s["steps_per_worker"] == {"chief:0": per_worker, "worker:0": per_worker}
    assert s["last_loss"] < s["first_loss"], s
    assert {t.task: t.state for t in st.tasks} == {
        "chief:0": "SUCCEEDED", "worker:0": "SUCCEEDED", "ps:0": "SUCCEEDED", "ps:1": "SUCCEEDED"}
    ckpt = spec.checkpoint.dir
    assert read_json(f"{ckpt}/summary.json")["global_step"] == per_worker
    index = read_json(f"{ckpt}/tfyarn-checkpoint.json")
    assert index["checkpoints"][-1]["name"] == s["last_checkpoint"] == f"ckpt-{per_worker}"
    assert index["checkpoints"][-1]["global_step"] == per_worker
    assert len(index["checkpoints"]) >= 2                          # every 10 steps, then the final one
    report = read_json(f"{ckpt}/report.json")
    assert report["app_id"] == st.app_id and report["state"] == "SUCCEEDED" and report["exit_code"] == 0
    assert report["summary"]["global_step"] == per_worker and set(report["tasks"]) >= {"chief:0", "worker:0"}
    assert s["export"]["version"] == per_worker and s["export"]["checkpoint"] == s["last_checkpoint"]
    assert s["export"]["url"] == hdfs.join(spec.export.dir, str(per_worker))
    assert hdfs_exists(s["export"]["url"] + "/saved_model.pb")
    assert_clean(yarn, st.app_id, tag=spec.name)


def test_async_ps_warm_started_from_hdfs_with_evaluator_and_live_tensorboard(
        yarn, sync_job, dataset, hdfs_root, tensorboard_dir, monkeypatch):
    source_spec, source = sync_job
    assert source.state is AppState.SUCCEEDED, "the warm start needs the sync job's checkpoint"
    tb = tensorboard_dir
    monkeypatch.syspath_prepend(tb)   # preflight looks for the tensorboard role's package where the tasks will
    name = unique("async")
    doc = job_doc(dataset, name, sync=False, epochs=3, ckpt=hdfs.join(hdfs_root, name, "ckpt"), every_steps=10,
                  model="fault_models:slow_recommender", code=str(FAULT_JOBS))
    doc["params"]["step_delay_s"] = 0.1                            # ~12 s of training: TensorBoard is seen live
    doc["checkpoint"]["init_from"] = source_spec.checkpoint.dir
    doc["data"]["eval"] = [dataset]
    doc["roles"]["evaluator"] = {"instances": 1, "memory": "1 GiB"}
    doc["roles"]["tensorboard"] = {"instances": 1, "memory": "1 GiB", "env": {"PYTHONPATH": tb}}
    spec = load_spec_dict(doc)
    steps = planned_steps(spec)
    app_id = yarn.submit(spec)
    seen = {}

    def tensorboard_answers():
        st = yarn.status(app_id)
        assert not st.state.is_terminal, f"{app_id} ended before its TensorBoard answered: {st.diagnostics}"
        url = st.progress.get("tensorboard_url")
        if not url or st.state is not AppState.RUNNING:
            return None
        with urllib.request.urlopen(url, timeout=10) as r:
            seen.update(code=r.status, body=r.read(4096).decode("utf-8", "replace"), url=url)
        seen["still_running"] = yarn.status(app_id).state is AppState.RUNNING
        return True

    wait_until(tensorboard_answers, JOB_S, f"the TensorBoard URL of {app_id} in its status", poll=1.0)
    assert seen["code"] == 200 and "tensorboard" in seen["body"].lower(), seen
    assert seen["still_running"], "the TensorBoard URL answered only after training ended"
    st = runner.wait(yarn, app_id, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    s = st.summary
    per_worker = sum(steps)
    assert s["sync"] is False and s["global_step"] == s["total_steps"] == 2 * per_worker
    assert s["steps_per_worker"] == {"chief:0": per_worker, "worker:0": per_worker}
    # warm start: the sync job's final checkpoint, read from HDFS; a fresh run (not a resume) that starts better
    assert s["warm_started_from"] == f"{source_spec.checkpoint.dir}/{source.summary['last_checkpoint']}"
    assert s["resumed_from"] is None
    assert s["first_loss"] < source.summary["first_loss"], (s["first_loss"], source.summary["first_loss"])
    # the evaluator evaluated the final checkpoint; every evaluation is on HDFS
    assert s["eval"]["checkpoint"] == s["last_checkpoint"] and s["eval"]["examples"] > 0
    assert s["eval"]["loss"] > 0
    import fsspec
    with fsspec.open(f"{spec.checkpoint.dir}/eval/metrics.jsonl", "rt") as f:
        evals = [line for line in f.read().splitlines() if line.strip()]
    assert evals and s["last_checkpoint"] in evals[-1]
    tasks = {t.task: t.state for t in st.tasks}
    assert tasks["evaluator:0"] == "SUCCEEDED" and tasks["tensorboard:0"] == "SUCCEEDED", tasks
    assert_clean(yarn, app_id, tag=name)


def test_allreduce_trains_the_planned_steps_on_every_worker(yarn, dataset):
    name = unique("allreduce")
    spec = job(dataset, name, mode="allreduce", epochs=2)
    steps = planned_steps(spec)
    t0 = time.monotonic()
    st = runner.run(yarn, spec, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED and st.state.exit_code == 0, st.diagnostics
    s = st.summary
    assert s["mode"] == "allreduce" and s["num_workers"] == 2
    assert s["global_step"] == s["total_steps"] == sum(steps)
    assert s["steps_per_worker"] == {"chief:0": sum(steps), "worker:0": sum(steps)}
    assert s["steps_per_epoch"] == steps
    assert s["last_loss"] < s["first_loss"]
    assert_clean(yarn, st.app_id, tag=name)
    print(f"allreduce job: {time.monotonic() - t0:.1f}s submit to end")
