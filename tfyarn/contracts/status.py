"""What every backend reports and every reader understands: an app's state, its tasks, its status record.

The floor below ``backends/``, ``supervisor`` and the front ends (torchx keeps its ``specs`` below its schedulers the
same way): job control reads these types without importing a backend. ``tfyarn status --output json`` prints
:meth:`AppStatus.to_dict` (schema ``tfyarn.status/1``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable

from tfyarn.errors import ExitCode


class AppState(str, Enum):
    PENDING = "PENDING"  # accepted, tasks not all running yet
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    TIMED_OUT = "TIMED_OUT"  # a tfyarn deadline (rendezvous, stall, active deadline) ended it

    @property
    def is_terminal(self) -> bool:
        return self in (AppState.SUCCEEDED, AppState.FAILED, AppState.KILLED, AppState.TIMED_OUT)

    @property
    def exit_code(self) -> int:
        return {
            AppState.SUCCEEDED: ExitCode.SUCCEEDED,
            AppState.KILLED: ExitCode.KILLED,
            AppState.TIMED_OUT: ExitCode.TIMED_OUT,
        }.get(self, ExitCode.FAILED)


@dataclass
class TaskStatus:
    task: str  # 'worker:1'
    state: str  # PENDING | RUNNING | SUCCEEDED | FAILED | KILLED
    host: str | None = None
    restarts: int = 0
    exit_code: int | None = None
    diagnostics: str = ""
    log: str | None = None  # local path or URL of the task's log
    memory_mib: int | None = None  # what its role asks for (roles.<role>.memory)
    peak_rss_mib: int | None = None  # the highest resident memory seen (task + its children)
    cpu_percent: float | None = None  # CPU of the task's process tree (100 = one core), as it last published
    rss_mib: int | None = None  # resident memory of the task's process tree, as it last published


@dataclass
class AppStatus:
    """Stable, JSON-serialisable status (``tfyarn status --output json``; schema: docs/commands.md)."""

    app_id: str
    backend: str
    name: str
    state: AppState
    diagnostics: str = ""
    tasks: list[TaskStatus] = field(default_factory=list)
    progress: dict[str, Any] = field(default_factory=dict)  # global_step, total_steps, examples_per_sec, loss, eta_s
    started: float | None = None
    finished: float | None = None
    tracking_url: str | None = None
    summary: dict[str, Any] | None = None  # final run summary, once written
    attempt: int = 0  # job attempt (0-based; retry.max_attempts)
    tags: list[str] = field(default_factory=list)  # the spec's tags (schedulers find their apps by them)
    # why each task restart or job attempt happened, oldest first: {task, kind (restart|attempt), then, free,
    # class, cause, words, rule} — rule: which triage rule decided, in words (contracts.triage)
    causes: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.state.is_terminal and "eta_s" in self.progress:  # an ended app has no time left, whatever the
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
        return cls(
            app_id=d["app_id"],
            backend=d.get("backend", backend),
            name=d.get("name", ""),
            state=AppState(d["state"]),
            diagnostics=d.get("diagnostics", ""),
            tasks=[TaskStatus(**t) for t in d.get("tasks", [])],
            progress=d.get("progress") or {},
            started=d.get("started"),
            finished=d.get("finished"),
            tracking_url=d.get("tracking_url"),
            summary=d.get("summary"),
            attempt=d.get("attempt", 0),
            tags=d.get("tags", []),
            causes=d.get("causes", []),
        )


Echo = Callable[[str, str], None]  # (task, line): a task's log line as it is written


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
