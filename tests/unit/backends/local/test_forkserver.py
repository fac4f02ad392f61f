"""The local launcher's forkserver with real processes: what a forked task's process looks like (env, cwd, session,
output), exit statuses like Popen's, stopping, dying with the launcher or the server, and the fallbacks to starting
tasks as new processes."""
import json
import logging
import os
import re
import signal
import sys
import time

import psutil
import pytest

from launch_helpers import (app_processes, forkserver_process, small_spec, task_processes, wait_for_step,
                            wait_for_tasks, wait_no_processes)
from tfyarn import api, runner
from tfyarn.backends.base import AppState
from tfyarn.backends.local.forkserver import ForkServer, ForkServerError
from tfyarn.backends.local.backend import LocalBackend
from tfyarn.spec import load_spec_dict

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                           reason="the forkserver is used on Linux only")]
TASKS = ("chief:0", "worker:0")


def probe_spec(tmp_path, params=None, worker_env=None, **kw):
    roles = {"chief": {"instances": 1}, "worker": {"instances": 1, "env": worker_env or {}}}
    return load_spec_dict(small_spec(tmp_path, model="custom_jobs:probe", params=params or {}, roles=roles, **kw))


def probe(app_id: str, task: str) -> dict:
    """What custom_jobs:probe recorded about the process of ``task``."""
    return json.loads((LocalBackend().app_dir(app_id) / "tasks" / task.replace(":", "_") / "probe.json").read_text())


def server_log(app_id: str) -> str:
    return (LocalBackend().app_dir(app_id) / "forkserver.log").read_text()


def server_pid(app_id: str) -> int:
    text = server_log(app_id)
    found = re.search(r"forkserver: pid (\d+) ready", text)
    assert found, f"the forkserver never said it was ready; its log:\n{text}"
    return int(found.group(1))


