"""The key-value store tasks use to find each other and report progress.

One interface, two implementations: :class:`HttpKV` talks to the KV service the local launcher runs on 127.0.0.1
(:mod:`tfyarn.backends.local.kvserver`); on YARN the same interface wraps skein's application KV
(``tfyarn.task.yarn.kv_yarn``).
Unlike skein's ``kv.wait``, every wait here has a timeout and its error names the keys still missing.

Values are ``str``; structured values are JSON (:func:`put_json`).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from typing import Any, Iterable

from tfyarn.errors import WaitTimeout


class KVUnavailable(ConnectionError):
    """The KV service cannot be reached: the launcher (or YARN application master) is gone."""


class KV(ABC):
    @abstractmethod
    def get(self, key: str) -> str | None:
        """The value of ``key``, or None when absent."""

    @abstractmethod
    def put(self, key: str, value: str) -> None: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def items(self, prefix: str = "") -> dict[str, str]:
        """Every key starting with ``prefix`` and its value."""

    def wait(self, key: str, timeout: float, what: str | None = None) -> str:
        """Block until ``key`` exists; :class:`WaitTimeout` naming ``what`` (default: the key) after ``timeout`` s."""
        return self.wait_all([key], timeout, what)[key]

    def wait_all(self, keys: Iterable[str], timeout: float, what: str | None = None) -> dict[str, str]:
        """Block until every key exists. The timeout error lists the keys still missing, not just the first."""
        keys = list(keys)
        deadline = time.monotonic() + timeout
        found: dict[str, str] = {}
        delay = 0.02
        while True:
            for k in keys:
                if k not in found:
                    v = self.get(k)
                    if v is not None:
                        found[k] = v
            if len(found) == len(keys):
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise wait_timeout(keys, found, timeout, what)
            time.sleep(min(delay, left))
            delay = min(delay * 1.5, 0.5)


def wait_timeout(keys: list[str], found: dict[str, str], timeout: float, what: str | None) -> WaitTimeout:
    """The error of a wait for ``keys`` that ran out: it names the keys still missing, not just the first."""
    missing = ", ".join(k for k in keys if k not in found)
    return WaitTimeout(f"timed out after {timeout:g}s waiting for {what or 'keys'}: missing {missing}")


def put_json(kv: KV, key: str, value: Any) -> None:
    kv.put(key, json.dumps(value, separators=(",", ":")))


class MemoryKV(KV):
    """In-process KV (tests, a single-task run, a snapshot of another KV's ``items``; the local launcher's KV
    service keeps its keys in one, :class:`tfyarn.backends.local.kvserver.KVStore`). Thread-safe; a put wakes
    whoever waits on its condition."""

    def __init__(self, items: dict[str, str] | None = None) -> None:
        self._d: dict[str, str] = dict(items or {})
        self._cond = threading.Condition()

    def get(self, key: str) -> str | None:
        with self._cond:
            return self._d.get(key)

    def put(self, key: str, value: str) -> None:
        with self._cond:
            self._d[key] = str(value)
            self._cond.notify_all()

    def delete(self, key: str) -> None:
        with self._cond:
            self._d.pop(key, None)

    def items(self, prefix: str = "") -> dict[str, str]:
        with self._cond:
            return {k: v for k, v in self._d.items() if k.startswith(prefix)}


class HttpKV(KV):
    """Client of the launcher's KV service (``GET/PUT/DELETE /kv/<key>``, ``GET /kv?prefix=``); ``wait_all``
    long-polls it (one request, the server blocks)."""

    def __init__(self, url: str, request_timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.request_timeout = request_timeout

    def _req(
        self, method: str, path: str, body: bytes | None = None, timeout: float | None = None
    ) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.request_timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            raise KVUnavailable(f"KV service at {self.url} unreachable: {exc}") from None

    @staticmethod
    def _q(key: str) -> str:
        return urllib.parse.quote(key, safe="")

    def get(self, key: str) -> str | None:
        status, body = self._req("GET", f"/kv/{self._q(key)}")
        return body.decode() if status == 200 else None

    def put(self, key: str, value: str) -> None:
        status, body = self._req("PUT", f"/kv/{self._q(key)}", str(value).encode())
        if status != 204:
            raise KVUnavailable(f"KV put {key!r} failed: HTTP {status} {body[:200]!r}")

    def delete(self, key: str) -> None:
        self._req("DELETE", f"/kv/{self._q(key)}")

    def items(self, prefix: str = "") -> dict[str, str]:
        status, body = self._req("GET", f"/kv?prefix={self._q(prefix)}")
        return json.loads(body) if status == 200 else {}

    def wait_all(self, keys: Iterable[str], timeout: float, what: str | None = None) -> dict[str, str]:
        keys = list(keys)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            poll = max(0.0, min(left, 5.0))
            q = "&".join(f"key={self._q(k)}" for k in keys)
            status, body = self._req("GET", f"/wait?{q}&timeout={poll:.3f}", timeout=poll + self.request_timeout)
            found = json.loads(body) if status == 200 else {}
            if len(found) == len(keys):
                return found
            if time.monotonic() >= deadline:
                raise wait_timeout(keys, found, timeout, what)
