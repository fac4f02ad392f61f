"""Preflight: every problem reported at once, before anything is uploaded; files checked on memory:// and file://."""
import os

import fsspec
import pytest

from yarnutil import make_spec
from tfyarn.errors import ExitCode, PreflightError
from tfyarn.preflight import (QueueInfo, StaticClusterInfo, check_checkpoint_dir, check_data, check_resources,
                              rm_webapp_urls, run_preflight)

FEAT = {"label": {"dtype": "float32"}}


def data(*train, eval=()):
    return {"train": list(train), "eval": list(eval), "features": FEAT, "batch_size": 4}


@pytest.fixture
def mem():
    fs = fsspec.filesystem("memory")
    fs.pipe("/pf/train/part-0.tfrecord", b"x")
    fs.pipe("/pf/train/part-1.tfrecord", b"x")
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
    (tmp_path / "d" / "a.tfrecord").write_bytes(b"x")
    spec = make_spec(data=data(f"file://{tmp_path}/d/*.tfrecord"), checkpoint={"dir": f"file://{tmp_path}/ck/run1"})
    assert check_data(spec) == [] and check_checkpoint_dir(spec) == []
    assert (tmp_path / "ck" / "run1").is_dir() and os.listdir(tmp_path / "ck" / "run1") == []   # probe removed
    (tmp_path / "blocker").write_text("a file where a directory should be")
    spec = make_spec(data=data(f"file://{tmp_path}/d/*.tfrecord"), checkpoint={"dir": f"file://{tmp_path}/blocker/ck"})
    (problem,) = check_checkpoint_dir(spec)
    assert problem.startswith(f"checkpoint.dir: file://{tmp_path}/blocker/ck is not writable")


def test_relative_data_path_resolves_against_the_spec_dir(tmp_path):
    (tmp_path / "train.tfrecord").write_bytes(b"x")
    spec = make_spec(data=data("train.tfrecord")).model_copy(update={"base_dir": str(tmp_path)})
    assert check_data(spec) == []


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
    spec = make_spec(queue="nosuch", data=data("memory:///pf/none/*"), kerberos={"principal": "me@R", "keytab": str(kt)},
                     checkpoint={"dir": "memory:///pf/ck"})
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
    local = make_spec(data=data(f"{tmp_path}/me.keytab"))
    assert "is a local path" in run_preflight(local, None)[0]


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
    import tfyarn.preflight as pf
    from tfyarn.preflight import check_task_env, run_local_preflight
    roles = {"chief": {"instances": 1}, "tensorboard": {"instances": 1}}
    train = data("memory:///pf/train/part-*.tfrecord")
    common = {"mode": "allreduce", "data": train, "checkpoint": {"dir": "memory:///pf/ck"}}
    spec = make_spec(roles=roles, **common)
    monkeypatch.setattr(pf, "_installed", lambda m: m != "tensorboard")
    (problem,) = check_task_env(spec)
    assert problem.startswith("roles.tensorboard: the 'tensorboard' package is not installed") and "pip install" in problem
    with pytest.raises(PreflightError, match="roles.tensorboard"):
        run_local_preflight(spec)
    with pytest.raises(PreflightError, match="roles.tensorboard"):
        run_preflight(spec, check_files=False)                                  # environment.pack: auto
    for env in ({"archive": "hdfs:///envs/tf.tar.gz"}, {"python": "/opt/py/bin/python"}):
        run_preflight(make_spec(roles=roles, environment=env, **common), check_files=False)  # not ours to check
    assert check_task_env(make_spec(roles={"chief": {"instances": 1}}, **common)) == []
    monkeypatch.setattr(pf, "_installed", lambda m: True)
    assert check_task_env(spec) == []


def test_the_model_module_is_found_without_importing_it(tmp_path, mem):
    """A typo in ``model:`` is exit 2 before anything starts, not every task failing after importing TensorFlow. The
    module is looked up in the spec's code dir and this Python, and never imported (it would import TF, or worse)."""
    from tfyarn.preflight import check_task_env
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
