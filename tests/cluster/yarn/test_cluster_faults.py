"""Faults on the real cluster (the local equivalents are tests/functional/faults): containers killed with SIGKILL,
a task raising inside its container, and what preflight refuses before anything is submitted. A stopped worker (the
stall watchdog) is a scenario of the contract suite (tests/contract), on both backends.

Task processes are found on this machine by the app id their container exports (the NodeManagers run here) and the
task map the runtime writes to the app's KV (skein renumbers restarted containers)."""
import json
import re
import signal

import psutil
import pytest
import yaml

from clusterutil import (FAULT_JOBS, JOB_S, ROOT, CliRun, assert_clean, attempt_record, job_doc, needs_yarn,
                         planned_steps, task_process, tfyarn, unique, wait_for_step, wait_until, watch_end)
from tfyarn import runner
from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState
from tfyarn.contracts import job_end
from tfyarn.spec import load_spec_dict

pytestmark = needs_yarn

EVERY = 5   # checkpoint every 5 global steps


def _apps(yarn, name: str, active_only: bool = False) -> list[str]:
    """This test's apps (by its name tag), oldest first."""
    return [a.app_id for a in yarn.list(all_states=not active_only) if name in a.tags]


def _am_process(app_id: str) -> psutil.Process:
    """The JVM of ``app_id``'s skein ApplicationMaster (its container's working dir names the app)."""
    def find():
        for p in psutil.process_iter(["cmdline"]):
            try:
                if "com.anaconda.skein.ApplicationMaster" in " ".join(p.info["cmdline"] or []) and \
                        app_id in p.cwd():
                    return p
            except psutil.Error:
                continue
        return None
    return wait_until(find, 60, f"the ApplicationMaster JVM of {app_id}", poll=0.5)


@pytest.mark.timeout(6 * JOB_S)
def test_sigkilled_worker_chief_and_ps_each_start_a_job_attempt_from_the_hdfs_checkpoint(
        yarn, dataset, hdfs_root, tmp_path):
    """Sync ps: a lost worker, chief or ps cannot rejoin an open lockstep round, so each kill -9 ends the job attempt;
    the app's in-app supervisor kills its other task containers and starts every task again in the SAME application,
    which resumes from the latest checkpoint on HDFS (issue 30 item 6: a bare submit gets these attempts too). One run,
    three kills (attempts 0, 1, 2 in one app), then the skein ApplicationMaster's JVM killed (attempt 3: skein asks
    YARN for one AM attempt, so the app fails, supervisor and all): ``tfyarn run`` submits attempt 4, numbered after
    the app's own, as a new application, which trains to the planned global step. Status says each in-app attempt
    while it runs; the failed app names the AM's end; no ended attempt leaves skein's staging dir on HDFS."""
    name = unique("attempts")
    doc = job_doc(dataset, name, epochs=6, ckpt=hdfs.join(hdfs_root, name, "ckpt"), every_steps=EVERY,
                  model="fault_models:slow_recommender", code=str(FAULT_JOBS),
                  retry={"max_attempts": 5, "backoff": "1s"})
    doc["params"]["step_delay_s"] = 0.25
    spec = load_spec_dict(doc)
    total = sum(planned_steps(spec))
    killed = []     # (app id, victim, global step seen just before the kill)
    with CliRun(doc, tmp_path) as run:
        app_id = run.submitted(lambda: _apps(yarn, name, active_only=True), JOB_S, f"the application of {name}")[0]
        for attempt, victim in enumerate(("worker:0", "chief:0", "ps:0", "am")):
            # this backend did not submit it: the attempt is the app's own (control/attempt in its KV)
            running = wait_until(lambda a=attempt: (s := yarn.status(app_id)).attempt == a and s, JOB_S,
                                 f"in-app attempt {attempt} of {app_id}")
            if attempt:     # how the attempt before ended, recorded in the app: the task killed, first
                rec = wait_until(lambda a=attempt: attempt_record(yarn, app_id, a - 1), 30, f"attempts/{attempt - 1}")
                assert rec["diagnosis"].startswith(f"{killed[-1][1]}: exit code 137 (killed by SIGKILL)"), rec
            start = int(running.progress.get("per_task", {}).get("chief:0") or 0)
            # past a checkpoint of this attempt (the first progress of a resumed attempt may still be unpublished)
            wait_for_step(yarn, app_id, "chief:0", max(start, killed[-1][2] if killed else 0) + 2 * EVERY)
            seen = int(yarn.status(app_id).progress.get("global_step") or 0)
            (_am_process(app_id) if victim == "am" else task_process(yarn, app_id, victim)).send_signal(signal.SIGKILL)
            killed.append((app_id, victim, seen))
            assert seen < total - 10, f"the job was nearly done before the {victim} kill: raise epochs"
        st = run.status(3 * JOB_S)
    assert st["state"] == "SUCCEEDED" and st["attempt"] == 4, st
    s = st["summary"]
    assert s["global_step"] == s["total_steps"] == total
    assert s["steps_per_worker"] == {"chief:0": total, "worker:0": total}
    # attempt 4 resumed from a checkpoint taken after the last kill's previous one: lost work <= one interval + lag
    resumed = int(s["resumed_from"].rsplit("-", 1)[1])
    assert killed[-1][2] - EVERY - 10 <= resumed < total, (killed, s["resumed_from"])
    totals = s["attempts"]          # every attempt counted: its wall time, the steps done again after the AM kill
    assert totals["attempts"] == 5 and len(totals["by_attempt"]) == 4, totals     # the app's 3 and the AM kill's
    assert totals["wall_s"] >= s["elapsed_s"] and totals["lost_steps"] >= 0, (totals, s["elapsed_s"])
    assert totals["by_attempt"][-1]["resumes_at"] == s["resumed_step"] and s["resumed_step"] >= resumed, totals
    apps = _apps(yarn, name)
    assert apps[0] == app_id and len(apps) == 2, (apps, killed)      # one app for attempts 0-3, one for attempt 4
    home = hdfs.qualify(f"/user/{yarn.user}/.skein")
    fs, _ = hdfs.get_fs(home)
    left = [a for a in apps if fs.exists(hdfs.get_fs(f"{home}/{a}")[1])]
    assert left == [], f"skein staging dirs left on HDFS: {left}"
    for attempt, victim in enumerate(("worker:0", "chief:0", "ps:0")):  # every earlier attempt, in the final one
        assert f"{app_id} attempt {attempt}: {victim}: exit code 137" in st["diagnostics"], st["diagnostics"]
    assert f"{app_id}: " in st["diagnostics"], "the failed application is listed in the final diagnosis"
    d = json.loads(tfyarn("status", app_id, "--output", "json").stdout)
    assert (d["state"], d["attempt"]) == ("FAILED", 3), d          # its last in-app attempt, from another process
    print(f"AM kill: {app_id}: {d['diagnostics'][:300]}")
    assert_clean(yarn, *apps, tag=name)


