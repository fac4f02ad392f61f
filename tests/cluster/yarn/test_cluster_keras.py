"""Issue 27 on the real cluster, one job per path (lean: the local suite covers the variants):

* a compiled Keras 3 model (Embedding + Dense + a custom layer, Adam) as ``model:``, allreduce, HDFS data,
  checkpoints and the SavedModel export on HDFS;
* ``entrypoint:`` docs/models.md's tf_keras MultiWorkerMirroredStrategy ``fit`` script shipped in ``code:``, reading
  its equal-steps share of HDFS data through ``tfyarn.data.train_dataset()``;
* its tf_keras ParameterServerStrategy ``fit`` script (``mode: ps``), each worker's ``dataset_fn``
  reading its share with ``train_dataset(worker=...)`` (TF ops over the share its tfyarn process staged; from
  HDFS and tables: test_cluster_pss_share.py), here from a local directory;
* its Keras 3 MultiWorkerMirroredStrategy custom-loop script, on HDFS data;
* TensorFlow's "Multi-worker training with Keras" tutorial as docs/models.md gives it (issue 39): 2 workers,
  3 epochs over ``train_dataset()`` of MNIST-like records on HDFS; its run report shows each worker took exactly
  its planned batches, with fit's steps, loss and accuracy from ``tfyarn.keras.callback()``.
"""
import json

import pytest
from clusterutil import (
    JOB_S,
    assert_clean,
    hdfs_exists,
    job_doc,
    needs_yarn,
    planned_steps,
    unique,
    write_dataset,
)
from keras_helpers import DIGIT_FEATURES, doc_examples, require_tf_keras, write_digits

from tfyarn import runner
from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_yarn, pytest.mark.timeout(2 * JOB_S)]


