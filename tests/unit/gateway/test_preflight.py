"""Preflight: every problem reported at once, before anything is uploaded; files checked on memory:// and file://."""
import os
import sys

import fsspec
import pytest

from yarnutil import StaticClusterInfo, make_spec
from tfyarn.data.example import encode_example
from tfyarn.data.tfrecord import encode_record
from tfyarn.errors import ExitCode, PreflightError
from tfyarn.gateway.preflight import (QueueInfo, check_output_dirs, check_data, check_data_schema, check_resources,
                              run_preflight)
from tfyarn.backends.yarn.rest import rm_webapp_urls
from tfyarn.spec import load_spec_dict

FEAT = {"label": {"dtype": "float32"}}
#: one TFRecord file of Examples fitting FEAT (preflight samples the first record of each data URL), as many as one
#: global batch of make_spec() (data() below: batch_size 4 x 4 training tasks), which submit counts
GOOD = encode_record(encode_example({"label": 1.0})) * 16


def data(*train, eval=()):
    return {"train": list(train), "eval": list(eval), "features": FEAT, "batch_size": 4}


@pytest.fixture
def mem():
    fs = fsspec.filesystem("memory")
    fs.pipe("/pf/train/part-0.tfrecord", GOOD)
    fs.pipe("/pf/train/part-1.tfrecord", GOOD)
    yield fs
    fs.rm("/pf", recursive=True)


def test_data_globs_on_memory(mem):
    ok = make_spec(data=data("memory:///pf/train/part-*.tfrecord", "memory:///pf/train/part-1.tfrecord"))
    assert check_data(ok) == []
    bad = make_spec(data=data("memory:///pf/train/part-*.tfrecord", "memory:///pf/nope/*.tfrecord",
                              eval=["memory:///pf/eval.tfrecord"]))
    assert check_data(bad) == ["data.train[1]: memory:///pf/nope/*.tfrecord matches no files",
                               "data.eval[0]: memory:///pf/eval.tfrecord matches no files"]


def test_data_and_checkpoint_on_file_urls(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.tfrecord").write_bytes(GOOD)
    spec = make_spec(data=data(f"file://{tmp_path}/d/*.tfrecord"), checkpoint={"dir": f"file://{tmp_path}/ck/run1"})
    assert check_data(spec) == [] and check_output_dirs(spec) == []
    assert (tmp_path / "ck" / "run1").is_dir() and os.listdir(tmp_path / "ck" / "run1") == []   # probe removed
    (tmp_path / "blocker").write_text("a file where a directory should be")
    spec = make_spec(data=data(f"file://{tmp_path}/d/*.tfrecord"), checkpoint={"dir": f"file://{tmp_path}/blocker/ck"})
    (problem,) = check_output_dirs(spec)
    assert problem.startswith(f"checkpoint.dir: file://{tmp_path}/blocker/ck is not writable")
    spec = make_spec(data=data(f"file://{tmp_path}/d/*.tfrecord"), checkpoint={"dir": f"file://{tmp_path}/ck/run1"},
                     export={"dir": f"file://{tmp_path}/blocker/models"})
    (problem,) = check_output_dirs(spec)
    assert problem.startswith(f"export.dir: file://{tmp_path}/blocker/models is not writable")


RECO = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}}


