"""HTTP reads of the cluster's web endpoints (ResourceManager REST, NodeManager logs), with SPNEGO when asked.

A secure cluster with ``hadoop.http.authentication.type=kerberos`` answers ``401 Negotiate`` to a plain request.
:func:`urlopen` is ``urllib.request.urlopen`` until that happens, then authenticates with the process's Kerberos
login — the spec's keytab (:func:`set_login`, called by :func:`tfyarn.cluster.kerberos.login`) or else the ticket
cache — through requests-gssapi (the ``kerberos`` extra: it builds python-gssapi against the system's libkrb5, which a
non-secure gateway should not need). No JVM. The ``hadoop.auth`` cookie the server sets is kept per host, so a
``logs -f`` poll costs one Kerberos handshake per host, not one per request.
"""

from __future__ import annotations

import io
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from typing import Any

#: The login SPNEGO uses: an object with ``principal`` and ``keytab``; None: the ticket cache.
_login: Any = None
_lock = threading.Lock()
_sessions: dict[str, Any] = {}  # host:port -> a requests.Session that authenticates (cookie kept)
_creds: dict[tuple[str, str], Any] = {}

INSTALL_HINT = "pip install 'tfyarn[kerberos]' (requests-gssapi; it builds python-gssapi: apt-get install libkrb5-dev)"


class SpnegoUnavailable(OSError):
    """The endpoint wants SPNEGO and this process cannot do it (no library, no Kerberos credentials)."""


def set_login(kerberos: Any) -> None:
    """Make ``kerberos`` (``principal`` + absolute ``keytab``; None: the ticket cache) the SPNEGO login."""
    global _login
    with _lock:
        if kerberos != _login:
            _sessions.clear()
        _login = kerberos


def available() -> bool:
    """Whether SPNEGO can be tried here (requests-gssapi importable)."""
    try:
        import requests_gssapi  # noqa: F401
    except ImportError:
        return False
    return True


def urlopen(req: urllib.request.Request | str, timeout: float) -> Any:
    """``urllib.request.urlopen(req, timeout)``; a ``401 Negotiate`` answer is retried with SPNEGO. Errors are
    urllib's (``HTTPError`` for an HTTP status, ``OSError`` otherwise, :class:`SpnegoUnavailable` included)."""
    if isinstance(req, str):
        req = urllib.request.Request(req)
    host = urllib.parse.urlsplit(req.full_url).netloc
    if host not in _sessions:
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as exc:
            if exc.code != 401 or "negotiate" not in (exc.headers.get("WWW-Authenticate") or "").lower():
                raise
            exc.close()
    return _spnego_open(req, host, timeout)


def _service_host(host: str) -> str:
    """The host part of the ``HTTP/<host>`` principal: an IP literal is named by its reverse lookup (a service
    principal never names an address; 127.0.0.1 -> localhost), a name is used as it is, lower-cased."""
    name = host.rsplit(":", 1)[0].strip("[]")
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in name else socket.AF_INET, name)
    except OSError:
        return name.lower()
    try:
        return socket.gethostbyaddr(name)[0].lower()
    except OSError:
        return name


def _credentials(login: Any) -> Any:
    """Initiator credentials: the keytab's (into a private in-memory cache, the user's ticket cache untouched),
    else None (requests-gssapi then uses the default ticket cache)."""
    if login is None:
        import gssapi

        try:
            _ = gssapi.Credentials(usage="initiate").lifetime  # fails now, not as a bare 401 later
        except gssapi.exceptions.GSSError as exc:
            raise SpnegoUnavailable(
                "the web endpoint asks for Kerberos (SPNEGO) and there is no Kerberos ticket "
                f"({exc.gen_message()}): run kinit, or give the spec a kerberos: section "
                "(or TFYARN_KERBEROS_PRINCIPAL/_KEYTAB)"
            ) from None
        return None
    key = (login.principal, login.keytab)
    if key not in _creds:
        import gssapi

        name = gssapi.Name(login.principal, gssapi.NameType.kerberos_principal)
        store: dict[bytes | str, bytes | str] = {
            "client_keytab": login.keytab,
            "ccache": f"MEMORY:tfyarn-webauth-{id(key)}",
        }
        _creds[key] = gssapi.Credentials(name=name, usage="initiate", store=store)
    return _creds[key]


def _session(host: str) -> Any:
    with _lock:
        if host in _sessions:
            return _sessions[host]
        try:
            import gssapi
            import requests
            from requests_gssapi import OPTIONAL, HTTPSPNEGOAuth
        except ImportError as exc:
            raise SpnegoUnavailable(
                f"http://{host} asks for Kerberos (SPNEGO) and {exc.name} is not installed: {INSTALL_HINT}"
            ) from None
        try:
            creds = _credentials(_login)
        except SpnegoUnavailable:
            raise
        except gssapi.exceptions.GSSError as exc:
            who = f"the keytab of {_login.principal}" if _login else "the ticket cache"
            raise SpnegoUnavailable(
                f"SPNEGO to {host}: no Kerberos credentials from {who}: {exc.gen_message()}"
            ) from None
        target = gssapi.Name(f"HTTP@{_service_host(host)}", gssapi.NameType.hostbased_service)
        s = requests.Session()
        s.auth = HTTPSPNEGOAuth(
            creds=creds, target_name=target, opportunistic_auth=True, mutual_authentication=OPTIONAL
        )
        _sessions[host] = s
        return s


def _spnego_open(req: urllib.request.Request, host: str, timeout: float) -> Any:
    import requests

    s = _session(host)
    try:
        r = s.request(req.get_method(), req.full_url, data=req.data, headers=dict(req.header_items()), timeout=timeout)
    except requests.RequestException as exc:
        raise SpnegoUnavailable(f"SPNEGO to {host}: {exc}") from None
    headers = Message()
    for k, v in r.headers.items():
        headers[k] = v
    if r.status_code >= 400:
        if r.status_code == 401:
            _sessions.pop(host, None)
        raise urllib.error.HTTPError(req.full_url, r.status_code, r.reason or "", headers, io.BytesIO(r.content))
    return _Response(r.content, r.status_code, headers, req.full_url)


class _Response(io.BytesIO):
    """What ``urlopen`` returns, for the parts tfyarn reads: a context manager with ``read``, status, headers."""

    def __init__(self, body: bytes, status: int, headers: Message, url: str):
        super().__init__(body)
        self.status = self.code = status
        self.headers = headers
        self.url = url

    def getcode(self) -> int:
        return self.status
