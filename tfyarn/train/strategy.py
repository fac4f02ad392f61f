"""Starting allreduce's MultiWorkerMirroredStrategy, bounded, with SIGTERM still ending the task: what allreduce mode
and a custom loop's ``helpers.strategy()`` share (a module of its own: the allreduce loop imports the helpers)."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
from typing import Any

from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.context import ABORT_KEY, TaskContext, failure_key
from tfyarn.tasklib.watchdog import dump_stacks

log = logging.getLogger("tfyarn.train.allreduce")


def make_strategy(step_timeout_s: float) -> Any:
    """MWMS from TF_CONFIG (set by the runtime), with collective ops bounded by ``timeouts.step``.

    Creating it starts TF's coordination service, whose preemption notifier installs a C++ SIGTERM handler that only
    records the signal (measured: a stopped job's tasks trained on until SIGKILL). Python cannot see that handler
    (``signal.getsignal`` still reports the old one), so the old disposition is set again unconditionally.
    """
    import tensorflow as tf

    opts = tf.distribute.experimental.CommunicationOptions(timeout_seconds=float(step_timeout_s))
    main = threading.current_thread() is threading.main_thread()  # signal.signal works only there
    before = signal.getsignal(signal.SIGTERM) if main else None
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=opts)
    if main:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
    return strategy


#: Seconds past a bounded wait's timeout after which faulthandler's C thread dumps every thread's stack and exits
#: the task (code 1). It needs no GIL: MultiWorkerMirroredStrategy start-up holds the GIL while it waits for its peers
#: (measured: no Python thread ran during the whole wait), so the Python timer of :class:`_Bounded` cannot fire then.
GIL_FREE_BACKSTOP_S = 10.0


class _Bounded:
    """Fail the task (stack dump, ``failure/<task>``, exit 4) if a blocking call that TF cannot time out overruns;
    if that call holds the GIL, faulthandler ends the task :data:`GIL_FREE_BACKSTOP_S` later (stacks, exit 1)."""

    def __init__(self, ctx: TaskContext, what: str, timeout: float):
        self.ctx, self.what, self.timeout = ctx, what, timeout
        self.timer = threading.Timer(timeout, self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        msg = f"{self.ctx.task_id}: timed out after {self.timeout:g}s waiting for {self.what}"
        log.error("%s", msg)
        dump_stacks(msg)
        try:
            self.ctx.kv.put(failure_key(self.ctx.task_id), msg)
        finally:
            os._exit(int(WaitTimeout.exit_code))

    def __enter__(self) -> "_Bounded":
        log.info(
            "%s: waiting up to %gs for %s (then: stacks in this log and the task fails; if the wait holds the "
            "GIL, faulthandler's 'Timeout' dump and exit %gs later)",
            self.ctx.task_id,
            self.timeout,
            self.what,
            GIL_FREE_BACKSTOP_S,
        )
        self.timer.start()
        faulthandler.dump_traceback_later(self.timeout + GIL_FREE_BACKSTOP_S, exit=True)
        return self

    def __exit__(self, *exc) -> None:
        faulthandler.cancel_dump_traceback_later()
        self.timer.cancel()


def start_strategy(ctx: TaskContext) -> Any:
    """:func:`make_strategy` with its start-up bounded by ``timeouts.rendezvous`` (:class:`_Bounded`), then a check
    for a stop whose SIGTERM TF's notifier swallowed during that start-up."""
    with _Bounded(ctx, "MultiWorkerMirroredStrategy start-up (all workers connecting)", ctx.spec.timeouts.rendezvous):
        strategy = make_strategy(ctx.spec.timeouts.step)
    check_abort(ctx)
    return strategy


def check_abort(ctx: TaskContext) -> None:
    reason = ctx.kv.get(ABORT_KEY)
    if reason is not None:
        raise RuntimeError(f"{ctx.task_id}: job aborted: {reason}")