def test_data_that_does_not_fit_the_features_is_caught_by_sampling_first_records(tmp_path):
    import gzip
    d = tmp_path / "d"
    d.mkdir()
    good = encode_record(encode_example({"label": 1.0, "user_id": 3}))
    (d / "train-0.tfrecord").write_bytes(good * 3)
    (d / "train-1.tfrecord.gz").write_bytes(gzip.compress(good))                    # gzip: sampled decompressed
    (d / "empty.tfrecord").write_bytes(b"")                                         # nothing to check
    (d / "other.tfrecord").write_bytes(encode_record(encode_example({"label": 0.0, "x": [1.0, 2.0]})))
    (d / "floats.tfrecord").write_bytes(encode_record(encode_example({"label": 0.0, "user_id": 2.5})))
    (d / "garbage.tfrecord").write_bytes(b"not a tfrecord at all")
    (d / "cut.tfrecord").write_bytes(good[:-3])
    ok = make_spec(data={"train": [f"{d}/train-*"], "eval": [f"{d}/empty.tfrecord"], "features": RECO,
                         "batch_size": 2})
    assert check_data_schema(ok) == []
    bad = make_spec(data={"train": [f"{d}/train-*", f"{d}/other.tfrecord", f"{d}/floats.tfrecord"],
                          "eval": [f"{d}/garbage.tfrecord", f"{d}/cut.tfrecord"], "features": RECO, "batch_size": 2})
    assert check_data_schema(bad) == [
        f"data.train[1]: file://{d}/other.tfrecord record 0 does not fit data.features: feature 'user_id' is missing "
        f"(the record has: 'label', 'x')",
        f"data.train[2]: file://{d}/floats.tfrecord record 0 does not fit data.features: feature 'user_id' has the "
        f"wrong dtype: float_list, expected int64_list (dtype int64) (the record has: 'label', 'user_id')",
        f"data.eval[0]: file://{d}/garbage.tfrecord: not a TFRecord file (no valid record header at byte 0)",
        f"data.eval[1]: file://{d}/cut.tfrecord: the first record is truncated ({len(good) - 15} of {len(good) - 12} "
        f"bytes)"]
    with pytest.raises(PreflightError) as ei:                                        # what `tfyarn run` reports
        run_preflight(bad, None)
    assert "user_id' is missing" in str(ei.value) and "nothing was uploaded or submitted" in str(ei.value)


def test_with_on_corrupt_skip_one_fitting_sample_is_enough(tmp_path):
    good = encode_record(encode_example({"label": 1.0, "user_id": 3}))
    (tmp_path / "a.tfrecord").write_bytes(b"garbage that a skip-mode job would skip")
    (tmp_path / "b.tfrecord").write_bytes(good)
    data = {"train": [f"{tmp_path}/*.tfrecord"], "features": RECO, "batch_size": 2}
    assert check_data_schema(make_spec(data=data | {"on_corrupt": "skip"})) == []
    (problem,) = check_data_schema(make_spec(data=data))                              # fail mode: any bad sample
    assert problem == (
        f"data.train[0]: file://{tmp_path}/a.tfrecord: not a TFRecord file (no valid record header at byte 0)")
    (tmp_path / "b.tfrecord").write_bytes(encode_record(encode_example({"label": 1.0})))
    (problem,) = check_data_schema(make_spec(data=data | {"on_corrupt": "skip"}))   # every sample bad: reported
    assert problem.startswith(f"data.train[0]: file://{tmp_path}/a.tfrecord: not a TFRecord file")


def test_relative_data_path_resolves_against_the_spec_dir(tmp_path):
    (tmp_path / "train.tfrecord").write_bytes(GOOD)
    doc = make_spec().model_dump(mode="json", by_alias=True)
    doc["data"] = data("train.tfrecord")
    spec = load_spec_dict(doc, base_dir=str(tmp_path))
    assert spec.data.train == [str(tmp_path / "train.tfrecord")] and check_data(spec) == []


CLUSTER = StaticClusterInfo({"ml": QueueInfo("ml", max_memory_mib=8192, max_vcores=8, node_labels=("gpu",)),
                             "frozen": QueueInfo("frozen", state="STOPPED")}, max_memory_mib=16384, max_vcores=4)


def test_resources_against_queue_and_cluster():
    assert check_resources(make_spec(), CLUSTER) == []          # worker: 4096 MiB, 4 vcores, label gpu
    big = make_spec(roles={"ps": {"instances": 1, "memory": "12 GiB"},
                           "worker": {"instances": 2, "vcores": 6, "node_label": "fast-ssd"}})
    assert check_resources(big, CLUSTER, master_memory_mib=20000) == [
        "roles.ps.memory: 12288 MiB exceeds the maximum container size of queue 'ml' (8192 MiB)",
        "roles.worker.vcores: 6 exceeds the maximum of the cluster (4)",
        "roles.worker.node_label: 'fast-ssd' is not accessible from queue 'ml' (accessible: gpu)",
        "application master memory: 20000 MiB exceeds the maximum container size of queue 'ml' (8192 MiB)",
        "application master memory: 20000 MiB exceeds the maximum container size of the cluster (16384 MiB)",
    ]
    assert check_resources(make_spec(queue="nosuch"), CLUSTER) == ["queue: 'nosuch' does not exist on this cluster"]
    assert check_resources(make_spec(queue="frozen"), CLUSTER)[0] == \
        "queue: 'frozen' is STOPPED, not RUNNING (it accepts no applications)"


