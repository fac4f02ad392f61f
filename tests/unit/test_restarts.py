"""Restart policies on the local backend with real processes: in-place task restarts, job attempts, the caller's
timeout (timeouts.active_deadline is a scenario of the contract suite, tests/contract, on both backends)."""
import signal
import time

import pytest

from launch_helpers import small_spec, task_processes, wait_no_processes
from tfyarn import api, runner
from tfyarn.backends.base import AppState
from tfyarn.backends.local.backend import LocalBackend
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(120)


def spec_with(tmp_path, params, worker=None, **kw):
    """ps mode (allreduce cannot restart one worker): the ps is a real TF server; the training loop is custom."""
    roles = {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 1, **(worker or {})}}
    return load_spec_dict(small_spec(tmp_path, model="custom_jobs:count", params=params, roles=roles, mode="ps",
                                     **kw))


def test_sigkilled_worker_is_restarted_and_the_job_completes(tmp_path):
    spec = spec_with(tmp_path, {"steps": 80}, worker={"max_restarts": 2, "restart": "exit_code"})
    backend = LocalBackend()
    app_id = backend.submit(spec)
    deadline = time.monotonic() + 60
    worker = None
    while time.monotonic() < deadline and worker is None:
        proc = task_processes(app_id).get("worker:0")
        if proc and (backend.status(app_id).progress.get("per_task") or {}).get("worker:0"):
            worker = proc
        time.sleep(0.1)
    assert worker is not None
    worker.send_signal(signal.SIGKILL)
    st = runner.wait(backend, app_id, timeout=90, poll=0.2)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    tasks = {t.task: t for t in st.tasks}
    assert tasks["worker:0"].restarts == 1 and tasks["chief:0"].restarts == 0
    log = "\n".join(backend.logs(app_id, task="worker:0"))
    assert "==== tfyarn: restart 1/2 after exit code -9 ====" in log
    assert wait_no_processes(app_id, 5) == []


def test_exit_code_policy_does_not_restart_a_permanent_error(tmp_path):
    spec = spec_with(tmp_path, {"steps": 200, "worker_exit_code": 3},
                     worker={"max_restarts": 2, "restart": "exit_code"})
    st = api.run(spec, backend="local")
    assert st.state is AppState.FAILED
    assert st.diagnostics.startswith("worker:0 exited with code 3")
    assert {t.task: t.restarts for t in st.tasks}["worker:0"] == 0


def test_exit_code_policy_restarts_a_retryable_exit(tmp_path):
    spec = spec_with(tmp_path, {"steps": 30, "worker_exit_code": 137},
                     worker={"max_restarts": 1, "restart": "exit_code"})
    st = api.run(spec, backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert {t.task: t.restarts for t in st.tasks}["worker:0"] == 1


def test_chief_failure_retries_the_whole_job_as_a_new_attempt(tmp_path):
    spec = spec_with(tmp_path, {"steps": 10, "chief_fails_first_attempt": True},
                     retry={"max_attempts": 2, "backoff": "0.5s"})
    st = api.run(spec, backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.attempt == 1


def test_attempts_are_bounded(tmp_path):
    spec = spec_with(tmp_path, {"steps": 10, "chief_lost_attempts": 5}, retry={"max_attempts": 2, "backoff": "0.2s"})
    st = api.run(spec, backend="local")
    assert st.state is AppState.FAILED and st.attempt == 1, st.diagnostics
    assert st.diagnostics.startswith("chief:0 exited with code -9"), st.diagnostics
    assert "earlier attempts" in st.diagnostics, st.diagnostics


def test_the_users_error_is_not_retried_whatever_attempts_are_left(tmp_path):
    """The user's code raising fails the same way on every try: the job ends after one attempt, with its error."""
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:fail_on_worker",
                                     retry={"max_attempts": 3, "backoff": "0.2s"}))
    st = api.run(spec, backend="local")
    assert st.state is AppState.FAILED and st.attempt == 0, st.diagnostics
    assert st.diagnostics.startswith("worker:0 exited with code 1: RuntimeError: boom from worker:0"), st.diagnostics
    assert "not retried: the job's own code failed (raised RuntimeError)" in st.diagnostics, st.diagnostics


def test_the_api_callers_timeout_stops_a_local_run_as_yarns_does(tmp_path):
    """api.run(timeout=…) was ignored by the local backend (only YARN's follower applied it)."""
    from tfyarn import api
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:run_long", timeouts={"active_deadline": "1h"}))
    t0 = time.monotonic()
    st = api.run(spec, backend="local", timeout=4)
    assert st.state is AppState.TIMED_OUT and "active deadline of 4s exceeded (the caller's timeout)" in st.diagnostics
    assert time.monotonic() - t0 < 20
    assert wait_no_processes(st.app_id, 5) == []
