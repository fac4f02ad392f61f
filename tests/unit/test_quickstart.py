"""The README's quickstart, exactly as a new user runs it: real processes (ps, chief, 2 workers) over gRPC."""
import json
import re
import subprocess
import sys

import pytest

from launch_helpers import ROOT, wait_no_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_quickstart_trains_to_the_end_and_the_loss_goes_down(tfyarn_home):
    proc = subprocess.run([sys.executable, "-m", "tfyarn.cli", "run", str(ROOT / "specs" / "quickstart.yaml")],
                          capture_output=True, text=True, timeout=200, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # the summary a user reads
    assert re.search(r"job quickstart SUCCEEDED in [\d.]+s", out)
    m = re.search(r"steps per worker: chief:0=(\d+) worker:0=(\d+) worker:1=(\d+)", out)
    assert m and len(set(m.groups())) == 1, "every worker runs the same number of steps"
    assert re.search(r"examples/s: [\d,]+", out)
    loss = re.search(r"loss: first ([\d.]+) -> last ([\d.]+) \(down", out)
    assert loss and float(loss.group(2)) < 0.9 * float(loss.group(1)), out[-1500:]
    # live output is prefixed with the task
    for task in ("ps:0", "chief:0", "worker:0", "worker:1"):
        assert f"{task} | " in out
    # the machine-readable facts agree
    app_id = re.search(r"\((local-[\w-]+)\)", out).group(1)
    st = json.loads((tfyarn_home / "apps" / app_id / "status.json").read_text())
    s = st["summary"]
    steps = int(m.group(1))
    assert s["global_step"] == s["total_steps"] == 3 * steps
    assert s["steps_per_worker"] == {"chief:0": steps, "worker:0": steps, "worker:1": steps}
    assert s["global_batch_size"] == 768
    assert {t["task"]: t["state"] for t in st["tasks"]} == {
        "ps:0": "SUCCEEDED", "chief:0": "SUCCEEDED", "worker:0": "SUCCEEDED", "worker:1": "SUCCEEDED"}
    assert wait_no_processes(app_id, 5) == []


def test_sigint_mid_training_leaves_no_tensorflow_process_within_10s(tfyarn_home):
    import signal
    import time
    proc = subprocess.Popen([sys.executable, "-m", "tfyarn.cli", "-q", "run", str(ROOT / "specs" / "quickstart.yaml"),
                             "--set", "data.epochs=50"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    app_id = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until every training task has run steps (TF fully up)
        apps = sorted((tfyarn_home / "apps").glob("local-*")) if (tfyarn_home / "apps").exists() else []
        if apps and (apps[0] / "status.json").exists():
            app_id = apps[0].name
            try:
                per_task = json.loads((apps[0] / "status.json").read_text())["progress"].get("per_task") or {}
            except ValueError:
                per_task = {}
            if all((per_task.get(t) or 0) > 2 for t in ("chief:0", "worker:0", "worker:1")):
                break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the quickstart never started training")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3, out.decode()[-2000:]
    assert wait_no_processes(app_id, 10 - (time.monotonic() - t0)) == []


def test_running_a_finished_job_again_succeeds_at_once(tfyarn_home, tmp_path):
    """A scheduler's retry after the job had finished (its worker died after the end): the chief restores the final
    checkpoint and is done at once. It must wait for the workers' final records before letting the ps go; it did
    not, and a worker still starting waited on a session to a ps that had left (seen: RUNNING for 10 minutes)."""
    cmd = [sys.executable, "-m", "tfyarn.cli", "run", str(ROOT / "specs" / "quickstart.yaml"),
           "--set", f"checkpoint.dir={tmp_path / 'ckpt'}", "--set", "timeouts.stall=60"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=ROOT)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    app_id = re.search(r"\((local-[\w-]+)\)", out).group(1)
    st = json.loads((tfyarn_home / "apps" / app_id / "status.json").read_text())
    s = st["summary"]
    assert s["global_step"] == s["total_steps"] and s["resumed_from"] == f"ckpt-{s['total_steps']}", s
    assert {t["state"] for t in st["tasks"]} == {"SUCCEEDED"}, st["tasks"]
    assert st["finished"] - st["started"] < 30, "it trained nothing: it must not take long either"
    # the same checkpoint dir with another model size: TF1's Saver would restore the (1000, 16) checkpoint into the
    # (1000, 32) variables without a word (they take the checkpoint's shape); the chief refuses, naming the way out
    other = subprocess.run(cmd + ["--set", "params.dim=32"], capture_output=True, text=True, timeout=200, cwd=ROOT)
    out = other.stdout + other.stderr
    assert other.returncode == 1, out[-3000:]
    assert (f"chief:0 exited with code 1: CheckpointMismatch: checkpoint ckpt-{s['total_steps']} in "
            f"{tmp_path / 'ckpt'} does not fit this job's model: user_embedding has shape [1000, 16] in the "
            f"checkpoint, [1000, 32] in the model (and ") in out, out[-3000:]
    assert "point checkpoint.dir at a new directory to train afresh" in out
