"""The ps or the chief killed with SIGKILL: no task restart can fix that (the ps holds the variables, the chief the
session), so the launcher stops every task and starts a second job attempt, which restores the latest checkpoint and
trains to the planned global step. Lost work is bounded by the checkpoint interval.

Real processes on the local backend (1 ps + chief + 1 worker), ``retry.max_attempts: 2``."""
import json
import re
import signal

import pytest

from faultutil import fault_spec, planned_steps, task_process, wait_for_step
from launch_helpers import wait_no_processes
from tfyarn import runner
from tfyarn.backends.base import AppState
from tfyarn.backends.local.backend import LocalBackend
from tfyarn.spec import load_spec_dict
from tfyarn.train.helpers import position

EVERY = 6  # checkpoint every 6 global steps


@pytest.mark.timeout(240)
@pytest.mark.parametrize("victim", ["chief:0", pytest.param("ps:0", marks=pytest.mark.slow)])
def test_ps_or_chief_killed_the_job_resumes_from_the_checkpoint(tmp_path, victim):
    # 4 epochs of 24 steps: the kill lands in epoch 1 with ~70 steps to go, so a loaded box cannot finish the job
    # before the victim is found (with 2 epochs the ps had once already exited, the job done, when the test looked)
    spec = fault_spec(tmp_path, retry={"max_attempts": 2, "backoff": "0.5s"}, checkpoint_every=EVERY, epochs=4)
    steps = planned_steps(spec)
    total = 2 * sum(steps)
    backend = LocalBackend()
    app_id = backend.submit(spec)
    wait_for_step(backend, app_id, "chief:0", steps[0] + 3, timeout=90)   # into epoch 1: checkpoints exist
    seen = int(backend.status(app_id).progress.get("global_step") or 0)
    task_process(app_id, victim).send_signal(signal.SIGKILL)
    st = runner.wait(backend, app_id, timeout=180, poll=0.2)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.attempt == 1
    assert st.summary["global_step"] == st.summary["total_steps"] == total
    assert st.summary["steps_per_worker"] == {"chief:0": sum(steps), "worker:0": sum(steps)}
    launcher_log = (backend.app_dir(app_id) / "launcher.log").read_text()
    assert re.search(rf"attempt 1/2 failed \({re.escape(victim)} exited with code -9|"
                     rf"attempt 1/2 failed \((chief|worker):0 exited with code 1: .*(Unavailable|Aborted|Cancelled)",
                     launcher_log), launcher_log[-3000:]
    chief_log = "\n".join(backend.logs(app_id, task="chief:0"))
    m = re.search(r"resuming from (ckpt-\S+) \(global step (\d+)\)", chief_log)
    assert m, chief_log[-3000:]
    resumed = int(m.group(2))
    # lost work <= the checkpoint interval (+ the worker's steps between two of the chief's, + progress lag)
    assert seen - EVERY - 4 <= resumed < total, (seen, resumed)
    totals = st.summary["attempts"]     # the work attempt 1 did past the checkpoint: done again
    first = totals["by_attempt"][0]
    assert totals["attempts"] == 2 and first["resumes_at"] == resumed and first["reached"] >= seen, totals
    # (reached: the last progress seen, a report interval behind: async ps may even checkpoint past it)
    assert totals["lost_steps"] == max(0, first["reached"] - resumed), totals
    # the resumed position is each worker's own counter from the checkpoint, in the planned epochs
    m2 = re.search(r"chief:0: resuming at epoch (\d+) step (\d+) \(global step (\d+)\)", chief_log)
    assert m2 and int(m2.group(3)) == resumed
    chief_counter = sum(steps[:int(m2.group(1))]) + int(m2.group(2))
    assert position(chief_counter, steps) == (int(m2.group(1)), int(m2.group(2)))
    assert 0 < chief_counter <= resumed
    assert wait_no_processes(app_id, 10) == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["ps-sync", pytest.param("allreduce", marks=pytest.mark.slow)])
def test_a_sigtermed_chief_checkpoints_at_once_and_the_next_attempt_resumes_from_there(tmp_path, mode):
    """SIGTERM is how YARN takes a container away (preemption: SIGKILL follows after the NodeManager's
    sleep-delay-before-sigkill.ms): the chief saves a checkpoint between two steps and ends as SIGTERM would; the
    next attempt resumes from the step it was at, not from the last periodic checkpoint (none here: every 1000)."""
    spec = fault_spec(tmp_path, sync=True, retry={"max_attempts": 2, "backoff": "0.5s"}, checkpoint_every=1000,
                      epochs=4)
    if mode == "allreduce":
        doc = json.loads(spec.to_json())
        doc["mode"] = "allreduce"
        doc["roles"].pop("ps")
        spec = load_spec_dict(doc)
    steps = planned_steps(spec)
    total = sum(steps)
    backend = LocalBackend()
    app_id = backend.submit(spec)
    wait_for_step(backend, app_id, "chief:0", steps[0] + 3, timeout=120)
    seen = int(backend.status(app_id).progress.get("global_step") or 0)
    task_process(app_id, "chief:0").send_signal(signal.SIGTERM)
    st = runner.wait(backend, app_id, timeout=180, poll=0.2)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.attempt == 1, st.diagnostics
    assert st.summary["global_step"] == st.summary["total_steps"] == total, st.summary
    chief_log = "\n".join(backend.logs(app_id, task="chief:0"))
    saved = re.search(r"chief:0: SIGTERM \(a preemption or a stop\) at global step (\d+): checkpoint (ckpt-\S+) "
                      r"committed ([\d.]+)s after the signal", chief_log)
    assert saved, chief_log[-3000:]
    at = int(saved.group(1))
    resumed = re.search(r"resum(?:ing|ed) from (ckpt-\S+) \(global step (\d+)\)", chief_log)
    assert resumed and resumed.group(1) == saved.group(2) and int(resumed.group(2)) == at, chief_log[-3000:]
    # nothing before the signal is lost: it saves the step it was at when the loop saw the flag (status's global
    # step lags the chief's by its report interval, so `seen` is a lower bound), long before the end
    assert seen <= at < total - 10, (seen, at, total)
    assert float(saved.group(3)) < 5.0, saved.group(0)     # the local launcher's SIGKILL would come at 5 s
    launcher_log = (backend.app_dir(app_id) / "launcher.log").read_text()
    assert re.search(r"attempt 1/2 failed \((chief|worker):0 exited with code", launcher_log), launcher_log[-3000:]
    # totals over both attempts: nothing redone (attempt 1 reached at most the saved step), the wall time of both
    totals = st.summary["attempts"]
    assert totals["attempts"] == 2 and totals["by_attempt"][0]["resumes_at"] == at, totals
    assert totals["lost_steps"] == 0 and seen <= totals["by_attempt"][0]["reached"] <= at, totals
    assert totals["wall_s"] >= st.summary.get("elapsed_s", 0), (totals, st.summary)
    print(f"SIGTERM at global step >= {seen}: saved at {at} in {saved.group(3)}s; resumed there ({mode})")
    assert wait_no_processes(app_id, 10) == []
