"""tfyarn.runner.supervisor: the job-control rules both backends use, driven by a fake clock over a MemoryKV (no TF)."""
from __future__ import annotations

import json
import threading

import pytest

from tfyarn.backends.base import AppState, AppStatus, TaskStatus, WaitClock
from tfyarn.errors import AppNotFound
from tfyarn.tasklib.context import DONE_KEY, SUMMARY_KEY, TOTAL_STEPS_KEY
from tfyarn.tasklib.kv import MemoryKV
from tfyarn.tasklib.watchdog import DUMP_REQUEST_KEY
from tfyarn.spec import load_spec_dict
from tfyarn.backends.tasks import select_tasks, settle, task_matches
from tfyarn.runner.supervisor import Supervisor, training_end_note


def _spec(**over):
    doc = {"name": "sup", "model": "custom_jobs:quick", "mode": "ps",
           "data": {"train": ["memory://sup/*.tfrecord"], "batch_size": 4, "features": {"label": {"dtype": "float32"}}},
           "roles": {"chief": {"instances": 1}, "worker": {"instances": 2}, "ps": {"instances": 1}},
           "timeouts": {"rendezvous": 10, "stall": 20, "allocation": 30}}
    doc.update(over)
    return load_spec_dict(doc)


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _raw(state: AppState, **task_states: str) -> AppStatus:
    return AppStatus("app-1", "test", "sup", state,
                     tasks=[TaskStatus(task=t.replace("_", ":"), state=s) for t, s in task_states.items()])


def _progress(kv: MemoryKV, task: str, step: int, **more) -> None:
    kv.put(f"progress/{task}", json.dumps({"step": step, "global_step": step, "time": step, **more}))


def test_deadline_is_the_earlier_of_active_deadline_and_the_callers_timeout_and_names_it():
    clock = Clock()
    sup = Supervisor(_spec(timeouts={"active_deadline": 100}), started=clock.t, timeout=50, clock=clock)
    assert sup.deadline() == (50, "the caller's timeout")
    clock.t += 49
    assert sup.check() is None and sup.time_left() == 1
    clock.t += 2
    v = sup.check(_raw(AppState.RUNNING, chief_0="RUNNING"))
    assert v is not None and v.state is AppState.TIMED_OUT and v.reason == "deadline"
    assert "active deadline of 50s exceeded (the caller's timeout)" in v.diagnosis
    sup = Supervisor(_spec(timeouts={"active_deadline": 100}), started=clock.t, clock=clock)
    assert sup.deadline() == (100, "timeouts.active_deadline")
    assert Supervisor(_spec(), clock=clock).check() is None     # neither: no deadline at all


def test_allocation_timeout_names_the_pending_tasks_and_restarts_its_clock_once_they_run():
    clock = Clock()
    sup = Supervisor(_spec(), started=clock.t, clock=clock)
    assert sup.check(_raw(AppState.PENDING)) is None           # the AM itself pending: clock starts
    clock.t += 25
    assert sup.check(_raw(AppState.RUNNING, chief_0="RUNNING", worker_0="RUNNING")) is None   # all allocated
    clock.t += 25
    assert sup.check(_raw(AppState.PENDING, chief_0="RUNNING", worker_0="PENDING")) is None   # a new clock
    clock.t += 31
    v = sup.check(_raw(AppState.PENDING, chief_0="RUNNING", worker_0="PENDING", worker_1="PENDING"))
    assert v is not None and v.state is AppState.TIMED_OUT and v.reason == "allocation"
    assert "not allocated within 30s (timeouts.allocation): worker:0, worker:1 still pending" in v.diagnosis
    sup = Supervisor(_spec(), clock=clock)
    sup.check(_raw(AppState.PENDING))
    clock.t += 31
    assert "the application master still pending" in sup.check(_raw(AppState.PENDING)).diagnosis


def test_stall_over_a_memory_kv_names_the_tasks_and_asks_for_stacks():
    clock, kv = Clock(), MemoryKV()
    spec = _spec()
    sup = Supervisor(spec, started=clock.t, clock=clock, ack_wait_s=0.0)
    sup.begin_attempt(kv)
    running = _raw(AppState.RUNNING, **{t.replace(":", "_"): "RUNNING" for t in spec.tasks()})
    assert sup.check(running) is None                               # the watch's clock starts here
    for step in (1, 2, 3):
        clock.t += 15                                               # under stall (20): progress keeps it alive
        for t in spec.training_tasks:
            _progress(kv, t, step)
        assert sup.check(running) is None
    clock.t += 19
    assert sup.check(running) is None
    clock.t += 2
    assert sup.check(_raw(AppState.PENDING, chief_0="RUNNING", worker_0="PENDING")) is None   # not while pending
    v = sup.check(running)
    assert v is not None and v.state is AppState.TIMED_OUT and v.reason == "stall"
    assert "training stalled" in v.diagnosis and "timeouts.stall = 20s" in v.diagnosis
    assert "chief:0 at step 3" in v.diagnosis and kv.get(DUMP_REQUEST_KEY) is not None
    sup.end_attempt()
    sup.begin_attempt(kv)                                           # a new attempt: a new watch, start-up allowance
    assert sup.check(running) is None


