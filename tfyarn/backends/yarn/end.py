"""The YARN backend's hooks for the runner (:mod:`tfyarn.runner`) and the end of its apps:
``attempts`` (each attempt a new application), ``follow`` (one supervised status read per call),
``pause`` (the tasks' all-done watched between reads), ``followed`` (the run report), and the end of
the app: killed for a verdict of :class:`tfyarn.supervisor.Supervisor` (deadline, allocation, stall),
shut down SUCCEEDED once every task is done (the tasks leave that to a live follower), killed when
``runner.run`` is stopped (``end``). The attempt loop and the poll loop are the runner's.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from tfyarn.common import paths
from tfyarn.backends.yarn import in_app_attempts, phases, records, skein_staging
from tfyarn.backends.yarn.reports import Reporter
from tfyarn.contracts import job_end
from tfyarn.contracts.status import AppState, AppStatus
from tfyarn.common.interrupts import Interrupted
from tfyarn.runner import ScheduledAttempts
from tfyarn.report import HISTORY_FILE, preload_plotting
from tfyarn.task.yarn import app_end
from tfyarn.task.yarn.kv_yarn import SkeinKV
from tfyarn.spec import JobSpec
from tfyarn.supervisor import Supervisor, Verdict, checkpoint_url, training_end_note

log = logging.getLogger(__name__)


class Follower(Reporter):
    """The part of the YARN backend that follows a job to its end and ends the app when that is tfyarn's to do."""

    def attempts(
        self,
        spec: JobSpec,
        sup: Supervisor,
        echo: Callable[[str, str], None] | None = None,
        on_update: Callable[[AppStatus], None] | None = None,
        poll: float = 2.0,
    ) -> ScheduledAttempts:
        """Each attempt a new application (``TFYARN_ATTEMPT=n``), followed here under ``sup``; after
        its submit a one-shot command's private driver is let go (:meth:`_release_driver`)."""
        self._run_started = time.time()
        return _YarnAttempts(self, spec, sup, on_update, poll)

    def end(self, app_id: str, exc: BaseException) -> AppStatus:
        """``run`` was stopped (Ctrl-C, a scheduler's SIGTERM) or failed: the application it started
        must not outlive it (:func:`~tfyarn.runner.never_left_running`): killed, its end recorded
        (the follower's). One that ended on its own is left as it is."""
        st = self.status(app_id)
        if st.state.is_terminal:
            return st  # it had ended on its own just before: its outcome stands
        why = str(exc) if isinstance(exc, Interrupted) else f"{type(exc).__name__}: {exc}"
        log.warning("%s: killing %s", why, app_id)
        self._end_with(
            app_id,
            job_end.decide(job_end.FOLLOWER, stopped=f"{why}: killed {app_id}"),
            lambda _status, _diag: self.kill(app_id),
        )
        last, st = st, self.status(app_id)
        st.state = AppState.KILLED  # YARN reports the kill asynchronously; it was asked for, and accepted
        st.diagnostics = f"{why}: killed {app_id}" + training_end_note(
            st.progress or last.progress or {}, st.summary or last.summary, checkpoint_url(records.saved_spec(app_id))
        )
        return st

    def followed(self, st: AppStatus) -> None:
        """An app this process followed has ended: its timeline logged, its run report written (now,
        or by a detached process: ``detached_report``)."""
        log.debug("%s phases: %s", st.app_id, phases.text(self.phases(st.app_id, st)))
        self._report_at_end(st)

    def follow(self, app_id: str, sup: Supervisor | None = None) -> Callable[[], AppStatus]:
        """One supervised status read of ``app_id`` per call (``wait``, ``run``, the Airflow trigger), judged by
        :class:`tfyarn.supervisor.Supervisor` (``sup``, else one from the app's spec, counting from its submit; none
        when the spec is unknown): a verdict (deadline, allocation, stall) kills the app, which ends TIMED_OUT saying
        why. While the app's own supervisor (:mod:`~tfyarn.backends.yarn.supervise`) is alive, the stall watch
        is its; the follower keeps the deadline and allocation checks and ends the app once every task is done."""
        if not self._preloading:  # the run report's plot, at the end: matplotlib imported meanwhile
            self._preloading = True
            threading.Thread(target=preload_plotting, name="tfyarn-preload-matplotlib", daemon=True).start()
        if sup is None:
            spec = records.saved_spec(app_id, self._recover(app_id, running=True))  # submitted elsewhere: the app's
            if spec is not None:
                sup = Supervisor(
                    spec,
                    started=records.load(app_id).get("submitted") or time.time(),
                    history_path=paths.yarn_report_dir(app_id) / HISTORY_FILE,
                )
        if sup is not None:
            paths.yarn_report_dir(app_id).mkdir(parents=True, exist_ok=True)
            if sup.history.path is None:  # the runner's: its samples go where the report reads them (a job with
                sup.history.path = paths.yarn_report_dir(app_id) / HISTORY_FILE  # no checkpoints has no others)
            self._sups[app_id] = sup  # status reads feed its progress rate and history
            sup.begin_attempt()  # its stall watch starts once the app's KV answers

        def step() -> AppStatus:
            st = self.status(app_id)
            if st.state.is_terminal:
                return st
            self._heartbeat(app_id)
            if sup is None:
                return st
            if st.state is AppState.RUNNING:
                if self._supervised(app_id):
                    sup.end_attempt()  # the app's own supervisor watches for stalls (supervise)
                elif (app := self._app_client(app_id)) is not None:
                    sup.watch(SkeinKV(app.kv))
            verdict = sup.check(st)
            return st if verdict is None else self._end_by(app_id, verdict, sup)

        return step

    def _end_by(self, app_id: str, verdict: Verdict, sup: Supervisor) -> AppStatus:
        """Kill ``app_id`` for the supervisor's ``verdict``; its final status says why (saved: ``status`` later too)."""
        queue = sup.spec.queue if sup.spec is not None else None
        diag = verdict.diagnosis + (self._queue_state(queue) if verdict.reason == "allocation" else "")
        log.error("%s: %s; killing it", app_id, diag)
        self._end_with(
            app_id,
            job_end.decide(job_end.FOLLOWER, verdict=diag),
            lambda _status, _diag: self.kill(app_id),
        )
        st = self.status(app_id)
        st.state, st.diagnostics = verdict.state, diag
        records.save(app_id, final=st.to_dict())
        return st

    def _queue_state(self, queue: str | None) -> str:
        """What an allocation timeout's diagnosis adds: the queue's state and use (a full queue is the usual cause)."""
        if not queue:
            return ""
        try:
            q = self.client().get_queue(queue)
            return (
                f"; queue {queue!r} is {q.state} at {q.percent_used:.0f}% of its capacity "
                f"(capacity {q.capacity:g}%, max {q.max_capacity:g}%)"
            )
        except Exception as exc:  # noqa: BLE001 - the diagnosis must not fail on a missing queue report
            return f"; queue {queue!r}: no report ({exc})"

    def _supervised(self, app_id: str) -> bool:
        """The app's in-app supervisor is alive (:mod:`tfyarn.backends.yarn.supervise`): the stall watch is its,
        not this follower's."""
        return bool(
            self._on_am(
                app_id,
                "supervisor heartbeat",
                lambda app: app_end.follower_alive(SkeinKV(app.kv), time.time(), app_end.SUPERVISOR_KEY),
            )
        )

    def _heartbeat(self, app_id: str) -> None:
        """Tell the tasks a follower is alive: the last task done then leaves the shutdown to us (task.yarn.app_end),
        so the KV's last records (every task's done and phase times) are read before the AM goes."""
        self._on_am(
            app_id, "follower heartbeat", lambda app: app.kv.put(app_end.FOLLOWER_KEY, f"{time.time():.3f}".encode())
        )

    def pause(self, app_id: str, seconds: float, check_s: float = 0.2) -> None:
        """Between two status reads: sleep ``seconds``, looking every ``check_s`` s for the tasks'
        ``control/all_done`` (one cheap KV read): once it is there, read the status one last time and
        shut the application down SUCCEEDED, then wait for the RM to say so (tens of ms), so a follower
        returns within a fraction of a second of the last task's end."""
        end = time.monotonic() + seconds
        app = self._app_client(app_id)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(check_s, left))
            if app is None:
                continue
            try:
                done = app.kv.get(app_end.ALL_DONE_KEY)
            except Exception as exc:  # noqa: BLE001 - the AM may be going: the next status read says so
                log.debug("all-done watch of %s: %s", app_id, exc)
                return
            if done is not None:
                self._end_app(app_id, app)
                return

    def _end_app(self, app_id: str, app: Any) -> None:
        """The KV's last state (phase times, final progress) into the snapshot, then the app's end — ours, also when
        the app has its own supervisor (it leaves the end to a live follower: the report is written after the end,
        not before it) — and the RM's word on it (tens of ms)."""
        read: list[AppStatus] = []

        def shutdown(status: str, diagnostics: str) -> None:
            read.append(self.status(app_id))  # after the end record: the saved snapshot has it
            log.debug("every task of %s is done: shutting it down", app_id)
            app.shutdown(status, diagnostics)

        try:
            self._end_with(app_id, job_end.decide(job_end.FOLLOWER, done=True), shutdown, app_end.DONE_DIAGNOSTICS)
        except Exception as exc:  # noqa: BLE001 - the supervisor or the last task shuts it down when we cannot
            log.debug("shutdown of %s: %s", app_id, exc)
        st = read[0] if read else self.status(app_id)
        self._apps.pop(app_id, None)
        deadline = time.monotonic() + app_end.SUPERVISOR_GRACE_S
        while not st.state.is_terminal and time.monotonic() < deadline:
            time.sleep(0.05)
            st = self.status(app_id)

    def _end_with(
        self, app_id: str, end: job_end.JobEnd, shutdown: Callable[[str, str], Any], diagnostics: str | None = None
    ) -> None:
        """End ``app_id`` by :func:`~tfyarn.contracts.job_end.end_job`: ``end`` recorded in its KV
        when its application master answers (an app not running yet or any more has no KV: it is
        just ended), then ``shutdown``."""
        diag = end.reason if diagnostics is None else diagnostics
        job_end.end_job(_AmKV(self, app_id), end, shutdown, diag)


class _AmKV:
    """A running app's skein KV as :func:`~tfyarn.contracts.job_end.end_job` writes it; a put the
    application master does not take is logged (the end itself must still happen)."""

    def __init__(self, backend: Follower, app_id: str):
        self.backend, self.app_id = backend, app_id

    def put(self, key: str, value: str) -> None:
        self.backend._on_am(self.app_id, f"KV {key}", lambda app: app.kv.put(key, value.encode()))


class _YarnAttempts(ScheduledAttempts):
    """:class:`~tfyarn.runner.ScheduledAttempts` with the driver let go after each submit."""

    backend: Follower

    def start(self, attempt: int) -> str:
        app_id = super().start(attempt)
        self.backend._release_driver()
        return app_id

    def to_end(self, app_id: str) -> AppStatus:
        st = super().to_end(app_id)
        skein_staging.remove_after(self.backend, app_id)  # an AM killed leaves it (issue 30)
        # the attempts its in-app supervisor ran: the run's own (numbering, budget, totals, diagnosis)
        in_app_attempts.absorb(self.sup, records.load(app_id).get("snapshot") or {}, app_id)
        return st
