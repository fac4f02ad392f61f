"""Helpers of the launcher tests: find an app's processes, and a small valid spec running tests/jobs functions."""
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
JOBS = Path(__file__).resolve().parent / "jobs"


def app_processes(app_id: str) -> list[psutil.Process]:
    """Live processes started for ``app_id`` (tasks carry TFYARN_APP_ID in their environment)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("TFYARN_APP_ID") == app_id and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_no_processes(app_id: str, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = app_processes(app_id)
        if not left:
            return []
        time.sleep(0.2)
    return app_processes(app_id)


def small_spec(tmp_path, **overrides):
    """A valid spec dict for launcher tests: allreduce (no ps), custom train from tests/jobs, tiny fake data."""
    spec = {
        "name": "launcher-test", "model": "custom_jobs:quick", "code": str(JOBS), "mode": "allreduce",
        "data": {"train": str(tmp_path / "nodata" / "*.tfrecord"), "batch_size": 4,
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
