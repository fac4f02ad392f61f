"""The in-app supervisor's decisions without a cluster (tfyarn.runner.yarn_app.supervise): real skein Container objects,
the job's KV in memory, a fake clock; the cluster suite (test_cluster_supervised.py) runs it inside real apps."""
import json
import os
import subprocess
import sys
import time
from datetime import datetime

from skein.model import Container

from yarnutil import make_spec
from tfyarn.backends.base import AppState
from tfyarn.backends.yarn.appspec import SUPERVISOR_SERVICE
from tfyarn.runner.yarn_app.attempts import ACTIVE
from tfyarn.backends.yarn.states import app_state
from tfyarn.contracts.in_app import no_more_attempts_note
from tfyarn.runner.yarn_app.supervise import InAppSupervisor
from tfyarn.contracts import job_end
from tfyarn.task.yarn import app_end
from tfyarn.tasklib.kv import MemoryKV
from tfyarn.task.yarn.kv_yarn import mark_slot_done

APP = "application_1700000000000_0042"
ROLES = {"chief": {"instances": 1}, "worker": {"instances": 1}}


def people(shutdowns):
    """The shutdowns' diagnostics without the end record's line (contracts.job_end.with_record)."""
    return [(status, job_end.from_diagnostics(diag)[1]) for status, diag in shutdowns]


def container(service, instance, state):
    return Container(service_name=service, instance=instance, state=state,
                     yarn_container_id=f"container_1700000000000_0042_01_{hash((service, instance)) % 10**6:06d}",
                     yarn_node_http_address="node1:8042", start_time=datetime(2026, 1, 1), finish_time=None,
                     exit_message="")


class App:
    """skein.ApplicationClient's surface the supervisor uses."""

    def __init__(self, states):
        self.containers = [container(SUPERVISOR_SERVICE, 0, "RUNNING")]
        self.containers += [container(s, 0, st) for s, st in states.items()]
        self.shutdowns, self.killed, self.scaled = [], [], []

    def get_containers(self, services=None, states=None):
        return [c for c in self.containers if (states is None or str(c.state) in states)
                and (services is None or c.service_name in services)]

    def shutdown(self, status, diagnostics):
        self.shutdowns.append((status, diagnostics))

    def kill_container(self, id):
        c = next(c for c in self.containers if c.id == id)
        c.state = "KILLED"
        self.killed.append(id)

    def scale(self, service, count):
        n = max((c.instance for c in self.containers if c.service_name == service), default=-1) + 1
        active = [c for c in self.containers if c.service_name == service and str(c.state) in ACTIVE]
        for i in range(count - len(active)):
            self.containers.append(container(service, n + i, "REQUESTED"))
        self.scaled.append((service, count))


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def supervisor(tmp_path, states, **spec_over):
    spec = make_spec(**{"roles": ROLES, "mode": "allreduce", **spec_over})
    app, kv, clock = App(states), MemoryKV(), Clock()
    sup = InAppSupervisor(spec, app, kv, APP, started=clock.t, clock=clock, report_dir=tmp_path, ack_wait_s=0.2)
    sup.container_gone = lambda nm, cid: True               # the NodeManagers stopped what was killed
    sup.publish()
    return sup, app, kv, clock


def test_active_deadline_ends_the_app_timed_out_naming_it(tmp_path):
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "RUNNING", "worker": "RUNNING"},
                                     timeouts={"active_deadline": 60, "stall": 600})
    kv.put("progress/chief:0", json.dumps({"step": 3, "global_step": 3, "loss": 0.5, "time": clock.t}))
    assert sup.round() is False and app.shutdowns == []
    assert kv.get(app_end.SUPERVISOR_KEY) is not None and json.loads(kv.get("spec"))["name"] == "yarn-test"
    assert [t["task"] for t in sup.snap["tasks"]] == ["chief:0", "worker:0"]   # the supervisor is no task
    clock.t += 61
    assert sup.round() is True
    [(status, diag)] = app.shutdowns
    assert status == "FAILED" and "timeouts.active_deadline" in diag
    assert app_state("FINISHED", "FAILED", diag) is AppState.TIMED_OUT
    assert json.loads((tmp_path / "report.json").read_text())["state"] == "TIMED_OUT"


