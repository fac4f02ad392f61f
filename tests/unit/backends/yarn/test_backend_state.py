"""YarnBackend's client side: YARN states → tfyarn states/exit codes, per-task status from skein containers and the
app KV, status after the application master is gone, submit/kill/list, and preflight stopping a submit.

The ResourceManager and the application master are the edge we cannot run here: ``FakeRM`` answers with real
``skein.model.ApplicationReport`` / ``Container`` objects, and the app KV is skein's real KeyValueStore on FakeAM.
"""
import os
import signal
import threading
import time
from datetime import datetime, timedelta

import fsspec
import pytest
import skein
from skein.model import ApplicationReport, Container, ResourceUsageReport

from yarnutil import StaticClusterInfo, make_spec
from fake_am import FakeAM
from tfyarn import runner
from tfyarn.backends.yarn import records
from tfyarn.runner.owned import stop_app
from tfyarn.backends.base import AppState
from tfyarn.backends.yarn.backend import YarnBackend
from tfyarn.backends.yarn.states import app_state
from tfyarn.data.example import encode_example
from tfyarn.data.tfrecord import encode_record
from tfyarn.errors import AppNotFound, ExitCode, PreflightError
from tfyarn.gateway.preflight import QueueInfo
from tfyarn.tasklib.kv import put_json
from tfyarn.task.yarn.kv_yarn import SkeinKV, claim_task_index
from tfyarn.contracts import job_end

#: The diagnostics of an app tfyarn ended SUCCEEDED: the end record's line (job_end.with_record). YARN's SUCCEEDED
#: without it is no success of the job (issue 41).
DONE = job_end.with_record("tfyarn: every task reported done; application ended",
                           job_end.decide("task:chief:0", done=True, now=1.0))

APP = "application_1700000000000_0042"
T0 = datetime(2026, 1, 1, 12, 0, 0)


def report(state="RUNNING", final="UNDEFINED", diagnostics="", tags=("tfyarn",), app_id=APP, name="yarn-test"):
    res = skein.Resources(memory=0, vcores=0)
    return ApplicationReport(id=app_id, name=name, user="alice", queue="ml", tags=set(tags), host="am-host",
                             port=9000, tracking_url="http://rm/proxy/" + app_id, state=state, final_status=final,
                             progress=0.1, usage=ResourceUsageReport(0, 0, 0, res, res, res),
                             diagnostics=diagnostics, start_time=T0,
                             finish_time=None if state == "RUNNING" else T0 + timedelta(minutes=5))


def container(service, instance, state, minute=0, exit_message=""):
    return Container(service_name=service, instance=instance, state=state,
                     yarn_container_id=f"container_1700000000000_0042_01_{instance + 2:06d}",
                     yarn_node_http_address="node1:8042", start_time=T0 + timedelta(minutes=minute),
                     finish_time=None, exit_message=exit_message)


class FakeApp:
    def __init__(self, containers):
        self.am = FakeAM()
        self.kv = self.am.kv
        self.containers = containers

    def get_containers(self, services=None, states=None):
        return [c for c in self.containers if states is None or str(c.state) in states]

    def close(self):
        pass


class FakeRM:
    """skein.Client's surface that YarnBackend uses."""

    def __init__(self, reports, app=None):
        self.reports = {r.id: r for r in reports}
        self.app = app
        self.submitted = []
        self.killed = []

    def application_report(self, app_id):
        if app_id not in self.reports:
            raise skein.exceptions.ApplicationError(f"Application {app_id} not found")
        return self.reports[app_id]

    def connect(self, app_id, wait=True):
        if str(self.reports[app_id].state) != "RUNNING" or self.app is None:
            raise skein.exceptions.ApplicationNotRunningError(app_id)
        return self.app

    def submit(self, spec):
        assert isinstance(spec, skein.ApplicationSpec)
        self.submitted.append(spec)
        return APP

    def kill_application(self, app_id, user=""):
        self.killed.append(app_id)

    def get_applications(self, states=None, **kw):
        return [r for r in self.reports.values() if str(r.state) in states]


@pytest.mark.parametrize("yarn, final, diag, tasks, expected, code", [
    ("ACCEPTED", "UNDEFINED", "", None, AppState.PENDING, None),
    ("RUNNING", "UNDEFINED", "", ["RUNNING", "PENDING"], AppState.PENDING, None),
    ("RUNNING", "UNDEFINED", "", ["RUNNING", "RUNNING"], AppState.RUNNING, None),
    ("FINISHED", "SUCCEEDED", "", None, AppState.SUCCEEDED, ExitCode.SUCCEEDED),
    ("FINISHED", "FAILED", "Failure in service worker", None, AppState.FAILED, ExitCode.FAILED),
    ("FAILED", "FAILED", "AM container exited with 137", None, AppState.FAILED, ExitCode.FAILED),
    ("FINISHED", "KILLED", "", None, AppState.KILLED, ExitCode.KILLED),
    ("KILLED", "KILLED", "Application killed by user", None, AppState.KILLED, ExitCode.KILLED),
    ("FINISHED", "FAILED", "worker:1: timed out after 300s waiting for rendezvous", None, AppState.TIMED_OUT,
     ExitCode.TIMED_OUT),
    ("FINISHED", "FAILED", "Failure in service worker worker:0: timed out: waited 60s (timeouts.step) for workers",
     None, AppState.TIMED_OUT, ExitCode.TIMED_OUT),
    ("FINISHED", "UNDEFINED", "", None, AppState.FAILED, ExitCode.FAILED),
])
def test_state_and_exit_code_mapping(yarn, final, diag, tasks, expected, code):
    st = app_state(skein.model.ApplicationState(yarn), skein.model.FinalStatus(final), diag, tasks)
    assert st == expected
    assert (st.exit_code if st.is_terminal else None) == code


