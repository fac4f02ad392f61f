"""SIGINT, SIGTERM and SIGHUP as one exception while a client follows a job.

Why: a scheduler cancels a task with SIGTERM (Airflow, Oozie, a shell's ``timeout``), a user with Ctrl-C, a closed
terminal with SIGHUP. Python's default for SIGTERM/SIGHUP is to die on the spot, so ``tfyarn run --yarn`` would leave
its YARN application running, unowned. Inside :func:`interruptible` each of them raises :class:`Interrupted` where the
main thread is, so the caller decides: ``run`` kills the application it started, ``wait`` stops waiting and says how
to follow or kill the app it did not start.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """A stop signal arrived; ``signame`` says which (``SIGINT`` for Ctrl-C)."""

    def __init__(self, signame: str):
        super().__init__(f"interrupted by {signame}")
        self.signame = signame

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process ended by it (130 for Ctrl-C)."""
        return 128 + int(signal.Signals[self.signame])


@contextmanager
def _handlers(handler: Any) -> Iterator[None]:
    """Install ``handler`` for every stop signal inside the block, and put the previous ones back after it. Off the
    main thread (signals are delivered to the main thread only) nothing is installed.

    A previous handler of ``None`` was set outside Python (an embedding, a C library); it is restored as
    ``SIG_DFL``, the closest Python can express."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


@contextmanager
def interruptible() -> Iterator[None]:
    """Raise :class:`Interrupted` on SIGINT/SIGTERM/SIGHUP inside the block (main thread only), and turn a
    KeyboardInterrupt raised there (an earlier default SIGINT handler) into ``Interrupted("SIGINT")`` too."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    with _handlers(handler):
        try:
            yield
        except KeyboardInterrupt:
            raise Interrupted("SIGINT") from None


@contextmanager
def ignoring_stop_signals() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM/SIGHUP inside the block (main thread only): clean-up that must not be cut half way, such
    as killing the application a stopped ``run`` started (a second Ctrl-C must not leave it half done)."""
    with _handlers(signal.SIG_IGN):
        yield


@contextmanager
def deferring_stop_signals() -> Iterator[list[str]]:
    """Hold SIGINT/SIGTERM/SIGHUP back inside the block (main thread only) and say which arrived (the yielded list):
    for a call that must not be cut half way but whose result the caller needs even when stopped — a submit whose
    application may exist once the call returns, which a stopped ``run`` must then kill."""
    arrived: list[str] = []

    def handler(signum: int, _frame: object) -> None:
        arrived.append(signal.Signals(signum).name)

    with _handlers(handler):
        yield arrived