def test_run_preflight_reports_everything_at_once(tmp_path, mem):
    kt = tmp_path / "me.keytab"
    kt.write_bytes(b"k")
    kt.chmod(0o644)
    spec = make_spec(queue="nosuch", data=data("memory:///pf/none/*"),
                     kerberos={"principal": "me@R", "keytab": str(kt)}, checkpoint={"dir": "memory:///pf/ck"})
    with pytest.raises(PreflightError) as ei:
        run_preflight(spec, CLUSTER)
    err = ei.value
    assert err.exit_code == ExitCode.INVALID
    assert len(err.problems) == 3 and "nothing was uploaded or submitted" in str(err)
    assert "world-readable" in err.problems[0] and "me.keytab" in err.problems[0]
    assert "queue: 'nosuch'" in err.problems[1] and "matches no files" in err.problems[2]
    kt.chmod(0o600)
    ok = make_spec(data=data("memory:///pf/train/*"), kerberos={"principal": "me@R", "keytab": str(kt)},
                   checkpoint={"dir": "memory:///pf/ck"})
    assert run_preflight(ok, CLUSTER) == []
    (tmp_path / "local.tfrecord").write_bytes(GOOD)
    local = make_spec(data=data(f"{tmp_path}/local.tfrecord"))
    assert "is a local path" in run_preflight(local, None)[0]


def test_submit_counts_the_records_against_one_global_batch():
    """Fewer records than one global batch: no step can be planned and every task would fail at start after its TF
    import; YARN's preflight counted nothing (only the local backend did), so the job was submitted anyway."""
    fs = fsspec.filesystem("memory")
    one = len(GOOD) // 16
    fs.pipe("/cnt/a.tfrecord", GOOD[:one * 15])                                  # 15 records, 16 needed
    try:
        spec = make_spec(data=data("memory:///cnt/*.tfrecord"))
        with pytest.raises(PreflightError) as ei:
            run_preflight(spec, CLUSTER)
        assert ei.value.problems == ["data.train: 15 records are fewer than one global batch (4 training tasks x "
                                     "data.batch_size 4 = 16): no step can be planned; lower data.batch_size to at "
                                     "most 3 or give more data"]
        fs.pipe("/cnt/b.tfrecord", GOOD[:one])                                   # 16
        assert run_preflight(spec, CLUSTER) == []
    finally:
        fs.rm("/cnt", recursive=True)


def test_rm_web_addresses_ha_and_https():
    assert rm_webapp_urls({"yarn.resourcemanager.hostname": "rm1"}) == ["http://rm1:8088"]
    conf = {"yarn.resourcemanager.ha.rm-ids": "a,b", "yarn.resourcemanager.webapp.address.a": "rma:8088",
            "yarn.resourcemanager.hostname.b": "rmb"}
    assert rm_webapp_urls(conf) == ["http://rma:8088", "http://rmb:8088"]
    assert rm_webapp_urls({"yarn.http.policy": "HTTPS_ONLY",
                           "yarn.resourcemanager.webapp.https.address": "rm:8090"}) == ["https://rm:8090"]


