"""The processes of a local app's tasks: the local backend's container verbs (spawn, signal, stop, measure).

Every task is an OS process running ``python -m tfyarn.task`` (exactly what a YARN container runs), forked from a
fork server that imported TensorFlow once (the tasks of a local job would otherwise all import it at once on the same
cores), or, when it is disabled, not possible, or failed, started with ``subprocess.Popen``; both look the same here
(:class:`tfyarn.backends.local.forkserver.ForkedProcess`). Each task's output goes to its ``task.log`` (and, live, to
``echo``). What decides about the job — restarts, its end, attempts — is the local launcher's
(:mod:`tfyarn.runner.local_app`).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from tfyarn.backends.local.forkserver import ForkedProcess, ForkServer, ForkServerError, killpg
from tfyarn.backends.local.process_memory import tree_rss
from tfyarn.contracts.status import Echo, TaskStatus
from tfyarn.spec import JobSpec

log = logging.getLogger(__name__)

#: Environment every local task gets unless its role's ``env`` overrides it (TF's C++ INFO chatter hides real output).
TASK_ENV_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "TF_ENABLE_ONEDNN_OPTS": "0"}
#: Seconds a task gets between SIGTERM and SIGKILL when the job is stopped.
STOP_GRACE_S = 5.0
#: Set to 0 to start every task as a new process (``python -m tfyarn.task``) instead of forking it.
FORKSERVER_ENV = "TFYARN_FORKSERVER"
#: Prefixes of environment variables read only when the interpreter, libc, TensorFlow or the libraries it loads start
#: (the interpreter, linker, allocator, locale, TF/XLA/CUDA, BLAS/OpenMP thread pools, gRPC, Keras's HOME, and the
#: fork server switch itself): a forked task inherits what the server read, so a role whose ``env`` sets one of these
#: is started as a new process. Not TMPDIR: a forked task clears ``tempfile``'s cached directory.
STARTUP_ENV_PREFIXES = (
    *"PYTHON LD_ MALLOC TCMALLOC LC_ LANG TZ TF_ XLA_ CUDA NVIDIA OMP_ MKL KMP_ OPENBLAS GOTO GRPC_ KERAS HOME".split(),
    FORKSERVER_ENV,
)
#: Last lines of each task's output kept for its diagnosis: enough to hold a faulthandler dump of a few threads.
TAIL_LINES = 200
#: The first line of a dump Python writes from C: a faulthandler timeout (allreduce's GIL-free bound) or a fatal
#: error (a crash in TF's C++). The lines after it are stack frames, which say nothing on their own.
_C_DUMP = re.compile(r"^(Timeout \(\d+:\d\d:\d\d(\.\d+)?\)!|Fatal Python error: .*)$")
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR|CRITICAL) ")


def diagnosis_from_output(lines: Iterable[str]) -> str:
    """Why a task ended, from its last output lines (when it reported no ``failure/<task>`` itself): the last line
    (a Python exception's message), or, after a dump from C, its header and the last log line before it (what the
    task was doing, e.g. "waiting up to 300s for MultiWorkerMirroredStrategy start-up")."""
    kept = [ln for ln in lines if ln.strip()]
    for i in range(len(kept) - 1, -1, -1):
        if _C_DUMP.match(kept[i]):
            before = next((ln for ln in reversed(kept[:i]) if _LOG_LINE.match(ln)), None)
            return kept[i] + (f" after: {before}" if before else "")
    if not kept:
        return "(no output)"
    m = _LOG_LINE.match(kept[-1])
    if m and m.group(1) in ("INFO", "WARNING"):
        # an exit (os._exit, a signal, a C library's exit()) right after ordinary logging: that line is not the
        # cause, only what the task did last
        return f"ended without an error message; its last output: {kept[-1]}"
    return kept[-1]


def write_atomic(path: Path, text: str) -> None:
    """A reader never sees the file empty or half written (``status`` polls status.json and launcher.pid)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


#: Seconds between two samples of the tasks' resident memory (:meth:`TaskProcesses.sample_memory`).
MEMORY_SAMPLE_S = 1.0
#: File ``tfyarn kill`` writes in the app dir before it signals the launcher: the reason the job ends with.
KILL_REQUEST = "kill.request"


@dataclass
class TaskProcess:
    name: str
    dir: Path
    proc: subprocess.Popen | ForkedProcess | None = None
    reader: threading.Thread | None = None
    state: str = "PENDING"
    exit_code: int | None = None
    restarts: int = 0
    #: of those, the cluster's faults (a peer's or the transport's TF error: contracts.triage), not in max_restarts
    free_restarts: int = 0
    diagnostics: str = ""
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    peak_rss: int = 0  # bytes, task + its children (framing processes), highest sample

    @property
    def role(self) -> str:
        return self.name.split(":")[0]

    @property
    def log_path(self) -> Path:
        return self.dir / "task.log"


