"""Stall watchdog: decision logic (no TF, explicit clock) and one real-process test with SIGSTOP.

Why these tests: the seeds' jobs hung for hours with no signal. The watchdog must (1) never fire while any task's
step advances, (2) fire once global progress has been flat for ``timeouts.stall``, (3) name the frozen task, and
(4) leave the responsive tasks' stacks in their logs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfyarn.backends.local.kvserver import KVServer
from tfyarn.tasklib.context import DONE_KEY, progress_key
from tfyarn.tasklib.kv import HttpKV, MemoryKV
from tfyarn.tasklib.watchdog import (DUMP_REQUEST_KEY, StallWatchdog, dump_stacks, install_stack_dumps,
                                     stacks_ack_key, uninstall_stack_dumps)

TASKS = ["chief:0", "worker:0"]


def report(kv, task, step, **extra):
    kv.put(progress_key(task), json.dumps({"step": step, "global_step": step, **extra}))


def test_no_stall_while_any_task_advances():
    kv = MemoryKV()
    wd = StallWatchdog(kv, TASKS, stall_s=10)
    for t in range(0, 60, 5):                 # only chief advances; that is still global progress
        report(kv, "chief:0", t)
        report(kv, "worker:0", 3)
        assert wd.check(now=float(t)) is None


def test_stall_after_flat_progress_names_tasks_and_steps():
    kv = MemoryKV()
    wd = StallWatchdog(kv, TASKS, stall_s=10)
    report(kv, "chief:0", 1)
    report(kv, "worker:0", 1)
    assert wd.check(now=0.0) is None
    report(kv, "chief:0", 2)
    report(kv, "worker:0", 2)
    assert wd.check(now=3.0) is None
    assert wd.check(now=12.9) is None         # 9.9 s flat
    r = wd.check(now=13.0)                    # 10 s flat
    assert r is not None and r.stalled_for == pytest.approx(10.0)
    assert r.stopped_tasks == TASKS
    assert "chief:0 at step 2" in r.message and "worker:0 at step 2" in r.message
    assert "timeouts.stall = 10s" in r.message


def test_heartbeat_without_step_change_is_not_progress():
    """A progress record rewritten with a new time but the same step (a live reporter thread over a blocked main
    thread) must not keep the job alive."""
    kv = MemoryKV()
    wd = StallWatchdog(kv, TASKS, stall_s=5)
    for t in range(8):
        report(kv, "chief:0", 7, time=t)
        report(kv, "worker:0", 7, time=t)
        r = wd.check(now=float(t))
    assert r is not None and r.stalled_for == pytest.approx(7.0)


def test_startup_without_any_progress_is_a_stall_after_startup_s():
    kv = MemoryKV()
    wd = StallWatchdog(kv, TASKS, stall_s=5, startup_s=20)
    assert wd.check(now=100.0) is None
    assert wd.check(now=119.0) is None
    r = wd.check(now=120.0)
    assert r is not None and "never reported a step" in r.message
    assert r.message.startswith("training did not start: no task reported a first step within 20s "
                                "(timeouts.rendezvous + timeouts.stall = 20s)")
    assert r.suspects == TASKS


def test_a_task_that_ended_successfully_is_neither_asked_for_stacks_nor_a_suspect():
    """A chief that returned while its workers hang: its process is gone because it finished, not because it
    died (it was named the likely cause, with the ps)."""
    kv = MemoryKV()
    calls = []
    wd = StallWatchdog(kv, ["worker:0"], stall_s=1, on_stall=calls.append, ack_wait_s=0.2, signal_pids=False,
                       all_tasks={"chief:0": None, "ps:0": None, "worker:0": None})
    wd.task_ended("chief:0")
    wd.task_ended("ps:0")
    report(kv, "worker:0", 1)
    assert wd.poll(now=0.0) is None
    r = wd.poll(now=5.0)
    assert r is not None and r.no_ack == ["worker:0"] and r.suspects == ["worker:0"]


def test_after_done_only_tasks_that_neither_finish_nor_advance_are_reported():
    kv = MemoryKV()
    wd = StallWatchdog(kv, ["chief:0", "worker:0", "worker:1"], stall_s=10)
    for t in ("chief:0", "worker:0", "worker:1"):
        report(kv, t, 5)
    assert wd.check(now=0.0) is None
    kv.put(DONE_KEY, "1")
    report(kv, "chief:0", 9, done=True)      # finished
    report(kv, "worker:0", 8)                # still winding down, advancing
    assert wd.check(now=5.0) is None
    report(kv, "worker:0", 9, done=True)
    r = wd.check(now=10.0)                   # worker:1 (async, frozen) stuck at 5 since t=0
    assert r is not None and r.after_done and list(r.tasks) == ["worker:1"] and r.stopped_tasks == ["worker:1"]
    assert "training finished (control/done)" in r.message and "worker:1 at step 5" in r.message


def test_after_done_a_task_that_never_reported_is_reported_stall_s_after_done():
    """Seen: a re-run of a finished job; the chief was done at once, the ps left, and worker:1 hung in session start
    (never a step). Excluding tasks without a step kept the job RUNNING for 10 minutes, until interrupted."""
    kv = MemoryKV()
    wd = StallWatchdog(kv, ["chief:0", "worker:0", "worker:1"], stall_s=10, startup_s=300)
    assert wd.check(now=0.0) is None
    kv.put(DONE_KEY, "1")
    report(kv, "chief:0", 9, done=True)
    report(kv, "worker:0", 0, done=True)
    assert wd.check(now=50.0) is None        # done first seen now: the clock of a task without a step starts here
    assert wd.check(now=59.0) is None
    r = wd.check(now=60.0)
    assert r is not None and r.after_done and list(r.tasks) == ["worker:1"] and r.stalled_for == 10.0


def test_a_finished_job_never_stalls():
    kv = MemoryKV()
    wd = StallWatchdog(kv, TASKS, stall_s=1)
    report(kv, "chief:0", 5)
    report(kv, "worker:0", 5)
    assert wd.check(now=0.0) is None
    kv.put(DONE_KEY, "1")
    report(kv, "chief:0", 5, done=True)
    report(kv, "worker:0", 5, done=True)
    assert wd.check(now=100.0) is None


def test_a_chief_stuck_in_its_final_checkpoint_or_export_is_named_as_such():
    kv = MemoryKV()
    wd = StallWatchdog(kv, TASKS, stall_s=10)
    report(kv, "chief:0", 5, done=True)  # every step ran, no control/done
    report(kv, "worker:0", 5, done=True)
    assert wd.check(now=0.0) is None and wd.check(now=9.0) is None
    r = wd.check(now=10.0)
    assert r is not None
    assert r.message.startswith("every training task ran all its steps, but the chief did not finish its final "
                                "checkpoint, export and summary within 10s (timeouts.stall = 10s)")
    report(kv, "worker:0", 5)                  # one task not finished: the usual stall message
    wd2 = StallWatchdog(kv, TASKS, stall_s=10)
    wd2.check(now=0.0)
    assert wd2.check(now=10.0).message.startswith("training stalled: no task's step advanced for 10s")


def test_frozen_async_worker_is_not_a_stall_while_others_advance():
    kv = MemoryKV()
    wd = StallWatchdog(kv, ["worker:0", "worker:1"], stall_s=10)
    for t in range(0, 100, 5):
        report(kv, "worker:0", t)
        report(kv, "worker:1", 3)
        assert wd.check(now=float(t)) is None


def test_laggard_is_the_suspect_when_everyone_answers():
    kv = MemoryKV()
    wd = StallWatchdog(kv, ["worker:0", "worker:1", "worker:2"], stall_s=2)
    report(kv, "worker:0", 9)
    report(kv, "worker:1", 4)
    report(kv, "worker:2", 9)
    wd.check(now=0.0)
    r = wd.check(now=2.0)
    assert r.suspects == ["worker:1"]


def test_the_watch_keeps_watching_the_chiefs_finishing_phase_until_control_done():
    """Every training task reports ``done`` before the chief's final checkpoint, export and summary: a hung upload
    there must still fail the job (the watch used to end as soon as every task was finished)."""
    kv = MemoryKV()
    calls = []
    report(kv, "chief:0", 5, done=True)  # every step ran, no control/done
    report(kv, "worker:0", 5, done=True)
    wd = StallWatchdog(kv, TASKS, stall_s=0.5, on_stall=calls.append, ack_wait_s=0.1, signal_pids=False)
    assert wd.poll(now=0.0) is None
    assert wd.poll(now=1.0) is not None
    assert len(calls) == 1 and calls[0].message.startswith("every training task ran all its steps, but the chief")
    # with control/done set, finished tasks are never a stall
    kv2 = MemoryKV()
    kv2.put(DONE_KEY, "1")
    report(kv2, "chief:0", 5, done=True)
    report(kv2, "worker:0", 5, done=True)
    wd2 = StallWatchdog(kv2, TASKS, stall_s=0.5, on_stall=calls.append, signal_pids=False)
    assert wd2.poll(now=0.0) is None and wd2.poll(now=100.0) is None and len(calls) == 1


def test_poll_requests_dumps_collects_acks_and_calls_back_once():
    kv = MemoryKV()
    calls = []
    wd = StallWatchdog(kv, TASKS, stall_s=1, on_stall=calls.append, ack_wait_s=0.3, signal_pids=False)
    report(kv, "chief:0", 1)
    report(kv, "worker:0", 1)
    assert wd.poll(now=0.0) is None
    # chief answers any dump request instantly; worker:0 never does (frozen)
    orig_put = kv.put

    def put(key, value):
        orig_put(key, value)
        if key == DUMP_REQUEST_KEY:
            orig_put(stacks_ack_key("chief:0"), value)
    kv.put = put
    r = wd.poll(now=5.0)
    assert r is not None and calls == [r]
    assert r.no_ack == ["worker:0"] and r.suspects == ["worker:0"]
    assert "worker:0 at step 1 (did not answer the stack-dump request)" in r.message
    assert wd.poll(now=9.0) is r and len(calls) == 1


def test_update_pid_after_a_restart_is_used_for_diagnosis(monkeypatch):
    import tfyarn.tasklib.watchdog as wdmod
    kv = MemoryKV()
    wd = StallWatchdog(kv, {"worker:0": 111}, stall_s=1, ack_wait_s=0.0, signal_pids=False)
    wd.update_pid("worker:0", 222)
    seen = []
    monkeypatch.setattr(wdmod, "process_state", lambda pid: seen.append(pid) or "stopped")
    wd.check(now=0.0)
    r = wd.poll(now=5.0)
    assert seen == [222] and r.process_states == {"worker:0": "stopped"}


def test_kv_dump_request_writes_stacks_and_acknowledges(capfd):
    kv = MemoryKV()
    install_stack_dumps(kv, "worker:3", poll_s=0.05)
    try:
        kv.put(DUMP_REQUEST_KEY, "r1")
        kv.wait(stacks_ack_key("worker:3"), timeout=5, what="the dump acknowledgement of worker:3")
    finally:
        uninstall_stack_dumps()
    err = capfd.readouterr().err
    assert "tfyarn stack dump" in err and "request r1" in err
    assert "test_kv_dump_request_writes_stacks_and_acknowledges" in err   # the main thread's frame is in the dump


def test_dump_stacks_without_fd_logs_instead(caplog):
    class NoFd:
        def write(self, s): pass
        def flush(self): pass
    with caplog.at_level("WARNING"):
        dump_stacks("unit test", file=NoFd())
    assert "tfyarn stack dump" in caplog.text and "test_dump_stacks_without_fd_logs_instead" in caplog.text


# ----------------------------------------------------------------------------------------------- real processes

# A task that steps in lockstep with its peers (like a synchronous all-reduce): it advances only when every peer has
# reached its step, so a frozen peer blocks it — alive, answering dump requests, but not advancing.
FAKE_TASK = textwrap.dedent("""
    import json, sys, time
    from tfyarn.tasklib.kv import HttpKV
    from tfyarn.tasklib.watchdog import install_stack_dumps
    url, task, peers = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    kv = HttpKV(url)
    install_stack_dumps(kv, task, poll_s=0.2)

    def wait_for_peers_in_collective(step):
        while True:
            steps = [json.loads(kv.get("progress/" + p) or '{"step": 0}')["step"] for p in peers]
            if min(steps) >= step:
                return
            time.sleep(0.05)

    def training_step_loop():
        step = 0
        while True:
            wait_for_peers_in_collective(step)
            step += 1
            kv.put("progress/" + task, json.dumps({"step": step}))
            time.sleep(0.05)
    training_step_loop()
