"""HDFS and Hadoop configuration access for the gateway and the containers, without a JVM.

Why hdfs-native: TF 2.21 has no ``hdfs://`` filesystem and pyarrow's needs libhdfs.so + a JVM + CLASSPATH on every
node. hdfs-native is a Rust client, registered as fsspec's ``hdfs``/``viewfs`` protocols, that reads HA nameservices
and viewfs mount tables from ``$HADOOP_CONF_DIR`` itself and logs in with Kerberos (the ticket cache, or a keytab:
:func:`set_login`) or the delegation tokens of ``$HADOOP_TOKEN_FILE_LOCATION`` (set by YARN in every container).

This module adds the other Hadoop settings tfyarn reads (defaultFS, the ResourceManager, scheduler limits), qualified
``hdfs:///path`` URLs, and keytab hygiene (a keytab is a password: never logged or shipped, refused world-readable).
"""

from __future__ import annotations

import logging
import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlparse

from tfyarn.errors import PreflightError

log = logging.getLogger(__name__)

CONF_FILES = ("core-site.xml", "hdfs-site.xml", "yarn-site.xml", "capacity-scheduler.xml")


def hadoop_conf_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The Hadoop client config directory: ``explicit``, ``$HADOOP_CONF_DIR``, or ``$HADOOP_HOME/etc/hadoop``."""
    for cand in (
        explicit,
        os.environ.get("HADOOP_CONF_DIR"),
        os.environ.get("HADOOP_HOME") and os.path.join(os.environ["HADOOP_HOME"], "etc", "hadoop"),
    ):
        if cand and Path(cand).is_dir():
            return Path(cand)
    return None


def parse_hadoop_xml(path: str | os.PathLike) -> dict[str, str]:
    """``<configuration><property><name>k</name><value>v</value></property>...`` → {k: v} (no variable expansion)."""
    out: dict[str, str] = {}
    root = ET.parse(path).getroot()
    for prop in root.iter("property"):
        name, value = prop.findtext("name"), prop.findtext("value")
        if name is not None:
            out[name.strip()] = (value or "").strip()
    return out


def load_hadoop_conf(conf_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """Merged key/values of the client config files that exist (later files win, as Hadoop loads them)."""
    d = hadoop_conf_dir(conf_dir)
    conf: dict[str, str] = {}
    if d is None:
        return conf
    for name in CONF_FILES:
        p = d / name
        if p.is_file():
            try:
                conf.update(parse_hadoop_xml(p))
            except ET.ParseError as exc:
                log.warning("ignoring unparsable Hadoop config %s: %s", p, exc)
    return conf


def default_fs(conf: dict[str, str]) -> str:
    return conf.get("fs.defaultFS") or conf.get("fs.default.name") or "file:///"


def qualify(url: str, conf: dict[str, str] | None = None) -> str:
    """``hdfs:///p`` or ``/p`` (on a cluster whose defaultFS is HDFS) → ``hdfs://nameservice/p``: YARN localizes
    resources by fully qualified URL, and skein compares file systems by authority."""
    conf = load_hadoop_conf() if conf is None else conf
    u = urlparse(url)
    dfs = urlparse(default_fs(conf))
    if not u.scheme:
        if dfs.scheme in ("", "file"):
            return "file://" + os.path.abspath(url)
        return f"{dfs.scheme}://{dfs.netloc}{url if url.startswith('/') else '/' + url}"
    if u.scheme in ("hdfs", "viewfs") and not u.netloc and dfs.scheme == u.scheme and dfs.netloc:
        return f"{u.scheme}://{dfs.netloc}{u.path}"
    return url


def filesystems_for_tokens(urls: Iterable[str | None], conf: dict[str, str] | None = None) -> list[str]:
    """Distinct non-default ``hdfs://``/``viewfs://`` authorities among ``urls`` (skein ``file_systems``): skein gets
    a delegation token for the defaultFS only, and data on another namespace needs its own in the containers."""
    conf = load_hadoop_conf() if conf is None else conf
    dfs = urlparse(default_fs(conf))
    seen: list[str] = []
    for url in urls:
        if not url:
            continue
        u = urlparse(qualify(url, conf))
        if u.scheme in ("hdfs", "viewfs") and u.netloc:
            fs = f"{u.scheme}://{u.netloc}"
            if (u.scheme, u.netloc) != (dfs.scheme, dfs.netloc) and fs not in seen:
                seen.append(fs)
    return seen


# ------------------------------------------------------------------------------------------------------------ kerberos

#: This process's Kerberos login (principal + keytab), set on the gateway by :func:`tfyarn.cluster.kerberos.login`:
#: every hdfs-native file system opened afterwards — by :func:`get_fs` or by fsspec itself (``fsspec.open("hdfs://…")``)
#: — logs in with it instead of the ticket cache. None (always so in containers): ticket cache or delegation tokens.
_login: Any = None


def set_login(kerberos: Any) -> None:
    """Make ``kerberos`` (an object with ``principal`` and an absolute ``keytab``; None to undo) the login of every
    hdfs-native file system this process opens from now on, whoever opens it (fsspec's protocol registry)."""
    global _login
    if kerberos is None and _login is None:
        return
    import fsspec
    from hdfs_native.fsspec import HdfsFileSystem, ViewfsFileSystem

    if kerberos is not None:
        check_keytab(kerberos.keytab)
    _login = kerberos
    for proto, base in (("hdfs", HdfsFileSystem), ("viewfs", ViewfsFileSystem)):
        cls: Any = base if kerberos is None else _keytab_class(base)
        cls.clear_instance_cache()
        fsspec.register_implementation(proto, cls, clobber=True)


_KEYTAB_CLASSES: dict[type, type] = {}


def _keytab_class(base: Any) -> type:
    """``base`` whose client logs in with :data:`_login`'s keytab (its own instance cache: never a ticket-cache one)."""
    if base not in _KEYTAB_CLASSES:

        def __init__(self: Any, host: str | None = None, port: int | None = None, *args: Any, **opts: Any) -> None:
            from hdfs_native import Client

            base.__init__(self, host, port, *args, **opts)
            url = f"{self.protocol}://{host or ''}{f':{port}' if host and port else ''}"
            self.client = Client(
                url, dict(opts) or None, kerberos_principal=_login.principal, kerberos_keytab=_login.keytab
            )

        _KEYTAB_CLASSES[base] = type(f"Keytab{base.__name__}", (base,), {"__init__": __init__})
    return _KEYTAB_CLASSES[base]


def check_keytab(path: str | os.PathLike) -> None:
    """Refuse a keytab that is missing, not a regular file, or readable by every user (it is a password)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise PreflightError(f"kerberos.keytab: cannot read the keytab file ({p.name})") from None
    if not stat.S_ISREG(st.st_mode):
        raise PreflightError(f"kerberos.keytab: {p.name} is not a regular file")
    if st.st_mode & stat.S_IROTH:
        raise PreflightError(
            f"kerberos.keytab: {p.name} is world-readable (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run chmod 600 on it — tfyarn refuses to use or ship a world-readable keytab"
        )


# ---------------------------------------------------------------------------------------------------------- fsspec


def get_fs(url: str, conf: dict[str, str] | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for ``url``; ``hdfs://``/``viewfs://`` through hdfs-native, logged in as
    :func:`set_login` said, else with the ticket cache or ``$HADOOP_TOKEN_FILE_LOCATION`` tokens."""
    import fsspec
    import fsspec.core

    if "://" not in url and conf is not None:
        url = qualify(url, conf)
    if urlparse(url).scheme not in ("hdfs", "viewfs"):
        return fsspec.core.url_to_fs(url)
    u = urlparse(qualify(url, conf if conf is not None else load_hadoop_conf()))
    return fsspec.get_filesystem_class(u.scheme)(host=u.hostname, port=u.port), u.path or "/"


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/")] + [p.strip("/") for p in parts])
