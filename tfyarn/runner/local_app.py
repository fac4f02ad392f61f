"""The launcher: runs one local app to its end in this process, the local "application master".

It runs the KV service, starts one process per task (the local backend's
:class:`~tfyarn.backends.local.processes.TaskProcesses`), restarts tasks as their roles allow, and stops every task
on the first unrecoverable failure, on Ctrl-C / SIGTERM, or on a kill request: no task outlives it. It is the local
backend's :class:`tfyarn.runner.Attempts` (:data:`tfyarn.runner.attempts.APP_MASTERS`): the runner's loop starts
each attempt as a round of this one app. What decides about the job (attempts, deadline, stall watch, progress) is
:class:`tfyarn.runner.supervisor.Supervisor`, shared with YARN's follower and in-app supervisor.

``python -m tfyarn.runner.local_app APP_DIR APP_ID``: the detached launcher a local ``submit`` starts
(:meth:`tfyarn.backends.local.backend.LocalBackend.schedule`), running the app's job through the runner.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tfyarn.common import paths
from tfyarn.backends.local.backend import new_app_id
from tfyarn.backends.local.kvserver import KVServer
from tfyarn.backends.local.processes import (
    KILL_REQUEST,
    STOP_GRACE_S,
    TaskProcess,
    TaskProcesses,
    diagnosis_from_output,
    write_atomic,
)
from tfyarn.contracts.kv_keys import ABORT_KEY, DONE_KEY, PAGE_URL_KEY, RESOURCES_PREFIX, addr_key, failure_key
from tfyarn.contracts.progress import apply_resources
from tfyarn.contracts.status import AppState, AppStatus, Echo
from tfyarn.contracts.triage import classify, restarts
from tfyarn.errors import ExitCode
from tfyarn.gateway.preflight import run_local_preflight
from tfyarn.gateway.task_python import local_python
from tfyarn.report import HISTORY_FILE, ProgressHistory, checkpoint_url, write_report
from tfyarn.runner.attempts import Watch, run_attempts
from tfyarn.runner.supervisor import Supervisor, training_end_note
from tfyarn.spec import SIDECAR_ROLES, JobSpec, load_spec_json
from tfyarn.web import page_enabled
from tfyarn.web.server import StatusPage, file_tail

log = logging.getLogger(__name__)


class Launcher:
    """Runs one app to its end in this process. Thread-safe :meth:`stop` (signal handlers, kill requests)."""

    def __init__(
        self,
        spec: JobSpec,
        app_dir: Path,
        app_id: str,
        echo: Echo | None = None,
        on_update: Callable[[AppStatus], None] | None = None,
        forkserver: bool | None = None,
        supervisor: Supervisor | None = None,
    ):
        """``forkserver``: fork tasks from a warm fork server (default: unless ``TFYARN_FORKSERVER=0``).
        ``supervisor``: the run's (:func:`tfyarn.runner.run`; its progress points go to this app's dir);
        without one, a supervisor of its own (the spec's rules only)."""
        self.spec, self.app_dir, self.app_id = spec, app_dir, app_id
        self.on_update = on_update
        self._stop = threading.Event()
        # the tasks run environment.python, as on YARN, else this Python
        self.procs = TaskProcesses(spec, app_dir, app_id, echo, local_python(spec), forkserver, abort=self._stop)
        self.tasks = self.procs.tasks
        self._stop_state = AppState.KILLED
        self._stop_reason = ""
        self._state = AppState.PENDING
        self._diag = ""
        self._started = time.time()
        self._finished: float | None = None
        self._progress: dict = {}
        self.kv: KVServer | None = None
        self._kv_service: KVServer | None = None
        self._sidecar_failures: list[str] = []  # SIDECAR_ROLES tasks that failed for good (the job went on)
        supervisor = supervisor or Supervisor(spec, started=self._started)
        supervisor.history = ProgressHistory(app_dir / HISTORY_FILE)  # the run report's curves
        self.supervisor = supervisor
        self._between = False  # an attempt failed and the next one has not started (a stop ends the job)
        self._shutdown_deadline: float | None = None  # training finished: when tasks still running are stopped
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
        self.procs.stop(list(self.tasks.values()), STOP_GRACE_S)
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
                    self.procs.signal(t, signal.SIGKILL)
            try:
                reason = (self.app_dir / KILL_REQUEST).read_text().strip() or f"interrupted by {name}"
            except OSError:
                reason = f"interrupted by {name}"
            self.stop(reason, AppState.KILLED)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, handler)

    # ------------------------------------------------------------------------------------------------- status
    def status(self) -> AppStatus:
        tasks = self.procs.statuses()
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

    def _refresh(self) -> None:
        assert self.kv is not None
        self.procs.sample_memory()
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
        self.procs.start_forkserver()
        try:
            self.kv = self._kv_service = KVServer().start()
            self._start_page()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.procs.close_forkserver()
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
        self.procs.stop(list(self.tasks.values()), STOP_GRACE_S)
        self.procs.close_forkserver()  # after the tasks: its tasks would die with it
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
                self.procs.start(t, kv.url, self.supervisor.attempt)
            self._state = AppState.RUNNING
            # Start-up (imports, rendezvous, session start) gets timeouts.rendezvous + timeouts.stall before the first
            # step must appear; pids: a stall's diagnosis signals the tasks for their stacks
            self.supervisor.begin_attempt(kv.store, {t.name: t.proc.pid for t in self.tasks.values() if t.proc})
            self._follow(set(self.spec.training_tasks))
        finally:
            self.supervisor.end_attempt()
            self.procs.stop(list(self.tasks.values()), STOP_GRACE_S)

    def _restartable(self, task: TaskProcess) -> bool:
        """May this failed task be restarted in place? (Role policy, its budget, and the job not stopping.) A role
        that can rejoin (async ps workers, the evaluator) is restarted for the cluster's faults (triage: free) up to
        ``retry.cluster_faults`` more, as on YARN."""
        role = self.spec.role(task.role)
        code = task.exit_code if task.exit_code is not None else 1
        code = 128 - code if code < 0 else code  # killed by signal N → 128+N, as a shell reports it
        if role.restart == "never" or self._stop.is_set():
            return False
        if self._free_restart(task, code):
            return True
        if task.restarts - task.free_restarts >= role.max_restarts:
            return False
        return restarts(role.restart, code, classify(exit_code=code, failure=task.diagnostics or "", task=task.name))

    def _free_restart(self, task: TaskProcess, code: int) -> bool:
        """Is this failure the cluster's (a peer's or the transport's TF error) with ``retry.cluster_faults`` left
        for a task that can rejoin? Counted in :attr:`TaskProcess.free_restarts` when so."""
        rejoins = task.role == "evaluator" or (task.role == "worker" and self.spec.mode == "ps" and not self.spec.sync)
        t = classify(exit_code=code, failure=task.diagnostics or "", task=task.name)
        if not (rejoins and t.free and task.free_restarts < self.spec.retry.cluster_faults):
            return False
        task.free_restarts += 1
        log.warning("%s: the cluster's fault, not counted in max_restarts: %s; rule: %s", task.name, t.words, t.rule)
        return True

    def _restart(self, task: TaskProcess) -> None:
        assert self.kv is not None
        task.restarts += 1
        n = f"{task.restarts}/{self.spec.role(task.role).max_restarts}"
        log.warning("%s exited with code %s (%s); restarting it (%s)", task.name, task.exit_code, task.diagnostics, n)
        for key in (addr_key(task.name), failure_key(task.name)):
            self.kv.store.delete(key)  # it publishes a new address; the old diagnosis is history
        with open(task.log_path, "ab") as f:
            f.write(f"==== tfyarn: restart {n} after exit code {task.exit_code} ====\n".encode())
        self.procs.start(task, self.kv.url, self.supervisor.attempt)
        self.supervisor.task_restarted(task.name, task.proc.pid if task.proc is not None else None)

    def _follow(self, training: set[str]) -> None:
        """Until the attempt ends: a stop, the supervisor's verdict, a task's exit that ends it, or the end of
        training; the status refreshed every 0.5 s."""
        last_refresh = 0.0
        self._shutdown_deadline = None
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
                if self._exited(t, training):
                    return
            if self._training_done(training) and self._shut_down():
                return
            now = time.monotonic()
            if now - last_refresh >= 0.5:
                self._refresh()
                last_refresh = now
            self._stop.wait(0.1)

    def _exited(self, t: TaskProcess, training: set[str]) -> bool:
        """Task ``t``'s process has exited: restarted, let go, or the attempt's end (True)."""
        assert self.kv is not None
        store = self.kv.store
        assert t.proc is not None
        t.exit_code = t.proc.returncode
        self.procs.kill_leftovers(t)
        if t.exit_code == 0:
            t.state = "SUCCEEDED"
            self.supervisor.task_ended(t.name)
            # ps/evaluator/tensorboard end when the chief publishes done; before that, their exit is a bug
            done = store.get(DONE_KEY) is not None
            if t.name not in training and not done and not self._training_done(training):
                t.diagnostics = "exited before training finished"
                self._end(AppState.FAILED, f"{t.name} exited before training finished")
                return True
            return False
        t.state = "FAILED"
        if t.reader:
            t.reader.join(timeout=2.0)
        t.diagnostics = store.get(failure_key(t.name)) or diagnosis_from_output(t.tail)
        if self._restartable(t):
            self._restart(t)
            return False
        if t.role in SIDECAR_ROLES:
            log.warning("%s failed (exit %s: %s); training goes on without it", t.name, t.exit_code, t.diagnostics)
            self._sidecar_failures.append(f"{t.name} failed (exit {t.exit_code}), training went on: {t.diagnostics}")
            return False
        timed_out = t.exit_code == ExitCode.TIMED_OUT
        self._end(
            AppState.TIMED_OUT if timed_out else AppState.FAILED,
            f"{t.name} exited with code {t.exit_code}: {t.diagnostics}",
        )
        return True

    def _shut_down(self) -> bool:
        """Training has finished: the tasks still running get ``timeouts.shutdown`` to end, then are stopped; True
        once the attempt has ended (SUCCEEDED)."""
        assert self.kv is not None
        self.kv.store.put(DONE_KEY, "1")  # a chief that died mid-shutdown must not leave ps waiting
        rest = [t for t in self.tasks.values() if t.state == "RUNNING"]
        if not rest:
            self._end(AppState.SUCCEEDED, "; ".join(self._sidecar_failures))
            return True
        if self._shutdown_deadline is None:
            self._shutdown_deadline = time.monotonic() + self.spec.timeouts.shutdown
        elif time.monotonic() > self._shutdown_deadline:
            names = ", ".join(t.name for t in rest)
            log.warning(
                "%s still running %gs after training finished; stopping them", names, self.spec.timeouts.shutdown
            )
            self._end(
                AppState.SUCCEEDED,
                f"stopped {names}: still running {self.spec.timeouts.shutdown:g}s "
                f"after training finished (timeouts.shutdown)",
            )
            return True
        return False

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


def attempts(backend: Any, spec: JobSpec, sup: Supervisor, watch: Watch) -> Launcher:
    """The runner's attempts on the local backend: the launcher of a new app (after the local preflight), in
    this process; every attempt a round of that one app, its processes supervised by the launcher (``watch.echo``:
    their lines)."""
    run_local_preflight(spec, count_records=True)
    app_id = new_app_id()
    return Launcher(spec, paths.apps_dir() / app_id, app_id, echo=watch.echo, on_update=watch.on_update, supervisor=sup)


def main(app_dir: str, app_id: str) -> int:
    """The detached launcher of a local ``submit``: run the app whose spec.json is in ``app_dir`` through the
    runner's attempt loop; its exit code is the job's."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    d = Path(app_dir)
    spec = load_spec_json((d / "spec.json").read_text())
    sup = Supervisor(spec, started=time.time())
    echo: Echo = lambda task, line: print(f"{task:>13} | {line}", flush=True)  # noqa: E731
    st = run_attempts(Launcher(spec, d, app_id, echo=echo, supervisor=sup), sup)
    return int(st.state.exit_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