@pytest.fixture
def running(monkeypatch, tmp_path):
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"})
    cs = [container("ps", 0, "RUNNING"), container("chief", 0, "RUNNING"), container("worker", 0, "RUNNING"),
          container("worker", 1, "FAILED", exit_message="Exit code: 137, killed"),
          container("worker", 2, "RUNNING"), container("worker", 3, "RUNNING", minute=2)]
    app = FakeApp(cs)
    kv = SkeinKV(app.kv)
    for cid, n in (("worker_0", 0), ("worker_1", 1), ("worker_2", 2)):
        assert claim_task_index(kv, "worker", 3, cid) == n
    app.am.container_exited("worker_1")
    assert claim_task_index(kv, "worker", 3, "worker_3") == 1       # the replacement takes worker:1's slot
    kv.put("plan/total_steps", "100")
    put_json(kv, "progress/chief:0", {"step": 40, "global_step": 40, "examples_per_sec": 100.0, "loss": 0.4,
                                      "steps_per_sec": 2.0})
    put_json(kv, "progress/worker:0", {"step": 38, "global_step": 39, "examples_per_sec": 90.0, "loss": 0.6,
                                       "steps_per_sec": 2.0})
    rm = FakeRM([report()], app)
    b = YarnBackend(client=rm, cluster=StaticClusterInfo({"ml": QueueInfo("ml")}), preflight=False)
    records.save(APP, name=spec.name, spec=spec.to_json())
    return b, rm, app, kv


def test_running_status_from_containers_and_kv(running):
    b, rm, app, kv = running
    st = b.status(APP)
    assert st.state == AppState.RUNNING and st.backend == "yarn" and st.started == T0.timestamp()
    assert st.tags == ["tfyarn"]  # schedulers (Airflow retries) find their apps by tags
    tasks = {t.task: t for t in st.tasks}
    assert list(tasks) == ["ps:0", "chief:0", "worker:0", "worker:1", "worker:2"]
    assert tasks["worker:1"].state == "RUNNING" and tasks["worker:1"].restarts == 1
    assert tasks["worker:0"].restarts == 0 and tasks["worker:0"].host == "node1"
    assert st.progress["global_step"] == 40 and st.progress["total_steps"] == 100
    assert st.progress["examples_per_sec"] == 190.0 and st.progress["eta_s"] is None  # one sample: no rate yet
    time.sleep(1.1)  # the rate needs >= 1 s between samples
    for task in ("chief:0", "worker:0"):  # the global step moves on: the next status read has an ETA
        put_json(kv, f"progress/{task}", {"step": 60, "global_step": 60, "examples_per_sec": 95.0, "loss": 0.4})
    eta = b.status(APP).progress["eta_s"]
    assert eta is not None and eta > 0
    d = st.to_dict()
    assert d["schema"] == "tfyarn.status/1" and d["exit_code"] is None
    # side roles: the evaluator's newest result and the TensorBoard URL, live and (eval) joined to the summary
    put_json(kv, "eval/latest", {"checkpoint": "ckpt-60", "global_step": 60, "examples": 500, "loss": 0.5})
    kv.put("tensorboard/url", "http://node1:6006")
    st = b.status(APP)
    assert st.progress["eval"]["checkpoint"] == "ckpt-60" and st.progress["tensorboard_url"] == "http://node1:6006"
    assert st.summary is None                           # no summary before the chief writes it
    put_json(kv, "summary", {"mode": "ps", "global_step": 100})
    assert b.status(APP).summary == {"mode": "ps", "global_step": 100,
                                     "eval": {"checkpoint": "ckpt-60", "global_step": 60, "examples": 500, "loss": 0.5}}


def test_status_after_the_am_is_gone_uses_the_last_snapshot(running):
    b, rm, app, kv = running
    b.status(APP)                                       # a poll while running (what `wait` does every second)
    kv.put("failure/worker:2", "ValueError: bad record in part-3 at offset 77")
    b.status(APP)
    rm.reports[APP] = report("FINISHED", "FAILED", "Failure in service worker, see logs")
    b.conn._apps.clear()
    st = b.status(APP)
    assert st.state == AppState.FAILED and st.state.exit_code == 1
    assert st.diagnostics.startswith("worker:2: ValueError: bad record in part-3 at offset 77")
    assert "Failure in service worker" in st.diagnostics
    assert {t.task for t in st.tasks} >= {"worker:1", "worker:2"}
    assert all(t.state not in ("RUNNING", "PENDING") for t in st.tasks)
    assert st.progress["global_step"] == 40 and st.finished is not None
    fresh = YarnBackend(client=rm, preflight=False)     # another CLI process: reads the saved snapshot
    assert fresh.status(APP).diagnostics == st.diagnostics


def test_timed_out_from_task_failure_text(running):
    b, rm, app, kv = running
    kv.put("failure/chief:0", "timed out after 300s waiting for rendezvous: missing addr/worker:2")
    b.status(APP)
    rm.reports[APP] = report("FINISHED", "FAILED", "Failure in service chief")
    b.conn._apps.clear()
    assert b.status(APP).state == AppState.TIMED_OUT


