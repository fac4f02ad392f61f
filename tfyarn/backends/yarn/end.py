"""The end of a YARN app, as the runner decides it: the kill, and ``end`` — the ender's record put in the app's KV
(:func:`tfyarn.contracts.job_end.end_job`), then the kill (a verdict, a stop) or the shutdown SUCCEEDED (every task
done, its KV read one last time first) — and the running app's KV, which its follower reads and writes.

Why a part of its own: what ends an app changes it; status, logs and reports only read. Whether and why to end it
is the runner's (:mod:`tfyarn.runner.follow`, :mod:`tfyarn.runner.owned`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from tfyarn.backends.yarn import records, rest
from tfyarn.backends.yarn.connection import YarnConnection
from tfyarn.contracts import job_end
from tfyarn.contracts.status import AppState, AppStatus
from tfyarn.task.yarn import app_end
from tfyarn.task.yarn.kv_yarn import SkeinKV

log = logging.getLogger(__name__)


class Ender:
    """The end part of the YARN backend: ``kill``, ``end``, ``kv``, ``queue_note``; ``status`` reads an app's."""

    def __init__(self, conn: YarnConnection, status: Callable[[str], AppStatus]):
        self.conn, self.status = conn, status

    def kill(self, app_id: str) -> None:
        """Kill ``app_id``; through the RM's REST API (no JVM) this returns once the RM says KILLED (or ended)."""
        rep = self.conn.app_report(app_id)  # AppNotFound for an unknown id, before asking YARN to kill
        rm = self.conn.rm() if isinstance(rep, rest.AppReport) else None
        try:
            if rm is None:
                raise rest.RestUnavailable("no REST API")
            rm.kill(app_id)
        except rest.RestUnavailable as exc:
            log.debug("RM REST kill of %s: %s; asking the skein driver", app_id, exc)
            spec = records.saved_spec(app_id)
            # a job submitted for a proxy user (spec.user) is that user's: killing it as the submitter may be refused
            self.conn.client().kill_application(app_id, user=(spec.user or "") if spec else "")
        self.conn.forget(app_id)

    def kv(self, app_id: str) -> SkeinKV | None:
        """The running app's KV (through its application master); None when it has none."""
        app = self.conn.app_client(app_id)
        return None if app is None else SkeinKV(app.kv)

    def end(self, app_id: str, end: job_end.JobEnd) -> AppStatus:
        """End ``app_id`` as the follower decided: a SUCCEEDED end shuts it down (:meth:`_shut_down`); any other is
        recorded, then the app killed, its final status saved in ``end``'s state (``status`` later says TIMED_OUT
        for a deadline, which YARN calls KILLED). One that had ended on its own is left as it is."""
        if end.state == AppState.SUCCEEDED.value:
            return self._shut_down(app_id, end)
        st = self.status(app_id)
        if st.state.is_terminal:
            return st
        self._end_with(app_id, end, lambda _status, _diag: self.kill(app_id))
        st = self.status(app_id)
        st.state, st.diagnostics = AppState(end.state), end.reason
        records.save(app_id, final=st.to_dict())
        return st

    def _shut_down(self, app_id: str, end: job_end.JobEnd) -> AppStatus:
        """The KV's last state (phase times, final progress) into the snapshot, then the app's end — the
        follower's, also when the app has its own supervisor (it leaves the end to a live follower: the report is
        written after the end, not before it) — and the RM's word on it (tens of ms)."""
        app = self.conn.app_client(app_id)
        read: list[AppStatus] = []

        def shutdown(status: str, diagnostics: str) -> None:
            read.append(self.status(app_id))  # after the end record: the saved snapshot has it
            if app is not None:
                app.shutdown(status, diagnostics)

        try:
            self._end_with(app_id, end, shutdown, app_end.DONE_DIAGNOSTICS)
        except Exception as exc:  # noqa: BLE001 - the supervisor or the last task shuts it down when we cannot
            log.debug("shutdown of %s: %s", app_id, exc)
        st = read[0] if read else self.status(app_id)
        self.conn.forget(app_id)
        deadline = time.monotonic() + app_end.SUPERVISOR_GRACE_S
        while not st.state.is_terminal and time.monotonic() < deadline:
            time.sleep(0.05)
            st = self.status(app_id)
        return st

    def _end_with(
        self, app_id: str, end: job_end.JobEnd, shutdown: Callable[[str, str], Any], diagnostics: str | None = None
    ) -> None:
        """End ``app_id`` by :func:`~tfyarn.contracts.job_end.end_job`: ``end`` recorded in its KV
        when its application master answers (an app not running yet or any more has no KV: it is
        just ended), then ``shutdown``."""
        diag = end.reason if diagnostics is None else diagnostics
        job_end.end_job(_AmKV(self.conn, app_id), end, shutdown, diag)

    def queue_note(self, queue: str | None) -> str:
        """What an allocation timeout's diagnosis adds: the queue's state and use (a full queue is the usual cause)."""
        if not queue:
            return ""
        try:
            q = self.conn.client().get_queue(queue)
            return (
                f"; queue {queue!r} is {q.state} at {q.percent_used:.0f}% of its capacity "
                f"(capacity {q.capacity:g}%, max {q.max_capacity:g}%)"
            )
        except Exception as exc:  # noqa: BLE001 - the diagnosis must not fail on a missing queue report
            return f"; queue {queue!r}: no report ({exc})"


class _AmKV:
    """A running app's skein KV as :func:`~tfyarn.contracts.job_end.end_job` writes it; a put the
    application master does not take is logged (the end itself must still happen)."""

    def __init__(self, conn: YarnConnection, app_id: str):
        self.conn, self.app_id = conn, app_id

    def put(self, key: str, value: str) -> None:
        self.conn.on_am(self.app_id, f"KV {key}", lambda app: app.kv.put(key, value.encode()))
