"""The backend interface: the scheduler's verbs over a spec's apps.

Modelled on torchx's Scheduler: ``dryrun`` (the :class:`Request`, nothing started or uploaded),
``schedule`` (exactly that request), ``submit`` (the two in one), ``status``, ``logs``, ``kill``,
``list``, ``end`` (an app ended as a :class:`~tfyarn.contracts.job_end.JobEnd` says: recorded where
the app keeps its end, then killed or shut down), ``kv`` (a running app's KV store, where its tasks
publish), ``queue_note`` and the run report's place (``keep_report``, ``report_location``,
``saved_report``). Every backend returns the same :class:`AppStatus`, so the CLI, the Airflow operator
and users' scripts work the same against any.

A backend decides nothing about a job: a run to its end — attempts, deadlines, the stall watch, when
to end an app — is :mod:`tfyarn.runner`'s (torchx's Runner), which sits above the backends and drives
them through these verbs: it asks for the status, its supervisor decides, it tells the backend to
end. A backend does not run jobs (no run/wait): callers use ``runner.run(backend, spec)``,
``runner.wait(backend, app_id)`` or :mod:`tfyarn.api`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator, TypeVar

from tfyarn.contracts.job_end import JobEnd
from tfyarn.contracts.status import AppState, AppStatus, Echo, TaskStatus, WaitClock
from tfyarn.errors import TfyarnError
from tfyarn.spec import JobSpec

B = TypeVar("B", bound="Backend")

__all__ = ["AppState", "AppStatus", "Backend", "Echo", "Request", "TaskStatus", "WaitClock"]


@dataclass
class Request:
    """What a submit would start (each backend's subclass says how); ``str()``: what ``submit --dry-run`` prints."""

    spec: JobSpec
    attempt: int = 0  # job attempt (0-based): TFYARN_ATTEMPT of the tasks
    run_started: float | None = None  # wall time the run that schedules it began (None: a bare submit)


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

    # ------------------------------------------------------------------------------------- a followed app
    def end(self, app_id: str, end: JobEnd) -> AppStatus:
        """End ``app_id`` as ``end`` says (the runner's decision: a verdict, a stop, every task done):
        recorded where the app keeps its end, then killed (a SUCCEEDED end: shut down). An app that
        had ended on its own stays as it ended. Its status after, in ``end``'s state. Default: a kill."""
        st = self.status(app_id)
        if st.state.is_terminal:
            return st
        self.kill(app_id)
        st = self.status(app_id)
        st.state, st.diagnostics = AppState(end.state), end.reason
        return st

    def kv(self, app_id: str) -> Any:
        """The running app's KV store (:mod:`tfyarn.contracts.kv_keys`: ``get``, ``put``, ``items``) for its
        follower, or None when this backend offers none (the local launcher follows its own)."""
        return None

    def queue_note(self, queue: str | None) -> str:
        """What an allocation timeout's diagnosis adds: the queue's state and use (default: nothing)."""
        return ""

    def keep_report(self, st: AppStatus) -> None:  # noqa: B027 - most backends keep nothing
        """An app followed to its end (a run's attempt, a wait): its run report kept where this backend keeps
        them (YARN: written now, or by a detached process). Default: nothing (local: the launcher wrote it)."""