def test_the_in_app_supervisors_timeout_mark_is_not_in_the_diagnosis(running):
    """It marks its shutdown "timed out: …" so the state is TIMED_OUT; the diagnosis then reads as a local one."""
    b, rm, app, kv = running
    b.status(APP)
    rm.reports[APP] = report("FINISHED", "FAILED", "timed out: training stalled: no task's step advanced for 15s")
    b.conn._apps.clear()
    st = b.status(APP)
    assert st.state == AppState.TIMED_OUT and st.state.exit_code == ExitCode.TIMED_OUT
    assert st.diagnostics.startswith("training stalled: no task's step advanced for 15s"), st.diagnostics


def test_unknown_app_kill_and_list(running):
    b, rm, app, kv = running
    with pytest.raises(AppNotFound):
        b.status("application_1_0001")
    with pytest.raises(AppNotFound):
        b.kill("application_1_0001")
    assert rm.killed == []
    b.kill(APP)
    assert rm.killed == [APP]
    rm.reports["application_1700000000000_0050"] = report(app_id="application_1700000000000_0050",
                                                          tags=("spark",), name="other")
    assert [s.app_id for s in b.list()] == [APP]


def test_submit_runs_preflight_first_and_saves_the_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TFYARN_CACHE_DIR", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    # one global batch (4 x 4 training tasks): preflight counts the records before submitting
    fs.pipe("/sub/data/part-0.tfrecord", encode_record(encode_example({"label": 1.0})) * 16)
    spec = make_spec(environment={"python": "/opt/py/bin/python"},
                     data={"train": ["memory:///sub/data/part-*.tfrecord"], "batch_size": 4,
                           "features": {"label": {"dtype": "float32"}}})
    rm = FakeRM([report()])
    small = StaticClusterInfo({"ml": QueueInfo("ml", max_memory_mib=2048)}, max_memory_mib=8192, max_vcores=8)
    b = YarnBackend(client=rm, cluster=small, staging_dir="memory:///sub/staging")
    with pytest.raises(PreflightError) as ei:
        b.submit(spec)
    assert "roles.worker.memory: 4096 MiB exceeds the maximum container size of queue 'ml' (2048 MiB)" in str(ei.value)
    assert rm.submitted == [] and not (tmp_path / "cache").exists()
    b.submitter.cluster = StaticClusterInfo({"ml": QueueInfo("ml")}, max_memory_mib=8192, max_vcores=8)
    assert b.submit(spec) == APP
    sent = rm.submitted[0]
    assert sent.services["worker"].instances == 3 and "tfyarn" in sent.tags
    assert records.load(APP)["spec"] == spec.to_json()


def _backend(rm, staging):
    """A YarnBackend on the fake RM that submits (no preflight), staging under ``staging``."""
    return YarnBackend(client=rm, preflight=False, staging_dir=str(staging))


class SequenceRM(FakeRM):
    """Each submit is a new application; each ends in the next of ``outcomes`` (YARN state, final status, diag)."""

    def __init__(self, outcomes):
        super().__init__([])
        self.outcomes = list(outcomes)

    def submit(self, spec):
        self.submitted.append(spec)
        app_id = f"application_1700000000000_{len(self.submitted):04d}"
        state, final, diag = self.outcomes[len(self.submitted) - 1]
        self.reports[app_id] = report(state, final, diag, app_id=app_id, tags=tuple(spec.tags))  # as YARN keeps them
        return app_id


def test_run_submits_a_new_attempt_after_a_failure_and_stops_on_success(tmp_path, monkeypatch):
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"}, retry={"max_attempts": 3, "backoff": 0.1})
    rm = SequenceRM([("FINISHED", "FAILED", "Failure in service ps: ps:0 lost"), ("FINISHED", "SUCCEEDED", DONE)])
    st = runner.run(_backend(rm, tmp_path / "staging"), spec, poll=0.01)
    assert st.state is AppState.SUCCEEDED and st.attempt == 1
    assert [a.services["chief"].env["TFYARN_ATTEMPT"] for a in rm.submitted] == ["0", "1"]
    assert "earlier attempts: application_1700000000000_0001: Failure in service ps: ps:0 lost" in st.diagnostics
    # `tfyarn status --output json` of each application, from another process: the retry's says attempt 1
    other = YarnBackend(client=rm, preflight=False)
    assert [other.status(f"application_1700000000000_000{n}").to_dict()["attempt"] for n in (1, 2)] == [0, 1]
    assert [s.attempt for s in other.list(all_states=True)] == [0, 1]


def test_run_attempts_are_bounded_and_a_kill_is_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"}, retry={"max_attempts": 2, "backoff": 0.1})
    failing = SequenceRM([("FINISHED", "FAILED", "boom 1"), ("FINISHED", "FAILED", "boom 2")])
    st = runner.run(_backend(failing, tmp_path / "s"), spec, poll=0.01)
    assert st.state is AppState.FAILED and st.attempt == 1 and len(failing.submitted) == 2
    killed = SequenceRM([("KILLED", "KILLED", "Application killed by user")])
    st = runner.run(_backend(killed, tmp_path / "s"), spec, poll=0.01)
    assert st.state is AppState.KILLED and len(killed.submitted) == 1


