"""The KV service the local launcher runs on 127.0.0.1 for rendezvous and progress (stdlib only, no server to install).

Protocol (what :class:`tfyarn.tasklib.kv.HttpKV` speaks):
  GET    /kv/<key>            200 value | 404
  PUT    /kv/<key>            204
  DELETE /kv/<key>            204
  GET    /kv?prefix=<p>       200 JSON {key: value}
  GET    /wait?key=a&key=b&timeout=<s>   200 JSON of the keys present when all are, or when the timeout ends
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tfyarn.tasklib.kv import MemoryKV


class KVStore(MemoryKV):
    """The service's store: tfyarn's in-process KV, whose condition also wakes the long-polling ``/wait`` requests."""

    def clear(self) -> None:
        """Forget everything (a new job attempt rendezvous afresh)."""
        with self._cond:
            self._d.clear()

    def long_poll(self, keys: list[str], timeout: float) -> dict[str, str]:
        """The keys present once all are, or once ``timeout`` s have passed (``GET /wait``)."""
        with self._cond:
            self._cond.wait_for(lambda: all(k in self._d for k in keys), timeout=max(0.0, timeout))
            return {k: self._d[k] for k in keys if k in self._d}


class _Handler(BaseHTTPRequestHandler):
    server: "KVServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep the launcher's output clean
        pass

    def _send(self, code: int, body: bytes = b"", ctype: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _parse(self) -> tuple[str, dict[str, list[str]]]:
        u = urllib.parse.urlsplit(self.path)
        return u.path, urllib.parse.parse_qs(u.query, keep_blank_values=True)

    def do_GET(self) -> None:
        path, q = self._parse()
        store = self.server.store
        if path.startswith("/kv/"):
            v = store.get(urllib.parse.unquote(path[4:]))
            self._send(404) if v is None else self._send(200, v.encode())
        elif path == "/kv":
            self._send(200, json.dumps(store.items(q.get("prefix", [""])[0])).encode(), "application/json")
        elif path == "/wait":
            found = store.long_poll(q.get("key", []), float(q.get("timeout", ["0"])[0]))
            self._send(200, json.dumps(found).encode(), "application/json")
        else:
            self._send(404)

    def do_PUT(self) -> None:
        path, _ = self._parse()
        if not path.startswith("/kv/"):
            return self._send(404)
        n = int(self.headers.get("Content-Length", "0"))
        self.server.store.put(urllib.parse.unquote(path[4:]), self.rfile.read(n).decode())
        self._send(204)

    def do_DELETE(self) -> None:
        path, _ = self._parse()
        if path.startswith("/kv/"):
            self.server.store.delete(urllib.parse.unquote(path[4:]))
        self._send(204)


class KVServer(ThreadingHTTPServer):
    """``with KVServer() as s: s.url`` — serves in a daemon thread on an ephemeral loopback port."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _Handler)
        self.store = KVStore()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> "KVServer":
        self._thread = threading.Thread(
            target=self.serve_forever, name="tfyarn-kv", daemon=True, kwargs={"poll_interval": 0.2}
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def __enter__(self) -> "KVServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
