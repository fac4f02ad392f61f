"""Following one app to its end: the poll loop of ``wait`` and of each attempt of ``run``.

Why one loop: both backends follow an app the same way — read its status, show it, stop at its end
or at the follower's own bound (:class:`~tfyarn.contracts.status.WaitClock`), pause, read again.
What differs is behind three hooks of the backend: ``follow(app_id, sup)`` (one judged status read
per call: YARN applies the job's rules there and ends the app for a verdict), ``pause(app_id, s)``
(YARN ends an app whose tasks are all done meanwhile) and ``followed(st)`` (what the backend keeps of
an app this process followed to its end: YARN's run report).
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

from tfyarn.contracts.status import AppStatus, WaitClock
from tfyarn.errors import WaitTimeout
from tfyarn.supervisor import Supervisor


class Followable(Protocol):
    """What :func:`follow_to_end` needs of a backend (:class:`tfyarn.backends.base.Backend` has it)."""

    name: str

    def follow(self, app_id: str, sup: Supervisor | None = None) -> Callable[[], AppStatus]: ...

    def pause(self, app_id: str, seconds: float) -> None: ...

    def followed(self, st: AppStatus) -> None: ...


def poll_to_end(
    step: Callable[[], AppStatus],
    what: str,
    timeout: float | None = None,
    poll: float = 1.0,
    on_update: Callable[[AppStatus], None] | None = None,
    pause: Callable[[float], None] | None = None,
) -> AppStatus:
    """Call ``step`` until the status it returns has ended; ``on_update`` sees each status.
    :class:`WaitTimeout` (naming ``what``) after ``timeout`` s; ``pause(poll)`` between two reads
    (default: a sleep)."""
    clock = WaitClock(timeout, what)
    while True:
        st = step()
        if on_update:
            on_update(st)
        if st.state.is_terminal:
            return st
        expired = clock.expired(st.state)
        if expired:
            raise WaitTimeout(expired)
        (pause or time.sleep)(poll)


def follow_to_end(
    backend: Followable,
    app_id: str,
    sup: Supervisor | None = None,
    timeout: float | None = None,
    poll: float = 1.0,
    on_update: Callable[[AppStatus], None] | None = None,
) -> AppStatus:
    """Follow ``app_id`` through the backend's hooks to its end, then ``backend.followed(st)``.
    ``sup``: the run's supervisor (None: the backend's own for the app, if it keeps one)."""
    st = poll_to_end(
        backend.follow(app_id, sup),
        f"{backend.name} app {app_id}",
        timeout,
        poll,
        on_update,
        lambda s: backend.pause(app_id, s),
    )
    backend.followed(st)  # after a kill for a stall too: where it stalled is what its report shows
    return st


def wait(
    backend: Followable,
    app_id: str,
    timeout: float | None = None,
    poll: float = 1.0,
    on_update: Callable[[AppStatus], None] | None = None,
) -> AppStatus:
    """Follow an app this process did not start (``tfyarn wait``, the Airflow operator) to its end.
    ``timeout`` bounds this wait only (:class:`WaitTimeout`; the app runs on)."""
    return follow_to_end(backend, app_id, None, timeout, poll, on_update)