class KillableRM(SequenceRM):
    """Applications stay RUNNING until killed (then KILLED, as YARN reports a kill)."""

    def kill_application(self, app_id, user=""):
        super().kill_application(app_id, user)
        self.reports[app_id] = report("KILLED", "KILLED", "Application killed by user", app_id=app_id)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_run_stopped_by_a_signal_kills_the_application_it_started(tmp_path, monkeypatch, signame):
    """A scheduler cancelling `tfyarn run --yarn` (SIGTERM), Ctrl-C or a closed terminal must not leave the YARN
    application running with nobody following it."""
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"}, retry={"max_attempts": 3, "backoff": 0.1})
    sig = getattr(signal, signame)
    before = signal.getsignal(sig)

    class StoppedOnceSubmitted(KillableRM):
        def submit(self, spec):     # not a timer from the test's start: on a loaded box it fired before the submit
            threading.Timer(0.1, os.kill, (os.getpid(), sig)).start()
            return super().submit(spec)
    rm = StoppedOnceSubmitted([("RUNNING", "UNDEFINED", "")])
    st = runner.run(_backend(rm, tmp_path / "s"), spec, poll=0.01)
    assert rm.killed == ["application_1700000000000_0001"] and len(rm.submitted) == 1   # killed, not retried
    assert st.state is AppState.KILLED and st.state.exit_code == ExitCode.KILLED
    assert st.diagnostics == f"interrupted by {signame}: killed application_1700000000000_0001"
    assert signal.getsignal(sig) is before                                               # handlers put back


def test_a_stop_during_the_submit_call_kills_the_application_it_created(tmp_path, monkeypatch):
    """SIGTERM while skein's submit runs: the application exists once the call returns, so it is held back until
    then and the new application is killed (it used to be orphaned: the signal cut the call, no id to kill)."""
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"}, retry={"max_attempts": 3, "backoff": 0.1})

    class SignalDuringSubmit(KillableRM):
        def submit(self, spec):
            os.kill(os.getpid(), signal.SIGTERM)        # arrives while the RM is creating the application
            time.sleep(0.2)
            return super().submit(spec)
    rm = SignalDuringSubmit([("RUNNING", "UNDEFINED", "")])
    st = runner.run(_backend(rm, tmp_path / "s"), spec, poll=0.01)
    assert rm.killed == ["application_1700000000000_0001"] and len(rm.submitted) == 1
    assert st.state is AppState.KILLED
    assert st.diagnostics == "interrupted by SIGTERM: killed application_1700000000000_0001"


def test_run_stopped_before_its_first_submit_returned_exits_with_the_signal(tmp_path, monkeypatch):
    """E.g. SIGTERM while the environment is being packed: nothing to kill; the CLI says so, exit 128 + signal."""
    from click.testing import CliRunner

    from tfyarn.cli import cli
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))

    def slow_schedule(self, request):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("the signal did not interrupt the submit")
    monkeypatch.setattr(YarnBackend, "schedule", slow_schedule)
    monkeypatch.setattr("tfyarn.api.get_backend", lambda name=None: _Ctx(YarnBackend(client=FakeRM([]),
                                                                                    preflight=False)))
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(make_spec(environment={"python": "/opt/py/bin/python"}).model_dump_json(by_alias=True))
    r = CliRunner().invoke(cli, ["run", str(spec_path), "--yarn"])
    assert r.exit_code == 128 + signal.SIGTERM, r.output
    assert "interrupted by SIGTERM: stopped before anything was submitted" in r.output


class _Ctx:
    def __init__(self, b):
        self.b = b

    def __enter__(self):
        return self.b

    def __exit__(self, *exc):
        return False


def test_run_stopped_after_its_application_ended_reports_that_outcome(tmp_path, monkeypatch):
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"})
    rm = SequenceRM([("FINISHED", "SUCCEEDED", DONE)])
    b = YarnBackend(client=rm, preflight=False, staging_dir=str(tmp_path / "s"))
    from tfyarn.common.interrupts import Interrupted
    b.submit(spec)
    st = stop_app(b, "application_1700000000000_0001", Interrupted("SIGTERM"), spec)
    assert st.state is AppState.SUCCEEDED and rm.killed == []


def test_unallocated_containers_time_out_with_the_queue_state(monkeypatch, tmp_path):
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"}, timeouts={"allocation": "0.3s"})
    cs = [container("ps", 0, "RUNNING"), container("chief", 0, "RUNNING"), container("worker", 0, "RUNNING"),
          container("worker", 1, "REQUESTED"), container("worker", 2, "REQUESTED")]
    rm = FakeRM([report()], FakeApp(cs))
    rm.get_queue = lambda name: skein.model.Queue(name, "RUNNING", 20.0, 40.0, 99.5, set(), "")
    b = YarnBackend(client=rm, preflight=False)
    records.save(APP, name=spec.name, spec=spec.to_json())
    t0 = time.monotonic()
    st = runner.wait(b, APP, timeout=30, poll=0.05)
    assert time.monotonic() - t0 < 10
    assert st.state is AppState.TIMED_OUT and st.state.exit_code == ExitCode.TIMED_OUT
    assert st.diagnostics == ("containers not allocated within 0.3s (timeouts.allocation): worker:1, worker:2 "
                              "still pending; queue 'ml' is RUNNING at 100% of its capacity (capacity 20%, max 40%)")
    assert rm.killed == [APP]
    rm.reports[APP] = report("KILLED", "KILLED", "Application killed by user")
    later = YarnBackend(client=rm, preflight=False).status(APP)  # another process asks later: still the deadline
    assert later.state is AppState.TIMED_OUT and "timeouts.allocation" in later.diagnostics


