"""An in-app attempt on the Kerberized cluster (issue 40): a bare submit's sync ps job whose worker is killed with
SIGKILL; the app's in-app supervisor ends the attempt — the chief's and the ps's containers killed and waited for —
and starts the next in the same application, which SUCCEEDS. The supervisor, a container with delegation tokens only,
is refused by the NodeManagers' SPNEGO web UI: it asks the ResourceManager with the app's RM delegation token
instead, and its log shows every killed container answered there (its NodeManager's report, relayed), none taken
as stopped by the grace. Its other RM reads, the app's start time and its page's report, go with the same token
(backends/yarn/rest.in_container) and are answered too. Real CLI processes, real TF tasks running as alice
(LinuxContainerExecutor)."""
import json
import signal
import time

import psutil
import pytest

from krbutil import (FAULT_JOBS, JOB_S, job_doc, kill_session_apps, needs_kerberos, nm_log_dir, tfyarn, unique,
                     write_spec, yarn_backend)
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_kerberos, pytest.mark.timeout(4 * JOB_S)]


@pytest.fixture(scope="module", autouse=True)
def _cleanup(cluster, krb_env, alice_keytab):
    yield
    kill_session_apps(alice_keytab)


def task_process(app_id: str, service: str, timeout: float = JOB_S) -> psutil.Process:
    """The Python process of the app's task container of ``service`` (this machine is the node)."""
    deadline = time.monotonic() + timeout
    while True:
        for p in psutil.process_iter(["cmdline"]):
            try:
                if "tfyarn.task" not in " ".join(p.info["cmdline"] or []):
                    continue
                env = p.environ()
                if env.get("TFYARN_APP_ID") == app_id and env.get("SKEIN_CONTAINER_ID", "").startswith(f"{service}_"):
                    return p
            except psutil.Error:
                continue
        assert time.monotonic() < deadline, f"no {service} process of {app_id} within {timeout:g}s"
        time.sleep(0.5)


def supervisor_log(cluster, app_id: str) -> str:
    """Every in-app supervisor log of the app on this node (skein's ``<service>.log`` in the container log dirs)."""
    logs = sorted((nm_log_dir(cluster) / app_id).glob("container_*/tfyarn-supervisor.log"))
    assert logs, f"no tfyarn-supervisor.log of {app_id} under {nm_log_dir(cluster)}"
    return "\n".join(p.read_text(errors="replace") for p in logs)


def test_an_in_app_attempts_killed_containers_are_answered_by_the_resourcemanager(
        cluster, krb_env, alice_keytab, session_data, session_root, tmp_path):
    name = unique("krb-attempt")
    doc = job_doc(session_data, name, keytab=alice_keytab, epochs=6, model="fault_models:slow_recommender",
                  code=str(FAULT_JOBS), checkpoint={"dir": f"{session_root}/ckpt-{name}", "every_steps": 5},
                  retry={"max_attempts": 2, "backoff": "1s"})
    doc["params"]["step_delay_s"] = 0.25
    spec_path = write_spec(tmp_path, doc)
    r = tfyarn(krb_env, "submit", str(spec_path), "--yarn", "--output", "json", timeout=JOB_S)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    app_id = json.loads(r.stdout)["app_id"]

    b = yarn_backend(load_spec_dict(doc))
    try:
        t0 = time.monotonic()
        while (st := b.status(app_id)).progress.get("global_step", 0) < 10:    # past a checkpoint (every 5)
            assert st.state.value in ("PENDING", "RUNNING"), f"{app_id} ended: {st.state.value} {st.diagnostics}"
            assert time.monotonic() - t0 < JOB_S, f"{app_id} not at step 10 within {JOB_S:g}s"
            time.sleep(1)
    finally:
        b.close()
    task_process(app_id, "worker").send_signal(signal.SIGKILL)

    r = tfyarn(krb_env, "wait", app_id, "--output", "json", timeout=2 * JOB_S)
    st = json.loads(r.stdout)
    assert r.returncode == 0 and st["state"] == "SUCCEEDED", f"{r.stdout}\n{r.stderr}"
    assert st["attempt"] == 1 and st["progress"]["global_step"] == 60, (st["attempt"], st["progress"])
    causes = [(c["kind"], c["task"], c["rule"]) for c in st["causes"]]     # the kill named: the worker, then attempt 0
    assert ("restart", "worker:0", "exit code 137: killed from outside") in causes, st["causes"]
    assert ("attempt", "attempt 0", "exit code 137: killed from outside") in causes, st["causes"]

    log = supervisor_log(cluster, app_id)
    asked = [ln for ln in log.splitlines() if "asking the ResourceManager instead" in ln]
    answered = [ln for ln in log.splitlines() if "stopped: answered by the ResourceManager" in ln]
    print(f"{app_id}: the NodeManager refused {len(asked)}x; answered by the RM:\n" + "\n".join(answered))
    assert asked, f"the NodeManager was not asked and refused (SPNEGO): not the secure path\n{log[-3000:]}"
    ended = [ln for ln in log.splitlines() if "attempt 0 ended:" in ln]
    assert len(ended) == 1 and "containers killed and gone" in ended[0], ended
    killed = int(ended[0].split("attempt 0 ended: ", 1)[1].split()[0])
    assert killed >= 2 and len(answered) == killed, (killed, answered)  # every container killed (chief, ps, ...)
    started = [ln for ln in log.splitlines() if f"{app_id} started at " in ln]     # one per attempt's supervisor
    assert started and all("read with the app's RM delegation token" in ln for ln in started), started
    assert f"page of {app_id}: " in log, f"no page served\n{log[-3000:]}"
    for unanswered in ("the grace of", "cannot say whether", "no answer from the ResourceManager", "timed out",
                       "no start time of", "no report of"):
        assert unanswered not in log, f"{unanswered!r} in the supervisor's log\n{log[-3000:]}"
