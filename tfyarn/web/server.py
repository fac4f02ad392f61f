"""A small HTTP server for the job's page: ``/`` the page, ``/status.json`` the ``tfyarn.status/1``
document, ``/history.json?since=T`` progress points (loss, examples/s over time), ``/log?task=T``
the tail of a task's log.

Why stdlib ``http.server``: four routes, a handful of requests a minute when someone looks, none
when nobody does; a framework would be a dependency of every gateway and container for that. The
callables it is given are only called when a request comes, so a page nobody opens costs its
thread's idle loop (~0 CPU)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from tfyarn.web.page import PAGE

log = logging.getLogger(__name__)

#: Most points one ``/history.json`` answer carries: more are thinned evenly (the charts are
#: ~500 px wide; a long job's 5000 points took 80-250 ms to send on a loaded box, 2000 stay well
#: under 200 ms).
MAX_POINTS = 2000
#: Bytes of a task's log the ``/log`` route returns (its end).
LOG_TAIL_BYTES = 256 * 1024

StatusFn = Callable[[], dict[str, Any]]
PointsFn = Callable[[], list[dict[str, Any]]]
LogFn = Callable[[str], "str | None"]


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        page = self.server.page
        try:
            route = url.path.rstrip("/").rsplit("/", 1)[-1] or "index.html"
            if route == "index.html":
                self._send(200, PAGE.encode(), "text/html; charset=utf-8")
            elif route == "status.json":
                self._json(page.status())
            elif route == "history.json":
                since = float((query.get("since") or ["0"])[0] or 0)
                self._json({"points": page.points_since(since)})
            elif route == "log":
                task = (query.get("task") or [""])[0]
                text = page.log(task) if page.log is not None and task else None
                if text is None:
                    self._send(404, f"no log of {task!r} here\n".encode(), "text/plain; charset=utf-8")
                else:
                    self._send(200, text.encode(errors="replace"), "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:
            log.debug("page request %s failed", self.path, exc_info=True)
            self._send(500, f"{type(exc).__name__}: {exc}\n".encode(), "text/plain; charset=utf-8")

    def _json(self, doc: Any) -> None:
        self._send(200, json.dumps(doc, default=str, separators=(",", ":")).encode(), "application/json")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("page: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    page: "StatusPage"


class StatusPage:
    """The page of one job, served from a daemon thread until :meth:`close`.

    ``status``: the ``tfyarn.status/1`` dict now (``AppStatus.to_dict()``); ``points``: the progress
    points so far (each with ``task`` and ``time``); ``log``: a task's log text or None. ``host`` is
    where it listens (``""``: every interface, for a page another machine proxies); ``advertise``:
    the host name in :attr:`url`."""

    def __init__(
        self,
        status: StatusFn,
        points: PointsFn | None = None,
        log: LogFn | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
    ):
        self.status, self._points, self.log = status, points, log
        self.host, self.port, self.advertise = host, port, advertise
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "StatusPage":
        srv = _Server((self.host, self.port), _Handler)
        srv.page = self
        self._server, self.port = srv, srv.server_address[1]
        self._thread = threading.Thread(
            target=srv.serve_forever, kwargs={"poll_interval": 0.5}, name="tfyarn-page", daemon=True
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        host = self.advertise or (self.host if self.host not in ("", "0.0.0.0") else "127.0.0.1")
        return f"http://{host}:{self.port}/"

    def points_since(self, since: float) -> list[dict[str, Any]]:
        pts = self._points() if self._points is not None else []
        new = [p for p in pts if float(p.get("time") or 0) > since]
        if len(new) > MAX_POINTS:  # every k-th, and the newest (the page continues from its time)
            k = -(-len(new) // MAX_POINTS)
            new = new[-1::-k][::-1]
        return new

    def close(self) -> None:
        srv, self._server = self._server, None
        if srv is not None:
            srv.shutdown()
            srv.server_close()

    def __enter__(self) -> "StatusPage":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def file_tail(path: str, limit: int = LOG_TAIL_BYTES) -> str | None:
    """The last ``limit`` bytes of a local file as text (None: no such file): a local task's
    ``/log``."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None