def test_a_followed_job_gets_a_run_report(running, tmp_path):
    from tfyarn import api
    b, rm, app, kv = running
    b.status(APP)  # followed while it runs: progress recorded
    put_json(kv, "progress/chief:0", {"step": 90, "global_step": 90, "examples_per_sec": 110.0, "loss": 0.2,
                                      "time": 2.0})
    b.status(APP)
    rm.reports[APP] = report("FINISHED", "SUCCEEDED", DONE)
    st = runner.wait(b, APP, timeout=10, poll=0.01)
    assert st.state is AppState.SUCCEEDED
    rep, png = api.report(APP)
    assert rep["app_id"] == APP and rep["state"] == "SUCCEEDED"
    assert rep["tasks"]["chief:0"]["last_loss"] == 0.2


def _followed_app(monkeypatch, tmp_path, stall: str):
    """A running app (every container RUNNING, its KV on FakeAM) submitted by this backend: (spec, kv, rm, b)."""
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"}, timeouts={"stall": stall})
    app = FakeApp([container(r, i, "RUNNING") for r in spec.roles for i in range(spec.instances(r))])
    rm = FakeRM([report()], app)
    b = YarnBackend(client=rm, preflight=False)
    records.save(APP, name=spec.name, spec=spec.to_json())
    return spec, SkeinKV(app.kv), rm, b


def test_a_followed_job_whose_training_stops_is_killed_timed_out_naming_the_tasks(monkeypatch, tmp_path):
    """On YARN the follower (run, submit --wait, wait) is the stall watchdog the local launcher is: no training
    task's step advancing for timeouts.stall kills the app, after asking every task for its stacks."""
    from tfyarn.tasklib.watchdog import DUMP_REQUEST_KEY
    spec, kv, rm, b = _followed_app(monkeypatch, tmp_path, stall="0.5s")
    for t in spec.training_tasks:
        put_json(kv, f"progress/{t}", {"step": 3, "global_step": 3, "time": 1.0})
    t0 = time.monotonic()
    st = runner.wait(b, APP, timeout=30, poll=0.05)
    took = time.monotonic() - t0
    assert st.state is AppState.TIMED_OUT and st.state.exit_code == ExitCode.TIMED_OUT, st.diagnostics
    assert st.diagnostics.startswith("training stalled: no task's step advanced for") and \
        "(timeouts.stall = 0.5s)" in st.diagnostics, st.diagnostics
    assert all(f"{t} at step 3" in st.diagnostics for t in spec.training_tasks), st.diagnostics
    assert kv.get(DUMP_REQUEST_KEY) is not None            # every task was asked for its stacks
    assert rm.killed == [APP] and 0.5 <= took < 10, took


def test_a_followed_job_that_advances_is_not_a_stall(monkeypatch, tmp_path):
    spec, kv, rm, b = _followed_app(monkeypatch, tmp_path, stall="0.5s")
    stop = threading.Event()

    def train():
        step = 0
        while not stop.wait(0.1):
            step += 1
            put_json(kv, f"progress/{spec.training_tasks[0]}", {"step": step, "global_step": step, "time": step})
            if step == 20:
                rm.reports[APP] = report("FINISHED", "SUCCEEDED", DONE)
    t = threading.Thread(target=train, daemon=True)
    t.start()
    try:
        st = runner.wait(b, APP, timeout=30, poll=0.05)
    finally:
        stop.set()
        t.join(5)
    assert st.state is AppState.SUCCEEDED and rm.killed == []


def test_a_stale_global_driver_record_is_dropped_not_fatal(monkeypatch):
    """~/.skein/driver naming a dead driver (after a reboot) made from_global_driver raise ConnectionError, which
    nothing caught: every YARN command failed. It is forgotten and a driver started instead (a private one here:
    TFYARN_DRIVER_IDLE=0 turns the shared one off)."""
    calls = []
    monkeypatch.setenv("TFYARN_DRIVER_IDLE", "0")

    def dead():
        raise skein.exceptions.ConnectionError("Unable to connect to driver at localhost:43567")
    monkeypatch.setattr(skein.Client, "from_global_driver", staticmethod(dead))
    monkeypatch.setattr(skein.Client, "stop_global_driver", staticmethod(lambda force=False: calls.append(force)))
    def private(self, **kw):
        self._proc = None                                # nothing to stop when it is collected
        calls.append(("private", kw))
    monkeypatch.setattr(skein, "Client", type("PrivateClient", (skein.Client,), {"__init__": private}))
    monkeypatch.setenv("HADOOP_CONF_DIR", "/etc/hadoop/conf")
    b = YarnBackend()
    client = b.client()
    jit = {"java_options": ["-XX:TieredStopAtLevel=1"]}
    assert type(client).__name__ == "PrivateClient" and calls == [True, ("private", {"log": False, **jit})]


def test_staging_tokens_and_kill_follow_the_cluster_and_the_proxy_user(monkeypatch, tmp_path):
    """The default staging dir is qualified against fs.defaultFS (a host-less hdfs:/// broke viewfs clusters);
    every filesystem a task touches gets a delegation token (init_from, export.dir and the staging dir were left
    out); a job submitted for a proxy user is killed as that user."""
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HADOOP_USER_NAME", "alice")
    monkeypatch.delenv("TFYARN_STAGING_DIR", raising=False)
    b = YarnBackend(client=FakeRM([report()]), preflight=False)
    b.conn.conf = {"fs.defaultFS": "viewfs://cluster"}
    assert b.staging_dir == "viewfs://cluster/user/alice/.tfyarn"
    b.conn.conf = {"fs.defaultFS": "hdfs://ns1"}
    assert b.staging_dir == "hdfs://ns1/user/alice/.tfyarn"
    b.conn._staging_opt = "hdfs://staging-ns/tmp/tfyarn"
    spec = make_spec(environment={"python": "/opt/py/bin/python"},
                     checkpoint={"dir": "hdfs://ns1/ckpt", "init_from": "hdfs://old-ns/ckpt"},
                     export={"dir": "hdfs://serving-ns/models"})
    app = b.dryrun(spec).app
    assert set(app.file_systems) == {"hdfs://old-ns", "hdfs://serving-ns", "hdfs://staging-ns"}
    rm = b.client()
    records.save(APP, name=spec.name, spec=spec.to_json())
    users = []
    rm.kill_application = lambda app_id, user="": users.append((app_id, user))
    b.kill(APP)
    assert users == [(APP, "alice")]                       # make_spec's spec.user


