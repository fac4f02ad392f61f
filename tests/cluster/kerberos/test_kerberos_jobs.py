"""Jobs on the Kerberized cluster from a keytab-only gateway (no ticket cache) and from a ticket cache only (issues 23,
31): validate --check-files, pack, dry-run, run (ps mode, data and checkpoints on HDFS, containers on delegation
tokens, as the app user's OS account), status, logs after the end (aggregated) and live (-f), status/list/kill with
no JVM at all (SPNEGO to the RM); proxy users' containers as the proxy user; the keytab never in anything a job
wrote (aggregated logs included); tokens outliving their renew interval. Real CLI processes, real TF tasks in YARN
containers; the node is this machine, its Python the suite's node_python()."""
import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from krbutil import (ALICE, FAULT_JOBS, JOB_S, job_doc, kill_session_apps, kinit, needs_kerberos,
                     nm_log_dir, rm_json, tfyarn, unique, write_spec, yarn_backend)
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_kerberos, pytest.mark.timeout(3 * JOB_S)]
#: Apps of this module that ended, by test (the logs test reads the run test's).
FINISHED: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def _cleanup(cluster, krb_env, alice_keytab):
    yield
    kill_session_apps(alice_keytab)


def app_id_of(r: subprocess.CompletedProcess) -> str:
    ids = [w for w in (r.stdout + r.stderr).split() if w.startswith("application_")]
    assert ids, f"no application id in the output:\n{r.stdout}\n{r.stderr}"
    return ids[0].rstrip(").,;")


def status_json(env, app_id: str) -> dict:
    r = tfyarn(env, "status", app_id, "--output", "json")
    assert r.returncode in (0, 1, 3, 4), r.stderr
    return json.loads(r.stdout)


def rm_app(app_id: str, keytab: Path) -> dict:
    """The ResourceManager's record of an app (its REST API, SPNEGO with alice's keytab)."""
    return rm_json(f"apps/{app_id}", keytab)["app"]


def aggregated(app_id: str, keytab: Path, user: str = "alice", timeout: float = 120) -> dict[str, bytes]:
    """The app's aggregated log files on HDFS (path -> bytes), once the RM says aggregation SUCCEEDED."""
    t0 = time.monotonic()
    while (state := rm_app(app_id, keytab).get("logAggregationStatus")) not in ("SUCCEEDED", "FAILED", "TIME_OUT"):
        assert time.monotonic() - t0 < timeout, f"log aggregation of {app_id}: still {state} after {timeout:g}s"
        time.sleep(1)
    assert state == "SUCCEEDED", f"log aggregation of {app_id}: {state}"
    from tfyarn.cluster import hdfs
    from tfyarn.backends.yarn.log_files import aggregated_log_dirs
    out = {}
    for d in aggregated_log_dirs(app_id, user, hdfs.load_hadoop_conf()):
        fs, path = hdfs.get_fs(d)
        if fs.exists(path):
            out.update({f"hdfs:{p}": fs.cat_file(p) for p in fs.find(path)})
    assert out, f"no aggregated logs of {app_id} in {aggregated_log_dirs(app_id, user, hdfs.load_hadoop_conf())}"
    return out


def container_owners(cluster, app_id: str) -> set[str]:
    """The OS accounts owning the files in the app's container log dirs (the tasks' logs, the launch script: the
    LinuxContainerExecutor writes them as the container's account, the default executor as the NodeManager's)."""
    import pwd
    files = [p for p in (nm_log_dir(cluster) / app_id).glob("container_*/*") if p.is_file()]
    assert files, f"no container log files of {app_id} in {nm_log_dir(cluster)}"
    return {pwd.getpwuid(p.stat().st_uid).pw_name for p in files}


def wait_for_steps(app_id: str, spec, steps: int, min_s: float = 0.0) -> dict:
    """Status of ``app_id`` once it made ``steps`` global steps and ran ``min_s`` seconds since this call, polled
    in this process (one skein driver, logged in with the spec's keytab: a CLI process per poll costs a JVM)."""
    b = yarn_backend(spec)
    t0 = time.monotonic()
    try:
        while True:
            st = b.status(app_id)
            if st.progress.get("global_step", 0) >= steps and time.monotonic() - t0 >= min_s:
                return st.to_dict()
            assert st.state.value in ("PENDING", "RUNNING"), f"{app_id} ended: {st.state.value} {st.diagnostics}"
            assert time.monotonic() - t0 < JOB_S + min_s, f"{app_id} not at step {steps} within {JOB_S:g}s: {st}"
            time.sleep(2)
    finally:
        b.close()


