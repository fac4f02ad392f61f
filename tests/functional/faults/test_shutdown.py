"""timeouts.shutdown: with ``success_policy: chief`` the job succeeds when the chief finishes; a task still running
``timeouts.shutdown`` s later is stopped and named in the diagnosis (the job never waits on it forever)."""
import time

import pytest

from faultutil import JOBS
from launch_helpers import small_spec, wait_no_processes
from tfyarn import api
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict


@pytest.mark.timeout(120)
def test_task_still_running_after_training_is_stopped_at_the_shutdown_timeout(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, model="fault_models:chief_quick_worker_forever", code=str(JOBS),
                                     success_policy="chief", timeouts={"rendezvous": 60, "shutdown": "3s"}))
    t0 = time.monotonic()
    st = api.run(spec, backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.diagnostics == "stopped worker:0: still running 3s after training finished (timeouts.shutdown)"
    assert st.summary["global_step"] == 3
    assert {t.task: t.state for t in st.tasks}["worker:0"] == "KILLED"
    assert time.monotonic() - t0 < 90
    assert wait_no_processes(st.app_id, 10) == []