def _app_with_workers(monkeypatch, tmp_path, containers):
    """A running app of make_spec() (ps, chief, 3 workers with restarts) on FakeAM; the first containers of each
    role have claimed their tasks. Returns (backend, rm, app, kv)."""
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"})
    app = FakeApp(containers)
    kv = SkeinKV(app.kv)
    for c in containers:
        if c.instance < spec.instances(c.service_name):
            assert claim_task_index(kv, c.service_name, spec.instances(c.service_name),
                                    f"{c.service_name}_{c.instance}") == c.instance
    rm = FakeRM([report()], app)
    b = YarnBackend(client=rm, preflight=False)
    records.save(APP, name=spec.name, spec=spec.to_json())
    return b, rm, app, kv


def test_a_restarting_worker_is_itself_restarting_never_a_phantom_task(monkeypatch, tmp_path):
    """kill -9 of worker:1 (skein's worker_1): its replacement container worker_3 has not claimed a task yet. The
    status showed `worker:3 PENDING` beside `worker:1 FAILED`; it is worker:1, PENDING, restarts 1."""
    from tfyarn.task.yarn.kv_yarn import restarts_before
    w1 = container("worker", 1, "RUNNING")
    cs = [container("ps", 0, "RUNNING"), container("chief", 0, "RUNNING"), container("worker", 0, "RUNNING"), w1,
          container("worker", 2, "RUNNING")]
    b, rm, app, kv = _app_with_workers(monkeypatch, tmp_path, cs)
    # the container script reported the death before the application master heard of it
    put_json(kv, "exit/worker:1", {"code": 137, "died_at": 1.0, "container": w1.yarn_container_id})
    tasks = {t.task: t for t in b.status(APP).tasks}
    assert tasks["worker:1"].state == "FAILED" and tasks["worker:1"].exit_code == 137
    assert tasks["worker:1"].diagnostics == "exit code 137 (killed by SIGKILL)"
    # the AM has heard: worker_1 FAILED (skein's message has no exit code), worker_3 requested in its place
    app.containers[3] = container("worker", 1, "FAILED", exit_message="Container failed during execution, see "
                                                                      "logs for more information.")
    app.containers.append(Container(service_name="worker", instance=3, state="REQUESTED", yarn_container_id="",
                                    yarn_node_http_address="", start_time=None, finish_time=None, exit_message=""))
    app.am.container_exited("worker_1")
    st = b.status(APP)
    assert [t.task for t in st.tasks] == ["ps:0", "chief:0", "worker:0", "worker:1", "worker:2"]
    tasks = {t.task: t for t in st.tasks}
    assert tasks["worker:1"].state == "PENDING" and tasks["worker:1"].restarts == 1
    assert st.state is AppState.PENDING                        # a task waits for its container
    # it runs and claims worker:1's slot: restart 1 of worker:1 (what the rejoin reports)
    app.containers[-1] = container("worker", 3, "RUNNING", minute=3)
    assert claim_task_index(kv, "worker", 3, "worker_3") == 1
    assert restarts_before(kv, "worker:1", "worker_3") == 1 and restarts_before(kv, "worker:0", "worker_0") == 0
    st = b.status(APP)
    tasks = {t.task: t for t in st.tasks}
    assert [t.task for t in st.tasks] == ["ps:0", "chief:0", "worker:0", "worker:1", "worker:2"]
    assert tasks["worker:1"].state == "RUNNING" and tasks["worker:1"].restarts == 1
    assert tasks["worker:1"].exit_code is None and st.state is AppState.RUNNING


def test_the_tasks_that_died_are_named_with_their_exit_codes_after_the_end(monkeypatch, tmp_path):
    """kill -9 of ps:0: every task showed KILLED, exit_code null, and the diagnosis was skein's 'Failure in service'.
    The exit records the follower saw, or the diagnosis the container script gave the application, name them."""
    cs = [container("ps", 0, "RUNNING"), container("chief", 0, "RUNNING"), container("worker", 0, "RUNNING"),
          container("worker", 1, "RUNNING"), container("worker", 2, "RUNNING")]
    b, rm, app, kv = _app_with_workers(monkeypatch, tmp_path, cs)
    put_json(kv, "exit/ps:0", {"code": 137, "died_at": 10.0, "container": cs[0].yarn_container_id})
    kv.put("failure/chief:0", "UnavailableError: Socket closed")
    put_json(kv, "exit/chief:0", {"code": 1, "died_at": 12.0, "container": cs[1].yarn_container_id,
                                  "failure": "UnavailableError: Socket closed"})
    b.status(APP)                                              # the follower's last poll before the AM went away
    rm.reports[APP] = report("FINISHED", "FAILED", "Failure in service ps, see logs for more information.")
    b.conn._apps.clear()
    st = b.status(APP)
    assert st.state is AppState.FAILED
    assert st.diagnostics == ("ps:0: exit code 137 (killed by SIGKILL); chief:0: exit code 1: UnavailableError: "
                              "Socket closed\nFailure in service ps, see logs for more information.")
    tasks = {t["task"]: t for t in st.to_dict()["tasks"]}
    assert (tasks["ps:0"]["state"], tasks["ps:0"]["exit_code"]) == ("FAILED", 137)
    assert (tasks["chief:0"]["state"], tasks["chief:0"]["exit_code"]) == ("FAILED", 1)
    assert tasks["worker:0"]["state"] == "KILLED" and tasks["worker:0"]["exit_code"] is None


