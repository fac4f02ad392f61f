"""The fork server's wire protocol, one module for both ends: the launcher's client
(``backends/local/forkserver.py``) and the warm server (``task/forkserver.py``) import it, neither imports the other.

An ``AF_UNIX`` ``SOCK_SEQPACKET`` socketpair keeps message boundaries, so one ``recvmsg`` is one message with its fds.
Messages are JSON objects:

* server → client, once: ``{"ready": true, "pid": …}`` after the preload, or ``{"error": "…"}`` and exit 1;
* client → server: ``{"id": n, "env": {…}, "cwd": "…"}`` + (SCM_RIGHTS) the write end of the task's output pipe;
* server → client: ``{"id": n, "pid": …}`` or ``{"id": n, "error": "…"}``;
* server → client: ``{"exit": pid, "returncode": rc}`` when a task ended (Popen's convention: ``-N`` for signal N).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Sequence

#: Environment variable holding the fd number of the server's end of the control socket.
FD_ENV = "TFYARN_FORKSERVER_FD"
#: Largest message (a task's environment as JSON); a larger one is refused, and the launcher starts that task as a new
#: process instead.
MAX_MESSAGE = 1 << 20


class MessageTooLarge(OSError):
    """A message over :data:`MAX_MESSAGE` bytes: not sent, or (received) truncated and its fds closed."""


def send(sock: socket.socket, msg: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(msg).encode()
    if len(data) > MAX_MESSAGE:
        raise MessageTooLarge(f"message of {len(data)} bytes is larger than {MAX_MESSAGE}")
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the fds passed with it; ``None`` at EOF (the other end closed or died)."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, max_fds)
    if not data:
        return None, fds
    if flags & socket.MSG_TRUNC:
        for fd in fds:
            os.close(fd)
        raise MessageTooLarge(f"message larger than {MAX_MESSAGE} bytes")
    return json.loads(data), fds
