"""YARN task restarts counted per job attempt: a container the in-app supervisor started for a new attempt is no
restart of the task (tfyarn.task.yarn.kv_yarn.restarts_before with control/attempt, tfyarn.contracts.in_app)."""
import json

from tfyarn.contracts import in_app
from tfyarn.tasklib.kv import MemoryKV
from tfyarn.task.yarn.kv_yarn import restarts_before


def test_a_new_attempts_container_is_no_restart_but_a_replacement_within_it_is():
    kv = MemoryKV()
    for cid, task in {"chief_0": "chief:0", "worker_0": "worker:0", "worker_1": "worker:0"}.items():
        kv.put(f"taskmap/{cid}", task)
    assert restarts_before(kv, "worker:0", "worker_1") == 1               # attempt 0: worker_1 replaced worker_0
    kv.put("control/attempt", json.dumps({"attempt": 1, "first": {"chief": 1, "worker": 2}}))
    kv.put("taskmap/chief_1", "chief:0")
    kv.put("taskmap/worker_2", "worker:0")
    assert restarts_before(kv, "chief:0", "chief_1") == 0
    assert restarts_before(kv, "worker:0", "worker_2") == 0
    kv.put("taskmap/worker_3", "worker:0")
    assert restarts_before(kv, "worker:0", "worker_3") == 1               # a restart within attempt 1


def test_attempt_scoped_keys_and_the_budget_replayed_from_the_ended_attempts():
    assert in_app.attempt_scoped("exit/chief:0") and in_app.attempt_scoped("control/all_done")
    assert in_app.attempt_scoped("slot-done/worker:1") and in_app.attempt_scoped("summary")
    for kept in ("spec", "control/supervisor", "control/follower", "taskmap/chief_0", "attempts/0",
                 "control/attempt", "index/0/train/manifest", "page/url"):
        assert not in_app.attempt_scoped(kept), kept
    killed = "chief:0: exit code 137 (killed by SIGKILL)"
    preempted = "worker:0: preempted by the scheduler (YARN: Container preempted by scheduler)"
    assert in_app.hand_over(killed, 2, [], supervisor_alive=True)
    assert not in_app.hand_over(killed, 2, [killed], supervisor_alive=True)      # 2 of 2 attempts run
    assert in_app.hand_over(preempted, 2, [killed], supervisor_alive=True)       # the cluster's: not counted
    assert not in_app.hand_over(killed, 2, [], supervisor_alive=False)
    user = in_app.hand_over("chief:0: exit code 1: ValueError: x", 5, [], supervisor_alive=True)
    assert not user and user.reason.startswith("not retried: the job's own code failed")
    items = {"attempts/1": json.dumps({"attempt": 1, "diagnosis": "b"}),
             "attempts/0": json.dumps({"attempt": 0, "diagnosis": "a"})}
    assert in_app.ended_diagnoses(items) == ["a", "b"]
    assert in_app.in_attempt("worker_2", {"attempt": 1, "first": {"worker": 2}})
    assert not in_app.in_attempt("worker_1", {"attempt": 1, "first": {"worker": 2}})
    assert in_app.in_attempt("worker_1", None) and in_app.attempt_number(None, 3) == 3
