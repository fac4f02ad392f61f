"""Issue 27 on the real cluster, one job per path (lean: the local suite covers the variants):

* a compiled Keras 3 model (Embedding + Dense + a custom layer, Adam) as ``model:``, allreduce, HDFS data,
  checkpoints and the SavedModel export on HDFS;
* ``entrypoint:`` docs/models.md's tf_keras MultiWorkerMirroredStrategy ``fit`` script shipped in ``code:``, reading
  its equal-steps share of HDFS data through ``tfyarn.data.train_dataset()``.
"""
import pytest
from clusterutil import (
    JOB_S,
    assert_clean,
    hdfs_exists,
    job_doc,
    needs_yarn,
    planned_steps,
    unique,
)
from keras_helpers import doc_examples, require_tf_keras

from tfyarn import hdfs, runner
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
