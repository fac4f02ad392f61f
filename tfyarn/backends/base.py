"""The backend interface: turn a spec into running tasks, then describe, follow, and stop them.

Modelled on torchx's Scheduler: the verbs are ``dryrun`` (the :class:`Request`, nothing started or
uploaded), ``schedule`` (exactly that request), ``submit`` (the two in one), ``status``, ``logs``,
``kill``, ``list`` and ``end`` (the end of an app a stopped run owns). Every backend returns the same
:class:`AppStatus`, so the CLI, the Airflow operator and users' scripts work the same against any.

A run to the end — attempts, deadlines, following, the report's moment — is the runner's
(:mod:`tfyarn.runner`, torchx's Runner), once for every backend; what is truly a backend's own
stays behind four documented hooks: ``attempts`` (how one attempt runs: YARN schedules an app and
follows it, local's launcher supervises its processes), ``follow`` (one judged status read), ``pause``
(between reads) and ``followed`` (an app followed to its end). A backend does not run jobs: callers
run one through the runner (``runner.run(backend, spec)``, ``runner.wait(backend, app_id)``, or
:mod:`tfyarn.api`), which takes the backend.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from tfyarn.contracts.status import AppState, AppStatus, Echo, TaskStatus, WaitClock
from tfyarn.errors import TfyarnError
from tfyarn.runner import Attempts, ScheduledAttempts
from tfyarn.spec import JobSpec
from tfyarn.supervisor import Supervisor

B = TypeVar("B", bound="Backend")

__all__ = ["AppState", "AppStatus", "Backend", "Echo", "Request", "TaskStatus", "WaitClock"]


@dataclass
class Request:
    """What a submit would start (each backend's subclass says how); ``str()``: what ``submit --dry-run`` prints."""

    spec: JobSpec
    attempt: int = 0  # job attempt (0-based): TFYARN_ATTEMPT of the tasks


class Backend(ABC):
    name: str = "?"
    #: write a followed job's run report from a detached process after the runner's ``run``/``wait`` return, so the
    #: caller's exit does not wait for a plot and uploads (a backend whose jobs write their own report ignores it)
    detached_report: bool = False

    @abstractmethod
    def dryrun(self, spec: JobSpec, attempt: int = 0) -> Request:
        """The request :meth:`schedule` would start for ``spec``. Starts, uploads and writes nothing."""

    @abstractmethod
    def schedule(self, request: Request) -> str:
        """Start exactly ``request`` (from this backend's :meth:`dryrun`); return its app id without waiting."""

    def submit(self, spec: JobSpec) -> str:
        """Start the job (``schedule(dryrun(spec))``); return its app id without waiting for it to finish."""
        return self.schedule(self.dryrun(spec))

    @abstractmethod
    def status(self, app_id: str) -> AppStatus: ...

    @abstractmethod
    def logs(self, app_id: str, task: str | None = None, follow: bool = False) -> Iterator[str]:
        """Log lines of one task ('worker:1') or of all tasks (each line prefixed with its task)."""

    @abstractmethod
    def kill(self, app_id: str) -> None: ...

    def list(self) -> list[AppStatus]:
        return []

    def report_location(self, st: AppStatus, build: bool = True) -> str | None:
        """Where the run report (report.json) of the app is, or None; ``build``: an ended app whose report nobody
        wrote gets one now, when this backend can."""
        return None

    def saved_report(self, app_id: str) -> str:
        """Where the report.json of ``app_id`` is (a path or URL; built now when this backend can); TfyarnError when
        there is none."""
        raise TfyarnError(f"the {self.name} backend keeps no run reports")

    def index_cache_dir(self) -> str | None:
        """Where this backend's jobs cache the indexes of read-only data (None: no shared cache)."""
        return None

    def close(self) -> None:  # noqa: B027 - a default: most backends hold nothing to release
        """Release what this backend holds (YARN: a private skein driver). Backends are context managers."""

    def __enter__(self: B) -> B:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------- the end of an app
    def end(self, app_id: str, exc: BaseException) -> AppStatus:
        """End ``app_id`` because the run that started it was stopped (``exc``: why) or failed: the
        runner never leaves an app running (:func:`tfyarn.runner.never_left_running`). An app that had
        ended on its own stays as it ended. Default: a kill, then its status."""
        st = self.status(app_id)
        if not st.state.is_terminal:
            self.kill(app_id)
            st = self.status(app_id)
        return st

    # ------------------------------------------------------------------------------------- the runner's hooks
    def attempts(
        self,
        spec: JobSpec,
        sup: Supervisor,
        echo: Echo | None = None,
        on_update: Callable[[AppStatus], None] | None = None,
        poll: float = 2.0,
    ) -> Attempts:
        """How this backend runs the attempts of ``spec`` for :func:`tfyarn.runner.run` (``sup``: the
        run's rules). Default: each attempt an app of its own, scheduled and followed through the
        verbs (:class:`tfyarn.runner.ScheduledAttempts`)."""
        return ScheduledAttempts(self, spec, sup, on_update, poll)

    def follow(self, app_id: str, sup: Supervisor | None = None) -> Callable[[], AppStatus]:
        """One status read per call for a follower (the runner, the Airflow trigger); a backend whose
        apps are supervised by their follower (YARN) judges each status by ``sup`` (else its own)."""
        return lambda: self.status(app_id)

    def pause(self, app_id: str, seconds: float) -> None:
        """Between two status reads of a follower (YARN watches for the job's end meanwhile)."""
        time.sleep(seconds)

    def followed(self, st: AppStatus) -> None:  # noqa: B027 - a hook: most backends keep nothing
        """An app this process followed (a run's attempt, a wait) has ended: what the backend keeps of
        it (YARN: the run report). Default: nothing (local: the launcher wrote it)."""
