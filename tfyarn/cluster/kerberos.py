"""Kerberos on the gateway: one login, checked before anything is submitted, used by every client tfyarn opens.

The login is the spec's ``kerberos: {principal, keytab}`` (a scheduler's worker usually has a keytab and no ticket
cache), else the user's ticket cache. :func:`login` checks it with one hdfs-native call to the default file system,
so every way it can fail is one clear line and exit 2 before anything is packed, then hands it to
:func:`tfyarn.cluster.hdfs.set_login` (and :func:`driver_options` to the skein driver). Containers never see the keytab:
they use the delegation tokens skein obtains at submit, renewed by the ResourceManager up to their maximum lifetime
(``dfs.namenode.delegation.token.max-lifetime``, 7 days by default: the longest job on a Kerberized cluster).
"""

from __future__ import annotations

import os
import re
import struct
import threading
from pathlib import Path
from typing import Any

from tfyarn.cluster import hdfs, webauth
from tfyarn.cluster._skein import JIT_OPTIONS
from tfyarn.errors import PreflightError
from tfyarn.spec import JobSpec, Kerberos

#: How long the login probe (KDC + NameNode) may take before it is reported as unreachable.
PROBE_TIMEOUT_S = 30.0


def secure(conf: dict[str, str]) -> bool:
    """Whether the cluster's client config says Kerberos (``hadoop.security.authentication``)."""
    return conf.get("hadoop.security.authentication", "simple").strip().lower() == "kerberos"


def resolved(spec: JobSpec | None) -> Kerberos | None:
    """The spec's Kerberos section (its keytab path made absolute when the spec was loaded)."""
    return None if spec is None else spec.kerberos


def from_env() -> Kerberos | None:
    """``TFYARN_KERBEROS_PRINCIPAL`` + ``TFYARN_KERBEROS_KEYTAB``: the login of commands that take an app id, not a
    spec (status, logs, kill of an app submitted elsewhere; on this machine the submitted spec's is used)."""
    p, k = os.environ.get("TFYARN_KERBEROS_PRINCIPAL"), os.environ.get("TFYARN_KERBEROS_KEYTAB")
    return Kerberos(principal=p, keytab=os.path.abspath(k)) if p and k else None


def short_name(principal: str) -> str:
    """``alice@REALM`` → ``alice``; ``svc/host@REALM`` → ``svc`` (the usual auth_to_local default)."""
    return re.split(r"[/@]", principal, maxsplit=1)[0]


# ---------------------------------------------------------------------------------------------------------- keytab


def keytab_principals(path: str | os.PathLike) -> list[str]:
    """The principals a keytab holds (``name/inst@REALM``), read from the MIT keytab format (version 0x502/0x501);
    only names are read, never keys. Raises ``ValueError`` on a file that is not a keytab."""
    data = Path(path).read_bytes()
    if len(data) < 2 or data[0] != 5 or data[1] not in (1, 2):
        raise ValueError("not a Kerberos keytab (bad version header)")
    big = data[1] == 2  # 0x501 stores numbers in host order; every writer today is 0x502
    i16, i32 = (">h", ">i") if big else ("<h", "<i")
    pos, out = 2, []
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from(i32, data, pos)
        pos += 4
        if size <= 0:  # a hole left by a deleted entry
            pos += -size
            continue
        entry, pos = data[pos : pos + size], pos + size
        (n,) = struct.unpack_from(i16, entry, 0)
        if data[1] == 1:
            n -= 1  # 0x501 counts the realm among the components
        off = 2
        parts = []
        for _ in range(n + 1):  # realm, then the components
            (ln,) = struct.unpack_from(i16, entry, off)
            parts.append(entry[off + 2 : off + 2 + ln].decode("utf-8", "replace"))
            off += 2 + ln
        name = "/".join(parts[1:]) + "@" + parts[0]
        if name not in out:
            out.append(name)
    return out


def check_keytab_principal(krb: Kerberos) -> None:
    """The keytab is private and holds ``krb.principal`` (a principal without ``@REALM`` matches any realm)."""
    hdfs.check_keytab(krb.keytab)
    name = Path(krb.keytab).name
    try:
        held = keytab_principals(krb.keytab)
    except (OSError, ValueError, struct.error) as exc:
        raise PreflightError(f"kerberos.keytab: {name} is not a readable keytab ({exc})") from None
    want = krb.principal
    if not any(h == want or ("@" not in want and h.split("@")[0] == want) for h in held):
        raise PreflightError(
            f"kerberos.principal: {want} is not in the keytab {name} (it holds "
            f"{', '.join(held) or 'no principal'}): wrong principal or wrong keytab"
        )


# ----------------------------------------------------------------------------------------------------------- login


def _gss_text(exc: BaseException) -> str:
    """The readable part of hdfs-native's ``GSSAPIError(GssMajorCodes {…}, code, "text")``."""
    s = str(exc)
    m = re.search(r'"([^"]*)"\)\s*$', s)
    return (m.group(1) if m else s).split(": ", 1)[-1] if "GSSAPIError" in s else s


