"""The local launcher's fork server: imports TensorFlow and tfyarn's task modules once, then forks every task of the
app from that warm state (milliseconds instead of ~3 s of imports each, the imported pages shared copy-on-write).

Not ``multiprocessing``'s forkserver: a task needs its own environment (its identity is in it) and cwd, its output in
a pipe the launcher reads, its own session (the launcher stops it with ``killpg``), a ``Popen``-like exit status and a
parent-death chain launcher → forkserver → task (``kill -9`` of the launcher leaves no process). The contract, and
what a forked task does not share with a spawned one: docs/ARCHITECTURE.md; the messages:
:mod:`tfyarn.common.forkserver_protocol`. It is started with the tasks' common environment (TF reads some of it, as
``TF_CPP_MIN_LOG_LEVEL``, at import). Single-threaded on purpose: ``fork()`` copies only the calling thread, and a lock
another thread held at that moment would stay locked forever in the child.
"""

from __future__ import annotations

import importlib
import logging
import os
import select
import signal
import socket
import sys
import time
import traceback
from contextlib import suppress
from typing import Any, NoReturn

from tfyarn.common.forkserver_protocol import FD_ENV, MessageTooLarge, recv
from tfyarn.common.forkserver_protocol import send as _send

#: Modules every task imports; importing them here is what makes a forked task start warm.
PRELOAD = (
    "tfyarn.task.main",
    "tfyarn.task.rendezvous",
    "tfyarn.train",
    "tfyarn.train.helpers",
    "tfyarn.train.ps",
    "tfyarn.train.allreduce",
    "tfyarn.train.checkpoint",
    "tfyarn.data",
)
POLL_S = 0.05  # how often the loop reaps children and checks its parent (exit statuses arrive within this)

# Signal dispositions of a freshly started interpreter (before any import can change them): a task gets these back.
_STARTUP_SIGNALS = {
    s: signal.getsignal(s)
    for s in signal.valid_signals()
    if s not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(s) is not None
}

#: Handlers TensorFlow gave its logger at import because the root logger had none (``tf_logging.get_logger``). A
#: spawned task configures logging before it imports TF, which then adds none: a forked task drops them, or every TF
#: message would be printed twice.
_IMPORT_HANDLERS: list[logging.Handler] = []


def _log(msg: str) -> None:
    """A line in forkserver.log (its stdout), timestamped like the tasks' log lines."""
    now = time.time()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))},{int(now % 1 * 1000):03d} forkserver: {msg}",
        flush=True,
    )


def preload() -> None:
    """Import TensorFlow (when installed; Keras only if the job's model code uses it, see
    :mod:`tfyarn.task.warm_imports`) and the tfyarn modules tasks import. Logging is left unconfigured: a task's
    ``logging.basicConfig`` would be a no-op if the root logger already had handlers."""
    from tfyarn.task import warm_imports

    tf_logger = logging.getLogger("tensorflow")
    before = list(tf_logger.handlers)
    if warm_imports.import_tensorflow():
        module = warm_imports.model_module(os.environ.get("TFYARN_SPEC_FILE"))
        try:
            keras = warm_imports.code_uses_keras(module, os.environ.get("TFYARN_CODE_DIR")) if module else False
        except Exception as exc:  # noqa: BLE001 - reading the job's code is an optimisation; tasks import on use
            _log(f"could not read model module {module!r} ({type(exc).__name__}: {exc}); Keras not preloaded")
            keras = False
        if keras:
            warm_imports.import_keras()
        _log(
            f"model module {module!r} {'uses' if keras else 'does not use'} Keras: "
            f"{'imported' if keras else 'not imported'}"
        )
    for name in PRELOAD:
        importlib.import_module(name)
    _IMPORT_HANDLERS[:] = [h for h in tf_logger.handlers if h not in before]


def _task_name(env: dict) -> str:
    return f"{env.get('TFYARN_ROLE', '?')}:{env.get('TFYARN_INDEX', '?')}"