def test_the_diagnosis_the_container_gave_the_application_names_the_tasks_without_a_follower(monkeypatch, tmp_path):
    cs = [container("ps", 0, "RUNNING"), container("chief", 0, "RUNNING"), container("worker", 0, "RUNNING"),
          container("worker", 1, "RUNNING"), container("worker", 2, "RUNNING")]
    b, rm, app, kv = _app_with_workers(monkeypatch, tmp_path, cs)
    b.status(APP)                                              # the last poll saw no failure yet
    diag = "chief:0: exit code 137 (killed by SIGKILL); worker:2: exit code 1: UnavailableError: chief:0 gone"
    rm.reports[APP] = report("FINISHED", "FAILED", diag)
    b.conn._apps.clear()
    st = YarnBackend(client=rm, preflight=False).status(APP)   # another process, after the end
    assert st.diagnostics == diag and st.state is AppState.FAILED
    tasks = {t.task: t for t in st.tasks}
    assert (tasks["chief:0"].state, tasks["chief:0"].exit_code) == ("FAILED", 137)
    assert (tasks["worker:2"].state, tasks["worker:2"].exit_code) == ("FAILED", 1)
    assert tasks["ps:0"].state == "KILLED"


def test_an_app_ended_with_nobody_reading_its_kv_is_judged_by_the_record_in_its_diagnostics(monkeypatch, tmp_path):
    """A bare submit whose task ended the app: its KV (control/end) is gone, no snapshot holds the record; the line
    the ender appended to YARN's diagnostics (contracts.job_end.with_record) gives the state, the diagnosis and the
    tasks' exit codes exactly — its text names no code for a regex to find — and is not shown to people."""
    from tfyarn.contracts import job_end
    from tfyarn.task.yarn import app_end
    cs = [container("ps", 0, "RUNNING"), container("chief", 0, "RUNNING"), container("worker", 0, "RUNNING"),
          container("worker", 1, "RUNNING"), container("worker", 2, "RUNNING")]
    b, rm, app, kv = _app_with_workers(monkeypatch, tmp_path, cs)
    b.status(APP)                                              # the last poll saw no failure and no record
    end = job_end.decide("failed-task:chief:0", failure="chief:0 died; worker:2 lost it",
                         exits={"chief:0": {"code": 137}, "worker:2": {"code": 1}})
    rm.reports[APP] = report("FINISHED", "FAILED", job_end.with_record("Failure in service chief", end))
    b.conn._apps.clear()
    st = YarnBackend(client=rm, preflight=False).status(APP)   # another process, after the end
    assert st.state is AppState.FAILED and st.diagnostics == "chief:0 died; worker:2 lost it"
    tasks = {t.task: t for t in st.tasks}
    assert (tasks["chief:0"].state, tasks["chief:0"].exit_code) == ("FAILED", 137)
    assert (tasks["worker:2"].state, tasks["worker:2"].exit_code) == ("FAILED", 1)
    assert [t for t in tasks if tasks[t].state == "KILLED"] == ["ps:0", "worker:0", "worker:1"]
    done = job_end.with_record(app_end.DONE_DIAGNOSTICS, job_end.decide("task:worker:1", done=True))
    rm.reports[APP] = report("FINISHED", "SUCCEEDED", done)
    st = YarnBackend(client=rm, preflight=False).status(APP)
    assert st.state is AppState.SUCCEEDED and st.diagnostics == "", st.diagnostics
    assert {t.state for t in st.tasks} == {"SUCCEEDED"}
    rm.reports[APP] = report("KILLED", "KILLED", job_end.with_record("Application killed by user.", end))
    st = YarnBackend(client=rm, preflight=False).status(APP)   # killed from outside after the record: YARN's word
    assert st.state is AppState.KILLED and "tfyarn-end" not in st.diagnostics, st.diagnostics


def test_a_task_that_raised_is_failed_with_its_code_though_the_shutdown_it_asked_for_killed_its_container(
        monkeypatch, tmp_path):
    """worker:0 raised; its container script reported exit 1 and shut the app down, which killed that very container
    (still running the report): skein says KILLED. The last snapshot, and the status after the end, showed
    `worker:0 KILLED`; it is FAILED with exit code 1, the others KILLED."""
    cs = [container("ps", 0, "RUNNING"), container("chief", 0, "RUNNING"), container("worker", 0, "RUNNING"),
          container("worker", 1, "RUNNING"), container("worker", 2, "RUNNING")]
    b, rm, app, kv = _app_with_workers(monkeypatch, tmp_path, cs)
    kv.put("failure/worker:0", "RuntimeError: boom from worker:0")
    put_json(kv, "exit/worker:0", {"code": 1, "died_at": 10.0, "container": cs[2].yarn_container_id,
                                   "failure": "RuntimeError: boom from worker:0"})
    app.containers = [container(c.service_name, c.instance, "KILLED") for c in cs]   # the shutdown under way
    tasks = {t.task: t for t in b.status(APP).tasks}
    assert (tasks["worker:0"].state, tasks["worker:0"].exit_code) == ("FAILED", 1)
    assert tasks["worker:0"].diagnostics == "RuntimeError: boom from worker:0"
    assert all(tasks[t].state == "KILLED" for t in ("ps:0", "chief:0", "worker:1", "worker:2"))
    rm.reports[APP] = report("FINISHED", "FAILED", "worker:0: exit code 1: RuntimeError: boom from worker:0")
    b.conn._apps.clear()
    for backend in (b, YarnBackend(client=rm, preflight=False)):   # the follower, and another process after the end
        st = backend.status(APP)
        tasks = {t.task: t for t in st.tasks}
        assert st.state is AppState.FAILED
        assert (tasks["worker:0"].state, tasks["worker:0"].exit_code) == ("FAILED", 1), backend
        assert [t.task for t in st.tasks if t.state == "KILLED"] == ["ps:0", "chief:0", "worker:1", "worker:2"]