@pytest.mark.timeout(2 * JOB_S)
def test_a_task_raising_in_its_container_fails_the_app_with_its_exception(yarn, dataset):
    name = unique("raises")
    spec = load_spec_dict(job_doc(dataset, name, mode="allreduce", model="custom_jobs:fail_on_worker",
                                  code=str(ROOT / "tests" / "helpers" / "jobs")))
    watched: dict = {}

    def watch(st):       # the failed task's end record, caught live (the KV dies with the app)
        if st.state is AppState.RUNNING and "end" not in watched:
            watched["end"] = watch_end(yarn, st.app_id)
    st = runner.run(yarn, spec, timeout=JOB_S, on_update=watch)
    assert st.state is AppState.FAILED and st.state.exit_code == 1, st.diagnostics
    end = watched["end"]()
    assert (end.state, end.by) == ("FAILED", "failed-task:worker:0"), end
    assert end.exit_codes["worker:0"] == 1, end
    assert "RuntimeError: boom from worker:0" in end.reason, end
    assert "RuntimeError: boom from worker:0" in st.diagnostics, st.diagnostics
    said, _ = job_end.from_diagnostics(yarn.conn.app_report(st.app_id).diagnostics)   # the same record, after the KV
    assert said == end and job_end.DIAGNOSTICS_MARK not in st.diagnostics, st.diagnostics
    tasks = {t.task: t for t in st.tasks}
    assert tasks["worker:0"].state == "FAILED" and "boom from worker:0" in tasks["worker:0"].diagnostics
    assert tasks["worker:0"].exit_code == 1, st.to_dict()["tasks"]
    assert tasks["chief:0"].state == "KILLED", st.to_dict()["tasks"]   # stopped by the shutdown, not failed
    assert_clean(yarn, st.app_id, tag=name)