def _become_task(req: dict, out_fd: int, server_pid: int) -> None:
    """In the forked child: the process state a task spawned by ``subprocess.Popen`` would have."""
    os.setsid()  # own session and process group: the launcher stops a task (and its children) with killpg
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    old_cwd = os.getcwd()
    os.chdir(req["cwd"])
    if sys.path and sys.path[0] == old_cwd:  # `python -m` puts the start directory first on sys.path
        sys.path[0] = os.getcwd()
    sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")]
    os.environ.clear()
    os.environ.update(req["env"])
    os.environ["TFYARN_PARENT_PID"] = str(server_pid)  # its parent is this server: launcher → forkserver → task
    if "tempfile" in sys.modules:  # it caches the temp dir it found first (the server's): look again, in this env
        tempfile_module: Any = sys.modules["tempfile"]
        tempfile_module.tempdir = None
    for sig, startup in _STARTUP_SIGNALS.items():
        with suppress(OSError, ValueError):
            signal.signal(sig, startup)
    for handler in _IMPORT_HANDLERS:
        logging.getLogger("tensorflow").removeHandler(handler)
    if "numpy" in sys.modules:  # `random` reseeds itself after fork; numpy's global RNG would repeat the server's
        sys.modules["numpy"].random.seed()
    from tfyarn.task.main import prctl

    prctl(15, _task_name(req["env"]).encode()[:15])  # PR_SET_NAME: `comm` names the task (its cmdline is ours)


def _finalize() -> None:
    """What the interpreter does at exit before a spawned task's process ends: join non-daemon threads, run atexit."""
    import atexit
    import threading

    vars(threading)["_shutdown"]()  # what Py_FinalizeEx calls (private: not in typeshed)
    atexit._run_exitfuncs()


def _run_child(sock: socket.socket, req: dict, out_fd: int, server_pid: int) -> NoReturn:
    """Run one task in the forked child and exit with its code. Never returns into the server's loop."""
    code = 1
    try:
        sock.close()
        _become_task(req, out_fd, server_pid)
        from tfyarn.task.main import main

        code = int(main())
        try:
            _finalize()
        except BaseException:  # noqa: BLE001 - the task's result stands
            traceback.print_exc()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - anything: print it, exit non-zero, never return to the server loop
        with suppress(BaseException):
            traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(BaseException):  # nothing may keep the child from exiting
                stream.flush()
        os._exit(code)


def _start(sock: socket.socket, req: dict, fds: list[int]) -> None:
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        _send(sock, {"id": req.get("id"), "error": f"expected 1 fd (the task's output pipe), got {len(fds)}"})
        return
    server_pid = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered here may be written again by the child
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(fds[0])
        _send(sock, {"id": req.get("id"), "error": f"fork failed: {exc}"})
        return
    if pid == 0:
        _run_child(sock, req, fds[0], server_pid)
    os.close(fds[0])  # only the task holds the pipe's write end: the launcher's reader sees EOF when the task ends
    _log(f"started {_task_name(req.get('env', {}))} as pid {pid}")
    _send(sock, {"id": req.get("id"), "pid": pid})


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        rc = os.waitstatus_to_exitcode(status)
        _log(f"pid {pid} exited with {rc}")
        _send(sock, {"exit": pid, "returncode": rc})


def serve(sock: socket.socket, parent_pid: int) -> int:
    """Start tasks on request and report their exits until EOF on the socket or the parent's death."""
    while True:
        if os.getppid() != parent_pid:  # PR_SET_PDEATHSIG normally got here first
            _log("the launcher died; exiting")
            return 3
        _reap(sock)
        ready, _, _ = select.select([sock], [], [], POLL_S)
        if not ready:
            continue
        try:
            msg, fds = recv(sock, 8)
        except MessageTooLarge as exc:
            _send(sock, {"id": None, "error": f"request refused: {exc}"})
            continue
        if msg is None:
            _log("control socket closed; exiting")
            return 0
        _start(sock, msg, fds)


def main() -> int:
    sock = socket.socket(fileno=int(os.environ.pop(FD_ENV)))
    parent_pid = int(os.environ["TFYARN_PARENT_PID"])
    from tfyarn.task.main import set_parent_death_signal  # part of the preload anyway

    set_parent_death_signal()
    if os.getppid() != parent_pid:
        return 3
    _log(f"pid {os.getpid()} importing TensorFlow and tfyarn's task modules")
    started = time.monotonic()
    try:
        preload()
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which starts tasks as processes instead
        traceback.print_exc()
        _send(sock, {"error": f"preload failed: {type(exc).__name__}: {exc}"})
        return 1
    _log(f"pid {os.getpid()} ready (imports took {time.monotonic() - started:.2f}s)")
    _send(sock, {"ready": True, "pid": os.getpid()})
    try:
        return serve(sock, parent_pid)
    except (BrokenPipeError, ConnectionResetError):
        _log("the launcher went away; exiting")
        return 0


if __name__ == "__main__":
    sys.exit(main())
