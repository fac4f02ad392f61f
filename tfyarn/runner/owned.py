"""Never leave an app running: whatever ends a ``run`` before its app has ended also ends the app.

Why: a ``run`` starts apps (YARN: one application per job attempt; local: the launcher's task
processes) and follows them; a stop signal, an error while following or a bug must not leave one
running, unowned (dask-yarn's ``submit_and_handle_failures`` in its ``core.py``: submit, then kill
on any failure). One context manager does it for both backends: the block names the app it started
(:meth:`Owned.own`); an exception leaving the block has it ended by the backend's ``end(app_id,
exc)`` with further stop signals ignored, then propagates — except a stop
(:class:`~tfyarn.common.interrupts.Interrupted`), which is the run's answer: the block ends and
:attr:`Owned.stopped` holds the app's final status. Stop signals raise
:class:`~tfyarn.common.interrupts.Interrupted` inside the block.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from tfyarn.contracts import job_end
from tfyarn.contracts.status import AppState, AppStatus
from tfyarn.common.interrupts import Interrupted, ignoring_stop_signals, interruptible
from tfyarn.report import checkpoint_url
from tfyarn.runner.supervisor import training_end_note
from tfyarn.spec import JobSpec

log = logging.getLogger(__name__)


class Owned:
    """The app a ``run`` block started (its last, for a run of several attempts) and, after a stop,
    its status."""

    def __init__(self) -> None:
        self.app_id: str | None = None
        self.stopped: AppStatus | None = None

    def own(self, app_id: str) -> str:
        self.app_id = app_id
        return app_id


@contextmanager
def never_left_running(end: Callable[[str, BaseException], AppStatus]) -> Iterator[Owned]:
    """Yield an :class:`Owned`; on any exception out of the block, ``end(app_id, exc)`` the app it
    owns (an exception naming an ``app_id`` — a stop during the submit — names it) and re-raise, or,
    for a stop, return with the ended app's status in ``owned.stopped``. ``end`` must leave an app
    that has ended on its own as it is."""
    owned = Owned()
    try:
        with interruptible():
            yield owned
    except BaseException as exc:
        app_id = getattr(exc, "app_id", None) or owned.app_id
        if app_id is None:
            raise  # nothing started yet: nothing to end
        with ignoring_stop_signals():  # a second Ctrl-C must not leave the end half done
            try:
                owned.stopped = end(app_id, exc)
            except Exception as end_exc:
                log.error("could not end %s after %s: %s", app_id, exc, end_exc)
                raise exc from end_exc
        if not isinstance(exc, Interrupted):
            raise


def stop_app(backend: Any, app_id: str, exc: BaseException, spec: JobSpec | None) -> AppStatus:
    """End ``app_id`` of a run that was stopped (Ctrl-C, a scheduler's SIGTERM) or failed (``exc``): the
    backend records the follower's end and kills it; its status says why, and whether training had completed
    (:func:`~tfyarn.runner.supervisor.training_end_note`). One that ended on its own is left as it is."""
    st = backend.status(app_id)
    if st.state.is_terminal:
        return st  # it had ended on its own just before: its outcome stands
    why = str(exc) if isinstance(exc, Interrupted) else f"{type(exc).__name__}: {exc}"
    log.warning("%s: killing %s", why, app_id)
    reason = f"{why}: killed {app_id}"
    last, st = st, backend.end(app_id, job_end.decide(job_end.FOLLOWER, stopped=reason))
    st.state = AppState.KILLED  # YARN reports the kill asynchronously; it was asked for, and accepted
    progress, summary = st.progress or last.progress or {}, st.summary or last.summary
    st.diagnostics = reason + training_end_note(progress, summary, checkpoint_url(spec))
    return st