def test_stall_at_startup_gets_rendezvous_plus_stall_and_the_watch_can_start_late():
    clock, kv = Clock(), MemoryKV()
    sup = Supervisor(_spec(), started=clock.t, clock=clock, ack_wait_s=0.0)
    sup.begin_attempt()                                              # YARN: the KV is not reachable yet
    running = _raw(AppState.RUNNING, chief_0="RUNNING")
    clock.t += 100
    assert sup.check(running) is None
    sup.watch(kv)
    assert sup.check(running) is None
    clock.t += 29
    assert sup.check(running) is None
    clock.t += 2
    v = sup.check(running)
    assert v is not None and "training did not start" in v.diagnosis and "= 30s" in v.diagnosis


def test_no_stall_once_every_training_task_finished_after_done():
    clock, kv = Clock(), MemoryKV()
    spec = _spec()
    sup = Supervisor(spec, started=clock.t, clock=clock, ack_wait_s=0.0)
    sup.begin_attempt(kv)
    running = _raw(AppState.RUNNING, chief_0="RUNNING")
    sup.check(running)
    for t in spec.training_tasks:
        _progress(kv, t, 5, done=True)
    kv.put(DONE_KEY, "1")
    clock.t += 1
    assert sup.check(running) is None
    clock.t += 100
    assert sup.check(running) is None


def test_attempt_decisions_fold_earlier_diagnoses_and_respect_the_deadline():
    clock = Clock()
    spec = _spec(retry={"max_attempts": 3, "backoff": 5})
    sup = Supervisor(spec, started=clock.t, clock=clock)
    assert not sup.next_attempt(AppState.SUCCEEDED, "")
    assert not sup.next_attempt(AppState.KILLED, "killed")
    assert not sup.next_attempt(AppState.FAILED, "ps:0 died", stopped=True)
    assert sup.next_attempt(AppState.FAILED, "ps:0 died", label="app_1")
    assert sup.attempt == 1
    assert sup.next_attempt(AppState.TIMED_OUT, "stalled")
    assert not sup.next_attempt(AppState.FAILED, "again")          # 3 attempts in all
    clock.t += 278
    assert sup.final_diagnosis("again") == \
        "again\nearlier attempts: app_1: ps:0 died; stalled (3 attempts in 278s in all)"
    sup = Supervisor(_spec(retry={"max_attempts": 3, "backoff": 5}, timeouts={"active_deadline": 100}),
                     started=clock.t, clock=clock)
    clock.t += 96                                                    # the backoff would pass the deadline
    assert not sup.next_attempt(AppState.FAILED, "x")
    assert sup.final_diagnosis("x") == "x"
    stop = threading.Event()
    stop.set()
    assert sup.backoff(stop) is False


def test_progress_from_a_kv_or_a_snapshot_records_history_and_summary():
    kv = MemoryKV()
    spec = _spec()
    sup = Supervisor(spec)
    kv.put(TOTAL_STEPS_KEY, "10")
    _progress(kv, "chief:0", 4, loss=0.5)
    _progress(kv, "worker:0", 3, loss=0.7)
    kv.put("eval/latest", json.dumps({"global_step": 4, "metrics": {"auc": 0.7}}))
    p = sup.progress(kv)
    assert p["global_step"] == 4 and p["total_steps"] == 10 and p["eval"]["metrics"]["auc"] == 0.7
    assert len(sup.history.points) == 2 and sup.summary is None
    kv.put(SUMMARY_KEY, json.dumps({"global_step": 10}))
    snap = kv.items()
    assert sup.progress(snap)["global_step"] == 4 and sup.summary == {"global_step": 10, "eval": p["eval"]}
    assert len(sup.history.points) == 2                              # the same records: no new points


