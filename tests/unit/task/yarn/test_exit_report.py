"""How a YARN task ended, reported by its container script after Python exits non-zero: the ``exit/<task>``
record, and the application shut down FAILED naming every task that ended badly when skein would fail it anyway.
The app's KV is skein's real KeyValueStore on FakeAM; the rest of the application client is faked (no AM here)."""
import json

import pytest
import skein

from fake_am import FakeAM
from tfyarn.contracts import job_end
from tfyarn.task.yarn import exit_report
from tfyarn.task.yarn.exit_report import describe, diagnosis, exit_codes_in, exit_text


class FakeAppClient:
    def __init__(self, spec, failed=()):
        self.am = FakeAM()
        self.kv = self.am.kv
        self.spec = spec
        self.failed = list(failed)          # (service, instance) of containers that FAILED earlier
        self.shutdowns = []

    def get_specification(self):
        return self.spec

    def get_containers(self, services=None, states=None):
        assert states == ["FAILED"]
        return [s for s in self.failed if services is None or s[0] in services]

    def shutdown(self, status="SUCCEEDED", diagnostics=None):
        self.shutdowns.append((status, diagnostics))


def people(shutdowns):
    """The shutdowns' diagnostics without the end record's line (contracts.job_end.with_record)."""
    return [(status, job_end.from_diagnostics(diag)[1]) for status, diag in shutdowns]


def app_spec(max_restarts=0, allow_failures=False):
    svc = lambda **kw: skein.Service(script="x", resources=skein.Resources(memory=128, vcores=1), **kw)  # noqa
    return skein.ApplicationSpec(services={"ps": svc(), "chief": svc(),
                                           "worker": svc(instances=2, max_restarts=max_restarts),
                                           "tensorboard": svc(allow_failures=True)})


def test_exit_texts():
    assert exit_text(137) == "exit code 137 (killed by SIGKILL)"
    assert exit_text(143) == "exit code 143 (killed by SIGTERM)"
    assert exit_text(1) == "exit code 1" and exit_text(-9) == "exit code -9 (killed by SIGKILL)"
    assert describe("chief:0", 1, "ValueError: x") == "chief:0: exit code 1: ValueError: x"
    d = "ps:0: exit code 137 (killed by SIGKILL); chief:0: exit code 1: UnavailableError: ps:0 gone; worker:1: hang"
    assert exit_codes_in(d) == {"ps:0": 137, "chief:0": 1}


@pytest.fixture
def container_env(monkeypatch):
    def set_env(skein_id, role):
        monkeypatch.setenv("SKEIN_CONTAINER_ID", skein_id)
        monkeypatch.setenv("TFYARN_ROLE", role)
        monkeypatch.setenv("CONTAINER_ID", f"container_1_0001_01_{len(skein_id):06d}")
    return set_env


def test_a_killed_ps_shuts_the_app_down_naming_it_first(container_env):
    app = FakeAppClient(app_spec())
    app.kv.put("taskmap/ps_0", b"ps:0")
    app.kv.put("taskmap/chief_0", b"chief:0")
    # the chief noticed first (its failure record) but the ps died first: the ps leads the diagnosis
    app.kv.put("failure/chief:0", b"UnavailableError: Socket closed (ps:0)")
    container_env("chief_0", "chief")
    app.kv.put("exit/chief:0", json.dumps({"code": 1, "died_at": 20.0,
                                           "failure": "UnavailableError: Socket closed (ps:0)"}).encode())
    container_env("ps_0", "ps")
    assert exit_report.report(app, 137, died_at=10.0, settle_s=0) == "ps:0"
    rec = json.loads(app.kv.get("exit/ps:0"))
    assert rec["code"] == 137 and rec["died_at"] == 10.0 and rec["skein_container"] == "ps_0"
    assert rec["failure"] is None                      # a SIGKILLed process writes nothing of its own
    assert people(app.shutdowns) == [("FAILED", "ps:0: exit code 137 (killed by SIGKILL); "
                                        "chief:0: exit code 1: UnavailableError: Socket closed (ps:0)")]
    end, _ = job_end.from_diagnostics(app.shutdowns[0][1])  # the record outlives the KV, in YARN's diagnostics
    assert (end.state, end.by, end.exit_codes) == ("FAILED", "failed-task:ps:0", {"ps:0": 137, "chief:0": 1})


