"""A worker killed with SIGKILL mid-epoch is restarted in place, rejoins through the rendezvous at a new address, and
resumes at its own position in the epoch plan (its counter on the live ps): the job ends at the planned global step,
every worker ran exactly its planned steps, and the in-flight step of the killed process is reported.

Real processes on the local backend: a ps, a chief and a worker training the recommender
(tests/functional/faults/jobs)."""
import random
import signal

import pytest

from faultutil import fault_spec, planned_steps, task_process, wait_for_step
from launch_helpers import wait_no_processes
from tfyarn import runner
from tfyarn.backends.base import AppState
from tfyarn.backends.local.backend import LocalBackend

pytestmark = pytest.mark.timeout(180)


def test_async_worker_killed_mid_epoch_rejoins_and_the_job_reaches_the_planned_step(tmp_path):
    spec = fault_spec(tmp_path, worker={"max_restarts": 2, "restart": "exit_code"})
    steps = planned_steps(spec)
    per_worker = sum(steps)
    kill_at = random.Random().randint(3, steps[0] - 4)   # mid-epoch 0, the worker's position
    backend = LocalBackend()
    app_id = backend.submit(spec)
    wait_for_step(backend, app_id, "worker:0", kill_at, timeout=90)
    old = task_process(app_id, "worker:0")
    old.send_signal(signal.SIGKILL)
    st = runner.wait(backend, app_id, timeout=150, poll=0.2)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    tasks = {t.task: t for t in st.tasks}
    assert tasks["worker:0"].restarts == 1
    s = st.summary
    assert s["global_step"] == s["total_steps"] == 2 * per_worker
    assert s["steps_per_worker"] == {"chief:0": per_worker, "worker:0": per_worker}
    assert s["rejoins"] == {"chief:0": 0, "worker:0": 1}
    assert s["lost_steps"]["chief:0"] == 0 and s["lost_steps"]["worker:0"] in (0, 1)
    assert s["lost_records"]["worker:0"] == s["lost_steps"]["worker:0"] * spec.data.batch_size
    log = "\n".join(backend.logs(app_id, task="worker:0"))
    assert "==== tfyarn: restart 1/2 after exit code -9 ====" in log
    assert "restart 1 rejoins" in log, log[-3000:]
    assert wait_no_processes(app_id, 10) == []