def test_preflight_refuses_what_cannot_run_with_exit_2_and_submits_nothing(yarn, dataset, tmp_path):
    """An unknown model module, memory above the cluster's maximum allocation and an unknown queue: exit 2 before
    anything is uploaded or submitted, each problem named (with the limit)."""
    name = unique("refused")
    max_mb = int(yarn.conf.get("yarn.scheduler.maximum-allocation-mb", "8192"))
    doc = job_doc(dataset, name, model="tfyarn_no_such_module:model")
    doc["roles"]["worker"]["memory"] = f"{max_mb // 1024 + 48} GiB"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    proc = tfyarn("submit", str(bad), "--yarn")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "tfyarn_no_such_module" in proc.stderr and "roles.worker" in proc.stderr, proc.stderr
    assert str(max_mb) in proc.stderr, proc.stderr                 # the limit it is above
    assert "nothing was uploaded or submitted" in proc.stderr
    queue = tmp_path / "queue.yaml"
    queue.write_text(yaml.safe_dump(job_doc(dataset, name, queue="no-such-queue")))
    proc = tfyarn("submit", str(queue), "--yarn")
    assert proc.returncode == 2 and "no-such-queue" in proc.stderr, proc.stdout + proc.stderr
    assert _apps(yarn, name) == [], "a refused spec submitted an application"


def _sigkill_delay_ms() -> int:
    """The cluster's NodeManager delay from SIGTERM to SIGKILL (YARN's default 250 ms; none known: 250)."""
    try:
        from tfyarn.cluster.hdfs import load_hadoop_conf
        return int(load_hadoop_conf().get("yarn.nodemanager.sleep-delay-before-sigkill.ms", "250"))
    except Exception:  # noqa: BLE001 - no cluster config: the test is skipped anyway
        return 250


@pytest.mark.timeout(4 * JOB_S)
@pytest.mark.skipif(_sigkill_delay_ms() < 2000,
                    reason="needs yarn.nodemanager.sleep-delay-before-sigkill.ms >= 2000 (YARN's default: 250)")
def test_a_chief_stopped_by_its_nodemanager_checkpoints_before_the_sigkill(yarn, dataset, hdfs_root, tmp_path):
    """The NodeManager stops a container as it does a preempted one: SIGTERM, then SIGKILL after
    sleep-delay-before-sigkill.ms. The chief (checkpoints every 1000 steps: never but this one) saves at once on the
    SIGTERM; the next attempt resumes from the step it was at."""
    name = unique("sigterm")
    doc = job_doc(dataset, name, epochs=6, ckpt=hdfs.join(hdfs_root, name, "ckpt"), every_steps=1000,
                  model="fault_models:slow_recommender", code=str(FAULT_JOBS),
                  retry={"max_attempts": 2, "backoff": "1s"})
    doc["params"]["step_delay_s"] = 0.25
    doc["timeouts"]["step"] = 30  # the sync worker left without its chief ends the attempt this soon (not 120 s)
    spec = load_spec_dict(doc)
    total = sum(planned_steps(spec))
    with CliRun(doc, tmp_path) as run:
        app_id = run.submitted(lambda: _apps(yarn, name, active_only=True), JOB_S, f"attempt 0 of {name}")[0]
        wait_for_step(yarn, app_id, "chief:0", 20)
        seen = int(yarn.status(app_id).progress.get("global_step") or 0)
        chief = task_process(yarn, app_id, "chief:0")
        container = chief.environ()["SKEIN_CONTAINER_ID"]
        yarn.client().connect(app_id).kill_container(container)    # the AM asks the NM to stop it
        st = run.status(3 * JOB_S)
    assert st["state"] == "SUCCEEDED" and st["attempt"] == 1, st
    s = st["summary"]
    assert s["global_step"] == s["total_steps"] == total, s
    logs = "\n".join(yarn.logs(app_id, task="chief:0"))
    saved = re.search(r"SIGTERM \(a preemption or a stop\) at global step (\d+): checkpoint (ckpt-\d+) committed "
                      r"([\d.]+)s after the signal", logs)
    assert saved, logs[-3000:]
    assert s["resumed_from"] == saved.group(2) and seen <= int(saved.group(1)) < total, (s, seen, saved.group(0))
    print(f"NM stop of the chief at global step >= {seen}: saved {saved.group(2)} {saved.group(3)}s after SIGTERM; "
          f"lost steps {s['attempts']['lost_steps']}")
    assert_clean(yarn, *_apps(yarn, name), tag=name)
