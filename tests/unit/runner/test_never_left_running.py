"""Never leave an app running (tfyarn/runner/owned.py): whatever leaves a run's block before its
app ended ends the app, once, with stop signals ignored meanwhile; a stop is answered with the app's
status, an error propagates."""

import os
import signal

import pytest

from tfyarn.runner.owned import never_left_running
from tfyarn.backends.yarn.submit import SubmittedThenInterrupted
from tfyarn.contracts.status import AppState, AppStatus
from tfyarn.common.interrupts import Interrupted


class Ender:
    def __init__(self, fail: bool = False):
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def __call__(self, app_id: str, exc: BaseException) -> AppStatus:
        os.kill(
            os.getpid(), signal.SIGINT
        )  # ignored while the end runs: no Interrupted out of here
        self.calls.append((app_id, repr(exc)))
        if self.fail:
            raise ConnectionError("RM unreachable")
        return AppStatus(
            app_id, "test", "job", AppState.KILLED, diagnostics=f"{exc}: killed {app_id}"
        )


def test_a_run_that_ends_normally_ends_nothing():
    end = Ender()
    with never_left_running(end) as owned:
        owned.own("app_1")
    assert end.calls == [] and owned.stopped is None


def test_an_error_while_following_ends_the_app_and_propagates():
    end = Ender()
    with pytest.raises(RuntimeError, match="follow broke"):
        with never_left_running(end) as owned:
            owned.own("app_1")
            raise RuntimeError("follow broke")
    assert end.calls == [("app_1", "RuntimeError('follow broke')")]


def test_a_stop_signal_ends_the_app_and_the_block_returns_its_status():
    end, before = Ender(), signal.getsignal(signal.SIGTERM)
    with never_left_running(end) as owned:
        owned.own("app_2")
        os.kill(
            os.getpid(), signal.SIGTERM
        )  # raises Interrupted in this (main) thread, inside the block
        raise AssertionError("the signal did not interrupt the block")
    assert [c[0] for c in end.calls] == ["app_2"] and "SIGTERM" in end.calls[0][1]
    assert owned.stopped is not None and owned.stopped.state is AppState.KILLED
    assert signal.getsignal(signal.SIGTERM) is before  # the run's handlers are gone with its block


def test_a_stop_during_the_submit_ends_the_app_the_submit_named():
    end = Ender()
    with never_left_running(end) as owned:
        raise SubmittedThenInterrupted("SIGINT", "app_3")
    assert [c[0] for c in end.calls] == ["app_3"] and owned.stopped is not None


def test_a_stop_before_anything_was_started_propagates_with_nothing_to_end():
    end = Ender()
    with pytest.raises(Interrupted):
        with never_left_running(end):
            raise Interrupted("SIGINT")
    assert end.calls == []


def test_an_end_that_fails_keeps_the_original_error():
    end = Ender(fail=True)
    with pytest.raises(Interrupted) as info:
        with never_left_running(end) as owned:
            owned.own("app_4")
            raise Interrupted("SIGHUP")
    assert isinstance(info.value.__cause__, ConnectionError) and end.calls[0][0] == "app_4"
