"""HDFS faults that pass: retried where tfyarn reads data and writes job files, said in one line
when they do not.

Why: on a shared cluster a DataNode restarts, a NameNode fails over, a socket resets. hdfs-native
raises these as ``RuntimeError('DataTransferError("All DataNodes failed: [DatanodeInfoProto
{...}]")')`` (a kilobyte of debug text) and does not retry by itself: every reader failed at once
and a checkpoint upload during a 20 s DataNode restart killed the chief. Here a transient fault is
retried with backoff for up to :func:`retry_window` seconds (a reader reopens the file at the same
offset, so the NameNode hands out the block's locations again: another replica, or the restarted
DataNode); then :class:`HdfsUnavailable` says which file, at which offset, and why, in one line."""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

#: hdfs-native error kinds (``Kind("detail")`` in the RuntimeError's text) that a DataNode, a NameNode failover or
#: the network explain, so that trying again later may work. Not: FileNotFound, AlreadyExists, InvalidPath,
#: SASL/GSSAPI (credentials), Unsupported* (these say the same on every try).
TRANSIENT_KINDS = frozenset(
    {
        "DataTransferError",
        "OperationFailed",
        "IOError",
        "BlocksNotFound",
        "ChecksumError",
        "InvalidRPCResponse",
        "FatalRPCError",
        "InternalError",
        "RPCError",
    }
)
#: Python exceptions that are about the path or the caller, never about the cluster's health.
PERMANENT = (
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    ValueError,
    TypeError,
)
_NET_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTDOWN})
_KIND = re.compile(r"^\s*([A-Za-z]+)\((.*)\)\s*$", re.DOTALL)
_NODE = re.compile(r'ip_addr: \\?"([^"\\]+)\\?".*?xfer_port: (\d+)', re.DOTALL)
ENV_WINDOW = "TFYARN_HDFS_RETRY_S"
DEFAULT_WINDOW_S = 120.0
MAX_LINE = 240


class HdfsUnavailable(OSError):
    """A file-system operation still failed after retrying for the whole window: one line (file,
    offset, cause). An OSError, so callers that handle I/O errors handle it; triage classes it as
    infrastructure."""

    def __init__(self, what: str, path: str, cause: BaseException, offset: int | None = None, tried_s: float = 0):
        where = f"{path} at byte {offset:,}" if offset is not None else path
        self.path, self.offset, self.cause = path, offset, one_line(cause)
        super().__init__(f"HDFS unavailable: {what} {where} failed for {tried_s:.0f}s: {self.cause}")


def retry_window() -> float:
    """Seconds a transient fault is retried: ``$TFYARN_HDFS_RETRY_S``, else 120 (a DataNode restart
    takes 20-60 s)."""
    try:
        return max(0.0, float(os.environ.get(ENV_WINDOW, DEFAULT_WINDOW_S)))
    except ValueError:
        return DEFAULT_WINDOW_S


def error_kind(exc: BaseException) -> str:
    """hdfs-native's kind of ``exc`` (``DataTransferError``...), else the exception's class name."""
    m = _KIND.match(str(exc)) if type(exc) is RuntimeError else None
    return m.group(1) if m else type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """May the same call work later? hdfs-native's transient kinds, connection resets and timeouts;
    not a missing file, a permission, a bad argument or credentials."""
    if isinstance(exc, (HdfsUnavailable, *PERMANENT)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if type(exc) is RuntimeError:
        return error_kind(exc) in TRANSIENT_KINDS
    return isinstance(exc, OSError) and exc.errno in _NET_ERRNOS


def one_line(exc: BaseException) -> str:
    """``exc`` as one short line: hdfs-native's ``Kind("detail")`` with the DataNode dump reduced to
    host:port."""
    text = str(exc)
    m = _KIND.match(text) if type(exc) is RuntimeError else None
    if m:
        kind, detail = m.group(1), m.group(2).strip().strip('"')
        nodes = sorted({f"{h}:{p}" for h, p in _NODE.findall(detail)})
        detail = re.split(r":?\s*\[|\s*\{", detail, maxsplit=1)[0].strip().rstrip(":")
        text = f"{kind}: {detail}" + (f" ({', '.join(nodes)})" if nodes else "")
    else:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."


def retry(
    call: Callable[[], T],
    what: str,
    path: str,
    *,
    window_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``; a transient fault is retried (0.5 s backoff doubling to 8 s) until ``window_s``
    (default :func:`retry_window`) has passed, then raised as :class:`HdfsUnavailable`. A permanent
    error is raised as is."""
    window = retry_window() if window_s is None else window_s
    t0, pause, tries = clock(), 0.5, 0
    while True:
        try:
            return call()
        except Exception as exc:
            tries += 1
            spent = clock() - t0
            if not is_transient(exc):
                raise
            if spent + pause > window:
                raise HdfsUnavailable(what, path, exc, tried_s=spent) from exc
            log.warning("%s %s failed (%s); retry %d in %.1fs", what, path, one_line(exc), tries, pause)
            sleep(pause)
            pause = min(pause * 2, 8.0)


class ReopeningReader(io.RawIOBase):
    """A read-only file that survives DataNode faults: a transient read error closes the file,
    reopens it with ``opener`` and seeks back to the same offset (the NameNode then names the
    block's live replicas), for up to the retry window; then :class:`HdfsUnavailable` names the file
    and the offset."""

    def __init__(
        self,
        opener: Callable[[], Any],
        path: str,
        window_s: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self._open, self.path, self._window = opener, path, window_s
        self._sleep, self._clock = sleep, clock
        self._pos = 0
        self._f: Any = retry(opener, "open", path, window_s=window_s, sleep=sleep, clock=clock)
        self.reopened = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._f.seek(offset, whence)  # hdfs-native's seek returns None: ask where it is
        self._pos = self._f.tell()
        return self._pos

    def _reopened(self) -> Any:
        with contextlib.suppress(Exception):  # the broken stream's close may fail too: it is replaced anyway
            self._f.close()

        def again() -> Any:
            f = self._open()
            f.seek(self._pos)
            return f

        self._f = again()
        self.reopened += 1
        return self._f

    def read(self, size: int = -1) -> bytes:
        t0, pause, first = self._clock(), 0.5, None
        window = retry_window() if self._window is None else self._window
        while True:
            try:
                data = self._f.read(size) if first is None else self._reopened().read(size)
                self._pos += len(data)
                return data
            except Exception as exc:
                spent = self._clock() - t0
                if not is_transient(exc):
                    raise
                if spent + pause > window:
                    raise HdfsUnavailable("read", self.path, exc, offset=self._pos, tried_s=spent) from exc
                if first is None:
                    first = exc
                    log.warning("read of %s at byte %d failed (%s); reopening", self.path, self._pos, one_line(exc))
                self._sleep(pause)
                pause = min(pause * 2, 8.0)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        if not self.closed:
            try:
                self._f.close()
            finally:
                super().close()


def needs_retry(url: str) -> bool:
    """Is ``url`` on HDFS (the file systems whose faults :class:`ReopeningReader` and :func:`retry`
    handle)?"""
    return url.startswith(("hdfs://", "viewfs://"))


def open_read(url: str) -> Any:
    """``fsspec.open(url, "rb")``'s file, reopened at the same offset after a transient fault when
    on HDFS."""
    import fsspec

    if not needs_retry(url):
        return fsspec.open(url, "rb").open()
    return ReopeningReader(lambda: fsspec.open(url, "rb").open(), url)
