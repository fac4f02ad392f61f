"""The launcher: runs one local app to its end in this process, the local "application master".

It runs the KV service, starts one process per task running ``tfyarn.task.main`` (exactly what a YARN container
runs), restarts tasks as their roles allow, and stops every task on the first unrecoverable failure, on Ctrl-C /
SIGTERM, or on a kill request: no task outlives it. It is the local backend's hook for the runner
(:class:`tfyarn.runner.Attempts`): the runner's loop starts each attempt as a round of this one app. What decides
about the job (attempts, deadline, stall watch, progress) is :class:`tfyarn.supervisor.Supervisor`, shared with the
YARN backend.

Tasks are forked from a fork server that imported TensorFlow once (the tasks of a local job would otherwise all import
it at once on the same cores), or, when it is disabled, not possible, or failed, started with ``subprocess.Popen``;
both look the same here (:class:`tfyarn.backends.local.forkserver.ForkedProcess`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from tfyarn.contracts.status import AppState, AppStatus, Echo, TaskStatus
from tfyarn.job_progress import apply_resources
from tfyarn.backends.local.forkserver import ForkedProcess, ForkServer, ForkServerError, killpg
from tfyarn.backends.local.kvserver import KVServer
from tfyarn.backends.local.process_memory import tree_rss
from tfyarn.errors import ExitCode
from tfyarn.report import HISTORY_FILE, ProgressHistory
from tfyarn.contracts.kv_keys import ABORT_KEY, DONE_KEY, PAGE_URL_KEY, RESOURCES_PREFIX, addr_key, failure_key
from tfyarn.spec import SIDECAR_ROLES, JobSpec
from tfyarn.supervisor import Supervisor, checkpoint_url, training_end_note, write_report
from tfyarn.web import page_enabled
from tfyarn.web.server import StatusPage, file_tail
from tfyarn.contracts.triage import classify, restarts

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
    "PYTHON",
    "LD_",
    "MALLOC",
    "TCMALLOC",
    "LC_",
    "LANG",
    "TZ",
    "TF_",
    "XLA_",
    "CUDA",
    "NVIDIA",
    "OMP_",
    "MKL",
    "KMP_",
    "OPENBLAS",
    "GOTO",
    "GRPC_",
    "KERAS",
    "HOME",
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


#: Seconds between two samples of the tasks' resident memory (:meth:`Launcher._sample_memory`).
MEMORY_SAMPLE_S = 1.0
#: File ``tfyarn kill`` writes in the app dir before it signals the launcher: the reason the job ends with.
KILL_REQUEST = "kill.request"


@dataclass
class _Task:
    name: str
    dir: Path
    proc: subprocess.Popen | ForkedProcess | None = None
    reader: threading.Thread | None = None
    state: str = "PENDING"
    exit_code: int | None = None
    restarts: int = 0
    diagnostics: str = ""
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    peak_rss: int = 0  # bytes, task + its children (framing processes), highest sample

    @property
    def role(self) -> str:
        return self.name.split(":")[0]

    @property
    def log_path(self) -> Path:
        return self.dir / "task.log"


class Launcher:
    """Runs one app to its end in this process. Thread-safe :meth:`stop` (signal handlers, kill requests)."""

    def __init__(
        self,
        spec: JobSpec,
        app_dir: Path,
        app_id: str,
        echo: Echo | None = None,
        on_update: Callable[[AppStatus], None] | None = None,
        python: str = sys.executable,
        forkserver: bool | None = None,
        timeout: float | None = None,
        supervisor: Supervisor | None = None,
    ):
        """``forkserver``: fork tasks from a warm fork server (default: unless ``TFYARN_FORKSERVER=0``).
        ``supervisor``: the run's (:func:`tfyarn.runner.run`; its progress points go to this app's dir);
        without one, a supervisor of its own with ``timeout``: seconds after which the job is stopped
        as TIMED_OUT (as ``timeouts.active_deadline``)."""
        self.spec, self.app_dir, self.app_id = spec, app_dir, app_id
        self.echo = echo
        self.on_update = on_update
        self.python = python
        self.tasks = {name: _Task(name, app_dir / "tasks" / name.replace(":", "_")) for name in spec.tasks()}
        self._stop = threading.Event()
        self._stop_state = AppState.KILLED
        self._stop_reason = ""
        self._state = AppState.PENDING
        self._diag = ""
        self._started = time.time()
        self._finished: float | None = None
        self._progress: dict = {}
        self._memory_sampled = 0.0
        self.kv: KVServer | None = None
        self._kv_service: KVServer | None = None
        self._sidecar_failures: list[str] = []  # SIDECAR_ROLES tasks that failed for good (the job went on)
        if supervisor is None:
            supervisor = Supervisor(spec, started=self._started, timeout=timeout)
        supervisor.history = ProgressHistory(app_dir / HISTORY_FILE)  # the run report's curves
        self.supervisor = supervisor
        self._between = False  # an attempt failed and the next one has not started (a stop ends the job)
        if forkserver is None:
            forkserver = os.environ.get(FORKSERVER_ENV, "1").strip() not in ("0", "false", "no", "off")
        self._want_forkserver = forkserver
        self._forkserver: ForkServer | None = None
        self._fork_roles: set[str] = set()  # roles whose tasks are forked (the others are started as processes)
        self._forkserver_checked = False  # waited for it to be ready (once, before the first task starts)
        self._forkserver_lost = False  # it became unusable mid-job (said once)
        self.page: StatusPage | None = None  # the job's page (tfyarn.web), while the launcher runs

    # ------------------------------------------------------------------------------------------------- control
    def stop(self, reason: str, state: AppState = AppState.KILLED) -> None:
        if not self._stop.is_set():
            self._stop_reason, self._stop_state = reason, state
            self._stop.set()

    def stop_now(self, reason: str) -> AppStatus:
        """End this app at once from outside its loop (the run following it stopped or failed:
        never left running): every task stopped, the state KILLED unless it had ended; its status."""
        self.stop(reason, AppState.KILLED)
        self._stop_tasks(list(self.tasks.values()), STOP_GRACE_S)
        if self._between:  # a stop during the backoff: the job ends as the stop says, with its note
            self._between = False
            self._end(self._stop_state, self._stop_reason)
            self._diag += self._killed_note()
        elif not self._state.is_terminal:
            self._end(AppState.KILLED, reason)
        self._finished = self._finished or time.time()
        try:  # the report before the final status.json, as after a last attempt
            self._write_report()
        except Exception as exc:  # noqa: BLE001 - a report never changes how the job ended
            log.warning("no run report for %s: %s", self.app_id, exc)
        st = self.status()
        write_atomic(self.app_dir / "status.json", json.dumps(st.to_dict(), indent=1))
        return st

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, _frame):
            name = signal.Signals(signum).name
            if self._stop.is_set():  # second signal: no more grace
                for t in self.tasks.values():
                    self._signal(t, signal.SIGKILL)
            try:
                reason = (self.app_dir / KILL_REQUEST).read_text().strip() or f"interrupted by {name}"
            except OSError:
                reason = f"interrupted by {name}"
            self.stop(reason, AppState.KILLED)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, handler)

    # ------------------------------------------------------------------------------------------------- tasks
    def _env(self, role_env: dict[str, str], task_vars: dict[str, str]) -> dict[str, str]:
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

    def _task_env(self, task: _Task, kv_url: str) -> dict[str, str]:
        """The task's environment. ``TMPDIR`` is the task's own ``tmp/`` (unless its role's ``env`` sets one): what a
        killed task leaves there (autograph's modules are deleted only at a clean exit) does not pile up in /tmp."""
        role, index = task.name.split(":")
        role_env = self.spec.role(role).env
        return self._env(
            {"TMPDIR": str(task.dir / "tmp"), **role_env},
            {
                "TFYARN_ROLE": role,
                "TFYARN_INDEX": index,
                "TFYARN_KV": kv_url,
                "TFYARN_ATTEMPT": str(self.supervisor.attempt),
                "TFYARN_RESTART": str(task.restarts),
            },
        )

    # ------------------------------------------------------------------------------------------------- fork server
    def _start_forkserver(self) -> None:
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
        base = self._env({}, {})
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
                fs.wait_ready(self.spec.timeouts.rendezvous, abort=self._stop)
            except ForkServerError as exc:
                if not self._stop.is_set():
                    log.warning("starting tasks as new processes from now on: %s", exc)
                self._close_forkserver()
                return None
        if not fs.usable:  # it died mid-job (its tasks died with it): restarts and new attempts start processes
            if not self._forkserver_lost:
                self._forkserver_lost = True
                log.warning("starting tasks as new processes from now on: %s", fs.error)
            return None
        return fs

    def _close_forkserver(self) -> None:
        fs, self._forkserver = self._forkserver, None
        if fs is not None:
            fs.close()

    def _start(self, task: _Task, kv_url: str) -> None:
        task.dir.mkdir(parents=True, exist_ok=True)
        env = self._task_env(task, kv_url)
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

    def _pump(self, task: _Task) -> None:
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
    def _signal(task: _Task, sig: int) -> None:
        if task.proc and task.proc.poll() is None:
            killpg(task.proc.pid, sig)

    @staticmethod
    def _kill_leftovers(task: _Task) -> None:
        """After a task ended: SIGKILL what is left of its process group (processes it started and did not end), as
        YARN's NodeManager does with a finished container's. The group outlives its leader while it has members, so
        its id is not reused meanwhile."""
        if task.proc is not None and task.proc.poll() is not None:
            killpg(task.proc.pid)

    def _stop_tasks(self, tasks: list[_Task], grace: float) -> None:
        """SIGTERM each task's process group, SIGKILL what is left after ``grace`` seconds; reap everything."""
        live = [(t, t.proc) for t in tasks if t.proc is not None and t.proc.poll() is None]
        for t, _ in live:
            self._signal(t, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, proc in live:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for t, proc in live:
            self._signal(t, signal.SIGKILL)
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
            self._kill_leftovers(t)  # (tasks that had ended by themselves included)
            if t.reader:
                t.reader.join(timeout=2.0)

    # ------------------------------------------------------------------------------------------------- status
    def status(self) -> AppStatus:
        tasks = [
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
        if self.kv is not None:  # what each task publishes of itself: CPU %, current RSS
            apply_resources(tasks, self.kv.store.items(RESOURCES_PREFIX))
        return AppStatus(
            app_id=self.app_id,
            backend="local",
            name=self.spec.name,
            state=self._state,
            diagnostics=self._diag,
            tasks=tasks,
            progress=self._progress,
            started=self._started,
            finished=self._finished,
            tracking_url=str(self.app_dir),
            summary=self.supervisor.summary,
            tags=list(self.spec.tags),
            attempt=self.supervisor.attempt,
        )

    def _sample_memory(self) -> None:
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

    def _refresh(self) -> None:
        assert self.kv is not None
        self._sample_memory()
        self._progress = self.supervisor.progress(self.kv.store)
        st = self.status()
        write_atomic(self.app_dir / "status.json", json.dumps(st.to_dict(), indent=1))
        if self.on_update:
            self.on_update(st)

    # ------------------------------------------------------------------------- the runner's hook: attempts
    # (tfyarn.runner.Attempts) — one app, its attempts rounds of it; the loop over them is the runner's
    app_per_attempt = False

    @property
    def stop_event(self) -> threading.Event:
        """Set by this launcher's signal handlers and kill requests: no further attempt starts."""
        return self._stop

    def __enter__(self) -> Launcher:
        """The app's dir, the fork server, the KV service and the page, for every attempt."""
        self._install_signal_handlers()
        self.app_dir.mkdir(parents=True, exist_ok=True)
        (self.app_dir / "spec.json").write_text(self.spec.to_json())
        write_atomic(self.app_dir / "launcher.pid", str(os.getpid()))
        self._start_forkserver()
        try:
            self.kv = self._kv_service = KVServer().start()
            self._start_page()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_forkserver()
        if self.page is not None:
            self.page.close()
        if self._kv_service is not None:  # (self.kv stays: the final status reads its records)
            self._kv_service.stop()
            self._kv_service = None

    def start(self, attempt: int) -> str:
        """Attempt ``attempt`` (the supervisor's count): a later one starts the whole job again from
        its latest checkpoint, the KV cleared (it rendezvous afresh). Its tasks start in :meth:`to_end`."""
        self._between = False
        if attempt > 0:
            assert self.kv is not None
            self.kv.store.clear()
            self._publish_page()
            self._sidecar_failures = []
            for t in self.tasks.values():
                t.state, t.exit_code, t.diagnostics, t.restarts = "PENDING", None, "", 0
        return self.app_id

    def to_end(self, app_id: str) -> AppStatus:
        """Start every task and follow them to this attempt's end, restarting them as their roles
        allow; every task is stopped when it returns."""
        assert self.kv is not None
        self._run_attempt(self.kv)
        if self._state is AppState.KILLED:  # read after every task has stopped
            self._diag += self._killed_note()
        self._between = self._state in (AppState.FAILED, AppState.TIMED_OUT)
        return self.status()

    def end(self, app_id: str, exc: BaseException) -> AppStatus:
        """The run stopped or failed (or was stopped between attempts): :meth:`stop_now`."""
        return self.stop_now(str(exc) or type(exc).__name__)

    def finish(self, st: AppStatus) -> AppStatus:
        """After the last attempt, ``st`` with the runner's final diagnosis: the run report, then the
        final status.json (whoever sees the outcome finds the report)."""
        self._between = False
        self._stop_tasks(list(self.tasks.values()), STOP_GRACE_S)
        self._close_forkserver()  # after the tasks: its tasks would die with it
        self._diag = st.diagnostics
        self._finished = time.time()
        self._write_report()
        self._refresh()
        return self.status()

    def _killed_note(self) -> str:
        """What a KILLED job adds: whether training had completed (and what was written)."""
        assert self.kv is not None
        progress = self.supervisor.progress(self.kv.store)
        return training_end_note(progress, self.supervisor.summary, checkpoint_url(self.spec))

    def _start_page(self) -> None:
        """The job's page on 127.0.0.1 (``TFYARN_PAGE=0``: none; ``TFYARN_PAGE_PORT``: its port), its URL logged
        and in the KV (status shows it as ``progress.page_url``). A page that cannot start is a warning."""
        if not page_enabled():
            return
        try:
            self.page = StatusPage(
                lambda: self.status().to_dict(),
                lambda: self.supervisor.history.points,
                log=lambda task: file_tail(str(self.tasks[task].log_path)) if task in self.tasks else None,
                port=int(os.environ.get("TFYARN_PAGE_PORT") or 0),
            ).start()
        except (OSError, ValueError) as exc:
            log.warning("no page for %s: %s", self.app_id, exc)
            return
        self._publish_page()
        log.info("page: %s", self.page.url)

    def _publish_page(self) -> None:
        if self.page is not None and self.kv is not None:
            self.kv.store.put(PAGE_URL_KEY, self.page.url)

    def _write_report(self) -> None:
        """The run report in the app dir and next to the checkpoints; never able to change the job's outcome."""
        if self.kv is not None:  # the last records and the summary, not those of the last 0.5 s poll
            self.supervisor.progress(self.kv.store)
        write_report(self.app_dir, self.status(), self.supervisor.history.points, checkpoint_url(self.spec))

    def _run_attempt(self, kv: KVServer) -> None:
        try:
            for t in self.tasks.values():
                self._start(t, kv.url)
            self._state = AppState.RUNNING
            # Start-up (imports, rendezvous, session start) gets timeouts.rendezvous + timeouts.stall before the first
            # step must appear; pids: a stall's diagnosis signals the tasks for their stacks
            self.supervisor.begin_attempt(kv.store, {t.name: t.proc.pid for t in self.tasks.values() if t.proc})
            self._follow(set(self.spec.training_tasks))
        finally:
            self.supervisor.end_attempt()
            self._stop_tasks(list(self.tasks.values()), STOP_GRACE_S)

    def _restartable(self, task: _Task) -> bool:
        """May this failed task be restarted in place? (Role policy, its budget, and the job not stopping.)"""
        role = self.spec.role(task.role)
        code = task.exit_code if task.exit_code is not None else 1
        code = 128 - code if code < 0 else code  # killed by signal N → 128+N, as a shell reports it
        if role.restart == "never" or task.restarts >= role.max_restarts or self._stop.is_set():
            return False
        return restarts(role.restart, code, classify(exit_code=code, failure=task.diagnostics or ""))

    def _restart(self, task: _Task) -> None:
        assert self.kv is not None
        role = self.spec.role(task.role)
        task.restarts += 1
        log.warning(
            "%s exited with code %s (%s); restarting it (%d/%d)",
            task.name,
            task.exit_code,
            task.diagnostics,
            task.restarts,
            role.max_restarts,
        )
        for key in (addr_key(task.name), failure_key(task.name)):
            self.kv.store.delete(key)  # it publishes a new address; the old diagnosis is history
        with open(task.log_path, "ab") as f:
            f.write(
                f"==== tfyarn: restart {task.restarts}/{role.max_restarts} after exit code {task.exit_code} "
                f"====\n".encode()
            )
        self._start(task, self.kv.url)
        self.supervisor.task_restarted(task.name, task.proc.pid if task.proc is not None else None)

    def _follow(self, training: set[str]) -> None:
        assert self.kv is not None
        store = self.kv.store
        last_refresh = 0.0
        shutdown_deadline: float | None = None
        while True:
            if self._stop.is_set():
                self._end(self._stop_state, self._stop_reason)
                return
            verdict = self.supervisor.check()  # the active deadline, the stall watch
            if verdict is not None:
                self._end(verdict.state, verdict.diagnosis)
                return
            for t in self.tasks.values():
                if t.state != "RUNNING" or t.proc is None or t.proc.poll() is None:
                    continue
                t.exit_code = t.proc.returncode
                self._kill_leftovers(t)
                if t.exit_code == 0:
                    t.state = "SUCCEEDED"
                    self.supervisor.task_ended(t.name)
                    # ps/evaluator/tensorboard end when the chief publishes done; before that, their exit is a bug
                    done = store.get(DONE_KEY) is not None
                    if t.name not in training and not done and not self._training_done(training):
                        t.diagnostics = "exited before training finished"
                        self._end(AppState.FAILED, f"{t.name} exited before training finished")
                        return
                    continue
                t.state = "FAILED"
                if t.reader:
                    t.reader.join(timeout=2.0)
                t.diagnostics = store.get(failure_key(t.name)) or diagnosis_from_output(t.tail)
                if self._restartable(t):
                    self._restart(t)
                    continue
                if t.role in SIDECAR_ROLES:
                    log.warning(
                        "%s failed (exit %s: %s); training goes on without it", t.name, t.exit_code, t.diagnostics
                    )
                    self._sidecar_failures.append(
                        f"{t.name} failed (exit {t.exit_code}), training went on: {t.diagnostics}"
                    )
                    continue
                timed_out = t.exit_code == ExitCode.TIMED_OUT
                self._end(
                    AppState.TIMED_OUT if timed_out else AppState.FAILED,
                    f"{t.name} exited with code {t.exit_code}: {t.diagnostics}",
                )
                return
            if self._training_done(training):
                store.put(DONE_KEY, "1")  # a chief that died mid-shutdown must not leave ps waiting
                rest = [t for t in self.tasks.values() if t.state == "RUNNING"]
                if not rest:
                    self._end(AppState.SUCCEEDED, "; ".join(self._sidecar_failures))
                    return
                if shutdown_deadline is None:
                    shutdown_deadline = time.monotonic() + self.spec.timeouts.shutdown
                elif time.monotonic() > shutdown_deadline:
                    names = ", ".join(t.name for t in rest)
                    log.warning(
                        "%s still running %gs after training finished; stopping them",
                        names,
                        self.spec.timeouts.shutdown,
                    )
                    self._end(
                        AppState.SUCCEEDED,
                        f"stopped {names}: still running {self.spec.timeouts.shutdown:g}s "
                        f"after training finished (timeouts.shutdown)",
                    )
                    return
            now = time.monotonic()
            if now - last_refresh >= 0.5:
                self._refresh()
                last_refresh = now
            self._stop.wait(0.1)

    def _training_done(self, training: set[str]) -> bool:
        """Success policy: every training task finished (default), or the chief did (``success_policy: chief``)."""
        if self.spec.success_policy == "chief":
            return self.tasks[self.spec.training_tasks[0]].state == "SUCCEEDED"
        return all(self.tasks[t].state == "SUCCEEDED" for t in training)

    def _end(self, state: AppState, diagnostics: str) -> None:
        self._state, self._diag = state, diagnostics
        if state is not AppState.SUCCEEDED:
            log.error("job %s: %s", state.value, diagnostics)
            if self.kv is not None:  # before the SIGTERMs: a task that cannot act on one (TF swallowed it in
                self.kv.store.put(ABORT_KEY, diagnostics)  # allreduce start-up) stops at its next abort check
