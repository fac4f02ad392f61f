"""The end of a YARN job as one protocol (tfyarn/contracts/job_end.py): the decision, the record
written before the shutdown, who leaves the end to whom, and status reading the record before YARN's
text (backends/yarn/outcome.py)."""

import json

import pytest

from tfyarn.backends.yarn import outcome
from tfyarn.contracts import job_end
from tfyarn.contracts.kv_keys import END_KEY
from tfyarn.contracts.status import AppState
from tfyarn.task.yarn import app_end
from tfyarn.tasklib.kv import MemoryKV


def test_decide_by_precedence_stop_failure_done_verdict():
    exits = {"ps:0": {"code": 137, "died_at": 1.0}, "chief:0": {"code": None}}
    assert job_end.decide("task:chief:0", done=True, now=5.0) == job_end.JobEnd(
        "SUCCEEDED", job_end.DONE_REASON, "task:chief:0", {}, 5.0
    )
    failed = job_end.decide(
        "failed-task:ps:0", failure="ps:0: exit code 137", exits=exits, done=True
    )
    assert (failed.state, failed.final_status, failed.exit_codes) == (
        "FAILED",
        "FAILED",
        {"ps:0": 137},
    )
    late = job_end.decide("supervisor", done=True, verdict="timed out: active deadline 60s")
    # a job that finished is not failed by the deadline reached meanwhile
    assert late.state == "SUCCEEDED"
    timed = job_end.decide("supervisor", verdict="timed out: training stalled for 30s")
    assert (timed.state, timed.final_status, timed.reason) == (
        "TIMED_OUT",
        "FAILED",
        "training stalled for 30s",
    )
    stop = job_end.decide("follower", stopped="interrupted: killed app_1", verdict="x", failure="y")
    assert (stop.state, stop.final_status, stop.reason) == (
        "KILLED",
        "KILLED",
        "interrupted: killed app_1",
    )


def test_decide_refuses_an_unknown_ender_and_no_end_at_all():
    with pytest.raises(ValueError, match="unknown ender 'airflow'"):
        job_end.decide("airflow", done=True)
    with pytest.raises(ValueError, match="nothing ends the job"):
        job_end.decide("follower")


def test_the_record_round_trips_and_bad_records_are_none():
    end = job_end.decide(
        "failed-task:worker:1", failure="worker:1: exit code 1", exits={"worker:1": {"code": 1}}
    )
    assert job_end.JobEnd.from_json(end.to_json()) == end
    assert set(json.loads(end.to_json())) == {"state", "reason", "exit_codes", "by", "time"}
    for bad in (None, "", "{", '{"reason": "x"}', '{"state": "RUNNING"}', "[1]"):
        assert job_end.JobEnd.from_json(bad) is None, bad


def test_end_job_writes_the_record_before_the_shutdown():
    kv, seen = MemoryKV(), []
    end = job_end.decide("supervisor", verdict="timed out: allocation 10s")
    job_end.end_job(
        kv, end, lambda status, diag: seen.append((status, diag, kv.get(END_KEY))), "timed out: x"
    )
    assert seen == [("FAILED", job_end.with_record("timed out: x", end), end.to_json())]


def test_the_record_rides_as_the_last_line_of_the_diagnostics_and_is_read_back_exactly():
    """After the end the KV is gone: the diagnostics YARN keeps carry the record (one JSON line,
    last: a ResourceManager cutting long diagnostics keeps their end), read exactly, the rest left
    for people; a long reason is cut there (the KV's record keeps it whole)."""
    end = job_end.decide("failed-task:ps:0", failure="ps:0: exit code 137\n" + "x" * 5000,
                         exits={"ps:0": {"code": 137}, "worker:0": {"code": None}}, now=5.0)
    text = job_end.with_record("ps:0: exit code 137 (killed by SIGKILL)", end)
    last = text.splitlines()[-1]
    assert last.startswith(job_end.DIAGNOSTICS_MARK) and len(last) < 2 * job_end.REASON_MAX
    cut = "Diagnostic messages truncated, showing last 65536 chars:\n" + text[-len(last) - 20:]
    for diag in (text, cut, text + "\nFailing this attempt."):
        got, rest = job_end.from_diagnostics(diag)
        assert (got.state, got.by, got.exit_codes, got.time) == ("FAILED", "failed-task:ps:0", {"ps:0": 137}, 5.0)
        assert len(got.reason) == job_end.REASON_MAX and job_end.DIAGNOSTICS_MARK not in rest
    assert job_end.from_diagnostics(text)[1] == "ps:0: exit code 137 (killed by SIGKILL)"
    done = job_end.with_record(app_end.DONE_DIAGNOSTICS, job_end.decide("task:chief:0", done=True))
    assert job_end.from_diagnostics(done)[1] == app_end.DONE_DIAGNOSTICS
    for none in ("", "worker:0: exit code 1", "tfyarn-end: {not json", "say tfyarn-end: {}"):
        assert job_end.from_diagnostics(none) == (None, none)


def test_who_leaves_the_end_to_whom():
    assert job_end.leave_to("task:chief:0", True, True) == "supervisor"
    assert job_end.leave_to("task:chief:0", False, True) == "follower"
    assert job_end.leave_to("task:chief:0", False, False) is None
    assert job_end.leave_to("supervisor", True, True) == "follower"
    assert job_end.leave_to("supervisor", True, False) is None
    assert job_end.leave_to("follower", True, True) is None
    assert job_end.leave_to("failed-task:ps:0", True, True) is None


def test_the_last_task_records_its_end_before_shutting_down():
    kv = MemoryKV({"slot-done/chief:0": "1", "slot-done/worker:0": "1"})
    seen = []
    assert app_end.finish_if_last(
        kv, ["chief:0", "worker:0"], "worker:0", lambda diag: seen.append((kv.get(END_KEY), diag))
    )
    [(rec, diag)] = seen
    end = job_end.JobEnd.from_json(rec)
    assert end is not None and (end.state, end.by) == ("SUCCEEDED", "task:worker:0")
    assert job_end.from_diagnostics(diag) == (end, app_end.DONE_DIAGNOSTICS)


def test_status_reads_the_record_first_and_only_when_yarn_agrees():
    snap = {
        "end": job_end.decide("supervisor", verdict="timed out: stalled").to_json(),
        "failures": {"worker:0": "stuck"},
        "exits": {},
    }
    assert outcome.from_record("RUNNING", "UNDEFINED", snap) is None
    state, diag = outcome.from_record("FINISHED", "FAILED", snap)
    assert state is AppState.TIMED_OUT and "stalled" in diag and "worker:0: stuck" in diag
    assert (
        outcome.from_record("FINISHED", "SUCCEEDED", snap) is None
    )  # YARN ended it otherwise: the text
    done = {"end": job_end.decide("follower", done=True).to_json()}
    assert outcome.from_record("FINISHED", "SUCCEEDED", done) == (AppState.SUCCEEDED, "")
    killed = {"end": job_end.decide("follower", verdict="active deadline 5s reached").to_json()}
    assert outcome.from_record("KILLED", "KILLED", killed) == (
        AppState.TIMED_OUT,
        "active deadline 5s reached",
    )
    assert outcome.from_record("FINISHED", "FAILED", {}) is None  # an older app: no record
