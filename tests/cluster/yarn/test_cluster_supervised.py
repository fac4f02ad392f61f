"""Issue 20 on the real cluster: a job is supervised however it was submitted — by the supervisor inside its
application (tfyarn.runner.yarn_app.supervise), with nobody following it.

Five small apps are submitted at once (the suite's time): a stalled one, one past its active deadline, one that
succeeds (its report, and status/wait from machines that did not submit it), one whose supervisor is killed, one
without a checkpoint dir (its report). Nothing
here follows an app while it runs (no ``wait``/``run`` heartbeat): what ends them is in the app.
"""
import json
import signal

import psutil
import pytest
import yaml

from clusterutil import (JOB_S, ROOT, app_processes, attempt_record, job_doc, needs_yarn, task_process, tfyarn,
                         unique,
                         wait_for_step, wait_no_processes, wait_until, watch_end)
from tfyarn.backends.yarn import records
from tfyarn.backends.yarn.rest import RmRest
from tfyarn.backends.yarn.appspec import SUPERVISOR_SERVICE
from tfyarn.contracts import job_end
from tfyarn.report import report_at
from tfyarn.task.yarn.app_end import DONE_DIAGNOSTICS
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_yarn, pytest.mark.timeout(3 * JOB_S)]
JOBS = str(ROOT / "tests" / "helpers" / "jobs")


def _doc(dataset, name, model, **over):
    return job_doc(dataset, name, mode="allreduce", model=f"custom_jobs:{model}", code=JOBS, **over)


@pytest.fixture(scope="module")
def apps(yarn, dataset, hdfs_root, tmp_path_factory):
    """{kind: (app_id, spec doc)}, all submitted bare (no follower), before any test looks at one."""
    docs = {"stall": _doc(dataset, unique("sup-stall"), "lockstep", retry={"max_attempts": 2, "backoff": 1}),
            "deadline": _doc(dataset, unique("sup-deadline"), "run_long"),
            "ok": _doc(dataset, unique("sup-ok"), "count", ckpt=f"{hdfs_root}/sup-ok/ckpt"),
            "nosup": _doc(dataset, unique("sup-killed"), "count"),
            "nockpt": _doc(dataset, unique("sup-nockpt"), "count")}
    docs["stall"]["timeouts"]["stall"] = 20
    docs["deadline"]["timeouts"]["active_deadline"] = 60
    docs["nosup"]["params"] = {"steps": 600}           # 30 s of steps: time to kill its supervisor first
    out = {}
    # the stalled job as a user submits it: `tfyarn submit`, which then exits (its attempts run in the app)
    path = tmp_path_factory.mktemp("sup") / "stall.yaml"
    path.write_text(yaml.safe_dump(docs["stall"]))
    sub = tfyarn("-q", "submit", str(path), "--yarn")
    assert sub.returncode == 0, sub.stderr[-3000:]
    out["stall"] = (sub.stdout.strip(), docs["stall"])
    for kind in ("deadline", "ok", "nosup", "nockpt"):
        out[kind] = (yarn.submit(load_spec_dict(docs[kind])), docs[kind])
    yield out
    for app_id, _ in out.values():
        if not yarn.status(app_id).state.is_terminal:
            yarn.kill(app_id)


def _ended(yarn, app_id):
    """The RM's final report of ``app_id``: RM polls only, so no follower heartbeat reaches the app."""
    rm = RmRest(yarn.conf, yarn.user)
    return wait_until(lambda: (r := rm.report(app_id)).state in ("FINISHED", "FAILED", "KILLED") and r, JOB_S,
                      f"{app_id} to end", poll=1.0)


def test_a_killed_supervisor_does_not_fail_the_job(yarn, apps, tmp_path):
    """First: this job ends ~30 s after its tasks start, the others wait for their supervisor."""
    app_id, _ = apps["nosup"]

    def supervisor():
        for p in app_processes(app_id):
            try:
                if "supervise" in " ".join(p.cmdline()):
                    return p
            except psutil.Error:
                continue
        return None
    proc = wait_until(supervisor, JOB_S, f"the supervisor process of {app_id}", poll=0.5)
    proc.kill()
    end = watch_end(yarn, app_id)
    rep = _ended(yarn, app_id)
    assert rep.final_status == "SUCCEEDED", rep.diagnostics
    # no supervisor, no follower: the last task done ended it, recording so first (job_end)
    rec = end()
    assert (rec.state, rec.by.split(":")[0], rec.exit_codes) == ("SUCCEEDED", "task", {}), rec
    # the KV is gone and nobody read it: YARN's final diagnostics carry the same record, for status
    said, people = job_end.from_diagnostics(rep.diagnostics)
    assert said == rec and people == DONE_DIAGNOSTICS, rep.diagnostics
    st = yarn.status(app_id)
    assert st.state.value == "SUCCEEDED" and SUPERVISOR_SERVICE not in " ".join(t.task for t in st.tasks)
    assert st.diagnostics == "", st.to_dict()
    # from a machine with no record of it at all (its killed supervisor's staging-dir record holds no end)
    r = tfyarn("status", app_id, "--output", "json", env={"TFYARN_HOME": str(tmp_path / "elsewhere")})
    d = json.loads(r.stdout)
    assert r.returncode == 0 and (d["state"], d["diagnostics"]) == ("SUCCEEDED", ""), r.stdout + r.stderr[-2000:]
    assert wait_no_processes(app_id) == []