def test_a_tensorboard_role_needs_tensorboard_where_the_tasks_run_this_env(monkeypatch, mem):
    """Checked for local runs and packed envs (this Python is what the tasks run); not for a prebuilt archive or a
    python on the nodes, which the gateway cannot look into."""
    import tfyarn.gateway.preflight as pf
    from tfyarn.gateway.preflight import check_task_env, run_local_preflight
    roles = {"chief": {"instances": 1}, "tensorboard": {"instances": 1}}
    train = data("memory:///pf/train/part-*.tfrecord")
    common = {"mode": "allreduce", "data": train, "checkpoint": {"dir": "memory:///pf/ck"}}
    spec = make_spec(roles=roles, **common)
    monkeypatch.setattr(pf, "_installed", lambda m: m != "tensorboard")
    (problem,) = check_task_env(spec)
    assert problem.startswith("roles.tensorboard: the 'tensorboard' package is not installed")
    assert "pip install" in problem
    with pytest.raises(PreflightError, match="roles.tensorboard"):
        run_local_preflight(spec)
    with pytest.raises(PreflightError, match="roles.tensorboard"):
        run_preflight(spec, check_files=False)                                  # environment.pack: auto
    for env in ({"archive": "hdfs:///envs/tf.tar.gz"}, {"python": "/opt/py/bin/python"}):
        run_preflight(make_spec(roles=roles, environment=env, **common), check_files=False)  # not ours to check
    # environment.python naming this very interpreter (a node python shared with the gateway): the tasks run this
    # env, so a missing tensorboard is caught before submitting (issue 19: tensorboard:0 failed on YARN instead)
    with pytest.raises(PreflightError, match="roles.tensorboard"):
        run_preflight(make_spec(roles=roles, environment={"python": sys.executable}, **common), check_files=False)
    base = os.path.realpath(sys.executable)     # a venv's python links to its base: a different environment
    if base != os.path.abspath(sys.executable):
        run_preflight(make_spec(roles=roles, environment={"python": base}, **common), check_files=False)
    assert check_task_env(make_spec(roles={"chief": {"instances": 1}}, **common)) == []
    monkeypatch.setattr(pf, "_installed", lambda m: True)
    assert check_task_env(spec) == []


