"""Following one app to its end (``wait``, each attempt of ``run``): the runner reads the status, the run's
:class:`~tfyarn.runner.supervisor.Supervisor` decides, the backend ends the app (``backend.end``, a
:class:`~tfyarn.contracts.job_end.JobEnd`): a verdict ends it TIMED_OUT saying why. Over the running app's KV
(``backend.kv``: YARN) the follower says it is alive (``control/follower``: the last task leaves the end to it),
leaves the stall watch to a live in-app supervisor and, between reads, ends the app SUCCEEDED within a fraction of a
second of ``control/all_done``. Then the backend keeps the run report (``backend.keep_report``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from tfyarn.backends.base import Backend
from tfyarn.contracts import job_end
from tfyarn.contracts.kv_keys import ALL_DONE_KEY, FOLLOWER_KEY, SUPERVISOR_KEY
from tfyarn.contracts.status import AppState, AppStatus, WaitClock
from tfyarn.errors import WaitTimeout
from tfyarn.report import preload_plotting
from tfyarn.runner.supervisor import Supervisor, Verdict
from tfyarn.task.yarn.app_end import follower_alive
from tfyarn.backends.yarn import records

log = logging.getLogger(__name__)
_preloading = threading.Event()  # matplotlib imported once per process, meanwhile, for the report at the end


def poll_to_end(
    step: Callable[[], AppStatus],
    what: str,
    timeout: float | None = None,
    poll: float = 1.0,
    on_update: Callable[[AppStatus], None] | None = None,
    pause: Callable[[float], None] | None = None,
) -> AppStatus:
    """Call ``step`` until the status it returns has ended; ``on_update`` sees each status.
    :class:`WaitTimeout` (naming ``what``) after ``timeout`` s; ``pause(poll)`` between two reads
    (default: a sleep)."""
    clock = WaitClock(timeout, what)
    while True:
        st = step()
        if on_update:
            on_update(st)
        if st.state.is_terminal:
            return st
        expired = clock.expired(st.state)
        if expired:
            raise WaitTimeout(expired)
        (pause or time.sleep)(poll)


class Follower:
    """One app followed by this process: :meth:`step` is one judged status read, :meth:`pause` the time
    between two. ``sup`` None: status reads only (the app's rules are applied elsewhere, or unknown)."""

    def __init__(self, backend: Backend, app_id: str, sup: Supervisor | None):
        self.backend, self.app_id, self.sup = backend, app_id, sup
        if sup is not None:
            sup.begin_attempt()  # its stall watch starts once the app's KV answers

    def _on_kv(self, what: str, call: Callable[[Any], Any]) -> Any:
        """``call(kv)`` on the running app's KV; None without one or when it fails (the next read says why)."""
        kv = self.backend.kv(self.app_id)
        if kv is None:
            return None
        try:
            return call(kv)
        except Exception as exc:  # noqa: BLE001 - see above
            log.debug("%s of %s: %s", what, self.app_id, exc)
            return None

    def step(self) -> AppStatus:
        st = self.backend.status(self.app_id)
        if self.sup is not None:
            self.sup.seen(st.progress or {})  # the step reached: what a next attempt redoes
        if st.state.is_terminal:
            return st
        # alive: the last task done leaves the end to us, so the KV's last records are read before the end
        self._on_kv("follower heartbeat", lambda kv: kv.put(FOLLOWER_KEY, f"{time.time():.3f}"))
        if self.sup is None:
            return st
        if st.state is AppState.RUNNING:
            supervised = self._on_kv("supervisor heartbeat", lambda kv: follower_alive(kv, time.time(), SUPERVISOR_KEY))
            if supervised:
                self.sup.end_attempt()  # the app's own supervisor watches for stalls
            else:
                kv = self.backend.kv(self.app_id)
                if kv is not None:
                    self.sup.watch(kv)
        verdict = self.sup.check(st)
        return st if verdict is None else self.end_by(verdict)

    def end_by(self, verdict: Verdict) -> AppStatus:
        """End the app for the supervisor's ``verdict``; its final status says why."""
        assert self.sup is not None
        queue = self.sup.spec.queue if self.sup.spec is not None else None
        diag = verdict.diagnosis + (self.backend.queue_note(queue) if verdict.reason == "allocation" else "")
        log.error("%s: %s; killing it", self.app_id, diag)
        return self.backend.end(self.app_id, job_end.decide(job_end.FOLLOWER, verdict=diag))

    def pause(self, seconds: float, check_s: float = 0.2) -> None:
        """Sleep ``seconds``, looking every ``check_s`` s for ``control/all_done`` (one cheap KV read): then the
        app is ended SUCCEEDED (the backend reads its KV one last time first)."""
        end = time.monotonic() + seconds
        watch = self.backend.kv(self.app_id) is not None
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(check_s, left))
            if not watch:
                continue
            try:
                kv = self.backend.kv(self.app_id)
                done = kv.get(ALL_DONE_KEY) if kv is not None else None
            except Exception as exc:  # noqa: BLE001 - the app may be ending: the next status read says so
                log.debug("all-done watch of %s: %s", self.app_id, exc)
                return
            if done is not None:
                log.debug("every task of %s is done: ending it", self.app_id)
                try:
                    self.backend.end(self.app_id, job_end.decide(job_end.FOLLOWER, done=True))
                except Exception as exc:  # noqa: BLE001 - the supervisor or the last task ends it when we cannot
                    log.debug("end of %s: %s", self.app_id, exc)
                return


def follow_to_end(
    backend: Backend,
    app_id: str,
    sup: Supervisor | None = None,
    timeout: float | None = None,
    poll: float = 1.0,
    on_update: Callable[[AppStatus], None] | None = None,
) -> AppStatus:
    """Follow ``app_id`` to its end under ``sup`` (None: the rules :func:`supervisor_for` finds), then
    ``backend.keep_report(st)``."""
    keeps = type(backend).keep_report is not Backend.keep_report  # it writes the run report at the end
    if keeps and not _preloading.is_set():  # the report's plot: matplotlib imported meanwhile
        _preloading.set()
        threading.Thread(target=preload_plotting, name="tfyarn-preload-matplotlib", daemon=True).start()
    follower = Follower(backend, app_id, sup if sup is not None else supervisor_for(backend, app_id))
    st = poll_to_end(follower.step, f"{backend.name} app {app_id}", timeout, poll, on_update, follower.pause)
    backend.keep_report(st)  # after a kill for a stall too: where it stalled is what its report shows
    return st


def supervisor_for(backend: Backend, app_id: str) -> Supervisor | None:
    """The rules a follower applies to an app it did not start (``wait``, the Airflow trigger): a YARN app's — its
    spec (this machine's record, else the app's own, recovered by a status read), the deadline counting from its
    submit; None when the spec is unknown. A local app's launcher applies them itself (None)."""
    if backend.name != "yarn":
        return None
    spec = records.saved_spec(app_id)
    if spec is None:
        backend.status(app_id)  # an app submitted elsewhere: its status read recovers its spec from the app
        spec = records.saved_spec(app_id)
    if spec is None:
        return None
    return Supervisor(spec, started=records.load(app_id).get("submitted") or time.time())


def wait(
    backend: Backend,
    app_id: str,
    timeout: float | None = None,
    poll: float = 1.0,
    on_update: Callable[[AppStatus], None] | None = None,
) -> AppStatus:
    """Follow an app this process did not start (``tfyarn wait``, the Airflow operator) to its end.
    ``timeout`` bounds this wait only (:class:`WaitTimeout`; the app runs on)."""
    return follow_to_end(backend, app_id, None, timeout, poll, on_update)