def test_a_worker_with_restarts_left_or_a_side_role_does_not_end_the_app(container_env):
    app = FakeAppClient(app_spec(max_restarts=2), failed=[("worker", 0)])
    app.kv.put("taskmap/worker_3", b"worker:1")
    container_env("worker_3", "worker")
    assert exit_report.report(app, 137, died_at=1.0, settle_s=0) == "worker:1"
    assert app.shutdowns == [] and json.loads(app.kv.get("exit/worker:1"))["code"] == 137
    app.failed.append(("worker", 1))                   # the budget (2 restarts for the service) is now used
    assert exit_report.report(app, 137, died_at=2.0, settle_s=0) == "worker:1"
    assert people(app.shutdowns) == [("FAILED", "worker:1: exit code 137 (killed by SIGKILL)")]
    side = FakeAppClient(app_spec())
    container_env("tensorboard_0", "tensorboard")
    exit_report.report(side, 1, died_at=1.0, settle_s=0)
    assert side.shutdowns == [] and json.loads(side.kv.get("exit/tensorboard_0"))["code"] == 1


def _shipped_spec(tmp_path, monkeypatch):
    """The tasks' spec file of a ps job with a tensorboard (ps:0, chief:0, worker:0, worker:1, tensorboard:0)."""
    from tfyarn.spec import load_spec_dict
    spec = load_spec_dict({"name": "tb", "model": "tfyarn.models.recommender:model", "mode": "ps",
                           "data": {"train": ["x"], "features": {"label": {"dtype": "float32"}}, "batch_size": 1},
                           "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 2},
                                     "tensorboard": {"instances": 1}},
                           "checkpoint": {"dir": str(tmp_path / "ckpt")}})
    (tmp_path / "spec.json").write_text(spec.to_json())
    monkeypatch.setenv("TFYARN_SPEC_FILE", str(tmp_path / "spec.json"))
    return spec


def test_a_side_task_failing_after_every_other_task_reported_done_ends_the_job_succeeded(container_env, tmp_path,
                                                                                         monkeypatch):
    """Its failure ends nothing, but it was the last end the job waited for: its exit report makes the check a
    task's success makes (app_end.finish_if_last), so the app ends SUCCEEDED with an end record. It ended nothing
    before, and skein's end without a record made the job FAILED although it trained."""
    _shipped_spec(tmp_path, monkeypatch)
    app = FakeAppClient(app_spec())
    app.kv.put("taskmap/tensorboard_0", b"tensorboard:0")
    for task in ("ps:0", "chief:0", "worker:0", "worker:1"):
        app.kv.put(f"slot-done/{task}", b"1")
    container_env("tensorboard_0", "tensorboard")
    assert exit_report.report(app, 137, died_at=1.0, settle_s=0) == "tensorboard:0"   # killed: no failure record
    assert len(app.shutdowns) == 1 and app.shutdowns[0][0] == "SUCCEEDED", app.shutdowns
    end, _ = job_end.from_diagnostics(app.shutdowns[0][1])
    assert (end.state, end.by) == ("SUCCEEDED", "task:tensorboard:0")
    assert json.loads(app.kv.get("control/end"))["state"] == "SUCCEEDED"
    (cause,) = [json.loads(v) for k, v in app.kv.get_prefix("cause/").items()]
    assert cause["then"] == "the job goes on without it", cause      # (it said "restarted in place")