def test_task_containers_pending_past_the_allocation_timeout_are_named(tmp_path):
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "RUNNING", "worker": "REQUESTED"},
                                     timeouts={"allocation": 30, "stall": 600})
    assert sup.round() is False
    clock.t += 31
    assert sup.round() is True
    [(status, diag)] = app.shutdowns
    assert status == "FAILED" and "timeouts.allocation" in diag and "worker:0 still pending" in diag, diag
    assert "chief:0" not in diag and app_state("FINISHED", "FAILED", diag) is AppState.TIMED_OUT


def test_a_stall_asks_for_stacks_through_the_kv_and_names_the_stopped_task(tmp_path):
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "RUNNING", "worker": "RUNNING"},
                                     timeouts={"stall": 60, "rendezvous": 60})
    kv.put("progress/chief:0", json.dumps({"step": 5}))
    kv.put("progress/worker:0", json.dumps({"step": 5}))
    assert sup.round() is False
    clock.t += 30
    kv.put("progress/chief:0", json.dumps({"step": 9}))    # the chief advances, then both stop
    assert sup.round() is False
    clock.t += 61
    assert sup.round() is True
    [(status, diag)] = app.shutdowns
    assert status == "FAILED" and "timeouts.stall" in diag and "worker:0 at step 5" in diag, diag
    assert kv.get("control/dump_stacks") is not None           # every task was asked for its stacks
    assert app_state("FINISHED", "FAILED", diag) is AppState.TIMED_OUT


def test_every_task_done_writes_the_report_then_ends_the_app(tmp_path):
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "RUNNING", "worker": "RUNNING"})
    kv.put("progress/chief:0", json.dumps({"step": 3, "global_step": 3, "loss": 0.5, "time": clock.t}))
    assert sup.round() is False
    for t in ("chief:0", "worker:0"):
        mark_slot_done(kv, t)
    # the last task leaves the end to a live supervisor (after its report), not to itself
    assert app_end.finish_if_last(kv, ["chief:0", "worker:0"], "worker:0", lambda _diag: app.shutdowns.append("task"),
                                  supervisor_grace_s=0.3, poll_s=0.05) is True
    assert app.shutdowns == ["task"]                         # nobody ended it within the grace: the task did
    app.shutdowns.clear()
    assert sup.round() is True
    assert people(app.shutdowns) == [("SUCCEEDED", app_end.DONE_DIAGNOSTICS)]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["state"] == "SUCCEEDED" and report["app_id"] == APP and "chief:0" in report["tasks"]


def test_a_live_follower_ends_the_app_itself_and_the_supervisor_only_after_its_grace(tmp_path, monkeypatch):
    """A follower (run/wait) ends the app at once and writes the report after: the job's end does not wait for a plot
    and HDFS uploads. One that does not do it within its grace leaves the end to the supervisor, report first."""
    monkeypatch.setattr(app_end, "FOLLOWER_GRACE_S", 0.3)
    monkeypatch.setattr("tfyarn.runner.yarn_app.supervise.POLL_S", 0.0)
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "RUNNING", "worker": "RUNNING"})
    for t in ("chief:0", "worker:0"):
        mark_slot_done(kv, t)
    kv.put(app_end.ALL_DONE_KEY, json.dumps({"time": clock.t, "by": "worker:0"}))
    kv.put(app_end.FOLLOWER_KEY, f"{time.time():.3f}")
    assert sup.round() is False and app.shutdowns == [] and not (tmp_path / "report.json").exists()
    time.sleep(0.4)                                          # the follower never came: past its grace
    assert sup.round() is True and people(app.shutdowns) == [("SUCCEEDED", app_end.DONE_DIAGNOSTICS)]
    assert json.loads((tmp_path / "report.json").read_text())["state"] == "SUCCEEDED"


def test_a_task_that_died_without_its_report_and_no_attempt_left_ends_the_app_failed(tmp_path):
    """skein's services allow failures in a supervised app (it would fail the app, and the next in-app attempt with
    it): a container that died without its exit report (a kill of the whole container) and that skein did not
    replace is the attempt's end, judged by the supervisor; no attempt left: FAILED, naming it."""
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "SUCCEEDED", "worker": "FAILED"})
    assert sup.round() is True
    [(status, diag)] = people(app.shutdowns)
    assert status == "FAILED" and diag.startswith("worker:0: "), diag
    assert app.scaled == [] and kv.get("control/attempt") is None