def test_run_stopped_after_training_completed_says_so_in_its_diagnosis(monkeypatch, tmp_path):
    """The local launcher's diagnosis of a job stopped from outside says whether training had completed and what was
    written (supervisor.training_end_note); `run --yarn` said only 'interrupted by SIGTERM: killed …'."""
    from tfyarn.common.interrupts import Interrupted
    cs = [container("ps", 0, "RUNNING"), container("chief", 0, "RUNNING"), container("worker", 0, "RUNNING"),
          container("worker", 1, "RUNNING"), container("worker", 2, "RUNNING")]
    b, rm, app, kv = _app_with_workers(monkeypatch, tmp_path, cs)

    def kill_application(app_id, user=""):
        rm.killed.append(app_id)
        rm.reports[app_id] = report("KILLED", "KILLED", "Application killed by user")
    rm.kill_application = kill_application
    kv.put("plan/total_steps", "40")
    for t in ("chief:0", "worker:0", "worker:1", "worker:2"):
        put_json(kv, f"progress/{t}", {"step": 10, "global_step": 40, "loss": 0.5})
    st = stop_app(b, APP, Interrupted("SIGTERM"), records.saved_spec(APP))   # the chief has not written its summary yet
    assert rm.killed == [APP] and st.state is AppState.KILLED
    assert st.diagnostics == (f"interrupted by SIGTERM: killed {APP}; training had completed (global step 40/40): "
                              "the summary was not written (no checkpoint.dir)")
    rm.reports[APP] = report()                              # a second job, stopped mid-training: no note
    b.conn._apps.clear()
    for t in ("chief:0", "worker:0", "worker:1", "worker:2"):
        put_json(kv, f"progress/{t}", {"step": 2, "global_step": 8, "loss": 0.5})
    records.save(APP, final=None)
    st = stop_app(b, APP, Interrupted("SIGINT"), records.saved_spec(APP))
    assert st.diagnostics == f"interrupted by SIGINT: killed {APP}"


def test_an_error_while_following_kills_the_application_and_propagates(tmp_path, monkeypatch):
    """Not only a stop: any exception out of `run` (here the caller's own update hook) kills the
    application it started (runner/owned.py), recording why, and the error reaches the caller."""
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = make_spec(environment={"python": "/opt/py/bin/python"})
    rm = KillableRM([("RUNNING", "UNDEFINED", "")])

    def broken(st):
        raise RuntimeError("display broke")
    with pytest.raises(RuntimeError, match="display broke"):
        runner.run(_backend(rm, tmp_path / "s"), spec, poll=0.01, on_update=broken)
    assert rm.killed == ["application_1700000000000_0001"] and len(rm.submitted) == 1


def test_a_shared_driver_that_died_is_replaced_on_the_next_call(monkeypatch):
    """A long-lived backend (a scheduler, the YARN test session) kept the client of a shared driver whose JVM had
    died (UNAVAILABLE on every later call: a CI run failed 18 tests so); the next call joins or starts another."""
    from tfyarn.backends.yarn import connection as conn_mod

    class FakeRecord:   # driver.Record's fields the connection reads (alive: a property there too)
        def __init__(self, alive):
            self.alive, self.jvm_pid = alive, 4242

    class FakeLease:
        def __init__(self, name, alive):
            self.client, self.record, self.released = name, FakeRecord(alive), False

        def release(self):
            self.released = True

    dead, fresh = FakeLease("dead driver's client", False), FakeLease("new driver's client", True)
    # the dead one's record is a real one, of processes that are gone
    dead.record = conn_mod.skein_driver.Record(key="k", address="127.0.0.1:1", jvm_pid=2**22 + 7, keeper_pid=2**22 + 9,
                                               keeper_started="", user="u", principal="", hadoop_conf_dir="",
                                               idle_s=1.0, started=0.0, log="")
    acquired = []
    monkeypatch.setattr(conn_mod.skein_driver, "acquire", lambda ident, kw, env=None: acquired.append(1) or fresh)
    monkeypatch.setattr(skein.Client, "from_global_driver",
                        staticmethod(lambda: (_ for _ in ()).throw(skein.exceptions.DriverNotRunningError("none"))))
    monkeypatch.setenv("HADOOP_CONF_DIR", "/etc/hadoop/conf")
    b = YarnBackend()
    b.conn._lease, b.conn._client = dead, dead.client
    assert b.client() == "new driver's client" and dead.released and acquired == [1]
    assert b.client() == "new driver's client" and acquired == [1]      # a live one is kept
