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
    assert f"3 epochs" not in proc.stdout and f"{props['epochs']} epochs" in proc.stdout
    # and the same line with a broken override fails with exit 2, naming the path (the check is real)
    bad = [a.replace(f"data.epochs={props['epochs']}", "data.epochs=lots") for a in args]
    proc = subprocess.run(["bash", str(OOZIE / "tfyarn-action.sh"), *bad], cwd=OOZIE, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "data.epochs" in proc.stderr