""")


@pytest.mark.timeout(90)
def test_sigstopped_task_fails_the_job_with_diagnosis_and_stacks(tmp_path):
    script = tmp_path / "fake_task.py"
    script.write_text(FAKE_TASK)
    stall_s, margin = 3.0, 4.0
    with KVServer() as server:
        kv = HttpKV(server.url)
        procs, logs = {}, {}
        for t in TASKS:
            logs[t] = tmp_path / f"{t.replace(':', '_')}.log"
            with open(logs[t], "w") as err:
                procs[t] = subprocess.Popen([sys.executable, str(script), server.url, t, ",".join(TASKS)],
                                            stderr=err, stdout=subprocess.DEVNULL)
        try:
            kv.wait_all([progress_key(t) for t in TASKS], timeout=30, what="first progress of the fake tasks")
            stalled = []
            wd = StallWatchdog(kv, {t: p.pid for t, p in procs.items()}, stall_s=stall_s,
                               on_stall=lambda r: stalled.append((time.monotonic(), r)), ack_wait_s=2.0)

            def watch(seconds: float) -> None:     # the follower's loop (the supervisor polls it the same way)
                end = time.monotonic() + seconds
                while not stalled and time.monotonic() < end:
                    wd.poll()
                    time.sleep(0.2)

            watch(1.5)
            assert not stalled, "fired while both tasks were advancing"
            t_freeze = time.monotonic()
            os.kill(procs["worker:0"].pid, signal.SIGSTOP)
            watch(stall_s + margin + 2.0)
            assert stalled, f"no stall reported within {stall_s + margin + 2.0}s of freezing worker:0"
            fired_at, r = stalled[0]
            assert fired_at - t_freeze <= stall_s + margin
            assert r.process_states["worker:0"] == "stopped"
            assert r.no_ack == ["worker:0"] and r.suspects == ["worker:0"]
            assert set(r.stopped_tasks) == set(TASKS)
            assert "worker:0" in r.message and "process stopped" in r.message
        finally:
            for p in procs.values():
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait(timeout=10)
    chief_log = logs["chief:0"].read_text()
    assert "tfyarn stack dump" in chief_log
    assert "wait_for_peers_in_collective" in chief_log and "training_step_loop" in chief_log