# ------------------------------------------------------------------------------------------------ keytab-only gateway

def test_keytab_only_validate_dry_run_run_and_status(cluster, krb_env, alice_keytab, session_data, session_root,
                                                     tmp_path):
    ckpt = f"{session_root}/ckpt-run"
    doc = job_doc(session_data, unique("krb-run"), keytab=alice_keytab, epochs=2,
                  checkpoint={"dir": ckpt, "every_steps": 10, "keep": 2})
    spec = write_spec(tmp_path, doc)

    r = tfyarn(krb_env, "validate", str(spec), "--check-files", "--yarn")
    assert r.returncode == 0, r.stderr        # lists HDFS data, probes the checkpoint dir: keytab login only
    r = tfyarn(krb_env, "submit", str(spec), "--yarn", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "keytab" not in r.stdout and str(alice_keytab) not in r.stdout

    t0 = time.monotonic()
    r = tfyarn(krb_env, "-v", "run", str(spec), "--yarn", "--output", "json", timeout=JOB_S)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    st = json.loads(r.stdout)
    assert st["state"] == "SUCCEEDED", st["diagnostics"]
    FINISHED["run"] = st["app_id"]
    assert st["progress"]["global_step"] == 20, st["progress"]     # 2 epochs of 4000 records, 2 workers x 100
    assert container_owners(cluster, st["app_id"]) == {"alice"}     # the LinuxContainerExecutor ran them as alice
    print(f"keytab-only run: {time.monotonic() - t0:.0f}s")

    from tfyarn.cluster import hdfs
    fs, path = hdfs.get_fs(ckpt)                # the chief wrote checkpoints through its delegation token
    assert fs.exists(f"{path}/tfyarn-checkpoint.json") and fs.exists(f"{path}/summary.json")

    st2 = status_json(krb_env, st["app_id"])    # a new process, a new driver: the saved spec's keytab
    assert st2["state"] == "SUCCEEDED" and st2["summary"]["app_id"] == st["app_id"]
    env = {**krb_env, "TFYARN_HOME": str(tmp_path / "other-machine"),
           "TFYARN_KERBEROS_PRINCIPAL": ALICE, "TFYARN_KERBEROS_KEYTAB": str(alice_keytab)}
    st3 = status_json(env, st["app_id"])        # no saved spec here: the login from TFYARN_KERBEROS_*
    assert st3["state"] == "SUCCEEDED"
    r = tfyarn({**env, "TFYARN_KERBEROS_KEYTAB": ""}, "status", st["app_id"])
    assert r.returncode == 2 and "no Kerberos ticket" in r.stderr.strip().splitlines()[-1], r.stderr


def test_pack_stages_the_env_with_the_keytab(cluster, alice_keytab, small_venv, session_root, tmp_path):
    """Environment staging and upload through the keytab login (a tiny venv: the TF one is 1.7 GB)."""
    from tfyarn.cluster import hdfs
    from tfyarn.gateway import packaging
    spec = load_spec_dict(job_doc("hdfs:///unused/*", unique("krb-pack"), keytab=alice_keytab,
                                  environment={"pack": "venv"}))
    b = yarn_backend(spec)
    staging = f"{session_root}/staging"
    assert b.user == "alice"                     # the principal's name, not this machine's account
    ref = packaging.ensure_env(spec, staging, prefix=str(small_venv), conf=b.conf,
                               local_cache=tmp_path / "cache")
    assert ref.uploaded_bytes > 0 and not ref.cached
    fs, path = hdfs.get_fs(ref.archive_url)
    assert fs.info(path)["size"] == ref.uploaded_bytes
    again = packaging.ensure_env(spec, staging, prefix=str(small_venv), conf=b.conf, local_cache=tmp_path / "cache")
    assert again.cached and again.uploaded_bytes == 0 and again.archive_url == ref.archive_url


def test_logs_after_the_end_from_the_aggregated_logs(krb_env, alice_keytab):
    """The finished app of the keytab-only run test, once its logs are aggregated (hdfs:///tmp/logs/alice): read
    with the keytab login, no ticket cache (the `yarn logs` JVM fallback would need one)."""
    if "run" not in FINISHED:
        pytest.skip("the keytab-only run test did not leave a finished app")
    files = aggregated(FINISHED["run"], alice_keytab)
    r = tfyarn(krb_env, "logs", FINISHED["run"], timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for task in ("chief:0", "worker:0", "ps:0"):
        assert any(ln.startswith(f"{task} |") and "logs unavailable" not in ln for ln in lines), (task, r.stdout)
    assert len(files) >= 1


# -------------------------------------------------------------------------------------------- ticket cache, proxy user

def test_ticket_cache_only_as_an_allowed_proxy_user(cluster, krb_env, alice_keytab, session_data, tmp_path):
    """A user who ran kinit, whose spec has no kerberos section, submitting for bob (the cluster lets alice
    impersonate bob: scripts/kerberos-cluster's core-site); the tasks read alice's data with bob's tokens, in
    containers that run as the OS account bob."""
    env = {**krb_env, "KRB5CCNAME": kinit(alice_keytab, tmp_path / "cc")}
    doc = job_doc(session_data, unique("krb-cache"), user="bob")
    spec = write_spec(tmp_path, doc)
    assert "kerberos" not in spec.read_text()
    r = tfyarn(env, "validate", str(spec), "--check-files", "--yarn")
    assert r.returncode == 0, r.stderr
    r = tfyarn(env, "run", str(spec), "--yarn", "--output", "json", timeout=JOB_S)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    st = json.loads(r.stdout)
    assert st["state"] == "SUCCEEDED" and st["progress"]["global_step"] == 10, st
    assert rm_app(st["app_id"], alice_keytab)["user"] == "bob"
    assert container_owners(cluster, st["app_id"]) == {"bob"}


def test_proxy_user_refused(krb_env, alice_keytab, session_data, tmp_path):
    doc = job_doc(session_data, unique("krb-proxy-no"), keytab=alice_keytab, user="carol")
    r = tfyarn(krb_env, "submit", str(write_spec(tmp_path, doc)), "--yarn")
    assert r.returncode == 2, f"{r.stdout}\n{r.stderr}"
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: user: 'carol'") and "not allowed to impersonate carol" in last, r.stderr
    assert "Traceback" not in r.stderr and not r.stdout.strip()


# ---------------------------------------------------------------------------------------------------------- secrets

def test_keytab_never_in_anything_the_job_wrote(cluster, krb_env, alice_keytab, session_root, session_data,
                                                tmp_path):
    """A job dumps the whole KV and its environment into its summary; the keytab's bytes (raw or base64) and its
    path must be in none of: the CLI's output (-v), the dry-run YAML, status JSON, the run report, the KV, the tasks'
    environment, the container logs and launch scripts (local and aggregated on HDFS), the spec the tasks read,
    skein's HDFS staging dir."""
    ckpt = f"{session_root}/ckpt-leak"
    doc = job_doc(session_data, unique("krb-leak"), keytab=alice_keytab, model="fault_models:dump_kv_and_env",
                  code=str(FAULT_JOBS), checkpoint={"dir": ckpt})
    spec = write_spec(tmp_path, doc)
    home = Path(krb_env["TFYARN_HOME"])
    dry = tfyarn(krb_env, "-v", "submit", str(spec), "--yarn", "--dry-run")
    run = tfyarn(krb_env, "-v", "run", str(spec), "--yarn", "--output", "json", timeout=JOB_S)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    st = json.loads(run.stdout)
    seen = st["summary"]
    assert seen["env"]["TFYARN_ROLE"] and seen["env"].get("HADOOP_TOKEN_FILE_LOCATION"), seen["env"]   # real dump
    app_id = st["app_id"]
    stat = tfyarn(krb_env, "status", app_id, "--output", "json")

    texts = {"dry-run": dry.stdout + dry.stderr, "run": run.stdout + run.stderr, "status": stat.stdout + stat.stderr}
    report = home / "yarn" / app_id
    blobs = {str(p): p.read_bytes() for p in report.rglob("*") if p.is_file()}
    assert blobs, f"no run report in {report}"
    app_logs = nm_log_dir(cluster) / app_id
    blobs.update({str(p): p.read_bytes() for p in app_logs.rglob("*") if p.is_file()})
    assert any(p.endswith("launch_container.sh") for p in blobs), f"no container launch script in {app_logs}"
    agg = aggregated(app_id, alice_keytab)
    assert any(b"TFYARN_ROLE" in v or b"tfyarn" in v for v in agg.values()), "the aggregated logs hold no task log"
    blobs.update(agg)
    from tfyarn.cluster import hdfs
    fs, path = hdfs.get_fs(f"{cluster['fs']}/user/alice/.skein/{app_id}")
    staged = fs.find(path) if fs.exists(path) else []
    for p in staged:
        blobs[f"hdfs:{p}"] = fs.cat_file(p)
    fs, path = hdfs.get_fs(ckpt)
    for p in fs.find(path):
        blobs[f"hdfs:{p}"] = fs.cat_file(p)
    assert any("tfyarn-spec.json" in p for p in blobs) or not staged, "the spec the tasks read was not found"

    secret = alice_keytab.read_bytes()
    key = secret[-40:]                                 # key material of the last entry
    needles = {"keytab path": str(alice_keytab).encode(), "keytab dir": alice_keytab.parent.name.encode(),
               "keytab bytes": key, "keytab base64": base64.b64encode(secret)[8:48]}
    for where, text in [*texts.items(), *blobs.items()]:
        data = text.encode() if isinstance(text, str) else text
        for what, needle in needles.items():
            assert needle not in data, f"{what} found in {where}"
    assert len(blobs) > 10, sorted(blobs)


# ----------------------------------------------------------------------------------------------- delegation tokens

def follow_live(env, app_id: str, prefixes: tuple[str, ...], timeout: float = JOB_S) -> list[str]:
    """`tfyarn logs -f` on a running app until it prints a line starting with one of ``prefixes`` (then stopped);
    the lines it printed (empty when none came within ``timeout``)."""
    import queue
    import threading
    p = subprocess.Popen([sys.executable, "-m", "tfyarn.cli", "logs", "-f", app_id], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in p.stdout], daemon=True).start()   # type: ignore
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not any(ln.startswith(prefixes) for ln in seen):
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                assert p.poll() is None, f"logs -f ended (exit {p.returncode}): {p.stderr.read()}"
    finally:
        p.terminate()
        p.wait(30)
    return seen if any(ln.startswith(prefixes) for ln in seen) else []


def renew_interval_s() -> float:
    from tfyarn.cluster import hdfs
    return int(hdfs.load_hadoop_conf().get("dfs.namenode.delegation.token.renew-interval", 86400000)) / 1000


def token_lists(token_file: Path, url: str) -> subprocess.CompletedProcess:
    """A fresh process reading HDFS with nothing but ``token_file`` (as a task does), no ticket cache."""
    code = ("import sys; from hdfs_native import Client; "
            "print(len(list(Client(sys.argv[1]).list_status('/user/alice'))))")
    env = {**os.environ, "HADOOP_TOKEN_FILE_LOCATION": str(token_file), "KRB5CCNAME": "FILE:/nonexistent"}
    return subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=60, env=env)