class TaskProcesses:
    """The task processes of one local app (``tasks``: one :class:`TaskProcess` per task of the spec). ``abort``: set
    when the job stops (a wait for the fork server ends early)."""

    def __init__(
        self,
        spec: JobSpec,
        app_dir: Path,
        app_id: str,
        echo: Echo | None = None,
        python: str = sys.executable,
        forkserver: bool | None = None,
        abort: threading.Event | None = None,
    ):
        """``forkserver``: fork tasks from a warm fork server (default: unless ``TFYARN_FORKSERVER=0``)."""
        self.spec, self.app_dir, self.app_id, self.echo, self.python = spec, app_dir, app_id, echo, python
        self.abort = abort or threading.Event()
        self.tasks = {name: TaskProcess(name, app_dir / "tasks" / name.replace(":", "_")) for name in spec.tasks()}
        self._memory_sampled = 0.0
        if forkserver is None:
            forkserver = os.environ.get(FORKSERVER_ENV, "1").strip() not in ("0", "false", "no", "off")
        self._want_forkserver = forkserver
        self._forkserver: ForkServer | None = None
        self._fork_roles: set[str] = set()  # roles whose tasks are forked (the others are started as processes)
        self._forkserver_checked = False  # waited for it to be ready (once, before the first task starts)
        self._forkserver_lost = False  # it became unusable mid-job (said once)

    def statuses(self) -> list[TaskStatus]:
        """Each task as it is now (state, restarts, exit code, log, memory)."""
        return [
            TaskStatus(
                task=t.name,
                state=t.state,
                host="127.0.0.1",
                restarts=t.restarts,
                exit_code=t.exit_code,
                diagnostics=t.diagnostics,
                log=str(t.log_path),
                memory_mib=self.spec.role(t.role).memory_mib,
                peak_rss_mib=t.peak_rss >> 20 if t.peak_rss else None,
            )
            for t in self.tasks.values()
        ]

    def env(self, role_env: dict[str, str], task_vars: dict[str, str]) -> dict[str, str]:
        """A task's environment; with neither a role's env nor task vars, what every task of the app shares (the
        fork server's). That has ``TFYARN_APP_ID``: a forked task's ``/proc/<pid>/environ`` is the server's, and the
        app's processes are still told by it."""
        env = {
            **os.environ,
            **TASK_ENV_DEFAULTS,
            **role_env,
            "TFYARN_SPEC_FILE": str(self.app_dir / "spec.json"),
            "TFYARN_APP_ID": self.app_id,
            "TFYARN_PARENT_PID": str(os.getpid()),
            "TFYARN_HOST": "127.0.0.1",
        }
        if self.spec.code:
            env["TFYARN_CODE_DIR"] = str(Path(self.spec.code).resolve())
        env.update(task_vars)
        env.pop("TF_CONFIG", None)
        return env

    def task_env(self, task: TaskProcess, kv_url: str, attempt: int) -> dict[str, str]:
        """The task's environment. ``TMPDIR`` is the task's own ``tmp/`` (unless its role's ``env`` sets one): what a
        killed task leaves there (autograph's modules are deleted only at a clean exit) does not pile up in /tmp."""
        role, index = task.name.split(":")
        role_env = self.spec.role(role).env
        return self.env(
            {"TMPDIR": str(task.dir / "tmp"), **role_env},
            {
                "TFYARN_ROLE": role,
                "TFYARN_INDEX": index,
                "TFYARN_KV": kv_url,
                "TFYARN_ATTEMPT": str(attempt),
                "TFYARN_RESTART": str(task.restarts),
            },
        )

    # ------------------------------------------------------------------------------------------------- fork server
    def start_forkserver(self) -> None:
        """Start the fork server now (its TF import overlaps our own start-up); :meth:`_forker` waits for it. Off
        Linux (fork after importing TF is only known to be safe there) and for roles whose ``env`` sets a start-up
        variable (:data:`STARTUP_ENV_PREFIXES`), tasks are started as new processes."""
        if not self._want_forkserver:
            log.info(
                "starting tasks as new processes: the forkserver is disabled (%s=0 or forkserver=False)", FORKSERVER_ENV
            )
            return
        if not sys.platform.startswith("linux"):
            log.info("starting tasks as new processes: the forkserver is only used on Linux")
            return
        base = self.env({}, {})
        for role in sorted({t.role for t in self.tasks.values()}):
            role_env = self.spec.role(role).env
            changed = sorted(k for k, v in role_env.items() if k.startswith(STARTUP_ENV_PREFIXES) and base.get(k) != v)
            if changed:
                log.info(
                    "starting %s tasks as new processes, not from the forkserver: their env sets %s, read when "
                    "the interpreter or TensorFlow starts",
                    role,
                    ", ".join(changed),
                )
            else:
                self._fork_roles.add(role)
        if not self._fork_roles:
            return
        try:
            self._forkserver = ForkServer(self.python, base, self.app_dir / "forkserver.log", cwd=self.app_dir).start()
        except OSError as exc:
            log.warning("starting tasks as new processes: cannot start the forkserver: %s", exc)

    def _forker(self, role: str) -> ForkServer | None:
        """The fork server for a task of ``role``, once it is ready (waited for the first time, bounded by
        ``timeouts.rendezvous``); None: start the task as a new process."""
        fs = self._forkserver
        if fs is None or role not in self._fork_roles:
            return None
        if not self._forkserver_checked:
            self._forkserver_checked = True
            try:
                fs.wait_ready(self.spec.timeouts.rendezvous, abort=self.abort)
            except ForkServerError as exc:
                if not self.abort.is_set():
                    log.warning("starting tasks as new processes from now on: %s", exc)
                self.close_forkserver()
                return None
        if not fs.usable:  # it died mid-job (its tasks died with it): restarts and new attempts start processes
            if not self._forkserver_lost:
                self._forkserver_lost = True
                log.warning("starting tasks as new processes from now on: %s", fs.error)
            return None
        return fs

    def close_forkserver(self) -> None:
        fs, self._forkserver = self._forkserver, None
        if fs is not None:
            fs.close()

    def start(self, task: TaskProcess, kv_url: str, attempt: int) -> None:
        task.dir.mkdir(parents=True, exist_ok=True)
        env = self.task_env(task, kv_url, attempt)
        (task.dir / "tmp").mkdir(exist_ok=True)  # the default TMPDIR (a role's own is the user's to create)
        task.proc = None
        fs = self._forker(task.role)
        if fs is not None:
            try:
                task.proc = fs.spawn(env, task.dir)
            except ForkServerError as exc:  # e.g. fork failed (memory): only this task; the others run on
                log.warning("starting %s as a new process: %s", task.name, exc)
        if task.proc is None:
            # Own session: a terminal's Ctrl-C reaches only the launcher, which then stops tasks in order.
            task.proc = subprocess.Popen(
                [self.python, "-m", "tfyarn.task"],
                cwd=task.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        task.state = "RUNNING"
        task.reader = threading.Thread(target=self._pump, args=(task,), name=f"log-{task.name}", daemon=True)
        task.reader.start()

    def _pump(self, task: TaskProcess) -> None:
        """Copy a task's output to its log file and (live, prefixed with the task) to the launcher's output."""
        assert task.proc and task.proc.stdout
        with open(task.log_path, "ab") as logf:
            for raw in iter(task.proc.stdout.readline, b""):
                logf.write(raw)
                logf.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                task.tail.append(line)
                if self.echo:
                    self.echo(task.name, line)

    @staticmethod
    def signal(task: TaskProcess, sig: int) -> None:
        if task.proc and task.proc.poll() is None:
            killpg(task.proc.pid, sig)

    @staticmethod
    def kill_leftovers(task: TaskProcess) -> None:
        """After a task ended: SIGKILL what is left of its process group (processes it started and did not end), as
        YARN's NodeManager does with a finished container's. The group outlives its leader while it has members, so
        its id is not reused meanwhile."""
        if task.proc is not None and task.proc.poll() is not None:
            killpg(task.proc.pid)

    def stop(self, tasks: list[TaskProcess], grace: float) -> None:
        """SIGTERM each task's process group, SIGKILL what is left after ``grace`` seconds; reap everything."""
        live = [(t, t.proc) for t in tasks if t.proc is not None and t.proc.poll() is None]
        for t, _ in live:
            self.signal(t, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, proc in live:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for t, proc in live:
            self.signal(t, signal.SIGKILL)
            proc.wait()
            if t.state == "RUNNING":  # exit 0: it had finished its work as the stop came (an evaluator seeing the
                t.exit_code = proc.returncode  # abort), not ended by the signal
                t.state = "SUCCEEDED" if t.exit_code == 0 else "KILLED"
        for t in tasks:
            if t.state == "RUNNING" and t.proc is not None and t.proc.poll() is not None:
                # ended on its own after the follow loop's last look (the job ended meanwhile): its own outcome,
                # not RUNNING in the final status of an ended app
                t.exit_code = t.proc.returncode
                t.state = "SUCCEEDED" if t.exit_code == 0 else "FAILED"
            self.kill_leftovers(t)  # (tasks that had ended by themselves included)
            if t.reader:
                t.reader.join(timeout=2.0)

    def sample_memory(self) -> None:
        """Each running task's resident memory with its children, as YARN measures a container; a task crossing its
        role's ``memory`` is warned about once (on YARN it would be killed). At most once a second: ~0.6 % of a
        core."""
        now = time.monotonic()
        if now - self._memory_sampled < MEMORY_SAMPLE_S:
            return
        self._memory_sampled = now
        running = {t.proc.pid: t for t in self.tasks.values() if t.state == "RUNNING" and t.proc is not None}
        if not running:
            return
        for pid, total in tree_rss(running).items():
            t = running[pid]
            limit = self.spec.role(t.role).memory_mib << 20
            if total > limit >= t.peak_rss:
                log.warning(
                    "%s uses %d MiB of resident memory, more than roles.%s.memory (%d MiB): on YARN its "
                    "container would be killed",
                    t.name,
                    total >> 20,
                    t.role,
                    limit >> 20,
                )
            t.peak_rss = max(t.peak_rss, total)
