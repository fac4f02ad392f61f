"""The runner (tfyarn/runner): one attempt loop and one poll loop for every backend, which keeps only the scheduler's
verbs (no run/wait, no hooks: callers hand the backend to the runner, which decides). Attempts run on the real local
backend (real processes, a custom job that fails its first attempt); YARN's side of the same loop is
tests/unit/backends/yarn/test_backend_state.py's ``run`` tests."""
import logging
import os
import signal
import threading
import time

import pytest

from launch_helpers import small_spec, wait_no_processes
from tfyarn import runner
from tfyarn.backends import registry
from tfyarn.backends.base import AppState, Backend, Request
from tfyarn.backends.local.backend import LocalBackend
from tfyarn.runner.attempts import ScheduledAttempts
from tfyarn.runner.supervisor import Supervisor
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(180)
VERBS = {"dryrun", "schedule", "status", "logs", "kill"}


@pytest.mark.parametrize("name", list(registry.KNOWN))
def test_a_backend_is_its_verbs_and_runs_through_the_one_runner(name):
    """No backend has an attempt loop or a poll loop of its own, nor a run/wait, nor the runner's hooks: the runner
    takes the backend (torchx's Runner over its Scheduler), so a job runs only through ``runner.run``/``runner.wait``,
    and the job's rules are applied there."""
    cls = registry.backend_class(name)
    assert Backend.__abstractmethods__ == VERBS
    for cl in (Backend, cls):
        assert not hasattr(cl, "run") and not hasattr(cl, "wait"), [k for k in ("run", "wait") if hasattr(cl, k)]
    assert all(callable(getattr(cls, verb)) for verb in (*VERBS, "submit", "list", "end", "kv", "keep_report"))
    for cl in (Backend, cls):
        hooks = [h for h in ("attempts", "follow", "pause", "followed") if hasattr(cl, h)]
        assert hooks == [], (cl.__name__, hooks)


def _spec(tmp_path, backoff: str):
    roles = {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 1}}
    return load_spec_dict(small_spec(tmp_path, model="custom_jobs:count", mode="ps", roles=roles,
                                     params={"steps": 10, "chief_fails_first_attempt": True},
                                     retry={"max_attempts": 2, "backoff": backoff}))


def test_a_failed_attempt_is_followed_by_the_next_one_named_in_the_final_diagnosis(tmp_path):
    seen = []
    st = runner.run(LocalBackend(), _spec(tmp_path, "0.2s"), on_update=lambda s: seen.append(s.attempt))
    assert st.state is AppState.SUCCEEDED and st.attempt == 1, st.diagnostics
    assert 0 in seen and 1 in seen                                      # both attempts were followed
    # custom_jobs' chief SIGKILLs itself on attempt 0 (an infrastructure-like loss: the user's code is not retried)
    assert "earlier attempts: chief:0 exited with code -9" in st.diagnostics, st.diagnostics
    assert "2 attempts in" in st.diagnostics, st.diagnostics
    assert wait_no_processes(st.app_id, 10) == []


class _StopOnBackoff(logging.Handler):
    """SIGTERM to this process once the supervisor says the next attempt waits for its backoff."""

    def emit(self, record):
        if "starting attempt 2" in record.getMessage():
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()


def test_a_stop_during_the_backoff_ends_the_run_killed_at_once(tmp_path):
    """The backoff (60 s here) waits on the backend's stop: a SIGTERM then ends the run KILLED, saying so, with the
    earlier attempt in the diagnosis — no second attempt starts, no task is left."""
    handler = _StopOnBackoff()
    logging.getLogger("tfyarn.runner.supervisor").addHandler(handler)
    try:
        t0 = time.monotonic()
        st = runner.run(LocalBackend(), _spec(tmp_path, "60s"))
        took = time.monotonic() - t0
    finally:
        logging.getLogger("tfyarn.runner.supervisor").removeHandler(handler)
    assert st.state is AppState.KILLED, st.diagnostics
    assert st.diagnostics.startswith("interrupted by SIGTERM"), st.diagnostics
    assert "earlier attempts:" in st.diagnostics, st.diagnostics
    assert took < 60, took                                              # not after the backoff
    assert not [t.task for t in st.tasks if t.state in ("RUNNING", "PENDING")], st.to_dict()
    assert LocalBackend().status(st.app_id).state is AppState.KILLED    # its status.json says so too
    assert wait_no_processes(st.app_id, 10) == []


class _Stopped(Exception):
    pass


def test_a_run_ended_by_an_error_in_its_follower_still_leaves_its_run_report(tmp_path):
    """An error while following (here: the caller's on_update) ends the app (never left running) and still writes
    its report.json before the final status.json, as the last attempt's end does."""
    from tfyarn.common import paths

    def fail_once_training(st):
        if ((st.progress or {}).get("global_step") or 0) >= 3:     # the report has points to show
            raise _Stopped("the caller's progress display failed")

    roles = {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 1}}
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:count", mode="ps", roles=roles,
                                     params={"steps": 400}))
    with pytest.raises(_Stopped):
        runner.run(LocalBackend(), spec, on_update=fail_once_training, poll=0.2)
    apps = sorted(paths.apps_dir().iterdir())
    assert len(apps) == 1, apps
    st = LocalBackend().status(apps[0].name)
    assert st.state is AppState.KILLED, st.diagnostics
    assert (apps[0] / "report.json").is_file(), sorted(p.name for p in apps[0].iterdir())
    assert wait_no_processes(st.app_id, 10) == []


def test_an_attempt_scheduled_by_the_runner_carries_the_runs_start(tmp_path):
    """The run's start is the first mark of the job's timeline (YARN's ``start → app end`` phase) and tells the
    backend a run follows its submit (YARN then releases its JVM): the runner puts it on every request it schedules."""
    class Recording:
        name = "recording"
        scheduled: list[Request] = []

        def dryrun(self, spec, attempt=0):
            return Request(spec, attempt)

        def schedule(self, request):
            self.scheduled.append(request)
            return f"app-{request.attempt}"

    spec = _spec(tmp_path, "0.2s")
    sup = Supervisor(spec, started=1234.5)
    backend = Recording()
    assert ScheduledAttempts(backend, spec, sup).start(1) == "app-1"
    assert [(r.attempt, r.run_started) for r in backend.scheduled] == [(1, 1234.5)]
