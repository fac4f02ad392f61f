"""The backend interface: turn a spec into running tasks, then describe, follow, and stop them.

Modelled on torchx's Scheduler: ``dryrun`` builds the :class:`Request` without starting or uploading anything,
``schedule`` starts exactly that request, and ``submit`` is the two in one. Every backend returns the same
:class:`AppStatus`, so the CLI, the Airflow operator and users' scripts work the same against any.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from tfyarn.contracts.status import AppState, AppStatus, Echo, TaskStatus, WaitClock
from tfyarn.errors import TfyarnError, WaitTimeout
from tfyarn.spec import JobSpec

B = TypeVar("B", bound="Backend")

__all__ = ["AppState", "AppStatus", "Backend", "Echo", "Request", "TaskStatus", "WaitClock"]


@dataclass
class Request:
    """What a submit would start (each backend's subclass says how); ``str()``: what ``submit --dry-run`` prints."""

    spec: JobSpec
    attempt: int = 0  # job attempt (0-based): TFYARN_ATTEMPT of the tasks


class Backend(ABC):
    name: str = "?"
    #: write a followed job's run report from a detached process after ``run``/``wait`` return, so the caller's exit
    #: does not wait for a plot and uploads (a backend whose jobs write their own report ignores it)
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
    def run(
        self,
        spec: JobSpec,
        echo: Echo | None = None,
        on_update: Callable[[AppStatus], None] | None = None,
        timeout: float | None = None,
    ) -> AppStatus:
        """Run the job to its end with its job attempts; ``echo`` sees task log lines, ``on_update`` each status;
        ``timeout`` (seconds) ends it as TIMED_OUT."""

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

    def wait(
        self,
        app_id: str,
        timeout: float | None = None,
        poll: float = 1.0,
        on_update: Callable[[AppStatus], None] | None = None,
    ) -> AppStatus:
        """Poll until the app ends; ``on_update`` sees each status (progress display). Bounded by ``timeout``."""
        return self._wait_with(self.follow(app_id), app_id, timeout, poll, on_update)

    def follow(self, app_id: str) -> Callable[[], AppStatus]:
        """One status read per call for a follower (``wait``, the Airflow trigger); a backend whose jobs are
        supervised by their follower (YARN) judges each status there. Local: the launcher supervises its job."""
        return lambda: self.status(app_id)

    def _wait_with(
        self,
        step: Callable[[], AppStatus],
        app_id: str,
        timeout: float | None,
        poll: float,
        on_update: Callable[[AppStatus], None] | None,
    ) -> AppStatus:
        clock = WaitClock(timeout, f"{self.name} app {app_id}")
        while True:
            st = step()
            if on_update:
                on_update(st)
            if st.state.is_terminal:
                return st
            expired = clock.expired(st.state)
            if expired:
                raise WaitTimeout(expired)
            self._between_polls(app_id, poll)

    def _between_polls(self, app_id: str, poll: float) -> None:
        """Sleep between two status reads of :meth:`wait` (YARN watches for the job's end meanwhile)."""
        time.sleep(poll)