def test_what_a_scripts_code_imports_is_one_preflight_line_where_the_env_can_be_seen(tmp_path, monkeypatch, mem,
                                                                                   caplog):
    """Issue 39: a script using tf.keras.callbacks.TensorBoard in an env packed from .[tf-cpu] failed at its first
    summary (TBNotInstalledError) after packing, uploading and starting every container. Now: one line at submit
    (exit 2, nothing uploaded) where the tasks run this env; a warning naming the package where they do not (a
    python on the nodes, a prebuilt archive: not listable from here)."""
    import logging

    import tfyarn.gateway.preflight as pf
    from tfyarn.gateway.preflight import check_task_env, needed_packages
    code = tmp_path / "code"
    (code / "helpers").mkdir(parents=True)
    (code / "helpers" / "__init__.py").write_text("")
    (code / "helpers" / "board.py").write_text(
        "import tensorflow as tf\n\ndef callbacks(d):\n    return [tf.keras.callbacks.TensorBoard(log_dir=d)]\n")
    (code / "train.py").write_text("import tfyarn.data\nfrom helpers.board import callbacks\nprint(callbacks)\n")
    (code / "plain.py").write_text("import tensorflow as tf\n# TensorBoard is not used here\nprint(tf)\n")
    (code / "tracked.py").write_text("import os\nimport mlflow.tracking\n")
    (code / "summaries.py").write_text("import tensorflow as tf\nwith w.as_default():\n    tf.summary.scalar('x', 1)\n")
    base = {"mode": "allreduce", "roles": {"chief": {"instances": 1}}, "code": str(code)}

    def script(entry, **over):
        return load_spec_dict({"name": "s", "entrypoint": entry, **base, **over})

    missing = {"tensorboard", "mlflow"}
    monkeypatch.setattr(pf, "_installed", lambda m: m not in missing)
    (line,) = check_task_env(script("train.py --epochs 3"))          # through a module of code: it imports
    assert line == ("entrypoint: board.py uses tensorboard: the 'tensorboard' package is not installed in the "
                    "Python environment the tasks run (it is no longer installed with TensorFlow): pip install "
                    "'tfyarn[tensorboard]' (or tensorboard)"), line
    (line,) = check_task_env(script("summaries.py"))
    assert line.startswith("entrypoint: summaries.py uses tensorboard") and "tfyarn[tensorboard]" in line
    (line,) = check_task_env(script("tracked.py"))
    assert line.startswith("entrypoint: tracked.py uses mlflow: the 'mlflow' package is not installed")
    assert line.endswith("pip install 'tfyarn[tracking]' (or mlflow)"), line
    assert check_task_env(script("plain.py")) == []                   # a comment is not a use
    (line,) = check_task_env(script("helpers.board:callbacks"))       # module:function
    assert line.startswith("entrypoint: board.py uses tensorboard")
    (line,) = check_task_env(script("plain.py", tracking={"mlflow": "file:///tmp/mlruns"}))
    assert line.startswith("tracking.mlflow: the 'mlflow' package is not installed") and "tfyarn[tracking]" in line
    with pytest.raises(PreflightError, match="entrypoint: board.py uses tensorboard"):
        run_preflight(script("train.py"), check_files=False)           # environment.pack: auto (this env, packed)
    # a python on the nodes or a prebuilt archive: not listable here, said as a warning naming the package
    for env, where in (({"python": "/opt/py/bin/python"}, "environment.python /opt/py/bin/python"),
                       ({"archive": "hdfs:///envs/tf.tar.gz"}, "environment.archive hdfs:///envs/tf.tar.gz")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tfyarn.gateway.preflight"):
            warnings = run_preflight(script("train.py", environment=env), check_files=False)
        (w,) = [w for w in warnings if "tensorboard" in w]
        assert w == (f"entrypoint: board.py uses tensorboard needs the 'tensorboard' package: preflight cannot list "
                     f"the packages of {where} (not this Python environment); install 'tfyarn[tensorboard]' there"), w
        assert w in caplog.text
    missing.clear()                                                   # installed: nothing to say
    assert check_task_env(script("train.py")) == [] and needed_packages(script("plain.py")) == []
    assert [p for p, _, _ in needed_packages(script("train.py"))] == ["tensorboard"]


def test_the_model_module_is_found_without_importing_it(tmp_path, mem):
    """A typo in ``model:`` is exit 2 before anything starts, not every task failing after importing TensorFlow. The
    module is looked up in the spec's code dir and this Python, and never imported (it would import TF, or worse)."""
    from tfyarn.gateway.preflight import check_task_env
    common = {"mode": "allreduce", "data": data("memory:///pf/train/part-*.tfrecord"), "checkpoint": {"dir": None},
              "roles": {"chief": {"instances": 1}}}
    assert check_task_env(make_spec(model="tfyarn.models.recommender:model", **common)) == []
    (problem,) = check_task_env(make_spec(model="tfyarn.models.recomender:model", **common))
    assert problem.startswith("model: module 'tfyarn.models.recomender' not found")
    code = tmp_path / "code"
    (code / "mypkg").mkdir(parents=True)
    (code / "mypkg" / "__init__.py").write_text("")
    (code / "mypkg" / "nets.py").write_text("raise SystemExit('imported: the check must not run job code')\n")
    assert check_task_env(make_spec(model="mypkg.nets:build", code=str(code), **common)) == []
    (problem,) = check_task_env(make_spec(model="mypkg.net:build", code=str(code), **common))
    assert f"not found in the code dir {code} or the Python environment" in problem
    (problem,) = check_task_env(make_spec(model="nets:build", **common))       # without code: it is not on the path
    assert problem.startswith("model: module 'nets' not found")


def test_a_local_run_warns_that_gpus_are_not_enforced(tmp_path, caplog):
    from tfyarn.gateway.preflight import local_resource_warnings, run_local_preflight
    (tmp_path / "t.tfrecord").write_bytes(GOOD)
    d = data(f"{tmp_path}/t.tfrecord")
    assert local_resource_warnings(make_spec(data=d, roles={"ps": {"instances": 1}, "worker": {"instances": 1}})) == []
    spec = make_spec(data=d, roles={"ps": {"instances": 1}, "chief": {"instances": 1, "gpus": 1},
                                    "worker": {"instances": 2, "gpus": 2}, "evaluator": {"instances": 0, "gpus": 1}})
    (w,) = local_resource_warnings(spec)
    assert w.startswith("roles.chief.gpus: 1, roles.worker.gpus: 2: not enforced by the local backend")
    with caplog.at_level("WARNING", logger="tfyarn.gateway.preflight"):
        run_local_preflight(spec)
    assert w in caplog.text
