"""Helpers of the launcher tests: find an app's processes, and a small valid spec running
tests/helpers/jobs functions."""
import os
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).resolve().parent / "jobs"


def app_processes(app_id: str) -> list[psutil.Process]:
    """Live processes started for ``app_id``: tasks, their children and the forkserver (all carry TFYARN_APP_ID in
    their environment)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("TFYARN_APP_ID") == app_id and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def task_of(p: psutil.Process, app_id: str) -> str | None:
    """The task (``role:index``) whose process ``p`` is, else None.

    By the process's cwd (``<app dir>/tasks/<role>_<index>``) and session (a task leads its own): a task forked from
    the forkserver shows the server's environment in /proc/<pid>/environ (see ``tfyarn.task.forkserver``), so the
    environment names the app (every process has TFYARN_APP_ID) but not the task.
    """
    try:
        cwd = Path(p.cwd())
        if os.getsid(p.pid) != p.pid or cwd.parent.name != "tasks" or cwd.parent.parent.name != app_id:
            return None
    except (psutil.Error, OSError):
        return None
    role, _, index = cwd.name.rpartition("_")
    return f"{role}:{index}"


def task_processes(app_id: str) -> dict[str, psutil.Process]:
    """The live task processes of ``app_id`` by task name (not the forkserver, nor a task's own children)."""
    found = {}
    for p in app_processes(app_id):
        task = task_of(p, app_id)
        if task:
            found[task] = p
    return found


def forkserver_process(app_id: str) -> psutil.Process | None:
    """The app's live forkserver (its tasks share its command line, but run in their task dirs)."""
    for p in app_processes(app_id):
        try:
            if "tfyarn.task.forkserver" in p.cmdline() and task_of(p, app_id) is None and p.cwd().endswith(app_id):
                return p
        except psutil.Error:
            continue
    return None


def wait_for_tasks(app_id: str, tasks: set[str], timeout: float) -> dict[str, psutil.Process]:
    """Wait until every task in ``tasks`` has a live process; fails naming the missing ones."""
    deadline = time.monotonic() + timeout
    while True:
        procs = task_processes(app_id)
        if tasks <= procs.keys():
            return procs
        assert time.monotonic() < deadline, f"no live process for {sorted(tasks - procs.keys())} of {app_id} " \
                                            f"within {timeout:g}s (found {sorted(procs)})"
        time.sleep(0.1)


def wait_no_processes(app_id: str, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = app_processes(app_id)
        if not left:
            return []
        time.sleep(0.2)
    return app_processes(app_id)


def tiny_data(tmp_path) -> str:
    """A glob matching one small real TFRecord file (32 records with a float ``label``): what a spec needs to pass the
    pre-start data checks (at least one global batch: up to 8 training tasks at batch 4), for jobs whose custom
    train function reads no data."""
    from tfyarn.data.example import encode_example
    from tfyarn.data.tfrecord import TFRecordWriter
    d = tmp_path / "tinydata"
    if not d.is_dir():
        d.mkdir()
        with TFRecordWriter(str(d / "part-0.tfrecord")) as w:
            for i in range(32):
                w.write(encode_example({"label": [float(i % 2)]}))
    return str(d / "*.tfrecord")


def small_spec(tmp_path, **overrides):
    """A valid spec dict for launcher tests: allreduce (no ps), custom train from tests/helpers/jobs, tiny real data."""
    spec = {
        "name": "launcher-test", "model": "custom_jobs:quick", "code": str(JOBS), "mode": "allreduce",
        "data": {"train": tiny_data(tmp_path), "batch_size": 4,
                 "features": {"label": {"dtype": "float32"}}},
        "roles": {"chief": {"instances": 1}, "worker": {"instances": 1}},
        "timeouts": {"rendezvous": 60, "shutdown": 10},  # generous: a loaded 2-core CI box imports TF slowly
    }
    spec.update(overrides)
    return spec


def task_step(backend, app_id: str, task: str) -> int:
    return int((backend.status(app_id).progress.get("per_task") or {}).get(task) or 0)


def wait_for_step(backend, app_id: str, task: str, step: int, timeout: float) -> int:
    """Wait until ``task`` reports local step >= ``step``; fails naming the task, the step and its last status."""
    deadline = time.monotonic() + timeout
    while True:
        st = backend.status(app_id)
        now = task_step(backend, app_id, task)
        if now >= step:
            return now
        assert not st.state.is_terminal, f"job ended ({st.state.value}: {st.diagnostics}) before {task} step {step}"
        assert time.monotonic() < deadline, f"{task} did not reach step {step} within {timeout:g}s (at {now})"
        time.sleep(0.05)
