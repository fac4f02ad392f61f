"""Entrypoint (``module:function``) programs of the failure tests: one raises, one stops making progress."""
import time

import tfyarn


def bad_flag():
    """Fails like a user's script with a wrong argument: the exception's last line is the job's diagnosis."""
    import sys
    raise ValueError(f"unknown flag {sys.argv[1:]}")


def stalls():
    """Reports two steps, then hangs silently (no progress, no output) on the chief; other tasks wait for it."""
    for step in (1, 2):
        tfyarn.progress(step=step, loss=1.0)
    time.sleep(3600)


def chatty():
    """Never calls tfyarn.progress; prints for 30 s, longer than the test's watchdog allowance: its log output is
    its heartbeat."""
    for i in range(60):
        print(f"working {i}", flush=True)
        time.sleep(0.5)
