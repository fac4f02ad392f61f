"""Client of the fork server (``tfyarn.task.forkserver``): the launcher starts tasks through it, warm.

:meth:`ForkServer.spawn` returns a :class:`ForkedProcess`, which has what the launcher uses of ``subprocess.Popen``.
A forked task is the server's child, not ours: the server reaps it and sends its exit status, which a reader thread
here hands to the matching :class:`ForkedProcess`. If the server dies, its tasks die too (PR_SET_PDEATHSIG); every
unfinished one is SIGKILLed by process group to be sure and completes with -9. Thread-safe.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO

from tfyarn.common import forkserver_protocol as protocol
from tfyarn.common.forkserver_protocol import FD_ENV

log = logging.getLogger(__name__)

#: Seconds to wait for the server's reply to a start request (a fork takes milliseconds).
SPAWN_TIMEOUT_S = 30.0


class ForkServerError(RuntimeError):
    """The fork server could not start, or could not start a task: the launcher starts tasks as processes instead."""


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(deque(f, maxlen=lines)).decode(errors="replace").rstrip("\n") or "(empty)"
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


class ForkedProcess:
    """A task forked by the server, with the part of ``subprocess.Popen``'s interface the launcher uses."""

    def __init__(self, pid: int, stdout: BinaryIO):
        self.pid = pid
        self.stdout = stdout
        self.args = ["forkserver", str(pid)]
        self.returncode: int | None = None
        self._done = threading.Event()

    def _complete(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
            self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)  # (None waits: never here)
        assert self.returncode is not None
        return self.returncode


class _Request:
    def __init__(self, read_fd: int):
        self.read_fd = read_fd
        self.done = threading.Event()
        self.proc: ForkedProcess | None = None
        self.error = ""


class ForkServer:
    """One fork server process: ``start()``, ``wait_ready()``, then ``spawn()`` tasks; ``close()`` at the end."""

    def __init__(self, python: str, env: dict[str, str], log_path: Path, cwd: Path | None = None):
        self.python, self.env, self.log_path, self.cwd = python, dict(env), Path(log_path), cwd
        self.proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._error = ""  # why the server is not usable (set once it is not)
        self._next_id = 0
        self._pending: dict[int, _Request] = {}
        self._procs: dict[int, ForkedProcess] = {}

    def describe(self) -> str:
        pid = self.proc.pid if self.proc else "-"
        return f"forkserver ({self.python} -m tfyarn.task.forkserver, pid {pid}, log {self.log_path})"

    def start(self) -> ForkServer:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(self.env)
        env[FD_ENV] = str(theirs.fileno())
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as logf:
                self.proc = subprocess.Popen(
                    [self.python, "-m", "tfyarn.task.forkserver"],
                    env=env,
                    cwd=self.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self._reader.start()
        return self

    def wait_ready(self, timeout: float, abort: threading.Event | None = None) -> None:
        """Wait until the server has imported everything. Raises :class:`ForkServerError` naming what it waited for,
        with the tail of the server's log, on failure, on timeout, or when ``abort`` is set meanwhile."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if abort is not None and abort.is_set():
                raise ForkServerError(f"stopped while waiting for the {self.describe()} to import TensorFlow")
            if time.monotonic() > deadline:
                raise ForkServerError(
                    f"the {self.describe()} was not ready (importing TensorFlow and tfyarn's task "
                    f"modules) within {timeout:g}s; its log ends with:\n{log_tail(self.log_path)}"
                )
        if self._error:
            raise ForkServerError(
                f"the {self.describe()} failed: {self._error}; its log ends with:\n{log_tail(self.log_path)}"
            )

    @property
    def usable(self) -> bool:
        return self._ready.is_set() and not self._error

    @property
    def error(self) -> str:
        """Why it is not usable ('' while it is)."""
        return f"the {self.describe()}: {self._error}" if self._error else ""

    def spawn(self, env: dict[str, str], cwd: Path) -> ForkedProcess:
        """Fork one task with this environment and cwd; its stdout+stderr is the returned process's ``stdout``."""
        read_fd, write_fd = os.pipe()
        try:
            with self._lock:
                if not self.usable or self._sock is None:
                    raise ForkServerError(f"the {self.describe()} is not usable: {self._error or 'not ready'}")
                self._next_id += 1
                rid = self._next_id
                req = self._pending[rid] = _Request(read_fd)
                try:
                    protocol.send(self._sock, {"id": rid, "env": env, "cwd": str(cwd)}, [write_fd])
                except OSError as exc:
                    del self._pending[rid]
                    raise ForkServerError(f"cannot send a start request to the {self.describe()}: {exc}") from exc
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the task holds the write end now; ours would keep the reader from seeing EOF
        if not req.done.wait(SPAWN_TIMEOUT_S):
            with self._lock:
                if self._pending.pop(rid, None) is not None:
                    os.close(read_fd)
                    self._error = self._error or f"did not answer start request {rid} within {SPAWN_TIMEOUT_S:g}s"
                    raise ForkServerError(
                        f"the {self.describe()} did not answer start request {rid} within {SPAWN_TIMEOUT_S:g}s"
                    )
        if req.proc is None:
            raise ForkServerError(f"the {self.describe()} could not start the task: {req.error}")
        return req.proc

    def _read(self) -> None:
        """The reader thread: the ready message, replies to start requests, exit statuses — until EOF."""
        assert self._sock is not None
        while True:
            try:
                msg, _fds = protocol.recv(self._sock, 1)
            except OSError:
                msg = None
            if msg is None:
                break
            self._handle(msg)
        self._server_gone()

    def _handle(self, msg: dict) -> None:
        with self._lock:
            if "exit" in msg:
                proc = self._procs.pop(msg["exit"], None)
                if proc is not None:
                    proc._complete(int(msg["returncode"]))
            elif "id" in msg:
                req = self._pending.pop(msg["id"], None) if msg["id"] is not None else None
                if "pid" in msg:
                    if req is None:  # nobody waits for it any more (timed out): it must not run untracked
                        killpg(msg["pid"])
                        return
                    req.proc = self._procs[msg["pid"]] = ForkedProcess(msg["pid"], os.fdopen(req.read_fd, "rb"))
                elif req is not None:
                    os.close(req.read_fd)
                    req.error = str(msg.get("error"))
                if req is not None:
                    req.done.set()
            elif "ready" in msg:
                self._ready.set()
            elif "error" in msg:
                self._error = str(msg["error"])
                self._ready.set()

    def _server_gone(self) -> None:
        """EOF: the server exited (or we closed it). Its tasks die with it; complete everything still open."""
        with self._lock:
            if not self._error:
                self._error = "exited" if self._ready.is_set() else "exited before it was ready"
            self._ready.set()
            for req in self._pending.values():
                os.close(req.read_fd)
                req.error = self._error
                req.done.set()
            self._pending.clear()
            procs, self._procs = list(self._procs.values()), {}
        for proc in procs:
            killpg(proc.pid)  # PR_SET_PDEATHSIG has normally done it already
            proc._complete(-signal.SIGKILL)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the server (EOF on its socket; SIGKILL if it does not exit within ``timeout``). Tasks still running
        die with it: close after the tasks were stopped."""
        sock = self._sock
        if sock is not None:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader (EOF) and tells the server to exit
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not exit within %gs of closing its socket; killing it", self.describe(), timeout)
                killpg(self.proc.pid)
                self.proc.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout=timeout)
        if sock is not None:
            sock.close()


def killpg(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group ``pid`` leads; one already gone (or not ours) is left alone."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
