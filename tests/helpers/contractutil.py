"""The two backends behind one small interface, so that every contract scenario is written once.

Why: the issue's point is that a job behaves the same on ``local`` and ``yarn``; each backend's own suite asserted
its own behaviour and the two drifted apart. A :class:`Harness` hides only what must differ — where the data and
checkpoints live (local files / HDFS), how a task's process is found, how leftovers are looked for — and the scenarios
go through the public API (``tfyarn.api``) and the CLI as a user does.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

import psutil

from clusterutil import FAULT_JOBS, JOB_S, job_doc, tfyarn, unique
from launch_helpers import task_processes
from tfyarn import api
from tfyarn.spec import JobSpec, load_spec_dict

__all__ = ["Harness", "JOB_S", "unique"]


@dataclass
class Harness:
    """One backend as the scenarios see it. ``data``: the suites' dataset (clusterutil.write_dataset) as a glob;
    ``root``: a URL of this test's own directory (checkpoints); ``yarn``: the session's YarnBackend (YARN only)."""
    name: str
    data: str
    root: str
    yarn: Any = None

    def spec(self, name: str, *, epochs: int = 1, delay: float = 0.0, params: dict | None = None,
             timeouts: dict | None = None, every_steps: int | None = None, **over: Any) -> JobSpec:
        """A sync ps job (ps + chief + 1 worker) of ``fault_models.slow_recommender`` (``delay`` s per step):
        the same document on both backends but for the data and checkpoint URLs."""
        doc = job_doc(self.data, name, epochs=epochs, model="fault_models:slow_recommender", code=str(FAULT_JOBS),
                      ckpt=f"{self.root}/{name}/ckpt" if every_steps else None, every_steps=every_steps, **over)
        doc["params"].update({"step_delay_s": delay, **(params or {})})
        doc["timeouts"].update(timeouts or {})
        return load_spec_dict(doc)

    def task_process(self, app_id: str, task: str, timeout: float = JOB_S) -> psutil.Process:
        """The live Python process of ``task`` (``role:index``) of the app."""
        if self.yarn is not None:
            from clusterutil import task_process
            return task_process(self.yarn, app_id, task, timeout=timeout)
        from clusterutil import wait_until
        return wait_until(lambda: task_processes(app_id).get(task), timeout, f"a live process of {task} of {app_id}",
                          poll=0.1)

    def assert_clean(self, *app_ids: str, tag: str | None = None) -> None:
        """No process of these apps is left on this machine and each has ended; YARN: nothing tagged ``tag`` runs."""
        from clusterutil import wait_no_processes
        for app_id in app_ids:
            left = wait_no_processes(app_id, timeout=60)
            assert left == [], f"{app_id} left processes: {[(p.pid, p.cmdline()[:4]) for p in left]}"
            assert api.status(app_id).state.is_terminal, f"{app_id} still active"
        if tag:
            active = [a.app_id for a in api.list_apps(self.name) if tag in a.tags and not a.state.is_terminal]
            assert active == [], f"apps tagged {tag} still active: {active}"

    @staticmethod
    def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``tfyarn ARGS`` in a new process, as a user runs it (TFYARN_HOME, HADOOP_CONF_DIR from this one)."""
        return tfyarn(*args, timeout=timeout)

    def new_name(self, what: str) -> str:
        return unique(f"{what}-{self.name}")
