"""A job that did not train never says SUCCEEDED (issue 41), on the real cluster, through the CLI as a user runs it.

Two jobs whose Python on the nodes cannot run tfyarn's tasks: Debian's ``/usr/bin/python3`` (none of tfyarn's
dependencies: not even the exit report or the in-app supervisor can start, so only their containers' logs say why),
and a Python with tfyarn's dependencies but no TensorFlow (the tasks report their own failure). Each ends FAILED,
exit 1, the missing module and the interpreter in the diagnosis of `run`, of `status` and of its JSON."""
import json
import platform
import re
import subprocess

import pytest
import yaml

from clusterutil import JOB_S, job_doc, needs_yarn, python_without_tensorflow, tfyarn, unique

pytestmark = [*needs_yarn, pytest.mark.timeout(3 * JOB_S)]

SYSTEM_PYTHON = "/usr/bin/python3"


def _run_fails(doc, tmp_path, missing, python, version):
    """`tfyarn run` of ``doc`` exits 1 saying FAILED with ``cannot start: <missing> (python …)``; `status`, text
    and JSON, say the same afterwards (another process, from the app's record and logs)."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    run = tfyarn("run", str(path), "--yarn", "--output", "json", timeout=JOB_S)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    final = json.loads(run.stdout)
    why = f"cannot start: No module named '{missing}' (python {python} {version})"
    assert final["state"] == "FAILED" and final["exit_code"] == 1, final
    assert why in final["diagnostics"].splitlines()[0], final["diagnostics"]
    assert not any(t["state"] == "SUCCEEDED" for t in final["tasks"]), final["tasks"]
    text = tfyarn("status", final["app_id"])
    assert text.returncode == 1 and "FAILED" in text.stdout and why in text.stdout, text.stdout + text.stderr
    js = tfyarn("status", final["app_id"], "--output", "json")
    doc = json.loads(js.stdout)
    assert js.returncode == 1 and doc["state"] == "FAILED" and doc["exit_code"] == 1 and why in doc["diagnostics"]
    return final


def test_a_python_without_tfyarns_dependencies_fails_the_job_naming_the_module(dataset, tmp_path):
    have = subprocess.run([SYSTEM_PYTHON, "-c", "import pydantic"], capture_output=True)
    if have.returncode == 0:
        pytest.skip(f"{SYSTEM_PYTHON} has pydantic here")
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True).stdout.strip()
    doc = job_doc(dataset, unique("nodeps"), epochs=1, environment={"python": SYSTEM_PYTHON})
    # first the probe (validate --probe): one short container says what the nodes' Python lacks; exit 2
    (tmp_path / "probe.yaml").write_text(yaml.safe_dump(doc))
    probe = tfyarn("validate", str(tmp_path / "probe.yaml"), "--yarn", "--probe", timeout=JOB_S)
    assert probe.returncode == 2, probe.stdout + probe.stderr
    assert f"python {SYSTEM_PYTHON} {version}" in probe.stdout and re.search(
        r"pydantic +missing: No module named 'pydantic'", probe.stdout), probe.stdout
    assert f"cannot start: No module named 'pydantic' (python {SYSTEM_PYTHON} {version})" in probe.stderr
    final = _run_fails(doc, tmp_path, "pydantic", SYSTEM_PYTHON, version)
    # the in-app supervisor could not start either: its container failed the app at once (skein's words for it)
    assert "tfyarn-supervisor: cannot start" in final["diagnostics"], final["diagnostics"]
    assert "Failure in service tfyarn-supervisor" in final["diagnostics"], final["diagnostics"]


def test_a_python_without_tensorflow_fails_the_job_naming_it(yarn, dataset, tmp_path):
    python = python_without_tensorflow(tmp_path / "no-tf")
    doc = job_doc(dataset, unique("notf"), epochs=1, environment={"python": python})
    final = _run_fails(doc, tmp_path, "tensorflow", python, platform.python_version())
    assert final["progress"].get("global_step") in (None, 0), final["progress"]
    # `run --probe` finds it first and starts no job (exit 2); the probe names the modules it has and lacks
    before = {a.app_id for a in _apps(yarn, doc["name"])}
    probed = tfyarn("run", str(tmp_path / "job.yaml"), "--yarn", "--probe", timeout=JOB_S)
    assert probed.returncode == 2, probed.stdout + probed.stderr
    assert re.search(r"pydantic +\d", probed.stdout) and re.search(r"tensorflow +missing", probed.stdout), probed.stdout
    assert f"cannot start: No module named 'tensorflow' (python {python} " in probed.stderr, probed.stderr
    assert {a.app_id for a in _apps(yarn, doc["name"])} == before  # the job itself was never submitted


def _apps(yarn, name):
    return [a for a in yarn.list(all_states=True) if a.name == name]