def wait_restarts(backend, app_id: str, task: str, restarts: int, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        st = backend.status(app_id)
        t = next(t for t in st.tasks if t.task == task)
        if t.restarts >= restarts and t.state == "RUNNING":
            return st
        assert not st.state.is_terminal, f"job ended ({st.state.value}: {st.diagnostics}) before restart {restarts}"
        assert time.monotonic() < deadline, f"{task} was not restarted {restarts} times within {timeout:g}s"
        time.sleep(0.1)


def test_forked_tasks_have_their_own_env_cwd_session_and_output(tmp_path):
    (tmp_path / "worker-tmp").mkdir()
    spec = probe_spec(tmp_path, {"lines": 3, "exit_hooks": True, "tf_log": True},
                      worker_env={"PROBE_ONLY_WORKER": "yes", "TMPDIR": str(tmp_path / "worker-tmp")})
    echoed = []
    st = api.run(spec, backend="local", echo=lambda task, line: echoed.append((task, line)))
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    server = server_pid(st.app_id)
    assert not psutil.pid_exists(server), "the forkserver outlived its launcher's run()"
    infos = {task: probe(st.app_id, task) for task in TASKS}
    for task, info in infos.items():
        env, task_dir = info["env"], LocalBackend().app_dir(st.app_id) / "tasks" / task.replace(":", "_")
        assert info["ppid"] == server != os.getpid()  # forked by the server, not started by us (the launcher)
        assert env["TFYARN_PARENT_PID"] == str(server)  # the death chain: launcher → forkserver → task
        assert f"{env['TFYARN_ROLE']}:{env['TFYARN_INDEX']}" == task
        assert "TFYARN_FORKSERVER_FD" not in env and env["TF_CPP_MIN_LOG_LEVEL"] == "2"
        assert info["cwd"] == str(task_dir) and info["sid"] == info["pid"] and info["stdin"] == "/dev/null"
        assert info["comm"] == task and info["argv"][0].endswith(os.path.join("tfyarn", "task", "__main__.py"))
        expected = [f"probe {stream} {i} of {task}" for i in range(3) for stream in ("stdout", "stderr")]
        logged = [ln for ln in (task_dir / "task.log").read_text().splitlines() if ln.startswith("probe ")]
        assert logged == expected  # stdout and stderr in one pipe, line by line, in order
        text = (task_dir / "task.log").read_text()
        assert text.count("probe message through the tensorflow logger") == 1  # as in a spawned task: not twice
        assert [ln for t, ln in echoed if t == task and ln.startswith("probe ")] == expected
        # the task ended as an interpreter does: its non-daemon thread finished, then its atexit function ran
        assert (task_dir / "late.txt").read_text() == "ran" and (task_dir / "atexit.txt").read_text() == "ran"
    assert infos["worker:0"]["env"]["PROBE_ONLY_WORKER"] == "yes" and "PROBE_ONLY_WORKER" not in infos["chief:0"]["env"]
    # temporary files: the task's own tmp/ (not the server's cached temp dir), or what the role's env says
    assert infos["chief:0"]["tmpdir"] == str(LocalBackend().app_dir(st.app_id) / "tasks" / "chief_0" / "tmp")
    assert infos["worker:0"]["tmpdir"] == str(tmp_path / "worker-tmp")
    # the model code (custom_jobs) does not use Keras: TF was imported without its eager Keras import
    assert all(info["tf_imported"] and not info["keras_preloaded"] for info in infos.values())
    assert "model module 'custom_jobs' does not use Keras: not imported" in server_log(st.app_id)
    assert infos["chief:0"]["np_random"] != infos["worker:0"]["np_random"]  # numpy's RNG reseeded in each task
    assert infos["chief:0"]["random"] != infos["worker:0"]["random"]


def test_a_model_that_uses_keras_gets_it_preloaded_and_can_use_it(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, model="keras_jobs:dense"))
    st = api.run(spec, backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert "model module 'keras_jobs' uses Keras: imported" in server_log(st.app_id)
    for task in TASKS:
        info = probe(st.app_id, task)
        assert info["keras_preloaded"], f"{task}: Keras was not imported by the forkserver"
        assert info["out"] == [[3.0, 3.0]]  # Dense(2, ones) of ones(1, 3): the layer really ran in the forked task


@pytest.mark.parametrize("forkserver", ["1", "0"])
def test_keras_in_a_task_leaves_matplotlib_out_and_v_is_tfyarns_detail_not_every_librarys(tmp_path, forkserver):
    """Keras imports matplotlib.pyplot at import time when it is installed: every task of a Keras model paid ~0.3 s
    for it, and on a machine's first run printed "generated new fontManager" (~1 s). It is imported only where the
    report's PNG is drawn. And `-v` turned on DEBUG for every library: matplotlib's font scoring flooded it."""
    import subprocess

    import yaml
    spec = small_spec(tmp_path, model="keras_jobs:dense")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl"), "TFYARN_FORKSERVER": forkserver}  # a first run
    cmd = [sys.executable, "-m", "tfyarn.cli"]
    run = subprocess.run(cmd + ["run", str(path), "--local"], capture_output=True, text=True, timeout=110, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    app_id = re.search(r"\((local-[\w-]+)\)", run.stdout).group(1)
    for task in TASKS:
        info = probe(app_id, task)
        assert info["out"] == [[3.0, 3.0]] and info["matplotlib"] is False, (task, info)
    assert "fontManager" not in run.stderr and "matplotlib" not in run.stderr, run.stderr[-3000:]
    app_dir = LocalBackend().app_dir(app_id)
    assert (app_dir / "report.png").stat().st_size > 1000        # drawn where the launcher runs: matplotlib works
    if forkserver == "0":
        return
    for verbose, library_debug in (("-v", False), ("-vv", True)):
        (app_dir / "report.json").unlink()                            # `report` then draws the PNG again
        rep = subprocess.run(cmd + [verbose, "report", app_id], capture_output=True, text=True, timeout=60, env=env)
        assert rep.returncode == 0, rep.stderr[-3000:]
        assert (" DEBUG matplotlib" in rep.stderr) is library_debug, (verbose, rep.stderr[-2000:])
        index = subprocess.run(cmd + [verbose, "data", "index", str(tmp_path / "tinydata")], capture_output=True,
                               text=True, timeout=60, env=env)
        assert index.returncode == 0, index.stderr[-3000:]
        assert " DEBUG tfyarn.data." in index.stderr, (verbose, index.stderr)  # tfyarn's own detail
        assert (" DEBUG fsspec" in index.stderr) is library_debug, (verbose, index.stderr)


def test_exit_code_is_reported(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:count", params={"steps": 200, "worker_exit_code": 3}))
    st = api.run(spec, backend="local")
    assert st.state is AppState.FAILED
    assert st.diagnostics.startswith("worker:0 exited with code 3"), st.diagnostics
    assert {t.task: t.exit_code for t in st.tasks}["worker:0"] == 3
    server_pid(st.app_id)  # it was forked


def test_death_by_signal_is_reported_like_popen_and_the_task_restarts(tmp_path):
    roles = {"ps": {"instances": 1}, "chief": {"instances": 1},
             "worker": {"instances": 1, "max_restarts": 2, "restart": "exit_code"}}
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:probe", params={"run_long": True}, roles=roles,
                                     mode="ps"))
    backend = LocalBackend()
    app_id = backend.submit(spec)
    wait_for_step(backend, app_id, "worker:0", 1, timeout=60)
    for n, sig in ((1, signal.SIGTERM), (2, signal.SIGKILL)):
        worker = wait_for_tasks(app_id, {"worker:0"}, timeout=30)["worker:0"]
        worker.send_signal(sig)
        wait_restarts(backend, app_id, "worker:0", n, timeout=60)
    backend.kill(app_id, timeout=20)
    log = "\n".join(backend.logs(app_id, task="worker:0"))
    assert "==== tfyarn: restart 1/2 after exit code -15 ====" in log
    assert "==== tfyarn: restart 2/2 after exit code -9 ====" in log
    assert backend.status(app_id).state is AppState.KILLED
    assert wait_no_processes(app_id, 10) == []


def test_stopping_a_forked_task_ends_its_process_group(tmp_path):
    spec = probe_spec(tmp_path, {"run_long": True, "child": True})
    backend = LocalBackend()
    app_id = backend.submit(spec)
    wait_for_step(backend, app_id, "chief:0", 1, timeout=60)
    wait_for_step(backend, app_id, "worker:0", 1, timeout=60)
    tasks = task_processes(app_id)
    sleeps = [p for p in app_processes(app_id) if p.cmdline()[:1] == ["sleep"]]
    assert sorted(os.getpgid(p.pid) for p in sleeps) == sorted(p.pid for p in tasks.values())
    backend.kill(app_id, timeout=20)
    assert backend.status(app_id).state is AppState.KILLED
    assert wait_no_processes(app_id, 10) == []  # the tasks' children too: killpg, not kill


def test_what_a_task_left_running_when_it_ended_is_killed_with_its_process_group(tmp_path):
    st = api.run(probe_spec(tmp_path, {"child": True}), backend="local")  # each task starts `sleep 300`, then returns
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert wait_no_processes(st.app_id, 10) == []


def test_dead_forkserver_ends_its_tasks_and_the_job(tmp_path):
    spec = probe_spec(tmp_path, {"run_long": True})
    backend = LocalBackend()
    app_id = backend.submit(spec)
    wait_for_step(backend, app_id, "worker:0", 1, timeout=60)
    server = forkserver_process(app_id)
    assert server is not None, "no forkserver process found"
    server.kill()
    st = runner.wait(backend, app_id, timeout=60, poll=0.2)
    assert st.state is AppState.FAILED and "exited with code -9" in st.diagnostics, st.diagnostics
    assert wait_no_processes(app_id, 10) == []


def test_sigkilled_launcher_takes_the_forkserver_and_its_tasks_with_it(tmp_path):
    spec = probe_spec(tmp_path, {"run_long": True})
    backend = LocalBackend()
    app_id = backend.submit(spec)
    tasks = wait_for_tasks(app_id, set(TASKS), timeout=60)
    launcher = int((backend.app_dir(app_id) / "launcher.pid").read_text())
    server = forkserver_process(app_id)
    assert server is not None and server.ppid() == launcher
    assert {p.ppid() for p in tasks.values()} == {server.pid}
    os.kill(launcher, signal.SIGKILL)
    assert wait_no_processes(app_id, 10) == []


def test_a_role_env_setting_a_startup_variable_starts_that_role_as_processes(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tfyarn.backends.local.processes")
    st = api.run(probe_spec(tmp_path, worker_env={"OMP_NUM_THREADS": "1"}), backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert probe(st.app_id, "chief:0")["ppid"] == server_pid(st.app_id)
    worker = probe(st.app_id, "worker:0")
    assert worker["ppid"] == os.getpid() and worker["env"]["OMP_NUM_THREADS"] == "1"
    assert "starting worker tasks as new processes, not from the forkserver: their env sets OMP_NUM_THREADS" \
        in caplog.text


def test_disabled_forkserver_starts_every_task_as_a_process(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TFYARN_FORKSERVER", "0")
    caplog.set_level(logging.INFO, logger="tfyarn.backends.local.processes")
    st = api.run(probe_spec(tmp_path), backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    infos = {task: probe(st.app_id, task) for task in TASKS}
    assert {task: info["ppid"] for task, info in infos.items()} == {task: os.getpid() for task in TASKS}
    tasks_dir = LocalBackend().app_dir(st.app_id) / "tasks"
    assert {task: info["tmpdir"] for task, info in infos.items()} == {
        task: str(tasks_dir / task.replace(":", "_") / "tmp") for task in TASKS}
    # spawned tasks, too, import TF without its eager Keras import (the runtime does it before the train code)
    assert all(info["tf_imported"] and not info["keras_preloaded"] for info in infos.values())
    assert not (LocalBackend().app_dir(st.app_id) / "forkserver.log").exists()
    assert "the forkserver is disabled (TFYARN_FORKSERVER=0" in caplog.text


def _site_hook(tmp_path, body: str) -> str:
    """A sitecustomize that runs ``body`` in the forkserver only (the process that has the control socket's fd)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("import os, sys, time\nif 'TFYARN_FORKSERVER_FD' in os.environ:\n"
                                           + "".join(f"    {line}\n" for line in body.splitlines()))
    return str(hook)


def test_forkserver_that_cannot_start_falls_back_to_processes(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PYTHONPATH", _site_hook(tmp_path, "print('forkserver broken by the test', flush=True)\n"
                                                          "os._exit(7)"))
    caplog.set_level(logging.INFO, logger="tfyarn.backends.local.processes")
    st = api.run(probe_spec(tmp_path), backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert {task: probe(st.app_id, task)["ppid"] for task in TASKS} == {task: os.getpid() for task in TASKS}
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert warning.startswith("starting tasks as new processes from now on: the forkserver (")
    assert "forkserver broken by the test" in warning  # the tail of its log


def test_wait_ready_times_out_naming_what_it_waited_for(tmp_path):
    env = dict(os.environ, TFYARN_PARENT_PID=str(os.getpid()),
               PYTHONPATH=_site_hook(tmp_path, "print('forkserver hangs for the test', flush=True)\ntime.sleep(600)"))
    fs = ForkServer(sys.executable, env, tmp_path / "forkserver.log").start()
    try:
        with pytest.raises(ForkServerError, match=r"was not ready \(importing TensorFlow and tfyarn's task modules\) "
                                                  r"within 1.5s; its log ends with:\nforkserver hangs for the test"):
            fs.wait_ready(1.5)
        with pytest.raises(ForkServerError, match="is not usable"):
            fs.spawn({}, tmp_path)
    finally:
        t0 = time.monotonic()
        fs.close(timeout=2)
    assert fs.proc.returncode == -signal.SIGKILL and time.monotonic() - t0 < 6


def test_client_reports_exit_codes_and_refuses_to_spawn_once_the_server_died(tmp_path):
    env = dict(os.environ, TFYARN_PARENT_PID=str(os.getpid()), TF_CPP_MIN_LOG_LEVEL="2")
    fs = ForkServer(sys.executable, env, tmp_path / "forkserver.log").start()
    try:
        fs.wait_ready(120)
        # no TFYARN_SPEC_FILE: tfyarn.task.main fails at once, exit code 1, and says why on its output
        proc = fs.spawn({"PATH": os.environ["PATH"], "TFYARN_KV": "http://127.0.0.1:9"}, tmp_path)
        assert proc.wait(timeout=60) == 1 and proc.poll() == 1
        out = proc.stdout.read().decode()
        assert "task ?:? failed" in out and "KeyError: 'TFYARN_SPEC_FILE'" in out, out
        fs.proc.kill()
        deadline = time.monotonic() + 10
        while fs.usable:
            assert time.monotonic() < deadline, "the client did not notice the forkserver's death within 10s"
            time.sleep(0.05)
        assert fs.error.endswith(": exited")
        with pytest.raises(ForkServerError, match="is not usable: exited"):
            fs.spawn({}, tmp_path)
    finally:
        fs.close(timeout=5)
