"""tfyarn.train.stop_notice: SIGTERM sets a flag the chief's loop reads between steps; the save and the exit as
SIGTERM's own; the backstop when the loop never gets there. Real signals, in child processes (no TF)."""
import os
import signal
import subprocess
import sys
import textwrap

import tfyarn

ROOT = os.path.dirname(os.path.dirname(tfyarn.__file__))


def _child(body: str, timeout: float = 30) -> subprocess.CompletedProcess:
    code = textwrap.dedent("""
        import logging, os, signal, sys, time
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        from tfyarn.train.stop_notice import StopNotice
        notice = StopNotice("chief:0", backstop_s=1.0).install()
        assert notice.installed and not notice.pending
        """) + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


def test_sigterm_is_a_flag_then_the_save_and_an_exit_as_sigterm():
    r = _child("""
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):          # a step loop: the handler only flags
            if notice.pending:
                break
            time.sleep(0.01)
        print("flagged", flush=True)
        notice.save_and_exit(lambda: {"name": "ckpt-7"}, 7)
        print("not reached", flush=True)
        """)
    assert r.returncode == -signal.SIGTERM, (r.returncode, r.stderr[-2000:])
    assert "flagged" in r.stdout and "not reached" not in r.stdout
    assert "chief:0: SIGTERM (a preemption or a stop) at global step 7: checkpoint ckpt-7 committed" in r.stderr


def test_a_failed_save_is_said_and_the_task_still_ends():
    r = _child("""
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        def save():
            raise ConnectionError("ps:0 is gone")
        notice.save_and_exit(save, 9)
        """)
    assert r.returncode == -signal.SIGTERM, r.stderr[-2000:]
    assert "at global step 9: no checkpoint saved (ConnectionError: ps:0 is gone)" in r.stderr


def test_a_loop_that_never_reaches_the_check_is_ended_by_the_backstop():
    r = _child("""
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(20)                # a step that never returns
        print("not reached", flush=True)
        """)
    assert r.returncode == 128 + signal.SIGTERM, (r.returncode, r.stderr[-2000:])
    assert "SIGTERM 1s ago and the step loop did not reach the checkpoint" in r.stderr and not r.stdout
