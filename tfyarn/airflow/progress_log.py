"""Progress of a tfyarn app as lines in an Airflow task log, at a bounded rate (shared by operator and trigger)."""

from __future__ import annotations

from typing import Any, Callable

from tfyarn.contracts.status import AppStatus
from tfyarn.display import LineView


class _LogWriter:
    """A text stream that sends each written line to a logger (so :class:`LineView` can feed an Airflow log)."""

    def __init__(self, log: Any):
        self.log = log

    def write(self, text: str) -> None:
        for line in text.splitlines():
            if line.strip():
                self.log.info("%s", line)

    def flush(self) -> None:
        pass


def progress_logger(log: Any, every: float) -> Callable[[AppStatus], None]:
    """An ``on_update`` callable: a progress line every ``every`` s, and at once on any job or task state change
    (marked ``tfyarn``, not timestamped: Airflow stamps each log record)."""
    return LineView(_LogWriter(log), every=every, stamp=lambda: "tfyarn")