def test_settle_tasks_of_an_ended_app():
    st = _raw(AppState.FAILED, chief_0="RUNNING", worker_0="KILLED", worker_1="PENDING", ps_0="SUCCEEDED")
    st.diagnostics = "worker:0: exit code 137 (killed by SIGKILL)"
    settle(st, note="its launcher died")
    by = {t.task: t for t in st.tasks}
    assert (by["worker:0"].state, by["worker:0"].exit_code) == ("FAILED", 137)
    assert by["chief:0"].state == "KILLED" and by["chief:0"].diagnostics == "its launcher died"
    assert by["worker:1"].state == "KILLED" and by["ps:0"].state == "SUCCEEDED"
    ok = settle(_raw(AppState.SUCCEEDED, chief_0="RUNNING"))
    assert (ok.tasks[0].state, ok.tasks[0].exit_code) == ("SUCCEEDED", 0)
    running = settle(_raw(AppState.RUNNING, chief_0="RUNNING"))
    assert running.tasks[0].state == "RUNNING"


def test_task_selection_for_logs():
    names = ["chief:0", "worker:0", "worker:1", "ps:0"]
    assert select_tasks(names, None, "a") == names
    assert select_tasks(names, "worker", "a") == ["worker:0", "worker:1"]
    assert select_tasks(names, "worker:1", "a") == ["worker:1"]
    with pytest.raises(AppNotFound, match=r"no task 'evaluator' \(tasks: chief:0, worker:0, worker:1, ps:0\)"):
        select_tasks(names, "evaluator", "a")
    assert task_matches("container_1_0001_01_000002", "worker:0", "container_1_0001_01_000002")
    assert not task_matches("work", "worker:0")


def test_training_end_note():
    assert training_end_note({"global_step": 5, "total_steps": 10}, None, None) == ""
    note = training_end_note({"global_step": 10, "total_steps": 10}, None, None)
    assert note == "; training had completed (global step 10/10): the summary was not written (no checkpoint.dir)"
    note = training_end_note({}, {"global_step": 10, "total_steps": 10, "last_checkpoint": "ckpt-10"}, "/c")
    assert "the final checkpoint (ckpt-10) and the summary were written" in note


def test_wait_clock_names_what_it_waited_for():
    clock = Clock()
    w = WaitClock(10, "yarn app app_1", clock=clock)
    assert w.expired(AppState.RUNNING) is None
    clock.t += 11
    assert w.expired(AppState.RUNNING) == \
        "timed out after 10s waiting for yarn app app_1 to finish (last state RUNNING)"
    assert WaitClock(None, "x", clock=clock).expired(AppState.PENDING) is None


def test_totals_count_every_attempt_its_wall_time_and_the_steps_done_again(tmp_path):
    """Attempt 1 reached global step 40 and the job resumed from ckpt-30 (the next attempt's summary names it; its
    index entry says global step 30): 10 steps done again; the final status starts at the first attempt and its
    summary says so."""
    from tfyarn.train.checkpoint import CheckpointStore
    for ext in ("index", "data-00000-of-00001"):
        (tmp_path / f"ckpt-30.{ext}").write_bytes(b"x")
    ckpt = f"file://{tmp_path}/ckpt"
    CheckpointStore(ckpt).upload(str(tmp_path / "ckpt-30"), 30)
    clock = Clock()
    kv = MemoryKV()
    sup = Supervisor(_spec(retry={"max_attempts": 3, "backoff": 1}, checkpoint={"dir": ckpt}), started=clock.t,
                     clock=clock)
    _progress(kv, "chief:0", 40, global_step=40)
    assert sup.progress(kv)["global_step"] == 40
    clock.t += 60
    assert sup.next_attempt(AppState.FAILED, "chief:0: exit code 137 (killed by SIGKILL)")
    clock.t += 40
    kv.put(SUMMARY_KEY, json.dumps({"global_step": 90, "total_steps": 90, "resumed_from": "ckpt-30"}))
    sup.progress(kv)
    totals = sup.summary["attempts"]
    assert totals == {"attempts": 2, "wall_s": 100.0, "lost_steps": 10,
                      "by_attempt": [{"attempt": 0, "reached": 40, "resumes_at": 30, "lost_steps": 10}]}
    st = AppStatus("app-2", "yarn", "sup", AppState.SUCCEEDED, started=clock.t - 30,
                   summary={"resumed_from": "ckpt-30"})
    assert sup.fold_totals(st).started == 1000.0 and st.summary["attempts"]["lost_steps"] == 10
    # the summary's own resumed_step wins (the index keeps only the newest checkpoints)
    st.summary = {"resumed_from": "ckpt-pruned", "resumed_step": 33}
    assert sup.fold_totals(st).summary["attempts"]["by_attempt"][0]["resumes_at"] == 33
    one = Supervisor(_spec(), started=clock.t, clock=clock)
    assert one.fold_totals(AppStatus("a", "yarn", "sup", AppState.SUCCEEDED, started=5.0)).started == 5.0