def test_a_side_task_killed_whole_after_every_other_task_reported_done_ends_the_job_succeeded(tmp_path):
    """A tensorboard container YARN killed whole (memory, a preemption: no exit report, so no check of its own)
    once every other task reported done: the supervisor finds the job done (app_end.done_in) and ends it SUCCEEDED.
    It returned once every container had ended, and skein's end without a record made the job FAILED."""
    roles = {**ROLES, "tensorboard": {"instances": 1}}
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "SUCCEEDED", "worker": "SUCCEEDED", "tensorboard": "RUNNING"},
                                     roles=roles, checkpoint={"dir": str(tmp_path / "ckpt")})
    kv.put("taskmap/tensorboard_0", "tensorboard:0")
    mark_slot_done(kv, "chief:0")
    assert sup.round() is False and kv.get(app_end.ALL_DONE_KEY) is None       # worker:0 has not said it is done
    mark_slot_done(kv, "worker:0")
    assert sup.round() is False and kv.get(app_end.ALL_DONE_KEY) is None       # tensorboard:0 still runs
    next(c for c in app.containers if c.service_name == "tensorboard").state = "FAILED"
    assert sup.round() is True
    assert people(app.shutdowns) == [("SUCCEEDED", app_end.DONE_DIAGNOSTICS)]
    assert json.loads(kv.get(app_end.ALL_DONE_KEY))["by"] == "supervisor"
    assert json.loads(kv.get("control/end"))["state"] == "SUCCEEDED"


def test_a_bare_submits_failure_says_that_no_attempt_follows():
    spec = make_spec(roles=ROLES, mode="allreduce", retry={"max_attempts": 2})
    assert "`tfyarn run`" in no_more_attempts_note(spec, 0) and "attempt 1 of 2" in no_more_attempts_note(spec, 0)
    assert no_more_attempts_note(spec, 1) == ""
    # the user's code failed: no attempt would follow anyway, and that is what it says
    user = no_more_attempts_note(spec, 0, "chief:0: exit code 1: ValueError: bad shape")
    assert user.startswith("not retried: the job's own code failed (raised ValueError)"), user


def test_the_service_imports_no_tensorflow_and_one_that_cannot_start_says_why_and_exits_1(tmp_path):
    code = ("import sys, tfyarn.runner.yarn_app.supervise as m, tfyarn.cluster._skein as s; s.skein(); "
            "import tfyarn.task.yarn.kv_yarn, tfyarn.tasklib.watchdog, tfyarn.report; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; sys.exit(m.main())")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFYARN_SPEC", "SKEIN_"))}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)
    # outside a container it cannot start (no application master): exit 1 (its container fails the app), why in
    # contracts.startup's line; no marker file (a supervisor that started exits 0 whatever happens: test_appspec)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "exit code 1: cannot start: ValueError: Not running inside a container (python " in r.stderr, r.stderr
    assert not (tmp_path / ".tfyarn-supervisor-started").exists()


def test_a_task_on_a_node_that_stopped_answering_ends_the_attempt_naming_it(tmp_path):
    """issue 30: the NodeManager of worker:0's node refuses (nothing listens there) and worker:0 reports nothing:
    past ``timeouts.node_lost`` the supervisor ends the attempt, the lost node first in its diagnosis; a lost node
    is the cluster's doing (free of retry.max_attempts), so the next attempt starts in the same app."""
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "RUNNING", "worker": "RUNNING"},
                                     timeouts={"node_lost": 0.3}, retry={"max_attempts": 1, "backoff": "0.01s"})
    for c in app.containers:
        c.yarn_node_http_address = "127.0.0.1:1" if c.service_name == "worker" else "127.0.0.1:9"
    sup.nodes.prober = lambda addr: addr != "127.0.0.1:1"     # the chief's node answers
    kv.put("progress/chief:0", json.dumps({"step": 3, "time": time.time() + 60}))
    assert sup.round() is False and app.shutdowns == []        # not answering since now: not lost yet
    time.sleep(0.4)
    assert sup.round() is False and app.shutdowns == []        # the attempt ended; the next one runs
    [rec] = [json.loads(v) for k, v in kv.items("attempts/").items()]
    assert rec["diagnosis"].startswith("worker:0 lost with its node 127.0.0.1 (its NodeManager 127.0.0.1:1 has "
                                       "not answered for"), rec
    assert "chief:0" not in rec["diagnosis"] and rec["cause"] == "lost with its node"
    assert json.loads(kv.get("control/attempt"))["attempt"] == 1 and sup.attempt == 1


