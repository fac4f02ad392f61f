"""Local backend with real processes: stop-all on failure, signals, rendezvous timeout, no orphans,
submit/status/kill."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launch_helpers import small_spec, task_processes, wait_for_step, wait_for_tasks, wait_no_processes
from tfyarn import api, runner
from tfyarn.backends.base import AppState
from tfyarn.backends.local.backend import LocalBackend
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(120)


def test_first_failure_stops_every_task_with_its_diagnosis(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:fail_on_worker"))
    lines = []
    t0 = time.monotonic()
    st = api.run(spec, backend="local", echo=lambda task, line: lines.append((task, line)))
    assert time.monotonic() - t0 < 60  # the chief would sleep 300 s if it were not stopped
    assert st.state is AppState.FAILED
    assert st.diagnostics.startswith("worker:0 exited with code 1: RuntimeError: boom from worker:0")
    states = {t.task: t.state for t in st.tasks}
    assert states == {"chief:0": "KILLED", "worker:0": "FAILED"}
    assert any(task == "worker:0" and "boom from worker:0" in line for task, line in lines)
    assert wait_no_processes(st.app_id, 5) == []
    saved = json.loads((LocalBackend().app_dir(st.app_id) / "status.json").read_text())
    assert saved["state"] == "FAILED" and saved["exit_code"] == 1


@pytest.mark.parametrize("job, diagnosis", [
    ("deadline_on_worker", "DeadlineExceededError: Timed out waiting for the step's ops on /job:ps/task:0"),
    ("wait_timeout_on_worker", "timed out: waited 1s (timeouts.step) for workers to finish their 8 steps")])
def test_a_step_past_its_timeout_ends_the_job_timed_out_exit_4(tmp_path, job, diagnosis):
    """README: a step that overruns timeouts.step (TF's operation timeout in ps mode, tfyarn's own waits) ends the
    job with exit code 4, like every other bounded wait; the task's failure message says "timed out", which is all
    a YARN follower sees of it (tests/unit/backends/yarn/test_backend_state.py maps such a message to TIMED_OUT)."""
    spec = load_spec_dict(small_spec(tmp_path, model=f"custom_jobs:{job}"))
    st = api.run(spec, backend="local")
    assert st.state is AppState.TIMED_OUT and st.state.exit_code == 4, st.diagnostics
    assert st.diagnostics.startswith(f"worker:0 exited with code 4: {diagnosis}"), st.diagnostics
    assert wait_no_processes(st.app_id, 5) == []


def test_task_that_never_starts_times_out_naming_it(tmp_path):
    # A sitecustomize that hangs worker:1 before the runtime starts: a container that never comes up.
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text(
        "import os, time\n"
        "if os.environ.get('TFYARN_ROLE') == 'worker' and os.environ.get('TFYARN_INDEX') == '1':\n"
        "    time.sleep(600)\n")
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:run_long",
                                     roles={"chief": {"instances": 1},
                                            "worker": {"instances": 2, "env": {"PYTHONPATH": str(hang)}}},
                                     timeouts={"rendezvous": 4, "shutdown": 5}))
    t0 = time.monotonic()
    st = api.run(spec, backend="local")
    assert st.state is AppState.TIMED_OUT
    assert "rendezvous timed out after 4s: worker:1 never started (no address published)" in st.diagnostics
    assert time.monotonic() - t0 < 40
    assert wait_no_processes(st.app_id, 5) == []


def _write_spec(tmp_path, spec: dict):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_tfyarn_run_leaves_no_process_behind(tmp_path, sig, tfyarn_home):
    path = _write_spec(tmp_path, small_spec(tmp_path, model="custom_jobs:run_long"))
    proc = subprocess.Popen([sys.executable, "-m", "tfyarn.cli", "-q", "run", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ))
    # wait until both tasks report progress (they are really training)
    app_id = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        apps = list((tfyarn_home / "apps").glob("local-*")) if (tfyarn_home / "apps").exists() else []
        if apps and (apps[0] / "status.json").exists():
            app_id = apps[0].name
            st = json.loads((apps[0] / "status.json").read_text())
            if st["progress"].get("global_step", 0) > 3:
                break
        time.sleep(0.2)
    assert app_id, "the launcher never wrote a status"
    assert set(task_processes(app_id)) == {"chief:0", "worker:0"}
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 3, out.decode()
    assert f"interrupted by {sig.name}" in out.decode()
    assert wait_no_processes(app_id, 10) == []


@pytest.mark.slow
@pytest.mark.parametrize("params,said", [
    ({"checkpoint_at": 5, "chief_linger_s": 120},
     "the final checkpoint was not written (the latest is ckpt-5, global step 5), nor the summary"),
    ({"checkpoint_at": 10, "chief_linger_s": 120}, "the final checkpoint (ckpt-10) was written, the summary was not"),
    ({"checkpoint_at": 10, "worker_linger_s": 120}, "the final checkpoint (ckpt-10) and the summary were written"),
])
def test_a_run_stopped_after_training_completed_says_so_and_what_was_written(tmp_path, tfyarn_home, params, said):
    """Ctrl-C once every step had run: the KILLED report read like any interrupted run ("global step 10/10"); it
    now says that training had completed and whether the final checkpoint and the summary were written."""
    spec = small_spec(tmp_path, model="custom_jobs:done_then_linger", params={"steps": 10, **params},
                      checkpoint={"dir": str(tmp_path / "ckpt")})
    proc = subprocess.Popen([sys.executable, "-m", "tfyarn.cli", "-q", "run", str(_write_spec(tmp_path, spec))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    app_id, st = None, {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:   # the planned step reached (and, when the chief writes it, the summary)
        apps = list((tfyarn_home / "apps").glob("local-*")) if (tfyarn_home / "apps").exists() else []
        if apps and (apps[0] / "status.json").exists():
            app_id = apps[0].name
            st = json.loads((apps[0] / "status.json").read_text())
            index = tmp_path / "ckpt" / "tfyarn-checkpoint.json"
            committed = index.exists() and f'"ckpt-{params["checkpoint_at"]}"' in index.read_text()
            if (st["progress"].get("global_step") == 10 and committed
                    and (st["summary"] or "worker_linger_s" not in params)):
                break
        time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError(f"the job never reached global step 10 within 90s: {st}")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, (out, err[-2000:])
    assert f"diagnosis: interrupted by SIGINT; training had completed (global step 10/10): {said}" in out, out
    assert wait_no_processes(app_id, 10) == []


def test_submit_status_logs_kill_and_orphan_protection(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:run_long"))
    backend = LocalBackend()
    app_id = backend.submit(spec)
    wait_for_step(backend, app_id, "chief:0", 3, timeout=60)
    st = backend.status(app_id)
    assert st.state is AppState.RUNNING
    assert {t.task for t in st.tasks} == {"chief:0", "worker:0"}
    assert any("chief:0" in line for line in backend.logs(app_id))
    assert api.status(app_id).app_id == app_id  # the API finds the backend by the app id
    assert [a.app_id for a in backend.list()] == [app_id]
    backend.kill(app_id, timeout=20)
    st = backend.status(app_id)
    assert st.state is AppState.KILLED and st.state.exit_code == 3
    assert st.diagnostics.startswith("killed by `tfyarn kill` (user ")    # who asked, not just "SIGTERM"
    assert wait_no_processes(app_id, 10) == []
    # killing an ended app (a scheduler's on_kill after the end) changes nothing and says so
    from click.testing import CliRunner
    from tfyarn.cli import cli
    res = CliRunner().invoke(cli, ["kill", app_id])
    assert res.exit_code == 0 and res.output.strip() == f"{app_id} had already ended: KILLED; nothing to kill"
    assert api.kill(app_id).diagnostics == st.diagnostics


def test_a_kill_right_after_submit_ends_killed_not_failed(tmp_path):
    """The kill may reach the launcher before it has its signal handlers (CI saw FAILED: 'launcher died')."""
    backend = LocalBackend()
    app_id = backend.submit(load_spec_dict(small_spec(tmp_path, model="custom_jobs:run_long")))
    backend.kill(app_id, timeout=60)
    st = backend.status(app_id)
    assert st.state is AppState.KILLED, st.diagnostics
    assert st.diagnostics.startswith("killed by `tfyarn kill` (user "), st.diagnostics
    assert wait_no_processes(app_id, 10) == []


def test_tasks_die_with_a_sigkilled_launcher(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:run_long"))
    backend = LocalBackend()
    app_id = backend.submit(spec)
    wait_for_tasks(app_id, {"chief:0", "worker:0"}, timeout=60)
    # the premise: the launcher's status already lists the running tasks (its status.json is refreshed once a poll,
    # so right after the processes appear it may not yet; seen once in CI on a loaded box: no task to mark KILLED)
    deadline = time.monotonic() + 30
    while {t.task for t in backend.status(app_id).tasks} < {"chief:0", "worker:0"}:
        assert time.monotonic() < deadline, "the launcher's status never listed chief:0 and worker:0 within 30s"
        time.sleep(0.1)
    pid = int((backend.app_dir(app_id) / "launcher.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    assert wait_no_processes(app_id, 10) == []
    st = backend.status(app_id)
    assert st.state is AppState.FAILED and f"launcher process {pid} died" in st.diagnostics
    states = {t.task: t.state for t in st.tasks}
    assert not [t for t, s in states.items() if s in ("PENDING", "RUNNING")], states     # none still "running"
    assert "KILLED" in states.values(), states


def test_unknown_app_is_a_clear_error():
    from tfyarn.errors import AppNotFound
    with pytest.raises(AppNotFound, match="no local app 'local-nope'"):
        LocalBackend().status("local-nope")


def test_frozen_worker_fails_the_job_after_the_stall_timeout_with_stacks_in_logs(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:lockstep",
                                     timeouts={"rendezvous": 20, "stall": 4, "shutdown": 5}))
    backend = LocalBackend()
    app_id = backend.submit(spec)
    wait_for_step(backend, app_id, "chief:0", 5, timeout=60)
    assert backend.status(app_id).state is AppState.RUNNING
    worker = task_processes(app_id)["worker:0"]
    frozen_at = time.monotonic()
    worker.suspend()  # SIGSTOP
    st = runner.wait(backend, app_id, timeout=60, poll=0.2)
    took = time.monotonic() - frozen_at
    assert st.state is AppState.TIMED_OUT, st.diagnostics
    # not before the stall timeout; the upper bound only tells "the watchdog ended it" from "the wait's 60 s ran
    # out" (it read 19-23 s with a loaded box: stack dumps, then the stop grace)
    assert 4 <= took < 45, took
    assert "worker:0" in st.diagnostics and "stopped" in st.diagnostics
    chief_log = "\n".join(backend.logs(app_id, task="chief:0"))
    assert "tfyarn stack dump" in chief_log and "lockstep" in chief_log  # where the chief was waiting
    assert wait_no_processes(app_id, 10) == []


def test_logs_follow_every_task_until_the_end(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:count", params={"steps": 30}))
    backend = LocalBackend()
    app_id = backend.submit(spec)
    lines = list(backend.logs(app_id, follow=True))  # returns by itself once the app has ended
    assert backend.status(app_id).state is AppState.SUCCEEDED
    for task in ("chief:0", "worker:0"):
        mine = [ln for ln in lines if ln.startswith(f"{task} | ")]
        assert any(f"{task} finished in" in ln for ln in mine), lines[-20:]
    with pytest.raises(Exception, match="has no task 'worker:7'"):
        list(backend.logs(app_id, task="worker:7"))


def test_final_states_of_tasks_that_ended_unseen_or_were_stopped(tmp_path):
    """A task that exits between the follow loop's last look and the stop (the job ended meanwhile) gets its own
    outcome in the final status — never RUNNING in an ended app; a task still running is KILLED."""
    from tfyarn.runner.local_app import Launcher
    spec = load_spec_dict(small_spec(tmp_path, roles={"chief": {"instances": 1}, "worker": {"instances": 2}}))
    launcher = Launcher(spec, tmp_path / "app", "local-test")
    codes = {"chief:0": "import sys; sys.exit(0)", "worker:0": "import sys; sys.exit(3)",
             "worker:1": "import time; time.sleep(60)"}
    for name, code in codes.items():
        t = launcher.tasks[name]
        t.proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        t.state = "RUNNING"
    for name in ("chief:0", "worker:0"):
        launcher.tasks[name].proc.wait(timeout=30)
    t0 = time.monotonic()
    launcher.procs.stop(list(launcher.tasks.values()), grace=5.0)
    assert time.monotonic() - t0 < 5                     # SIGTERM ends the sleeper at once
    got = {t.task: (t.state, t.exit_code) for t in launcher.status().tasks}
    assert got == {"chief:0": ("SUCCEEDED", 0), "worker:0": ("FAILED", 3), "worker:1": ("KILLED", -signal.SIGTERM)}


def test_diagnosis_from_output_names_a_dump_from_c_and_what_the_task_was_doing():
    """A task ended by faulthandler (allreduce's GIL-free start-up bound) or a crash in C++ prints stack frames last;
    the diagnosis was one of those frames. Real output of ``faulthandler.dump_traceback_later(..., exit=True)``."""
    from tfyarn.backends.local.processes import diagnosis_from_output
    waiting = ("2026-11-22 16:29:11,331 INFO [chief:0] tfyarn.train.allreduce: chief:0: waiting up to 5s for "
               "MultiWorkerMirroredStrategy start-up (all workers connecting)")
    dump = [waiting, "Timeout (0:00:15)!", "Thread 0x00007f29f17bbb80 (most recent call first):",
            '  File "/x/tfyarn/train/allreduce.py", line 68 in make_strategy', '  File "<string>", line 7 in <module>']
    assert diagnosis_from_output(dump) == f"Timeout (0:00:15)! after: {waiting}"
    assert diagnosis_from_output(["Timeout (0:00:00.300000)!", "  File ..."]) == "Timeout (0:00:00.300000)!"
    crash = ["Fatal Python error: Segmentation fault", "", "Current thread 0x01 (most recent call first):", "  File a"]
    assert diagnosis_from_output(crash) == "Fatal Python error: Segmentation fault"
    assert diagnosis_from_output([waiting, "ValueError: bad batch", ""]) == "ValueError: bad batch"
    assert diagnosis_from_output([]) == "(no output)"
    # os._exit(7) after ordinary logging: that log line is what it did last, not the error
    assert diagnosis_from_output([waiting]) == f"ended without an error message; its last output: {waiting}"
    error = "2026-11-22 16:29:12,001 ERROR [chief:0] tfyarn.train: the ps at 10.0.0.2 is gone"
    assert diagnosis_from_output([waiting, error]) == error


def test_a_failed_tensorboard_does_not_fail_the_training_as_on_yarn(tmp_path, monkeypatch):
    """TensorBoard is a sidecar on both backends (YARN: skein's allow_failures): its failure is reported, the job
    trains to its end. Here it fails as it does without the tensorboard package (preflight, which would refuse the
    spec for that, is bypassed)."""
    import tfyarn.runner.local_app as local
    monkeypatch.setattr(local, "run_local_preflight", lambda spec, **checks: None)
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:count", params={"steps": 60},
                                     roles={"chief": {"instances": 1}, "worker": {"instances": 1},
                                            "tensorboard": {"instances": 1}},
                                     checkpoint={"dir": str(tmp_path / "ck")}))
    st = api.run(spec, backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.diagnostics.startswith("tensorboard:0 failed (exit 1), training went on: "), st.diagnostics
    states = {t.task: t.state for t in st.tasks}
    assert states == {"chief:0": "SUCCEEDED", "worker:0": "SUCCEEDED", "tensorboard:0": "FAILED"}, states


def test_a_tensorboard_failing_after_training_ended_leaves_the_job_succeeded(tmp_path, monkeypatch):
    """The other order: its process fails once every other task has ended (frozen until then: it never sees
    control/done). The job trained: SUCCEEDED, the failure said, as on YARN (tests/cluster/yarn/test_cluster_report.py);
    timeouts.shutdown is long, so nothing but the kill ends it."""
    import threading
    import tfyarn.runner.local_app as local
    monkeypatch.setattr(local, "run_local_preflight", lambda spec, **checks: None)
    stub = str(Path(__file__).resolve().parents[3] / "helpers" / "stub_tensorboard")
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:count", params={"steps": 40},
                                     roles={"chief": {"instances": 1}, "worker": {"instances": 1},
                                            "tensorboard": {"instances": 1, "env": {"PYTHONPATH": stub}}},
                                     checkpoint={"dir": str(tmp_path / "ck")},
                                     timeouts={"rendezvous": 60, "shutdown": 600}))
    ids, ended = [], {}
    run = threading.Thread(target=lambda: ended.setdefault("st", api.run(
        spec, backend="local", on_update=lambda st: ids.append(st.app_id) if not ids else None)), daemon=True)
    run.start()
    deadline = time.monotonic() + 90
    while not ids:
        assert time.monotonic() < deadline and run.is_alive(), "the run did not start its app within 90s"
        time.sleep(0.1)
    board = wait_for_tasks(ids[0], {"tensorboard:0"}, 60)["tensorboard:0"]
    board.send_signal(signal.SIGSTOP)
    backend = LocalBackend()
    try:
        while {t.task: t.state for t in backend.status(ids[0]).tasks if t.task != "tensorboard:0"} != {
                "chief:0": "SUCCEEDED", "worker:0": "SUCCEEDED"}:
            assert time.monotonic() < deadline and run.is_alive(), backend.status(ids[0])
            time.sleep(0.1)
    finally:
        board.send_signal(signal.SIGKILL)           # (also when the wait failed: nothing left stopped)
    run.join(60)
    st = ended["st"]
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.diagnostics.startswith("tensorboard:0 failed (exit -9), training went on: "), st.diagnostics
    states = {t.task: t.state for t in st.tasks}
    assert states == {"chief:0": "SUCCEEDED", "worker:0": "SUCCEEDED", "tensorboard:0": "FAILED"}, states


def test_an_error_in_the_run_stops_every_task_and_propagates(tmp_path):
    """The local run path never leaves its tasks running either (runner/owned.py): an exception
    out of the caller's update hook stops every task of the app, then reaches the caller."""
    spec = load_spec_dict(small_spec(tmp_path, model="custom_jobs:run_long"))
    seen = []

    def broken(st):
        seen.append(st.app_id)
        if st.progress.get("global_step", 0) > 1:
            raise RuntimeError("display broke")
    with pytest.raises(RuntimeError, match="display broke"):
        api.run(spec, backend="local", on_update=broken)
    assert seen and wait_no_processes(seen[-1], 10) == []
    saved = json.loads((LocalBackend().app_dir(seen[-1]) / "status.json").read_text())
    assert saved["state"] == "KILLED", saved
