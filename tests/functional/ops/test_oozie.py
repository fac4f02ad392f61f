"""The Oozie example (specs/oozie/): workflow.xml is well-formed and its shell action's tfyarn command line — the
<argument>s with the EL expressions filled in from job.properties — validates against the example spec."""
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from opsutil import ROOT

OOZIE = ROOT / "specs" / "oozie"
NS = {"wf": "uri:oozie:workflow:0.5", "sh": "uri:oozie:shell-action:0.3"}


def _properties():
    props = {}
    for line in (OOZIE / "job.properties").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            props[k.strip()] = v.strip()
    return props


def _el(text, props):
    """Fill ${...} as Oozie would for this test: properties, and a workflow id for wf:id()."""
    def sub(m):
        expr = m.group(1)
        if expr == "wf:id()":
            return "0000001-260101000000000-oozie-oozi-W"
        assert expr in props, f"workflow.xml uses ${{{expr}}}, which job.properties does not define"
        return props[expr]
    return re.sub(r"\$\{([^}]+)\}", sub, text)


def _shell_action():
    root = ET.parse(OOZIE / "workflow.xml").getroot()  # raises if not well-formed
    assert root.tag == f"{{{NS['wf']}}}workflow-app"
    shell = root.find("wf:action/sh:shell", NS)
    assert shell is not None, "no shell action"
    return shell


def _tfyarn_bin():
    cand = Path(sys.executable).parent / "tfyarn"
    return str(cand) if cand.exists() else shutil.which("tfyarn")


def test_workflow_is_well_formed_and_ships_what_it_runs():
    shell = _shell_action()
    files = [f.text for f in shell.findall("sh:file", NS)]
    assert shell.find("sh:exec", NS).text in files
    for f in files:
        assert (OOZIE / f).exists(), f"workflow ships {f}, which is not in specs/oozie"
    assert shell.find("sh:capture-output", NS) is not None
    assert os.access(OOZIE / "tfyarn-action.sh", os.X_OK)


@pytest.mark.timeout(120)
def test_the_actions_command_line_validates_against_the_example_spec(tmp_path):
    props = _properties()
    shell = _shell_action()
    args = [_el(a.text, props) for a in shell.findall("sh:argument", NS)]
    assert args[0] == "ctr.yaml" and "--set" in args
    env = {**os.environ, "TFYARN_OOZIE_VALIDATE": "1", "TFYARN": _tfyarn_bin()}
    proc = subprocess.run(["bash", str(OOZIE / "tfyarn-action.sh"), *args], cwd=OOZIE, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 epochs" not in proc.stdout and f"{props['epochs']} epochs" in proc.stdout
    # and the same line with a broken override fails with exit 2, naming the path (the check is real)
    bad = [a.replace(f"data.epochs={props['epochs']}", "data.epochs=lots") for a in args]
    proc = subprocess.run(["bash", str(OOZIE / "tfyarn-action.sh"), *bad], cwd=OOZIE, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "data.epochs" in proc.stderr


def _action(tmp_path, spec_path, env_extra):
    """Run the Oozie action script as Oozie's launcher would, against the local backend (no YARN here)."""
    tfyarn_bin = tmp_path / "bin" / "tfyarn"
    tfyarn_bin.parent.mkdir(exist_ok=True)
    tfyarn_bin.write_text(f"#!/bin/sh\nexec {sys.executable} -m tfyarn.cli \"$@\"\n")
    tfyarn_bin.chmod(0o755)
    env = dict(os.environ, TFYARN=str(tfyarn_bin), TFYARN_BACKEND="--local", **env_extra)
    return subprocess.Popen(["bash", str(OOZIE / "tfyarn-action.sh"), str(spec_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(180)
def test_a_retried_action_adopts_the_running_app_instead_of_starting_another(tmp_path):
    import time

    from opsutil import job_spec, write_spec
    from tfyarn.backends.local.backend import LocalBackend
    running = write_spec(tmp_path, job_spec(tmp_path, model="ops_jobs:long", tags=["ctr", "oozie-wf=w-1"]),
                         "running.yaml")
    first = subprocess.run([sys.executable, "-m", "tfyarn.cli", "-q", "submit", str(running), "--local"],
                           capture_output=True, text=True, timeout=60)
    app_id = first.stdout.strip()
    assert app_id.startswith("local-"), first.stderr
    # the retry: same tag; it must follow app_id, not submit the (short) spec it was given
    retry = _action(tmp_path, write_spec(tmp_path, job_spec(tmp_path, tags=["ctr", "oozie-wf=w-1"])),
                    {"TFYARN_ADOPT_TAG": "oozie-wf=w-1"})
    time.sleep(3)
    LocalBackend().kill(app_id)
    out, err = retry.communicate(timeout=60)
    assert f"app_id={app_id}" in out.splitlines(), (out, err)
    assert f"adopting {app_id}" in err
    assert retry.returncode == 3 and "exit_code=3" in out  # it followed the adopted app to its (killed) end
    assert len(LocalBackend().list()) == 1  # nothing else was started
    # no running app with the tag: the action submits its own job
    fresh = _action(tmp_path, write_spec(tmp_path, job_spec(tmp_path, tags=["oozie-wf=w-2"]), "fresh.yaml"),
                    {"TFYARN_ADOPT_TAG": "oozie-wf=w-2"})
    out, err = fresh.communicate(timeout=120)
    assert fresh.returncode == 0, err[-2000:]
    assert "exit_code=0" in out and len(LocalBackend().list()) == 2