def test_a_side_task_failing_first_is_counted_done_when_training_ends(container_env, tmp_path, monkeypatch):
    """The other order: its report ends nothing while training runs; the last training task's end then finds the
    job done, a killed side task (its exit record, no failure record) counted as done too."""
    from tfyarn.task.yarn import app_end
    from tfyarn.task.yarn.kv_yarn import SkeinKV
    spec = _shipped_spec(tmp_path, monkeypatch)
    app = FakeAppClient(app_spec())
    app.kv.put("taskmap/tensorboard_0", b"tensorboard:0")
    container_env("tensorboard_0", "tensorboard")
    exit_report.report(app, 137, died_at=1.0, settle_s=0)
    assert app.shutdowns == [] and app.kv.get("control/all_done") is None
    kv = SkeinKV(app.kv)
    for task in ("ps:0", "chief:0", "worker:0", "worker:1"):
        kv.put(f"slot-done/{task}", "1")
        last = app_end.finish_if_last(kv, spec.tasks(), task, lambda d: app.shutdown("SUCCEEDED", d), grace_s=0)
        assert last is (task == "worker:1"), task
    assert len(app.shutdowns) == 1 and job_end.from_diagnostics(app.shutdowns[0][1])[0].by == "task:worker:1"


def test_restart_exit_code_on_yarn_ends_the_app_at_the_codes_own_exit(container_env, tmp_path, monkeypatch):
    """``restart: exit_code`` as locally: skein would restart any failure, so the container's report ends the app
    when the policy refuses the restart (the code's own exit 1-127); a kill or an infrastructure fault is left to
    skein's restart (issue 30)."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"roles": {"worker": {"instances": 2, "max_restarts": 3, "restart": "exit_code"}}}))
    monkeypatch.setenv("TFYARN_SPEC_FILE", str(spec))
    app = FakeAppClient(app_spec(max_restarts=6))
    app.kv.put("taskmap/worker_2", b"worker:0")
    container_env("worker_2", "worker")
    assert exit_report.report(app, 137, died_at=1.0, settle_s=0) == "worker:0"     # killed: restarted
    app.kv.put("failure/worker:0", b"HdfsUnavailable: HDFS unavailable: read hdfs://nn/d at byte 9 failed for 120s")
    exit_report.report(app, 1, died_at=2.0, settle_s=0)                          # infrastructure: restarted
    assert app.shutdowns == []
    app.kv.put("failure/worker:0", b"KeyError: 'label'")
    exit_report.report(app, 1, died_at=3.0, settle_s=0)                          # the user's code: the end
    assert people(app.shutdowns) == [("FAILED", "worker:0: exit code 1: KeyError: 'label'")]
    spec.write_text(json.dumps({"roles": {"worker": {"instances": 2, "max_restarts": 3, "restart": "on_failure"}}}))
    app.shutdowns.clear()
    exit_report.report(app, 1, died_at=4.0, settle_s=0)
    assert app.shutdowns == []


def test_preempted_and_lost_containers_use_none_of_the_restart_budget(container_env, tmp_path, monkeypatch):
    """skein's budget is the spec's plus triage.FREE_RESTARTS per task (yarn_spec); the exit report holds the task
    to the spec's own budget, counting only failures that are the task's: YARN's preemptions and lost nodes are
    free (issue 30)."""
    from types import SimpleNamespace as C
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"roles": {"worker": {"instances": 2, "max_restarts": 1, "restart": "on_failure"}}}))
    monkeypatch.setenv("TFYARN_SPEC_FILE", str(spec))
    preempted = [C(exit_message="Container preempted by scheduler"),
                 C(exit_message="Container released on a *lost* node")] * 3
    app = FakeAppClient(app_spec(max_restarts=2 * 11), failed=preempted)
    app.get_containers = lambda services=None, states=None: list(app.failed)
    app.kv.put("taskmap/worker_9", b"worker:1")
    container_env("worker_9", "worker")
    exit_report.report(app, 1, died_at=1.0, settle_s=0)         # 6 free failures before: budget 2 untouched
    assert app.shutdowns == []
    app.failed += [C(exit_message="Exception from container-launch. Exit code: 1")] * 2
    exit_report.report(app, 1, died_at=2.0, settle_s=0)         # 2 of the task's own: the budget is used
    assert app.shutdowns and app.shutdowns[0][0] == "FAILED"


def test_main_says_it_in_the_log_and_never_fails(container_env, capsys):
    container_env("worker_1", "worker")
    # not in a container: no application master to reach. Never raises; its own exit says it could not report
    # (the container script then runs contracts.startup's check; the container keeps the task's code)
    assert exit_report.main(["137", "12.5"]) == exit_report.NOT_REPORTED
    err = capsys.readouterr().err
    assert "worker task (container worker_1 = container_1_0001_01_000008) ended with exit code 137 (killed by " \
           "SIGKILL)" in err
    assert "could not report the exit" in err


def test_diagnosis_orders_by_death():
    recs = {"worker:0": {"code": 1, "died_at": 5.0, "failure": "boom"}, "ps:1": {"code": 137, "died_at": 1.0}}
    assert diagnosis(recs) == "ps:1: exit code 137 (killed by SIGKILL); worker:0: exit code 1: boom"


# ------------------------------------------------------------------------------------ in-app attempts (issue 30)
def _job(tmp_path, monkeypatch, max_attempts=2):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"retry": {"max_attempts": max_attempts},
                                "roles": {"chief": {"instances": 1}, "worker": {"instances": 2}}}))
    monkeypatch.setenv("TFYARN_SPEC_FILE", str(spec))
    app = FakeAppClient(app_spec())
    app.kv.put("taskmap/chief_0", b"chief:0")
    return app


def _supervisor_alive(app, alive=True):
    import time
    app.kv.put("control/supervisor", f"{time.time() - (0 if alive else 60):.3f}".encode())


def test_a_retryable_failure_is_handed_to_a_live_supervisor_instead_of_ending_the_app(container_env, tmp_path,
                                                                                    monkeypatch):
    """The chief SIGKILLed (the cluster's doing, retried), a live in-app supervisor and an attempt left: no shutdown,
    the attempt's end with its diagnosis in control/attempt_end for the supervisor (which runs the next attempt)."""
    app = _job(tmp_path, monkeypatch)
    _supervisor_alive(app)
    container_env("chief_0", "chief")
    assert exit_report.report(app, 137, died_at=1.0, settle_s=0) == "chief:0"
    assert app.shutdowns == [] and json.loads(app.kv.get("exit/chief:0"))["code"] == 137
    handed = json.loads(app.kv.get("control/attempt_end"))
    assert handed["diagnosis"] == "chief:0: exit code 137 (killed by SIGKILL)" and handed["by"] == "failed-task:chief:0"
    # a peer failing from the same cause meanwhile: the attempt is ending, it reports nothing and ends nothing
    app.kv.put("taskmap/worker_0", b"worker:0")
    container_env("worker_0", "worker")
    exit_report.report(app, 1, died_at=2.0, settle_s=0)
    assert app.shutdowns == [] and app.kv.get("exit/worker:0") is None


@pytest.mark.parametrize("case", ["user code", "budget used", "no supervisor"])
def test_the_app_ends_failed_at_once_when_no_in_app_attempt_may_follow(container_env, tmp_path, monkeypatch, case):
    app = _job(tmp_path, monkeypatch)
    _supervisor_alive(app, alive=case != "no supervisor")
    if case == "user code":
        app.kv.put("failure/chief:0", b"ValueError: bad shape")
    if case == "budget used":                      # attempt 0 ended for a counted cause: 2 of 2 attempts are run
        app.kv.put("control/attempt", json.dumps({"attempt": 1, "first": {"chief": 0}}).encode())
        app.kv.put("attempts/0", json.dumps({"attempt": 0, "diagnosis": "chief:0: exit code 137 (killed by "
                                                                         "SIGKILL)"}).encode())
    container_env("chief_0", "chief")
    exit_report.report(app, 1 if case == "user code" else 137, died_at=1.0, settle_s=0)
    [(status, diag)] = people(app.shutdowns)
    assert status == "FAILED" and diag.startswith("chief:0: exit code") and app.kv.get("control/attempt_end") is None


def test_a_container_of_an_ended_attempt_reports_nothing_and_earlier_attempts_use_no_restart(container_env, tmp_path,
                                                                                            monkeypatch):
    """control/attempt names the first skein instance of each service in the running attempt: a container before it
    (killed by the supervisor) reports nothing; failures of earlier attempts' containers use no restart budget."""
    from types import SimpleNamespace as C
    app = _job(tmp_path, monkeypatch)
    app.kv.put("control/attempt", json.dumps({"attempt": 1, "first": {"chief": 1, "worker": 2}}).encode())
    container_env("chief_0", "chief")
    exit_report.report(app, 137, died_at=1.0, settle_s=0)
    assert app.shutdowns == [] and app.kv.get("exit/chief:0") is None
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"roles": {"worker": {"instances": 2, "max_restarts": 1}}}))
    earlier = [C(service_name="worker", instance=i, exit_message="Container failed") for i in (0, 1)]
    app = FakeAppClient(app_spec(max_restarts=2), failed=earlier)
    app.get_containers = lambda services=None, states=None: list(app.failed)
    attempt = {"attempt": 1, "first": {"worker": 2}}
    assert exit_report.ends_the_app(app, "worker", attempt) is False    # 2 failures, both of attempt 0
    assert exit_report.ends_the_app(app, "worker", None) is True
    app.failed += [C(service_name="worker", instance=3, exit_message="Container failed")] * 2
    assert exit_report.ends_the_app(app, "worker", attempt) is True


