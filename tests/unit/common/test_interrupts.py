"""Stop signals as one exception (``interruptible``) and ignored during clean-up (``ignoring_stop_signals``)."""
import os
import signal
import threading

import pytest

from tfyarn.common.interrupts import SIGNALS, Interrupted, ignoring_stop_signals, interruptible


def _handlers():
    return {sig: signal.getsignal(sig) for sig in SIGNALS}


def test_interruptible_raises_on_sigterm_and_restores_the_handlers():
    before = _handlers()
    with pytest.raises(Interrupted) as err:
        with interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):           # the handler runs between bytecodes of the main thread
                pass
    assert err.value.signame == "SIGTERM" and err.value.exit_code == 143
    assert _handlers() == before


def test_keyboard_interrupt_inside_becomes_interrupted_sigint():
    with pytest.raises(Interrupted) as err:
        with interruptible():
            raise KeyboardInterrupt
    assert err.value.exit_code == 130


def test_ignoring_stop_signals_ignores_them_then_restores_the_previous_handlers():
    seen = []
    old = signal.signal(signal.SIGHUP, lambda s, f: seen.append(s))
    try:
        before = _handlers()
        with ignoring_stop_signals():
            assert all(signal.getsignal(s) is signal.SIG_IGN for s in SIGNALS)
            os.kill(os.getpid(), signal.SIGHUP)      # ignored: no handler call, no exit
            os.kill(os.getpid(), signal.SIGTERM)
        assert seen == []
        assert _handlers() == before
        os.kill(os.getpid(), signal.SIGHUP)          # the previous handler is back
        for _ in range(1000):
            pass
        assert seen == [signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, old)


def test_off_the_main_thread_both_do_nothing():
    out = []

    def body():
        with interruptible(), ignoring_stop_signals():
            out.append(signal.getsignal(signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=body)
    t.start()
    t.join(5)
    assert out == [before]