def _probe(url: str, krb: Kerberos | None) -> BaseException | None:
    """One metadata call to the default file system with this login; the exception it raised, if any."""
    from hdfs_native import Client

    result: list[BaseException | None] = []

    def call() -> None:
        try:
            kw: dict[str, Any] = {"kerberos_principal": krb.principal, "kerberos_keytab": krb.keytab} if krb else {}
            Client(url, **kw).get_file_info("/")
            result.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            result.append(exc)

    t = threading.Thread(target=call, name="tfyarn-kerberos-probe", daemon=True)
    t.start()
    t.join(PROBE_TIMEOUT_S)
    if not result:
        return TimeoutError(f"no answer within {PROBE_TIMEOUT_S:.0f}s")
    return result[0]


def check(krb: Kerberos | None, conf: dict[str, str]) -> None:
    """Raise a one-line :class:`PreflightError` when this login cannot reach the cluster (see the module doc)."""
    if krb is not None:
        check_keytab_principal(krb)
    fs = hdfs.default_fs(conf)
    if not secure(conf) or not fs.startswith(("hdfs://", "viewfs://")):
        return
    exc = _probe(fs, krb)
    if exc is None:
        return
    text = _gss_text(exc)
    who = f"as {krb.principal} with its keytab" if krb else "from the ticket cache"
    krb5 = f"KRB5_CONFIG={os.environ['KRB5_CONFIG']}" if os.environ.get("KRB5_CONFIG") else "/etc/krb5.conf"
    if "Cannot contact any KDC" in text or "Cannot find KDC" in text:
        raise PreflightError(f"Kerberos: cannot reach the KDC ({text}); check the realm's kdc entries in {krb5}")
    if isinstance(exc, TimeoutError):
        raise PreflightError(
            f"Kerberos: logging in {who} to {fs} got {text}: is the KDC ({krb5}) or the NameNode down?"
        )
    if "GSSAPIError" not in str(exc):
        return  # not a login problem: preflight's own checks say what it is
    if krb is None and (
        "No Kerberos credentials" in text or "No credentials cache" in text or "not found" in text.lower()
    ):
        raise PreflightError(
            "the cluster is Kerberized (hadoop.security.authentication=kerberos) but there is no "
            "Kerberos ticket and the spec has no kerberos section: run kinit, or add "
            "kerberos: {principal, keytab} to the spec"
        )
    if krb is None and "expired" in text.lower():
        raise PreflightError(f"Kerberos: the ticket in the cache has expired ({text}): run kinit again")
    raise PreflightError(f"Kerberos: logging in {who} failed: {text}")


#: The logins this process has checked (principal, keytab, cluster): a command logs in once, however many backends,
#: preflight calls and ``pack`` ask (each check probes the NameNode over SPNEGO: a KDC round trip).
_CHECKED: set[tuple[str | None, str | None, str]] = set()


def login(krb: Kerberos | None, conf: dict[str, str]) -> Kerberos | None:
    """Check ``krb`` (or the ticket cache on a Kerberized cluster) and make it this process's HDFS login; a login
    already checked in this process is not checked again."""
    key = (krb.principal if krb else None, krb.keytab if krb else None, hdfs.default_fs(conf))
    if (krb is not None or secure(conf)) and key not in _CHECKED:
        check(krb, conf)
        _CHECKED.add(key)
    hdfs.set_login(krb)
    webauth.set_login(krb)  # the same login for SPNEGO to the web endpoints
    return krb


def proxy_refusal(exc: BaseException, user: str | None) -> PreflightError | None:
    """The one-line error for a submission whose proxy user (spec ``user:``) the cluster refuses, else None.

    Hadoop says "User: alice@R is not allowed to impersonate carol" (the ``hadoop.proxyuser.<who>.users|groups|hosts``
    of the cluster's core-site); YARN refuses before the application exists, so nothing was submitted."""
    text = str(exc)
    if not user or "not allowed to impersonate" not in text:
        return None
    line = next((ln.strip() for ln in text.splitlines() if "not allowed to impersonate" in ln), text)
    return PreflightError(
        f"user: {user!r}: the cluster refuses this proxy user ({line}; its core-site "
        "hadoop.proxyuser.<submitter>.users/groups/hosts decide); nothing was submitted"
    )


def driver_options(krb: Kerberos | None) -> dict[str, Any]:
    """skein ``Client`` keyword arguments: the keytab login, and the driver JVM's options: the client JIT
    (:data:`~tfyarn.cluster._skein.JIT_OPTIONS`), ``$SKEIN_DRIVER_JAVA_OPTIONS``, and the krb5.conf (Java ignores
    ``KRB5_CONFIG``, which MIT tools and hdfs-native honour; without it the driver says "Cannot locate KDC")."""
    kw: dict[str, Any] = {"keytab": krb.keytab, "principal": krb.principal} if krb else {}
    conf = os.environ.get("KRB5_CONFIG")
    opts = os.environ.get("SKEIN_DRIVER_JAVA_OPTIONS", "").split()  # skein's own variable: after ours, so it wins
    if conf and not any("java.security.krb5.conf" in o for o in opts):
        opts.append(f"-Djava.security.krb5.conf={conf}")
    kw["java_options"] = [*JIT_OPTIONS, *opts]
    return kw
