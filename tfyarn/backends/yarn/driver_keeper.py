"""``python -m tfyarn.backends.yarn.driver_keeper keep ARGS_JSON``: the keeper of tfyarn's shared skein driver.

Started by :func:`tfyarn.backends.yarn.driver.acquire` in a session of its own: it starts the JVM with skein's own
code (stdin a pipe: the JVM exits when the keeper dies, even by SIGKILL), records its address and stops it once no
command has used it for the idle time (see :mod:`tfyarn.backends.yarn.driver` for the files it shares with them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tfyarn.backends.yarn.driver import Record, _Files, _start_time
from tfyarn.cluster._skein import skein


class _Stop(Exception):
    pass


def _on_signal(signum: int, _frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def keep(args: dict[str, Any]) -> int:
    """The keeper process: start the JVM, record it, stop it when idle (or on SIGTERM/SIGINT/SIGHUP)."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)
    files = _Files(Path(args["dir"]), args["key"])
    idle = float(args["idle"])
    proc = None
    try:
        sk = skein()
        from skein.core import _start_driver  # skein's own start: security, `yarn classpath`, callback port

        address, proc = _start_driver(security=sk.Security.from_default(), log=str(files.jvm_log), **args["kw"])
        ident = args["ident"]
        me = os.getpid()
        files.write(
            Record(
                key=files.key,
                address=address,
                jvm_pid=proc.pid,
                keeper_pid=me,
                keeper_started=_start_time(me) or "",
                user=ident["user"],
                principal=ident["principal"],
                hadoop_conf_dir=ident["hadoop_conf_dir"],
                idle_s=idle,
                started=time.time(),
                log=str(files.log),
            )
        )
        files.mark_used()
        sys.stdout.write(f"ready {address}\n")
        sys.stdout.flush()
        os.close(1)
        poll = max(0.2, min(5.0, idle / 4))
        while proc.poll() is None:
            time.sleep(poll)
            if files.live_leases() or time.time() - files.last_used() < idle:
                continue
            with files.locked():  # no command takes it while we decide
                if not files.live_leases() and time.time() - files.last_used() >= idle:
                    files.remove_record(me)
                    print(f"{time.strftime('%F %T')} idle for {idle:g}s: stopping the driver", file=sys.stderr)
                    break
        else:
            print(f"{time.strftime('%F %T')} the driver JVM exited ({proc.returncode})", file=sys.stderr)
    except _Stop as exc:
        print(f"{time.strftime('%F %T')} {exc}: stopping the driver", file=sys.stderr)
    finally:
        files.remove_record(os.getpid())
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # skein's driver exits when its stdin closes
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "keep":
        sys.exit(keep(json.loads(sys.argv[2])))
    sys.exit("usage: python -m tfyarn.backends.yarn.driver_keeper keep ARGS_JSON (started by tfyarn itself)")