def test_a_compiled_keras_model_trains_in_allreduce_on_yarn_with_hdfs_checkpoints_and_export(yarn, dataset,
                                                                                             hdfs_root):
    name = unique("keras")
    doc = job_doc(dataset, name, mode="allreduce", epochs=2, ckpt=hdfs.join(hdfs_root, name, "ckpt"),
                  model="tfyarn.models.keras_recommender:model", export={"dir": hdfs.join(hdfs_root, name, "m")})
    doc["params"] = {"num_users": 100, "num_items": 100, "dim": 8, "hidden": 8, "learning_rate": 0.05}
    spec = load_spec_dict(doc)
    st = runner.run(yarn, spec, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    total = sum(planned_steps(spec))
    s = st.summary
    assert s["mode"] == "allreduce" and s["global_step"] == s["total_steps"] == total, s
    assert {t: v["worker_steps"] for t, v in s["tasks"].items()} == {"chief:0": total, "worker:0": total}
    assert s["last_loss"] < s["first_loss"] * 1.05, s
    assert hdfs_exists(s["export"]["url"] + "/saved_model.pb")
    assert_clean(yarn, st.app_id, tag=spec.name)


def test_an_entrypoint_tf_keras_fit_script_trains_on_its_hdfs_share_on_yarn(yarn, dataset, tmp_path):
    require_tf_keras()
    code = tmp_path / "code"
    code.mkdir()
    (code / "mwms_fit.py").write_text(doc_examples()["mwms_fit.py"])
    name = unique("script")
    doc = job_doc(dataset, name, mode="allreduce", epochs=2, code=str(code), entrypoint="mwms_fit.py --epochs 2")
    del doc["model"], doc["params"]
    spec = load_spec_dict(doc)
    st = runner.run(yarn, spec, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    per_epoch = min(planned_steps(spec))
    s = st.summary
    assert s["entrypoint"] == "mwms_fit.py --epochs 2" and s["global_step"] == 2 * per_epoch, s
    assert st.progress.get("per_task") == {"chief:0": 2 * per_epoch, "worker:0": 2 * per_epoch}, st.progress
    assert_clean(yarn, st.app_id, tag=spec.name)


def _script_job(dataset, tmp_path, script: str, **over):
    """A job running docs/models.md's ``script`` (shipped in ``code:``) on ``dataset``, 2 epochs."""
    code = tmp_path / "code"
    code.mkdir()
    (code / script).write_text(doc_examples()[script])
    name = unique(script.split(".")[0].replace("_", "-"))
    doc = job_doc(dataset, name, epochs=2, code=str(code), entrypoint=script, **over)
    del doc["model"], doc["params"]
    return load_spec_dict(doc)


def test_an_entrypoint_tf_keras_pss_fit_script_trains_on_its_workers_shares_on_yarn(yarn, tmp_path):
    require_tf_keras()
    data = write_dataset(str(tmp_path / "data"))  # local: the workers' dataset_fn is TF ops only
    spec = _script_job(data, tmp_path, "pss_fit.py", mode="ps", sync=False)
    assert {r: spec.roles[r].instances for r in ("ps", "chief", "worker")} == dict.fromkeys(
        ("ps", "chief", "worker"), 1)
    st = runner.run(yarn, spec, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    from tfyarn.data import build_manifest, plan

    m = build_manifest(spec.data.train)  # the shares are the PSS workers' (1), the chief coordinates
    per_epoch = min(plan(m, 1, e, spec.data.shuffle_seed, spec.data.batch_size).steps for e in (0, 1))
    planned = 2 * per_epoch  # the script: 2 epochs x steps_per_epoch() x 1 worker
    s = st.summary
    assert s["entrypoint"] == "pss_fit.py" and s["custom"] is True, s
    assert s["global_step"] == planned and s["last_loss"] is not None, s  # reported at the end
    assert st.progress.get("per_task", {}).get("chief:0") == planned, st.progress
    assert_clean(yarn, st.app_id, tag=spec.name)


def test_an_entrypoint_keras3_custom_loop_script_trains_on_its_hdfs_share_on_yarn(yarn, dataset,
                                                                                  tmp_path):
    spec = _script_job(dataset, tmp_path, "custom_loop.py", mode="allreduce")
    st = runner.run(yarn, spec, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    planned = 2 * min(planned_steps(spec))  # train_dataset(): 2 epochs x steps_per_epoch()
    s = st.summary
    assert s["entrypoint"] == "custom_loop.py" and s["global_step"] == planned, s
    assert s["first_loss"] is not None and s["last_loss"] is not None, s
    assert st.progress.get("per_task") == {"chief:0": planned, "worker:0": planned}, st.progress
    assert_clean(yarn, st.app_id, tag=spec.name)


def test_the_mwms_tutorial_takes_exactly_its_planned_batches_per_worker_on_yarn(yarn, hdfs_root, tmp_path):
    require_tf_keras()
    from tfyarn.display import summary_text

    code = tmp_path / "code"
    code.mkdir()
    (code / "mwms_tutorial.py").write_text(doc_examples()["mwms_tutorial.py"])
    name = unique("mwms-tutorial")
    # 3 epochs x 7 steps per worker of batch 64 (issue 39's run had 26: 3 minutes of a loaded CI box)
    data = write_digits(hdfs.join(hdfs_root, name, "data"), records=1000)
    doc = job_doc(data, name, mode="allreduce", epochs=3, batch=64, code=str(code), entrypoint="mwms_tutorial.py",
                  memory="1536 MiB")
    del doc["model"], doc["params"]
    doc["data"]["features"] = DIGIT_FEATURES
    doc["roles"] = {"worker": {"instances": 2, "memory": "1536 MiB"}}  # the tutorial's cluster: workers only
    spec = load_spec_dict(doc)
    planned = 3 * min(planned_steps(spec))
    assert planned == 21, planned
    st = runner.run(yarn, spec, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    workers = ("worker:0", "worker:1")
    s = st.summary
    assert s["planned_batches"] == planned and s["reported"] is True, s
    assert {t: (v["batches"], v["examples"], v["epochs"]) for t, v in s["taken"].items()} == dict.fromkeys(
        workers, (planned, planned * 64, 3)), s["taken"]
    assert s["global_step"] == planned and s["steps_per_worker"] == dict.fromkeys(workers, planned), s
    assert s["last_loss"] is not None and "accuracy" in s["metrics"] and s["examples_per_sec"] > 0, s
    line = f"batches taken from train_dataset(): worker:0={planned} worker:1={planned} (of {planned} planned"
    assert line in summary_text(st), summary_text(st)
    print(summary_text(st))
    where = yarn.write_report(st)  # the run report (the in-app supervisor's, copied; the job has no checkpoints)
    rep = json.loads(where.read_text())
    assert {t: rep["tasks"][t].get("batches_taken") for t in workers} == dict.fromkeys(workers, planned), rep["tasks"]
    assert {t: v["batches"] for t, v in rep["summary"]["taken"].items()} == dict.fromkeys(workers, planned)
    assert_clean(yarn, st.app_id, tag=spec.name)
