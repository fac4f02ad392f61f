"""A job run to its end with its attempts: ``run`` for every backend.

Why here and not in each backend: the rules of a run — a FAILED or TIMED_OUT attempt is followed
by another one (``TFYARN_ATTEMPT=n``, resuming from the latest checkpoint) after ``retry.backoff``,
up to ``retry.max_attempts`` (attempts the cluster ended counted apart,
:class:`~tfyarn.contracts.triage.AttemptBudget`), never past the deadline, never after a stop; the
final diagnosis names the earlier attempts — are the same on every backend, and decided by one
:class:`~tfyarn.runner.supervisor.Supervisor` per run. How one attempt runs is an
:class:`Attempts`: on YARN each attempt is an application of its own, scheduled through the verbs
and followed here (:class:`ScheduledAttempts`, with what the app's in-app supervisor ran taken in:
:mod:`tfyarn.runner.yarn_app.follower`); locally the launcher (:mod:`tfyarn.runner.local_app`) runs
every attempt as a round of one app, its processes supervised by itself (:data:`APP_MASTERS`).
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import time
from typing import Any, Callable, Protocol

from tfyarn.contracts.status import AppStatus, Echo
from tfyarn.runner.follow import follow_to_end
from tfyarn.runner.owned import never_left_running, stop_app
from tfyarn.runner.supervisor import Supervisor
from tfyarn.spec import JobSpec

#: A backend whose attempts are not each an app scheduled and followed here: its application master's attempts
#: (a factory like :class:`ScheduledAttempts`: ``(backend, spec, sup, watch)``), by backend name.
APP_MASTERS = {"local": "tfyarn.runner.local_app.attempts", "yarn": "tfyarn.runner.yarn_app.follower.YarnAttempts"}


@dataclasses.dataclass(frozen=True)
class Watch:
    """What the caller of :func:`run` sees of it, handed to whoever runs its attempts: ``echo`` the task log lines
    (where the backend streams them), ``on_update`` each status, polled every ``poll`` seconds."""

    echo: Echo | None = None
    on_update: Callable[[AppStatus], None] | None = None
    poll: float = 2.0


class Attempts(Protocol):
    """How a backend runs the attempts of one job for :func:`run` (a context manager around them).

    ``app_per_attempt``: each attempt is an app of its own (its id labels its diagnosis) rather than
    a round of one app. ``stop_event``: set when the backend itself was told to stop the run (local: its
    launcher's signal handlers); no further attempt starts and the backoff ends early."""

    @property
    def app_per_attempt(self) -> bool: ...

    @property
    def stop_event(self) -> threading.Event | None: ...

    def __enter__(self) -> Attempts: ...

    def __exit__(self, *exc: object) -> None: ...

    def start(self, attempt: int) -> str:
        """Start attempt ``attempt`` (0-based); its app id."""
        ...

    def to_end(self, app_id: str) -> AppStatus:
        """Follow the attempt to its end; its final status."""
        ...

    def end(self, app_id: str, exc: BaseException) -> AppStatus:
        """End the run's app now (the run was stopped or failed, or a stop came between two
        attempts); its final status. An app that had ended stays as it ended."""
        ...

    def finish(self, st: AppStatus) -> AppStatus:
        """After the last attempt, ``st`` carrying the final diagnosis: what the app keeps of it."""
        ...


class ScheduledAttempts:
    """Attempts of a backend whose every attempt is an app of its own: ``schedule(dryrun(spec,
    attempt))``, followed to its end by :func:`~tfyarn.runner.follow.follow_to_end` under the run's
    supervisor, ended by the backend's ``end``."""

    app_per_attempt = True
    stop_event: threading.Event | None = None

    def __init__(self, backend: Any, spec: JobSpec, sup: Supervisor, watch: Watch | None = None):
        self.backend, self.spec, self.sup, self.watch = backend, spec, sup, watch or Watch()

    def __enter__(self) -> ScheduledAttempts:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start(self, attempt: int) -> str:
        # the run's start marks the first phase of the job's timeline (and tells the backend a run follows)
        request = dataclasses.replace(self.backend.dryrun(self.spec, attempt=attempt), run_started=self.sup.started)
        return str(self.backend.schedule(request))

    def to_end(self, app_id: str) -> AppStatus:
        return follow_to_end(self.backend, app_id, self.sup, None, self.watch.poll, self.watch.on_update)

    def end(self, app_id: str, exc: BaseException) -> AppStatus:
        return stop_app(self.backend, app_id, exc, self.spec)

    def finish(self, st: AppStatus) -> AppStatus:
        return st


def attempts_for(backend: Any, spec: JobSpec, sup: Supervisor, watch: Watch) -> Attempts:
    """How ``backend`` runs the attempts of ``spec`` under ``sup``: its application master's
    (:data:`APP_MASTERS`), else each attempt an app of its own (:class:`ScheduledAttempts`)."""
    path = APP_MASTERS.get(backend.name)
    if path is None:
        return ScheduledAttempts(backend, spec, sup, watch)
    module, _, name = path.rpartition(".")
    factory = getattr(importlib.import_module(module), name)
    job: Attempts = factory(backend, spec, sup, watch)
    return job


def run(
    backend: Any,
    spec: JobSpec,
    echo: Echo | None = None,
    on_update: Callable[[AppStatus], None] | None = None,
    timeout: float | None = None,
    poll: float = 2.0,
) -> AppStatus:
    """Run ``spec`` on ``backend`` to its end with the job's attempts (module docstring); ``echo``
    sees task log lines (where the backend streams them), ``on_update`` each status; ``timeout``
    (seconds) ends it as TIMED_OUT, like ``timeouts.active_deadline``. Whatever leaves this before
    the app ended ends it (:func:`~tfyarn.runner.owned.never_left_running`): a stop returns the
    ended app's status, an error propagates."""
    sup = Supervisor(spec, started=time.time(), timeout=timeout)
    return run_attempts(attempts_for(backend, spec, sup, Watch(echo, on_update, poll)), sup)


def run_attempts(job: Attempts, sup: Supervisor) -> AppStatus:
    """The attempt loop of :func:`run` over ``job`` (also the local launcher's detached process's)."""
    with never_left_running(job.end) as owned:
        with job:
            while True:
                app_id = owned.own(job.start(sup.attempt))
                st = job.to_end(app_id)
                # an app that ran further attempts itself (YARN's in-app supervisor): the next is numbered after
                sup.attempt = max(sup.attempt, st.attempt)
                st.attempt = sup.attempt
                stopped = job.stop_event is not None and job.stop_event.is_set()
                label = app_id if job.app_per_attempt else ""
                if not sup.next_attempt(st.state, st.diagnostics, stopped=stopped, label=label):
                    break
                if not sup.backoff(job.stop_event):  # stopped meanwhile: the run ends as the stop says
                    st = job.end(app_id, RuntimeError("stopped during the backoff"))
                    break
            st.diagnostics = sup.final_diagnosis(st.diagnostics)
            return job.finish(sup.fold_totals(st))  # wall time and work redone over every attempt
    assert owned.stopped is not None  # (a stop: never_left_running ended the app)
    st = owned.stopped
    st.diagnostics = sup.final_diagnosis(st.diagnostics)
    return st
