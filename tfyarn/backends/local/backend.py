"""Local backend: every task of the job is an OS process on this machine, started exactly as a YARN container starts it.

A real process per task, not threads: TensorFlow's distributed runtime, gRPC servers, and the stalls tfyarn exists to
prevent only show up between processes. Layout of one app (``$TFYARN_HOME/apps/<app_id>/``)::

    spec.json            the resolved spec the tasks read
    status.json          AppStatus, rewritten atomically by the launcher (``status``/``wait`` read it)
    launcher.pid         pid of the launcher process (``kill`` signals it)
    tasks/<role>_<i>/    each task's working directory and ``task.log``
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psutil

from tfyarn.common import paths
from tfyarn.backends.base import Backend, Request
from tfyarn.backends.local.processes import KILL_REQUEST, write_atomic
from tfyarn.backends.tasks import select_tasks, settle
from tfyarn.contracts.status import AppState, AppStatus, WaitClock
from tfyarn.errors import AppNotFound, WaitTimeout
from tfyarn.gateway.preflight import run_local_preflight
from tfyarn.gateway.task_python import local_python
from tfyarn.report import HISTORY_FILE, REPORT_JSON, ProgressHistory, write_run_report
from tfyarn.spec import JobSpec, load_spec_json

__all__ = ["LocalBackend", "new_app_id"]
#: The module a submit runs detached, the app's launcher (its "application master": tfyarn.runner.local_app).
LAUNCHER_MODULE = "tfyarn.runner.local_app"


def new_app_id() -> str:
    return time.strftime("local-%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie — exited, not yet reaped by its parent — counts as dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class LocalPlan(Request):
    """A local submit: one process per task on this machine, started by a launcher process under ``apps``."""

    apps: Path = Path()
    python: str = sys.executable
    tasks: dict[str, dict[str, str]] = field(default_factory=dict)  # task → the environment its role adds

    def __str__(self) -> str:
        s = self.spec
        lines = [
            f"local app for job {s.name!r}: {len(self.tasks)} processes on 127.0.0.1 (app dir under {self.apps})",
            f"  mode={s.mode} sync={s.sync} global batch={s.global_batch_size} "
            f"({s.data.batch_size} per worker x {s.num_training_workers} training tasks)",
        ]
        for task, env in self.tasks.items():
            extra = " ".join(f"{k}={v}" for k, v in env.items())
            lines.append(f"  {task:<14} {self.python} -m tfyarn.task {extra}".rstrip())
        return "\n".join(lines)


class LocalBackend(Backend):
    """Runs jobs on this machine. ``runner.run`` runs the launcher in the foreground; ``submit``
    detaches a launcher process (:data:`LAUNCHER_MODULE`), which runs the job through the runner too."""

    name = "local"

    def app_dir(self, app_id: str) -> Path:
        d = paths.apps_dir() / app_id
        if not d.is_dir():
            raise AppNotFound(f"no local app {app_id!r} under {paths.apps_dir()}")
        return d

    def dryrun(self, spec: JobSpec, attempt: int = 0) -> LocalPlan:
        tasks = {t: {**spec.role(t.split(":")[0]).env} for t in spec.tasks()}
        return LocalPlan(spec, attempt, apps=paths.apps_dir(), python=local_python(spec), tasks=tasks)

    def schedule(self, request: Request) -> str:
        """Start the plan's launcher as a detached process (it outlives this one) and return the app id."""
        assert isinstance(request, LocalPlan), f"not a local plan: {request!r}"
        spec = request.spec
        run_local_preflight(spec, count_records=True)
        app_id = new_app_id()
        d = request.apps / app_id
        d.mkdir(parents=True)
        (d / "spec.json").write_text(spec.to_json())
        pending = AppStatus(
            app_id, "local", spec.name, AppState.PENDING, started=time.time(), tracking_url=str(d), tags=list(spec.tags)
        )
        write_atomic(d / "status.json", json.dumps(pending.to_dict(), indent=1))
        with open(d / "launcher.log", "ab") as out:
            proc = subprocess.Popen(
                [request.python, "-m", LAUNCHER_MODULE, str(d), app_id],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        write_atomic(d / "launcher.pid", str(proc.pid))
        return app_id

    def status(self, app_id: str) -> AppStatus:
        d = self.app_dir(app_id)
        try:
            st = AppStatus.from_dict(json.loads((d / "status.json").read_text()))
        except (OSError, ValueError) as exc:
            raise AppNotFound(f"local app {app_id!r} has no readable status: {exc}") from None
        if not st.state.is_terminal:
            pid_file = d / "launcher.pid"
            pid = int(pid_file.read_text()) if pid_file.exists() else None
            if pid is not None and not _pid_alive(pid):
                # the launcher may have just written its final status: read once more before declaring it dead
                st = AppStatus.from_dict(json.loads((d / "status.json").read_text()))
                if not st.state.is_terminal:
                    _launcher_died(st, pid, d / KILL_REQUEST)
        return st

    def logs(self, app_id: str, task: str | None = None, follow: bool = False) -> Iterator[str]:
        """``<task> | <line>`` of one task (``worker:1``), a role (``worker``) or every task, as on YARN; ``follow``
        keeps reading (the tasks interleaved as they write) until the app has ended and everything it wrote has been
        read."""
        d = self.app_dir(app_id)
        names = select_tasks(load_spec_json((d / "spec.json").read_text()).tasks(), task, app_id)
        files = {n: d / "tasks" / n.replace(":", "_") / "task.log" for n in names}
        pos = dict.fromkeys(files, 0)
        partial = dict.fromkeys(files, b"")  # a line being written is yielded once it is complete
        while True:
            ended = not follow or self.status(app_id).state.is_terminal  # before the read: nothing written is missed
            for n, path in files.items():
                if not path.exists():
                    continue
                with open(path, "rb") as f:
                    f.seek(pos[n])
                    lines = (partial[n] + f.read()).split(b"\n")
                    pos[n] = f.tell()
                partial[n] = lines.pop()
                if ended and partial[n]:
                    lines.append(partial[n])
                for raw in lines:
                    yield f"{n} | {raw.decode(errors='replace')}"
            if ended:
                return
            time.sleep(0.5)

    def kill(self, app_id: str, timeout: float = 30.0) -> None:
        d = self.app_dir(app_id)
        pid = int((d / "launcher.pid").read_text())
        if _pid_alive(pid):
            # says who asked, for the final diagnosis (a SIGTERM alone could come from anyone)
            write_atomic(d / KILL_REQUEST, f"killed by `tfyarn kill` (user {_user()}, pid {os.getpid()})")
            os.kill(pid, signal.SIGTERM)
        clock = WaitClock(timeout, f"local app {app_id}")
        while not (st := self.status(app_id)).state.is_terminal:
            expired = clock.expired(st.state)
            if expired:
                raise WaitTimeout(expired)
            time.sleep(0.2)

    def report_location(self, st: AppStatus, build: bool = True) -> str | None:
        """The app dir's report.json (written by the launcher at the end)."""
        p = Path(st.tracking_url) / REPORT_JSON if st.tracking_url else None
        return str(p) if p is not None and p.exists() else None

    def saved_report(self, app_id: str) -> str:
        """The app dir's report.json, built now from the status and recorded history when the launcher has written
        none (the app still runs, or its launcher died)."""
        d = self.app_dir(app_id)
        if not (d / REPORT_JSON).exists():
            write_run_report(d, self.status(app_id).to_dict(), ProgressHistory.load(d / HISTORY_FILE).points)
        return str(d / REPORT_JSON)

    def list(self) -> list[AppStatus]:
        out = []
        for d in sorted(paths.apps_dir().glob("local-*")):
            try:
                out.append(self.status(d.name))
            except AppNotFound:
                continue
        return out


def _launcher_died(st: AppStatus, pid: int, kill_request: Path) -> None:
    """The end of an app whose launcher died before writing one. A kill that came before the launcher had its
    signal handlers (a kill right after submit) ended it by SIGTERM's default: KILLED, as asked, not FAILED."""
    if kill_request.exists():
        st.state, st.diagnostics = AppState.KILLED, kill_request.read_text().strip()
        settle(st, "killed with its launcher")
    else:
        st.state, st.diagnostics = AppState.FAILED, f"launcher process {pid} died"
        settle(st, "its launcher died")  # they die with it (task.main._die_with_parent)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
