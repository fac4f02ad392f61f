"""What YARN did to a job's containers, said in words (backends/yarn/cluster_events.py, states.py),
and job attempts the cluster ended kept apart from ``retry.max_attempts`` (runner/supervisor.py +
contracts.triage). skein's own texts, as seen on Hadoop 3.3.6 with the CapacityScheduler preempting
(issue 30's reproduction)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from tfyarn.backends.yarn.states import (
    failure_diagnosis,
    snapshot,
    tasks_from_containers,
)
from tfyarn.contracts.status import AppState
from tfyarn.spec import load_spec_dict
from tfyarn.runner.supervisor import Supervisor

T0 = datetime(2026, 11, 26, 6, 0, tzinfo=timezone.utc)
PREEMPTED = "Container preempted by scheduler"


def container(service, instance, state, minute=0, exit_message="", cid=None):
    return SimpleNamespace(
        service_name=service,
        instance=instance,
        state=state,
        id=f"{service}_{instance}",
        yarn_container_id=cid or f"container_1795671803439_0003_01_{instance + 5:06d}",
        yarn_node_http_address="127.0.0.2:48042",
        start_time=T0 + timedelta(minutes=minute),
        finish_time=None,
        exit_message=exit_message,
        yarn_container_logs=None,
    )


def spec(sync=False, attempts=1):
    return load_spec_dict(
        {
            "name": "p",
            "model": "m:f",
            "mode": "ps",
            "sync": sync,
            "data": {"train": ["/d"], "features": {"label": {"dtype": "float32"}}, "batch_size": 1},
            "roles": {"ps": {}, "chief": {}, "worker": {"instances": 2}},
            "retry": {"max_attempts": attempts},
        }
    )


def test_a_preempted_worker_is_said_in_words_in_status_snapshot_and_diagnosis():
    s = spec()
    cs = [
        container("ps", 0, "RUNNING"),
        container("chief", 0, "RUNNING"),
        container("worker", 0, "RUNNING"),
        container(
            "worker",
            1,
            "FAILED",
            exit_message=PREEMPTED,
            cid="container_1795671803439_0003_01_000006",
        ),
        container("worker", 2, "REQUESTED", minute=2),
    ]  # skein's replacement of worker:1
    kv = {"taskmap/worker_0": "worker:0", "taskmap/worker_1": "worker:1"}
    tasks = {
        t.task: t
        for t in tasks_from_containers(
            cs, {"worker_0": "worker:0", "worker_1": "worker:1"}, s, {}, {}
        )
    }
    assert set(tasks) == {
        "ps:0",
        "chief:0",
        "worker:0",
        "worker:1",
    }  # the replacement is worker:1's
    assert tasks["worker:1"].state == "PENDING" and tasks["worker:1"].restarts == 1
    assert tasks["worker:1"].diagnostics == (
        "replacing its container preempted by the scheduler (container_1795671803439_0003_01_000006)")
    snap = snapshot(cs, kv, s, progress={})
    assert snap["events"] == {
        "worker:1": ["preempted by the scheduler (container_1795671803439_0003_01_000006)"]
    }
    # the newest container preempted (sync: skein fails the app): the task's diagnostics say so,
    # YARN's text after
    ended = cs[:4]
    t = {t.task: t for t in tasks_from_containers(ended, {}, s, {}, {})}["worker:1"]
    assert (
        t.state == "FAILED" and t.diagnostics == f"preempted by the scheduler (YARN: {PREEMPTED})"
    )
    diag = failure_diagnosis(
        "Failure in service worker, see logs for more information",
        {"chief:0": "CancelledError: RecvFromRemoteAsync is cancelled"},
        {},
        snap["events"],
    )
    assert diag.startswith(
        "worker:1: preempted by the scheduler (container_1795671803439_0003_01_000006); "
        "chief:0: CancelledError"
    ), diag
    assert diag.endswith("Failure in service worker, see logs for more information")


def test_attempts_ended_by_preemption_do_not_use_up_retry_max_attempts():
    sup = Supervisor(spec(sync=True, attempts=1))
    pre = (
        "worker:1: preempted by the scheduler (container_x); chief:0: CancelledError: "
        "RecvFromRemoteAsync is "
        "cancelled\nFailure in service worker, see logs for more information"
    )
    assert sup.next_attempt(
        AppState.FAILED, pre, label="app_1"
    )  # max_attempts 1, yet a new attempt
    assert sup.next_attempt(AppState.FAILED, pre, label="app_2") and sup.attempt == 2
    assert not sup.next_attempt(
        AppState.FAILED, "chief:0: exit code 1: ValueError: bad shape", label="app_3"
    )
    final = sup.final_diagnosis("chief:0: exit code 1: ValueError: bad shape")
    assert "2 attempts ended by the cluster (not counted in retry.max_attempts)" in final
    assert "app_1: worker:1: preempted by the scheduler" in final
    assert not Supervisor(spec(attempts=1)).next_attempt(
        AppState.KILLED, pre
    )  # a kill is never retried


def test_a_sync_app_failed_before_any_snapshot_saw_the_preemption_is_said_from_the_rm_report():
    """skein fails a sync job's app at once when a worker is preempted: the RM's report still counts
    it (numNonAMContainerPreempted), and that alone makes the attempt free."""
    from tfyarn.backends.yarn.cluster_events import rm_events
    from tfyarn.backends.yarn.rest import AppReport
    from tfyarn.contracts.triage import attempt_cause

    rep = AppReport.from_json(
        {
            "id": "application_1_0007",
            "state": "FINISHED",
            "finalStatus": "FAILED",
            "diagnostics": "Failure in service worker, see logs for more information",
            "queue": "a",
            "numNonAMContainerPreempted": 1,
        }
    )
    events = rm_events(rep, {})
    assert events == {"yarn": ["1 container preempted by the scheduler (queue a)"]}
    diag = failure_diagnosis(rep.diagnostics, {}, {}, events)
    assert diag.startswith(
        "yarn: 1 container preempted by the scheduler (queue a)\nFailure in service worker"
    )
    assert attempt_cause(diag).free
    said = {"worker:1": ["preempted by the scheduler (container_x)"]}
    assert rm_events(rep, said) == said  # the snapshot's words, not twice
    assert rm_events(AppReport.from_json({"id": "a", "numNonAMContainerPreempted": 0}), {}) == {}