def in_app_job(tmp_path, **retry):
    """A chief and a worker running attempt 0 of a supervised app, with what its tasks put in the KV."""
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "RUNNING", "worker": "RUNNING"},
                                     retry={"max_attempts": 2, "backoff": "0.01s", **retry})
    for k, v in {"taskmap/chief_0": "chief:0", "taskmap/worker_0": "worker:0", "slot/chief:0": "chief_0",
                 "slot/worker:0": "worker_0", "addr/chief:0": "h:1", "addr/worker:0": "h:2",
                 "progress/chief:0": json.dumps({"step": 13, "global_step": 13, "time": time.time()}),
                 "plan/total_steps": "40", "control/steps_aligned": "1", "index/0/train/manifest": "m",
                 app_end.FOLLOWER_KEY: f"{time.time():.3f}"}.items():
        kv.put(k, v)
    return sup, app, kv, clock


def test_a_failure_handed_over_ends_the_attempt_and_starts_every_task_again_in_the_same_app(tmp_path):
    """issue 30 item 6: the chief's exit report hands the attempt's end over (control/attempt_end): every task
    container is killed, the attempt's keys go (what outlives attempts stays), its end is recorded, the attempt
    number is bumped with the first skein instance of each service in it, and every task is started again."""
    sup, app, kv, clock = in_app_job(tmp_path)
    assert sup.round() is False
    kv.put("exit/chief:0", json.dumps({"code": 137, "died_at": 1.0}))
    kv.put("control/attempt_end", json.dumps({"by": "failed-task:chief:0", "time": 1.0,
                                              "diagnosis": "chief:0: exit code 137 (killed by SIGKILL)"}))
    assert sup.round() is False and app.shutdowns == []
    assert sorted(app.killed) == ["chief_0", "worker_0"]                     # the supervisor's own container lives
    assert app.scaled == [("chief", 1), ("worker", 1)]
    assert [c.id for c in app.get_containers(states=ACTIVE)] == [f"{SUPERVISOR_SERVICE}_0", "chief_1", "worker_1"]
    assert json.loads(kv.get("control/attempt"))["first"] == {"chief": 1, "worker": 1}
    left = kv.items()
    for gone in ("exit/", "slot/", "addr/", "progress/", "plan/", "control/steps_aligned", "control/attempt_end"):
        assert not [k for k in left if k.startswith(gone)], (gone, left)
    for kept in ("spec", "taskmap/chief_0", "index/0/train/manifest", app_end.SUPERVISOR_KEY, app_end.FOLLOWER_KEY):
        assert kept in left, kept
    rec = json.loads(kv.get("attempts/0"))
    assert rec["attempt"] == 0 and rec["cause"] == "killed by signal 9" and rec["reached"] == 13, rec
    assert sup.attempt == 1 and "attempt" not in sup.snap     # (read before the restart: the first attempt)
    sup.round()
    assert sup.snap["attempt"] == 1 and [r["attempt"] for r in sup.snap["attempts"]] == [0]
    # the new attempt's containers replace no failed one: no restart (the runtime's restarts_before agrees)
    assert {t["task"]: t["restarts"] for t in sup.snap["tasks"]} == {"chief:0": 0, "worker:0": 0}, sup.snap["tasks"]
    # a second retryable failure: retry.max_attempts 2 is used up, so the app ends FAILED, naming both attempts
    kv.put("control/attempt_end", json.dumps({"diagnosis": "chief:0: exit code 137 (killed by SIGKILL)"}))
    assert sup.round() is True
    [(status, diag)] = people(app.shutdowns)
    assert status == "FAILED" and diag.startswith("chief:0: exit code 137") and "earlier attempts: attempt 0:" in diag


def test_the_user_codes_failure_ends_the_app_at_once_whatever_attempts_are_left(tmp_path):
    sup, app, kv, clock = in_app_job(tmp_path, max_attempts=5)
    kv.put("control/attempt_end", json.dumps({"diagnosis": "chief:0: exit code 1: ValueError: bad shape"}))
    assert sup.round() is True and app.killed == [] and app.scaled == []
    [(status, diag)] = people(app.shutdowns)
    assert status == "FAILED" and "not retried: the job's own code failed (raised ValueError)" in diag, diag


