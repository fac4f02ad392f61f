"""The chief's checkpoint on a stop notice (SIGTERM), so at most the steps since then are lost.

Why: YARN takes a container away (preemption, an app killed) with SIGTERM, then SIGKILL after
``yarn.nodemanager.sleep-delay-before-sigkill.ms`` (250 ms by default); the local launcher the same
with a 5 s grace. Python's default for SIGTERM dies on the spot, losing every step since the last
periodic checkpoint. The handler only sets a flag (nothing is safe to do inside it: the main thread
may be in the middle of a session run); the chief's step loop checks it between steps, saves at
once, logs it, and ends as SIGTERM would have (exit -15 / 143, so triage still reads "killed from
outside"). A step that never returns (a peer gone in a lockstep round) cannot save: a backstop
timer then ends the task as before, :data:`BACKSTOP_S` after the signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any, Callable

log = logging.getLogger("tfyarn.train")

#: Seconds after the SIGTERM at which the task ends even if its step loop never got to the save.
BACKSTOP_S = float(os.environ.get("TFYARN_STOP_BACKSTOP_S") or 10.0)


class StopNotice:
    """A SIGTERM seen by the chief: :attr:`pending` between steps, then :meth:`save_and_exit`."""

    def __init__(self, task_id: str, backstop_s: float = BACKSTOP_S):
        self.task_id, self.backstop_s = task_id, backstop_s
        self.received: float | None = None  # time.monotonic() of the signal
        self.installed = False

    def install(self) -> StopNotice:
        """Catch SIGTERM (main thread only: elsewhere, and for a non-default handler already set,
        nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return self
        signal.signal(signal.SIGTERM, self._handler)
        self.installed = True
        return self

    @property
    def pending(self) -> bool:
        return self.received is not None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is not None:  # a second SIGTERM: no more waiting
            self.exit()
        self.received = time.monotonic()
        backstop = threading.Timer(self.backstop_s, self._backstop)
        backstop.daemon = True
        backstop.start()

    def _backstop(self) -> None:
        """A timer thread's: Python runs signal handlers in the main thread only, which may be stuck
        in a session run, so the process ends here with SIGTERM's shell exit code."""
        log.warning(
            "%s: SIGTERM %.0fs ago and the step loop did not reach the checkpoint; exiting",
            self.task_id,
            self.backstop_s,
        )
        _flush()
        os._exit(128 + signal.SIGTERM)

    def save_and_exit(self, save: Callable[[], Any], global_step: int) -> None:
        """Save a checkpoint of ``global_step`` now (``save`` returns its index entry, None when
        this step was already saved), log it, and end the task as the SIGTERM would have."""
        assert self.received is not None
        t0 = time.monotonic()
        try:
            entry = save()
        except BaseException as exc:  # noqa: BLE001 - it ends anyway: say why nothing was saved
            log.warning(
                "%s: SIGTERM (a preemption or a stop) at global step %d: no checkpoint saved (%s: %s)",
                self.task_id,
                global_step,
                type(exc).__name__,
                exc,
            )
        else:
            what = entry.get("name") if isinstance(entry, dict) else None
            log.warning(
                "%s: SIGTERM (a preemption or a stop) at global step %d: %s %.2fs after the signal "
                "(saved in %.2fs); exiting",
                self.task_id,
                global_step,
                (f"checkpoint {what} committed" if what else "this step's checkpoint was already saved"),
                time.monotonic() - self.received,
                time.monotonic() - t0,
            )
        self.exit()

    def exit(self) -> None:
        """End the process as an unhandled SIGTERM does (main thread)."""
        _flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal is delivered at once; never returns
        os._exit(128 + signal.SIGTERM)


def _flush() -> None:
    for h in logging.getLogger().handlers + log.handlers:
        with contextlib.suppress(Exception):  # best effort before dying
            h.flush()


def chief_notice(ctx: Any, saves: bool) -> StopNotice | None:
    """The chief's notice when it saves checkpoints (``saves``), else None."""
    if not (ctx.is_chief and saves):
        return None
    notice = StopNotice(ctx.task_id).install()
    return notice if notice.installed else None
