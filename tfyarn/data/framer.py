"""Record framing in a child process, so the training process runs no per-record Python.

Used when the C loops (:mod:`tfyarn.data.native`) are not built, or when asked for (``framing="process"``); with
them the reader thread frames (see :mod:`feeder`). Why: without them framing is ~0.8 us of Python per record holding
the GIL, which in a feeder thread made a small model's fed step slower than an in-graph ``tf.data`` step (measured:
1.7 vs 1.4 ms per 1000-record step, 2 cores). In a child process it runs on another core; the feeder thread only
receives ready lists of payloads (unpickled in C).

Why not ``multiprocessing.Process``: ``spawn`` re-imports the caller's ``__main__`` (a training script without a
``__main__`` guard would recurse) and ``fork`` is unsafe in a process running TensorFlow. The child is a plain
``python -c '... child_main ...' FD`` talking pickled messages over a socketpair; it never imports TensorFlow.

Protocol (one job in flight at a time; each job's stream ends with exactly one ``end`` or ``error``)::

    parent → child   ("frame", job, [FrameJob...], opts)   ("cancel", job)   ("exit",)
    child → parent   ("ready",)   ("chunk", job, range_index, payloads, first, offsets, skipped)
                     ("end", job)   ("error", job, exception)

Backpressure is the socket buffer: the child blocks in ``send`` while the parent does not read, so at most one chunk
plus one read block (``block_bytes``) are held in the child. It exits on ``exit``, on EOF (the parent is gone) or when
its parent process changes.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Iterator, Mapping

from tfyarn.data.errors import DataError
from tfyarn.data.fileindex import FileInfo
from tfyarn.data.tfrecord import Chunk, FrameOptions, iter_chunks

log = logging.getLogger(__name__)

#: Seconds the parent waits for a cancelled job's stream to end before it kills the child (and starts a new one
#: on next use): a child blocked in a slow read must not hold the feeder's ``close()`` for long.
CANCEL_TIMEOUT_S = 5.0
_POLL_S = 0.1
#: Socket buffer asked for on both ends: a chunk (2048 records of ~90 pickled bytes) fits several times over, so the
#: child keeps framing while the parent reads instead of the two taking turns (the kernel may cap it lower).
_SOCKET_BUFFER = 4 << 20
#: The child's command (``-c``, not ``-m tfyarn.data.framer``: ``-m`` would import this module twice, once through
#: the ``tfyarn.data`` package and once as ``__main__``).
_CHILD = (
    "import sys; sys.path.append(sys.argv[3]); from tfyarn.data.framer import child_main; "
    "sys.exit(child_main(int(sys.argv[1]), int(sys.argv[2])))"
)


@dataclass(frozen=True)
class FrameJob:
    """One record range of one file, with a known record boundary at or before ``start`` (manifest index)."""

    path: str
    start: int
    stop: int
    offset: int
    first: int
    gz: bool
    holes: Mapping[int, int] | None = None

    @classmethod
    def of(cls, fi: FileInfo, start: int, stop: int) -> "FrameJob":
        """Records ``[start, stop)`` of an indexed file, from the nearest boundary its index knows."""
        off, first = fi.boundary(start)
        return cls(fi.path, start, stop, off, first, fi.gz, dict(fi.holes) or None)

    def chunks(self, opts: FrameOptions) -> Iterator[Chunk]:
        """The range's records framed by :func:`tfrecord.iter_chunks` with the feeder's ``opts``."""
        return iter_chunks(
            self.path,
            self.start,
            self.stop,
            offset=self.offset,
            first_record=self.first,
            gz=self.gz,
            holes=self.holes,
            opts=opts,
        )


def _send(conn: Connection, msg: tuple) -> None:
    """Pickle without the memo (``fast``): a chunk is a flat list of distinct bytes objects, and memoizing each one
    costs about as much as pickling it (measured 0.027 vs 0.050 us per record)."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, pickle.HIGHEST_PROTOCOL)
    p.fast = True
    p.dump(msg)
    conn.send_bytes(buf.getbuffer())