def test_a_dead_container_skein_replaced_is_no_attempt_end(tmp_path):
    """An async worker preempted: skein started its replacement (restart budget left): the attempt goes on."""
    sup, app, kv, clock = in_app_job(tmp_path)
    app.containers[2].state = "FAILED"
    app.containers.append(container("worker", 1, "REQUESTED"))
    assert sup.round() is False and app.killed == [] and kv.get("control/attempt") is None
    app.containers[-1].state = "FAILED"                               # no replacement this time: the end
    assert sup.round() is False and sorted(app.killed) == ["chief_0"] and app.scaled == [("chief", 1), ("worker", 1)]
    assert json.loads(kv.get("control/attempt"))["first"] == {"chief": 1, "worker": 2}


def test_a_stall_with_an_attempt_left_runs_the_next_attempt_in_the_app_and_the_deadline_never_does(tmp_path):
    """A timeout is retried in the app as `tfyarn run` retries it: a stall with retry.max_attempts 2 ends attempt 0
    (its record names the stalled task) and starts every task again; the second stall uses the last attempt, so the
    app ends TIMED_OUT naming both. The active deadline is never retried, whatever attempts are left."""
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "RUNNING", "worker": "RUNNING"},
                                     timeouts={"stall": 60, "rendezvous": 60},
                                     retry={"max_attempts": 2, "backoff": "0.01s"})
    kv.put("progress/chief:0", json.dumps({"step": 5}))
    kv.put("progress/worker:0", json.dumps({"step": 5}))
    assert sup.round() is False
    clock.t += 61
    assert sup.round() is False and app.shutdowns == []
    assert sorted(app.killed) == ["chief_0", "worker_0"] and app.scaled == [("chief", 1), ("worker", 1)]
    rec = json.loads(kv.get("attempts/0"))
    assert "timeouts.stall" in rec["diagnosis"] and "worker:0 at step 5" in rec["diagnosis"], rec
    for c in app.get_containers(states=["REQUESTED"]):   # the new attempt's containers start
        c.state = "RUNNING"
    kv.put("progress/chief:0", json.dumps({"step": 2}))
    kv.put("progress/worker:0", json.dumps({"step": 2}))
    rounds = 0
    while not sup.round():        # the new attempt's stall watch starts afresh (its start-up grace first)
        clock.t += 30
        rounds += 1
        assert rounds < 20, "the second attempt's stall was never seen"
    [(status, diag)] = people(app.shutdowns)
    assert status == "FAILED" and "timeouts.stall" in diag and "earlier attempts: attempt 0:" in diag, diag
    assert app_state("FINISHED", "FAILED", diag) is AppState.TIMED_OUT

    sup, app, kv, clock = supervisor(tmp_path / "deadline", {"chief": "RUNNING", "worker": "RUNNING"},
                                     timeouts={"active_deadline": 60, "stall": 600},
                                     retry={"max_attempts": 3, "backoff": "0.01s"})
    assert sup.round() is False
    clock.t += 61
    assert sup.round() is True and app.killed == [] and app.scaled == []
    [(status, diag)] = people(app.shutdowns)
    assert status == "FAILED" and "timeouts.active_deadline" in diag and "earlier attempts" not in diag, diag


def test_a_restarted_supervisor_takes_up_the_apps_attempts_and_judges_the_container_dead_without_its_report(
        tmp_path):
    """Issue 40: every task service allows failures, so a container killed without its exit report is the in-app
    supervisor's to judge; a supervisor whose own container died is restarted by skein (SUPERVISOR_RESTARTS) and
    the new one takes up the app's attempts from the KV (their number, their budget), then ends the attempt."""
    from tfyarn.backends.yarn.appspec import SUPERVISOR_RESTARTS
    from tfyarn.runner.yarn_app.supervise import resume

    assert SUPERVISOR_RESTARTS >= 1
    sup, app, kv, clock = supervisor(tmp_path, {"chief": "SUCCEEDED", "worker": "FAILED"},
                                     retry={"max_attempts": 2})
    kv.put("control/attempt", json.dumps({"attempt": 1, "first": {"chief": 0, "worker": 0}, "time": 1.0}))
    kv.put("attempts/0", json.dumps({"attempt": 0, "diagnosis": "worker:0: exit code 137 (killed by SIGKILL)"}))
    resume(sup)
    assert sup.attempt == 1 and sup.sup.attempt == 1 and sup.sup.budget.counted == 2  # attempt 0 used one
    assert sup.round() is True   # the dead worker's container: no attempt left of retry.max_attempts 2
    [(status, diag)] = people(app.shutdowns)
    assert status == "FAILED" and "worker:0" in diag, diag
