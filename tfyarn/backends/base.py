"""The backend interface: turn a spec into running tasks, then describe, follow, and stop them.

Modelled on torchx's Scheduler: ``dryrun`` builds the :class:`Request` without starting or uploading anything,
``schedule`` starts exactly that request, and ``submit`` is the two in one. Every backend returns the same
:class:`AppStatus`, so the CLI, the Airflow operator and users' scripts work the same against any.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable, Iterator

from tfyarn.errors import ExitCode, TfyarnError, WaitTimeout
from tfyarn.spec import JobSpec


class AppState(str, Enum):
    PENDING = "PENDING"       # accepted, tasks not all running yet
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    TIMED_OUT = "TIMED_OUT"   # a tfyarn deadline (rendezvous, stall, active deadline) ended it

    @property
    def is_terminal(self) -> bool:
        return self in (AppState.SUCCEEDED, AppState.FAILED, AppState.KILLED, AppState.TIMED_OUT)

    @property
    def exit_code(self) -> int:
        return {AppState.SUCCEEDED: ExitCode.SUCCEEDED, AppState.KILLED: ExitCode.KILLED,
                AppState.TIMED_OUT: ExitCode.TIMED_OUT}.get(self, ExitCode.FAILED)


@dataclass
class TaskStatus:
    task: str                       # 'worker:1'
    state: str                      # PENDING | RUNNING | SUCCEEDED | FAILED | KILLED
    host: str | None = None
    restarts: int = 0
    exit_code: int | None = None
    diagnostics: str = ""
    log: str | None = None          # local path or URL of the task's log
    memory_mib: int | None = None   # what its role asks for (roles.<role>.memory)
    peak_rss_mib: int | None = None  # the highest resident memory seen (task + its children)
    cpu_percent: float | None = None  # CPU of the task's process tree (100 = one core), as it last published
    rss_mib: int | None = None       # resident memory of the task's process tree, as it last published


@dataclass
class AppStatus:
    """Stable, JSON-serialisable status (``tfyarn status --output json``; schema documented in the README)."""
    app_id: str
    backend: str
    name: str
    state: AppState
    diagnostics: str = ""
    tasks: list[TaskStatus] = field(default_factory=list)
    progress: dict[str, Any] = field(default_factory=dict)   # global_step, total_steps, examples_per_sec, loss, eta_s
    started: float | None = None
    finished: float | None = None
    tracking_url: str | None = None
    summary: dict[str, Any] | None = None                   # final run summary, once written
    attempt: int = 0                                         # job attempt (0-based; retry.max_attempts)
    tags: list[str] = field(default_factory=list)            # the spec's tags (schedulers find their apps by them)

    def __post_init__(self) -> None:
        if self.state.is_terminal and "eta_s" in self.progress:   # an ended app has no time left, whatever the
            self.progress = {k: v for k, v in self.progress.items() if k != "eta_s"}  # last progress poll said

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        d["schema"] = "tfyarn.status/1"
        d["exit_code"] = int(self.state.exit_code) if self.state.is_terminal else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], backend: str = "local") -> "AppStatus":
        """The inverse of :meth:`to_dict` (its derived ``schema`` and ``exit_code`` are dropped); ``backend`` is the
        default for records saved before they carried one."""
        return cls(app_id=d["app_id"], backend=d.get("backend", backend), name=d.get("name", ""),
                   state=AppState(d["state"]), diagnostics=d.get("diagnostics", ""),
                   tasks=[TaskStatus(**t) for t in d.get("tasks", [])], progress=d.get("progress") or {},
                   started=d.get("started"), finished=d.get("finished"), tracking_url=d.get("tracking_url"),
                   summary=d.get("summary"), attempt=d.get("attempt", 0), tags=d.get("tags", []))


@dataclass
class Request:
    """What a submit would start (each backend's subclass says how); ``str()``: what ``submit --dry-run`` prints."""
    spec: JobSpec
    attempt: int = 0                # job attempt (0-based): TFYARN_ATTEMPT of the tasks


Echo = Callable[[str, str], None]   # (task, line): a task's log line as it is written


class WaitClock:
    """A follower's own bound (``wait(timeout=…)``, the Airflow trigger's ``timeout``), not the job's deadline:
    running out leaves the app running and says what was waited for. ``expired(state)``: that message, or None."""

    def __init__(self, timeout: float | None, what: str, clock: Callable[[], float] = time.monotonic):
        self.timeout, self.what, self.clock = timeout, what, clock
        self.deadline = None if timeout is None else clock() + timeout

    def expired(self, last_state: AppState) -> str | None:
        if self.deadline is None or self.clock() < self.deadline:
            return None
        return f"timed out after {self.timeout:g}s waiting for {self.what} to finish (last state {last_state.value})"


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
    def run(self, spec: JobSpec, echo: Echo | None = None, on_update: Callable[[AppStatus], None] | None = None,
            timeout: float | None = None) -> AppStatus:
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

    def close(self) -> None:
        """Release what this backend holds (YARN: a private skein driver). Backends are context managers."""

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait(self, app_id: str, timeout: float | None = None, poll: float = 1.0,
             on_update: Callable[[AppStatus], None] | None = None) -> AppStatus:
        """Poll until the app ends; ``on_update`` sees each status (progress display). Bounded by ``timeout``."""
        return self._wait_with(self.follow(app_id), app_id, timeout, poll, on_update)

    def follow(self, app_id: str) -> Callable[[], AppStatus]:
        """One status read per call for a follower (``wait``, the Airflow trigger); a backend whose jobs are
        supervised by their follower (YARN) judges each status there. Local: the launcher supervises its job."""
        return lambda: self.status(app_id)

    def _wait_with(self, step: Callable[[], AppStatus], app_id: str, timeout: float | None, poll: float,
                   on_update: Callable[[AppStatus], None] | None) -> AppStatus:
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