def _recv(conn: Connection) -> tuple:
    return pickle.loads(conn.recv_bytes())


def _widen(sock: socket.socket) -> socket.socket:
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)
        except OSError:
            pass
    return sock


class FramerDied(RuntimeError):
    """The framing process exited unexpectedly (killed, out of memory, crashed)."""


def protocol_shared(path: str) -> bool:
    """Can a fresh child process open ``path`` the way this process does?

    Not fsspec's ``memory://`` (it exists only in this process), nor a protocol this process registered at run time
    (``fsspec.register_implementation`` with a class): a new interpreter knows only fsspec's built-in protocols and
    those packages declare as entry points (hdfs-native's ``hdfs``, s3fs, gcsfs...).
    """
    from fsspec.core import split_protocol
    from fsspec.registry import known_implementations

    protocol = split_protocol(path)[0] or "file"
    return protocol != "memory" and protocol in known_implementations


class Framer:
    """A child process running :func:`tfyarn.data.tfrecord.iter_chunks` for the ranges it is sent, reused every
    epoch. One caller at a time (the feeder's reader thread); :meth:`close` may be called from any thread.
    """

    def __init__(self, opts: FrameOptions):
        self.opts = opts  # iter_chunks' framing options
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._job = 0
        self._ready = False  # the current child sent "ready" (its imports are done)
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the current child has used so far (Linux ``/proc``; 0 without a child): the
        part of a feeder's input cost that the training process's own CPU time does not show (benchmarks)."""
        pid = self.pid
        if pid is None:
            return 0.0
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        """Start the child now, without waiting for its start-up (~0.2 s; idempotent)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> None:
        if not self._has_child():
            self._forget()
            self._start()

    def _has_child(self) -> bool:
        """A child is started and has not exited (call with the lock held)."""
        return self._conn is not None and self._alive()

    def running(self) -> bool:
        """Is a child running (started or starting)? Safe from any thread: it does not touch the connection."""
        with self._lock:
            return self._has_child()

    def ready(self) -> bool:
        """Is a child running and done starting? Never waits; only from the thread that calls :meth:`chunks` (it
        reads the connection)."""
        with self._lock:
            if self._ready:
                return self._alive()
            if not self._has_child():
                return False
            conn = self._conn
            assert conn is not None
            try:
                if conn.poll(0):  # before any job, the only message a child sends is "ready"
                    self._ready = _recv(conn)[0] == "ready"
            except (EOFError, OSError):
                return False
            return self._ready

    def _start(self) -> None:
        parent_sock, child_sock = (_widen(s) for s in socket.socketpair())
        # tfyarn importable in the child however we were started: its root is *appended* to sys.path there (not put
        # in PYTHONPATH, which would place a site-packages dir ahead of the standard library)
        root = str(Path(__file__).resolve().parents[2])
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(child_sock.fileno()), str(os.getpid()), root],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        finally:
            child_sock.close()
        conn = Connection(parent_sock.detach())
        self._proc, self._conn, self._ready = proc, conn, False
        self._finalizer = weakref.finalize(self, _shutdown, proc, conn)

    def chunks(self, jobs: list[FrameJob], check: Callable[[], None]) -> Iterator[tuple[int, Chunk]]:
        """Yield ``(index of the job, chunk)`` for every chunk of ``jobs`` in order.

        ``check`` is called while waiting (at least every 0.1 s) and may raise to abandon the wait (the feeder's
        stop flag). Leaving the generator early (break, exception) cancels the rest of the job in the child.
        """
        with self._lock:
            self._ensure_started()
            conn = self._conn
            assert conn is not None
            self._job += 1
            job = self._job
        _send(conn, ("frame", job, jobs, self.opts))
        ended = False
        try:
            while True:
                msg = self._recv(conn, check)
                kind = msg[0]
                if kind == "ready" or msg[1] != job:
                    continue
                if kind == "chunk":
                    _, _, index, payloads, first, offsets, skipped = msg
                    yield index, Chunk(payloads, first, offsets, skipped)
                elif kind == "end":
                    ended = True
                    return
                elif kind == "error":
                    ended = True
                    raise msg[2]
        finally:
            if not ended and self._conn is conn:  # (not after the child died: nothing left to cancel)
                self._cancel(conn, job)

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _recv(self, conn: Connection, check: Callable[[], None]) -> tuple:
        while True:
            check()
            try:
                if conn.poll(_POLL_S):
                    return _recv(conn)
            except (EOFError, OSError):
                pass
            else:
                if self._alive():
                    continue
            code = None
            if self._proc is not None:
                try:
                    code = self._proc.wait(timeout=1.0)  # EOF can be seen just before the exit is reapable
                except subprocess.TimeoutExpired:
                    pass
            self.close()
            raise FramerDied(
                f"the record framing process (tfyarn.data.framer) ended unexpectedly, exit code {code} "
                f"(killed? out of memory? its output is in this task's log)"
            )

    def _cancel(self, conn: Connection, job: int) -> None:
        """Stop the child's work on ``job`` and read its stream to the end, so the next job starts clean."""
        deadline = time.monotonic() + CANCEL_TIMEOUT_S
        try:
            _send(conn, ("cancel", job))
            while time.monotonic() < deadline:
                if conn.poll(_POLL_S):
                    msg = _recv(conn)
                    if msg[0] in ("end", "error") and msg[1] == job:
                        return
        except (EOFError, OSError):
            pass
        log.warning(
            "the record framing process did not stop within %gs (blocked in a read?); restarting it", CANCEL_TIMEOUT_S
        )
        self.close()

    def close(self) -> None:
        """Stop the child (idempotent); the next :meth:`chunks` starts a new one."""
        with self._lock:
            self._forget()

    def _forget(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # asks the child to exit, kills it after 2 s, reaps it, closes the socket
        self._proc = self._conn = self._finalizer = None
        self._ready = False


def _shutdown(proc: subprocess.Popen, conn: Connection) -> None:
    try:
        _send(conn, ("exit",))
    except (OSError, ValueError):
        pass
    conn.close()
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------------------------------ child


class _Cancelled(Exception):
    pass


def _frame(conn: Connection, job: int, jobs: list[FrameJob], opts: FrameOptions) -> None:
    for index, j in enumerate(jobs):
        for chunk in j.chunks(opts):
            while conn.poll():
                msg = _recv(conn)
                if msg[0] == "exit":
                    raise SystemExit(0)
                if msg[0] == "cancel" and msg[1] == job:
                    raise _Cancelled
            _send(conn, ("chunk", job, index, chunk.payloads, chunk.first, chunk.offsets, chunk.skipped))


def _picklable(exc: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else a DataError carrying its message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any unpicklable exception is reported by its text
        return DataError(f"{type(exc).__name__}: {exc}")


def child_main(fd: int, parent_pid: int) -> int:
    # Ctrl-C in a terminal reaches the whole process group: the parent handles it (and closes us), we must not die
    # mid-chunk with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        _send(conn, ("ready",))
    except OSError:  # the parent closed before we were up (its feeder finished without us)
        return 0
    while True:
        try:
            while not conn.poll(1.0):
                if os.getppid() != parent_pid:
                    return 0
            msg = _recv(conn)
        except (EOFError, OSError):
            return 0
        if msg[0] == "exit":
            return 0
        if msg[0] != "frame":
            continue  # a cancel that arrived after its job had ended
        _, job, jobs, opts = msg
        try:
            _frame(conn, job, jobs, opts)
            _send(conn, ("end", job))
        except _Cancelled:
            _send(conn, ("end", job))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return 0
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the feeder, which reports it
            try:
                _send(conn, ("error", job, _picklable(exc)))
            except OSError:
                return 0  # nobody left to report to