def test_tokens_outlive_the_renew_interval(cluster, krb_env, alice_keytab, session_data, session_root, tmp_path):
    """On a cluster whose HDFS tokens expire 20 s after their last renewal (scripts/test-kerberos starts it so), a job
    running for several intervals keeps reading and writing HDFS: the ResourceManager renews the tokens skein got
    (renewer: the RM). Proof both ways: the job's own token file opens HDFS in a new process after 2+ intervals,
    while a token nobody renews, fetched at the job's start, is refused by then. The job, still running, is then
    stopped with `tfyarn kill` from the keytab-only gateway (exit 0, then status exit 3: KILLED). Meanwhile
    `tfyarn logs -f` follows it live (the NodeManager's log API, SPNEGO), and status, list and kill run on a gateway
    where no JVM can start (``_JAVA_OPTIONS`` naming an unknown VM option): RM REST with SPNEGO only."""
    interval = renew_interval_s()
    if interval > 120:
        pytest.skip(f"dfs.namenode.delegation.token.renew-interval is {interval:g}s: start the cluster with "
                    "scripts/kerberos-cluster --token-renew-s 20 (scripts/test-kerberos does)")
    env_cc = {**krb_env, "KRB5CCNAME": kinit(alice_keytab, tmp_path / "cc")}
    control = tmp_path / "control.token"        # renewer nobody: expires one interval from now
    subprocess.run(["hdfs", "fetchdt", "--renewer", "nobody", str(control)], check=True, timeout=120, env=env_cc,
                   capture_output=True)
    assert token_lists(control, cluster["fs"]).returncode == 0, "the control token does not work at all"

    ckpt = f"{session_root}/ckpt-renew"
    doc = job_doc(session_data, unique("krb-renew"), keytab=alice_keytab, epochs=400,
                  model="fault_models:slow_recommender", code=str(FAULT_JOBS),
                  params={"num_users": 100, "num_items": 100, "dim": 8, "step_delay_s": 0.2},
                  checkpoint={"dir": ckpt, "every_secs": 5})
    r = tfyarn(krb_env, "submit", str(write_spec(tmp_path, doc)), "--yarn")
    assert r.returncode == 0, r.stderr
    app_id = r.stdout.strip()
    t0 = time.monotonic()
    tokens = None
    while tokens is None:
        found = sorted(Path(cluster["data"]).glob(f"nm-local/usercache/alice/appcache/{app_id}/*/container_tokens"))
        tokens = found[-1] if found else None
        assert time.monotonic() - t0 < JOB_S, f"no container of {app_id} within {JOB_S:g}s"
        time.sleep(1)
    live = follow_live(krb_env, app_id, ("chief:0 |", "worker:0 |"))
    spec = load_spec_dict(doc)
    step_then = wait_for_steps(app_id, spec, 1, min_s=2.5 * interval - (time.monotonic() - t0))["progress"][
        "global_step"]
    from tfyarn.train.checkpoint import CheckpointStore
    store = CheckpointStore(ckpt)
    while not (saved_then := (store.latest() or {}).get("global_step", 0)):   # a loaded box: TF starts late
        assert time.monotonic() - t0 < JOB_S, f"{app_id}: no checkpoint within {JOB_S:g}s of its containers"
        time.sleep(1)
    ok = token_lists(tokens, cluster["fs"])
    expired = token_lists(control, cluster["fs"])
    st = wait_for_steps(app_id, spec, step_then + 1, min_s=12)   # two more checkpoint periods
    saved_now = (store.latest() or {}).get("global_step", 0)
    nojvm = {**krb_env, "TFYARN_HOME": str(tmp_path / "no-jvm-home"), "_JAVA_OPTIONS": "-XX:+TfyarnNoJvmHere",
             "TFYARN_KERBEROS_PRINCIPAL": ALICE, "TFYARN_KERBEROS_KEYTAB": str(alice_keytab)}
    assert not (Path(krb_env["SKEIN_CONFIG"]) / "driver").exists(), "a global skein driver could be reused"
    running = tfyarn(nojvm, "status", app_id, "--output", "json")
    listed = tfyarn(nojvm, "list")
    killed = tfyarn(nojvm, "kill", app_id)                   # `kill` from a keytab-only gateway, a new process
    after = tfyarn(nojvm, "status", app_id)
    assert running.returncode == 0 and json.loads(running.stdout)["state"] == "RUNNING", running.stderr
    assert listed.returncode == 0 and app_id in listed.stdout, listed.stderr
    assert killed.returncode == 0 and f"killed {app_id}" in killed.stdout, killed.stderr
    assert after.returncode == 3, f"status after kill: exit {after.returncode}\n{after.stdout}\n{after.stderr}"
    assert ok.returncode == 0, f"the job's token no longer opens HDFS after {2.5 * interval:.0f}s:\n{ok.stderr}"
    assert expired.returncode != 0, "the unrenewed control token still works: the renew interval is not in effect"
    assert "expire" in (expired.stderr + expired.stdout).lower(), expired.stderr
    print(f"renewal: {time.monotonic() - t0:.0f}s after submit; job step {step_then} -> "
          f"{st['progress'].get('global_step')}, checkpoint {saved_then} -> {saved_now}")
    assert st["state"] == "RUNNING" and st["progress"].get("global_step", 0) > step_then, st
    assert live, "tfyarn logs -f printed no task line of the running job within its timeout"
    assert saved_now > saved_then > 0, f"the chief stopped committing checkpoints ({saved_then} -> {saved_now})"
