"""What YARN says about a job's tasks, on the real cluster (``pytest -m yarn``): their logs live (``logs -f``), which
task died and how (kill -9 → exit code 137 named in the status and the application's diagnostics), the attempt of
a retry's application, and an async ps worker restarted in its own slot (worker:1 restarting, its rejoin counted).

Each job is small: this very Python on the nodes, the session's tiny data set on HDFS (conftest ``dataset``).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from clusterutil import (FAULT_JOBS, JOB_S, assert_clean, job, job_doc, needs_yarn, planned_steps, task_process,
                         unique, wait_for_step)
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_yarn, pytest.mark.timeout(2 * JOB_S)]

TICKER = '''
import time
from tfyarn.train import custom_train


@custom_train
def ticker(ctx, helpers):
    """Prints numbered lines over time: what `logs -f` must stream, each line once."""
    for i in range(int(helpers.params["lines"])):
        print(f"tick {ctx.task_id} {i}", flush=True)
        time.sleep(float(helpers.params["every_s"]))
    return {"ticks": int(helpers.params["lines"])}
'''


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tfyarn.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


@pytest.fixture
def owned(yarn):
    """Apps a test submits: killed at its end if a failed assertion left one running."""
    apps = []
    yield apps
    for app_id in apps:
        if not yarn.status(app_id).state.is_terminal:
            yarn.kill(app_id)


def test_logs_follow_streams_every_line_once_and_ends_with_the_app(yarn, dataset, tmp_path, owned):
    """`tfyarn logs APP --task chief:0 -f` (the CLI, as a user runs it): lines arrive while the job runs, every one
    once and in order, none of the NodeManager's header or footer, and the command returns when the app ends."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "ticker.py").write_text(TICKER)
    lines = 40
    spec = job(dataset, unique("logs-f"), mode="allreduce", workers=1, model="ticker:ticker", code=str(code),
               params={"lines": lines, "every_s": 0.25})
    app_id = yarn.submit(spec)
    owned.append(app_id)
    proc = subprocess.Popen([sys.executable, "-m", "tfyarn.cli", "logs", app_id, "--task", "chief:0", "-f"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    got = []                                                    # (time received, line)

    def read():
        for line in proc.stdout:
            got.append((time.time(), line.rstrip("\n")))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        st = yarn.wait(app_id, timeout=JOB_S)
        assert st.state is AppState.SUCCEEDED, st.diagnostics
        rc = proc.wait(timeout=90)                              # the aggregated-log wait is bounded by 30 s
        ended = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    assert rc == 0, proc.stderr.read()[-2000:]
    texts = [t for _, t in got]
    assert all(t.startswith("chief:0 | ") for t in texts), texts[:5]
    ticks = [t[len("chief:0 | "):] for t in texts if "| tick " in t]
    assert ticks == [f"tick chief:0 {i}" for i in range(lines)]      # every line once, in order
    for junk in ("End of LogType", "may not be complete", "LogContents:", "LogLength:", "*" * 20):
        assert not any(junk in t for t in texts), junk
    first_tick = next(ts for ts, t in got if "| tick " in t)
    assert first_tick < st.finished, "lines stream while the job runs, not only at the end"
    assert ended - st.finished < 60
    assert_clean(yarn, app_id)


def test_a_killed_ps_is_named_with_its_exit_code_and_a_retry_app_says_its_attempt(yarn, dataset, owned):
    """kill -9 of ps:0's Python: the status (text and JSON, from another process, after the end) and the
    application's own diagnostics name ps:0 and exit code 137 first; the application was submitted as attempt 1
    (what `run` does after a failed first attempt) and every status of it says so."""
    doc = job_doc(dataset, unique("kill-ps"), sync=False, workers=1, epochs=10,
                  model="fault_models:slow_recommender", code=str(FAULT_JOBS))
    doc["params"]["step_delay_s"] = 0.2                    # ~40 s of training: the kill lands mid-job
    spec = load_spec_dict(doc)
    app_id = yarn.submit(spec, attempt=1)
    owned.append(app_id)
    wait_for_step(yarn, app_id, "chief:0", 3)
    running = json.loads(cli("status", app_id, "--output", "json").stdout)
    assert running["attempt"] == 1 and running["state"] == "RUNNING", running
    task_process(yarn, app_id, "ps:0").send_signal(signal.SIGKILL)
    st = yarn.wait(app_id, timeout=JOB_S)
    assert st.state is AppState.FAILED and st.state.exit_code == 1, st.diagnostics
    assert st.diagnostics.startswith("ps:0: exit code 137 (killed by SIGKILL)"), st.diagnostics
    assert "ps:0: exit code 137 (killed by SIGKILL)" in yarn._report(app_id).diagnostics   # kept by YARN itself
    r = cli("status", app_id, "--output", "json")
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    tasks = {t["task"]: t for t in d["tasks"]}
    assert (tasks["ps:0"]["state"], tasks["ps:0"]["exit_code"]) == ("FAILED", 137), tasks
    assert d["attempt"] == 1 and d["diagnostics"].startswith("ps:0: exit code 137"), d
    text = cli("status", app_id)
    assert "ps:0" in text.stdout and "137" in text.stdout, text.stdout
    assert_clean(yarn, app_id)


def test_an_async_worker_killed_restarts_as_itself_and_its_rejoin_is_counted(yarn, dataset, owned):
    """Async ps, kill -9 of worker:1's Python: skein starts a new container (its own instance number); the status
    shows worker:1 restarting (restarts 1), never a task index past the role's instances; the replacement claims
    worker:1's slot, rejoins, and the job ends at the planned global step with the rejoin in the summary."""
    doc = job_doc(dataset, unique("rejoin"), sync=False, workers=2, epochs=4, batch=100,
                  model="fault_models:slow_recommender", code=str(FAULT_JOBS))
    doc["params"]["step_delay_s"] = 0.1
    doc["roles"]["worker"]["max_restarts"] = 1
    spec = load_spec_dict(doc)
    per_worker = sum(planned_steps(spec))
    app_id = yarn.submit(spec)
    owned.append(app_id)
    wait_for_step(yarn, app_id, "worker:1", 3)
    task_process(yarn, app_id, "worker:1").send_signal(signal.SIGKILL)
    seen_tasks, restarting = set(), []

    def watch(st):
        seen_tasks.update(t.task for t in st.tasks)
        restarting.extend(t.state for t in st.tasks if t.task == "worker:1" and t.restarts == 1)
    st = yarn.wait(app_id, timeout=JOB_S, poll=0.5, on_update=watch)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert seen_tasks == {"ps:0", "chief:0", "worker:0", "worker:1"}, seen_tasks     # no phantom worker:2
    assert restarting and restarting[-1] == "SUCCEEDED", restarting
    tasks = {t.task: t for t in st.tasks}
    assert tasks["worker:1"].restarts == 1 and tasks["worker:0"].restarts == 0
    s = st.summary
    assert s["global_step"] == s["total_steps"] == 3 * per_worker, s
    assert s["steps_per_worker"] == {"chief:0": per_worker, "worker:0": per_worker, "worker:1": per_worker}
    assert s["rejoins"] == {"chief:0": 0, "worker:0": 0, "worker:1": 1}, s
    assert s["lost_steps"]["worker:1"] in (0, 1) and s["lost_steps"]["worker:0"] == 0
    assert_clean(yarn, app_id)