def test_a_stalled_bare_submit_runs_its_next_attempt_in_the_app_and_is_timed_out_when_it_stalls_again(yarn, apps):
    """retry.max_attempts 2 and nobody following: worker:0 frozen (SIGSTOP) stalls attempt 0, which its supervisor
    ends and retries in the same application (as `tfyarn run` retries a timeout); worker:0 of attempt 1 frozen too
    uses the last attempt: the app ends TIMED_OUT, by its supervisor, naming the task and the earlier attempt."""
    app_id, doc = apps["stall"]
    frozen = []
    try:
        for attempt in (0, 1):
            wait_until(lambda a=attempt: yarn.status(app_id).attempt == a, JOB_S, f"attempt {attempt} of {app_id}")
            wait_for_step(yarn, app_id, "worker:0", 3)
            proc = task_process(yarn, app_id, "worker:0")
            proc.send_signal(signal.SIGSTOP)
            frozen.append(proc)
            if attempt == 0:
                rec = wait_until(lambda: attempt_record(yarn, app_id, 0), JOB_S, f"attempt 0 of {app_id} to end")
                assert "timeouts.stall" in rec["diagnosis"] and "worker:0 at step" in rec["diagnosis"], rec
        rep = _ended(yarn, app_id)
    finally:
        for proc in frozen:
            try:
                proc.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
    assert "timeouts.stall" in rep.diagnostics and "worker:0" in rep.diagnostics, rep.diagnostics
    end = records.read_record(yarn.staging_dir, app_id)["snapshot"]["end"]   # for any machine
    assert '"by":"supervisor"' in end and '"state":"TIMED_OUT"' in end, end
    st = yarn.status(app_id)
    assert st.state.value == "TIMED_OUT" and st.state.exit_code == 4 and st.attempt == 1, st.diagnostics
    assert "worker:0 at step" in st.diagnostics, st.diagnostics
    assert "did not answer the stack-dump request" in st.diagnostics, st.diagnostics
    assert "earlier attempts: attempt 0: timed out" in st.diagnostics, st.diagnostics
    assert [a.app_id for a in yarn.list(all_states=True) if doc["name"] in a.tags] == [app_id]
    assert wait_no_processes(app_id) == []


def test_a_bare_submit_past_its_active_deadline_is_timed_out_naming_it(yarn, apps):
    app_id, _ = apps["deadline"]
    rep = _ended(yarn, app_id)
    assert rep.final_status == "FAILED" and "timeouts.active_deadline" in rep.diagnostics, rep.diagnostics
    st = yarn.status(app_id)
    assert st.state.value == "TIMED_OUT" and "active deadline of 60s" in st.diagnostics, st.diagnostics
    assert wait_no_processes(app_id) == []


def test_other_machines_recover_the_spec_and_the_supervisor_writes_the_report(yarn, apps, tmp_path):
    app_id, doc = apps["ok"]
    tasks = ["chief:0", "worker:0"]
    # status from a machine that did not submit it, while it runs: the spec from the app's KV
    def running():
        r = tfyarn("status", app_id, "--output", "json", env={"TFYARN_HOME": str(tmp_path / "a")})
        d = json.loads(r.stdout) if r.returncode == 0 else {}
        return d if d.get("state") in ("RUNNING", "SUCCEEDED") else None
    d = wait_until(running, JOB_S, f"{app_id} running, seen from another machine", poll=2.0)
    assert [t["task"] for t in d["tasks"]] == tasks, d["tasks"]          # the supervisor is no task
    # the run report next to the checkpoints, by the supervisor: nobody else has followed this job (yet)
    rep = _ended(yarn, app_id)
    assert job_end.from_diagnostics(rep.diagnostics)[1] == DONE_DIAGNOSTICS, rep.diagnostics  # tfyarn ended it
    end = records.read_record(yarn.staging_dir, app_id)["snapshot"]["end"]   # its supervisor's
    assert '"by":"supervisor"' in end and '"state":"SUCCEEDED"' in end, end
    ckpt = doc["checkpoint"]["dir"]
    assert report_at(ckpt, app_id) is not None, f"no report.json of {app_id} in {ckpt}"
    # wait from another machine: the outcome, the tasks, the summary
    w = tfyarn("wait", app_id, "--output", "json", env={"TFYARN_HOME": str(tmp_path / "b")}, timeout=JOB_S + 60)
    assert w.returncode == 0, w.stdout + w.stderr[-3000:]
    d = json.loads(w.stdout)
    assert d["state"] == "SUCCEEDED" and [t["task"] for t in d["tasks"]] == tasks, d
    assert d["summary"] and d["summary"].get("app_id") == app_id, d["summary"]
    # after the end, a third machine: the app's record in the staging dir
    r = tfyarn("status", app_id, "--output", "json", env={"TFYARN_HOME": str(tmp_path / "c")})
    d = json.loads(r.stdout)
    assert r.returncode == 0 and d["state"] == "SUCCEEDED", r.stdout + r.stderr[-2000:]
    assert [t["task"] for t in d["tasks"]] == tasks and d["progress"], d


def test_the_report_of_a_job_without_checkpoints_is_in_the_staging_dir_for_any_machine(yarn, apps, tmp_path):
    """No checkpoint dir: the supervisor's report (phases included) still reaches a machine that never followed."""
    app_id, _ = apps["nockpt"]
    assert job_end.from_diagnostics(_ended(yarn, app_id).diagnostics)[1] == DONE_DIAGNOSTICS
    r = tfyarn("report", app_id, "--output", "json", env={"TFYARN_HOME": str(tmp_path / "other")})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["app_id"] == app_id and rep["state"] == "SUCCEEDED", rep
    assert rep["phases"].get("training") is not None and rep["phases"].get("app end") is not None, rep["phases"]