def test_an_async_workers_peer_error_restarts_it_in_place_free_of_max_restarts(container_env, tmp_path, monkeypatch,
                                                                               capsys):
    """Issue 40: TF's "RunGraph request received twice" from the ps is the cluster's fault: an async ps worker with
    ``max_restarts: 0`` is restarted in place (skein has ``retry.cluster_faults`` more per task), up to that bound,
    and each restart's cause and rule are recorded (``cause/<task>/<container>``); the same class raised by the
    model itself ends the app."""
    from types import SimpleNamespace as C
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"mode": "ps", "sync": False, "retry": {"cluster_faults": 2},
                                "roles": {"worker": {"instances": 1, "max_restarts": 0}}}))
    monkeypatch.setenv("TFYARN_SPEC_FILE", str(spec))
    app = FakeAppClient(app_spec(max_restarts=2), failed=[])
    app.get_containers = lambda services=None, states=None: list(app.failed)
    twice = ("AbortedError: Graph execution error: From /job:ps/replica:0/task:0: "
             "The same RunGraph (Worker) request was received twice.")
    for n in (0, 1):
        app.kv.put(f"taskmap/worker_{n}", b"worker:0")
        app.kv.put("failure/worker:0", twice.encode())
        container_env(f"worker_{n}", "worker")
        exit_report.report(app, 1, died_at=1.0 + n, settle_s=0)
        assert app.shutdowns == [], n
        rec = json.loads(app.kv.get(f"cause/worker:0/worker_{n}"))
        assert rec["free"] and rec["then"] == "restarted in place" and rec["cause"] == "transport"
        assert "received twice" in rec["rule"]
        app.failed.append(C(service_name="worker", instance=n, exit_message="Exception from container-launch."))
    assert "restarted in place, not counted in max_restarts" in capsys.readouterr().err
    # the bound (retry.cluster_faults 2 x 1 instance) is used: the third ends the app, with its rule said
    app.kv.put("taskmap/worker_2", b"worker:0")
    container_env("worker_2", "worker")
    exit_report.report(app, 1, died_at=3.0, settle_s=0)
    assert app.shutdowns and app.shutdowns[0][0] == "FAILED"
    assert json.loads(app.kv.get("cause/worker:0/worker_2"))["then"] == "the attempt's end"
    # the model's own AbortedError: no restart in place, whatever bound is left
    fresh = FakeAppClient(app_spec(max_restarts=2), failed=[])
    fresh.get_containers = lambda services=None, states=None: []
    fresh.kv.put("taskmap/worker_0", b"worker:0")
    fresh.kv.put("failure/worker:0", b"AbortedError: model gave up")
    container_env("worker_0", "worker")
    exit_report.report(fresh, 1, died_at=1.0, settle_s=0)
    assert fresh.shutdowns and "AbortedError: model gave up" in fresh.shutdowns[0][1]
    assert not json.loads(fresh.kv.get("cause/worker:0/worker_0"))["free"]
