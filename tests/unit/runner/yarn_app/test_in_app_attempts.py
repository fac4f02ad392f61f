"""The in-app attempts' pieces without a cluster (tfyarn.runner.yarn_app.attempts): status's attempt and totals
from an app's snapshot, a run's supervisor taking in the attempts an app ran itself, the wait for killed containers."""
from types import SimpleNamespace as C

from yarnutil import make_spec
from tfyarn.backends.base import AppState
from tfyarn.backends.yarn.status import fold_in_app
from tfyarn.contracts.status import AppStatus
from tfyarn.runner.supervisor import Supervisor
from tfyarn.runner.yarn_app import attempts as in_app_attempts
from tfyarn.runner.yarn_app.attempts import absorb

ROLES = {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 1}}
SNAP = {"attempt": 2, "attempts": [
    {"attempt": 0, "diagnosis": "worker:0: exit code 137 (killed by SIGKILL)", "reached": 30, "resumes_at": 25,
     "lost_steps": 5},
    {"attempt": 1, "diagnosis": "worker:0: preempted by the scheduler (YARN: Container preempted by scheduler)",
     "reached": 50, "resumes_at": 50, "lost_steps": 0}]}


def test_status_says_the_in_app_attempt_and_totals_over_every_attempt():
    spec = make_spec(roles=ROLES, retry={"max_attempts": 3})
    st = AppStatus(app_id="a", backend="yarn", name="n", state=AppState.SUCCEEDED, started=100.0, finished=400.0,
                   summary={"global_step": 80, "resumed_step": 50, "elapsed_s": 90.0})
    st = fold_in_app(st, SNAP, spec)
    totals = st.summary["attempts"]
    assert st.attempt == 2 and totals["attempts"] == 3 and totals["wall_s"] == 300.0, totals
    assert totals["lost_steps"] == 5 and [r["attempt"] for r in totals["by_attempt"]] == [0, 1], totals
    plain = AppStatus(app_id="b", backend="yarn", name="n", state=AppState.RUNNING, summary=None)
    assert fold_in_app(plain, {}, spec).attempt == 0


def test_a_run_takes_in_the_attempts_the_app_ran_itself():
    """``tfyarn run`` after an app that ran attempts 0-2 and then failed (its AM killed): its next application is
    attempt 3, the budget has used what the app used (a preemption is free), the diagnoses and redone steps count."""
    sup = Supervisor(make_spec(roles=ROLES, retry={"max_attempts": 3}))
    absorb(sup, SNAP, "application_1_0001")
    assert sup.attempt == 2 and (sup.budget.counted, sup.budget.free) == (2, 1)
    assert sup.earlier[0] == "application_1_0001 attempt 0: worker:0: exit code 137 (killed by SIGKILL)"
    assert sup.next_attempt(AppState.FAILED, "AM Container for appattempt_1_0001_000001 exited with exitCode: -104")
    assert sup.attempt == 3 and len(sup.redone) == 3
    assert not sup.next_attempt(AppState.FAILED, "chief:0: exit code 137 (killed by SIGKILL)")   # 3 of 3 counted


def test_lost_tasks_and_the_wait_for_killed_containers():
    spec = make_spec(roles=ROLES)
    cs = [C(service_name="worker", instance=0, state="FAILED"), C(service_name="worker", instance=1, state="RUNNING"),
          C(service_name="chief", instance=0, state="RUNNING")]
    assert in_app_attempts.lost_task(spec, cs, None) == []                       # skein replaced it
    cs[1].state = "FAILED"
    assert [c.instance for c in in_app_attempts.lost_task(spec, cs, None)] == [0, 1]
    assert in_app_attempts.lost_task(spec, cs, {"attempt": 1, "first": {"worker": 2}}) == []  # an earlier attempt's
    asked = []

    def gone(nm, cid):
        asked.append(cid)
        return cid != "c2" or len(asked) > 3
    killed = [C(yarn_container_id="c1", yarn_node_http_address="n:8042"),
              C(yarn_container_id="c2", yarn_node_http_address="n:8042"), C(yarn_container_id="", state="REQUESTED")]
    assert in_app_attempts.wait_gone(killed, timeout=5, gone=gone, poll=0.01) == []
    assert in_app_attempts.wait_gone(killed[1:2], timeout=0.05, gone=lambda nm, cid: False, poll=0.01) == ["c2"]
