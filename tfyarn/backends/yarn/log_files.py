"""Container logs on YARN, during and after the run, on Hadoop 3.3 too.

Not ``skein.Client.application_logs``: it looks in ``<remote-app-log-dir>/<user>/logs/<appId>``, but Hadoop 3.3
aggregates into a bucketed layout (:func:`aggregated_log_dirs`), so skein found nothing and retried for ~45 s.
Running containers' logs come from the NodeManager web API; a finished app's are read from HDFS (no JVM) when
they are plain TFile (:func:`parse_tfile_logs`), else from ``yarn logs -applicationId``. Each task container's log
starts with :data:`tfyarn.backends.yarn.appspec.LOG_HEADER`, which maps a container id back to ``worker:1``.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from tfyarn.cluster import hdfs, webauth

log = logging.getLogger(__name__)

_APP_RE = re.compile(r"^application_(\d+)_(\d+)$")
_CONTAINER_RE = re.compile(rb"container_(?:e\d+_)?\d+_\d+_\d+_\d+")
_ENTRY_RE = re.compile(rb"\x00([\x01-\xff])([A-Za-z0-9_.\-]{1,255})\x00([\x01-\x14])(\d{1,20})")
_HEADER_RE = re.compile(r"\[tfyarn\] container (\S+)_(\d+) yarn=(\S+)")
#: A task's log link (``TaskStatus.log``): ``host:port/node/containerlogs/<container id>/<user>``.
NM_LOG_RE = _NM_LOG_RE = re.compile(r"^(?:https?://)?([^/]+)/node/containerlogs/(container_[0-9_e]+)")
#: Files YARN writes around a container that are not the task's output (shown only when asked for all files).
HOUSEKEEPING_FILES = frozenset(
    {"directory.info", "launch_container.sh", "prelaunch.err", "prelaunch.out", "container-localizer-syslog"}
)


@dataclass
class ContainerLog:
    container_id: str  # YARN container id
    files: dict[str, str] = field(default_factory=dict)

    @property
    def task(self) -> str:
        """'worker:1' from the tfyarn header, 'master' for the application master, else the container id."""
        for text in self.files.values():
            m = _HEADER_RE.search(text[:4096])
            if m:
                return f"{m.group(1)}:{m.group(2)}"
        if self.container_id.endswith("_000001"):
            return "master"
        return self.container_id


# ------------------------------------------------------------------------------------------- aggregated log layout


def bucket(app_id: str) -> str:
    """Hadoop 3.3's bucket dir for ``app_id``: sequence number mod 10000, 4 digits (``…_0012`` → ``0012``)."""
    m = _APP_RE.match(app_id)
    if not m:
        raise ValueError(f"not a YARN application id: {app_id!r} (expected application_<clusterTs>_<seq>)")
    return "%04d" % (int(m.group(2)) % 10000)


def aggregated_log_dirs(app_id: str, user: str, conf: dict[str, str]) -> list[str]:
    """Every directory where the aggregated logs of ``app_id`` may be, most likely first (qualified URLs)."""
    root = conf.get("yarn.nodemanager.remote-app-log-dir", "/tmp/logs").rstrip("/")
    nm_suffix = conf.get("yarn.nodemanager.remote-app-log-dir-suffix", "logs")
    formats = [f.strip() for f in conf.get("yarn.log-aggregation.file-formats", "TFile").split(",") if f.strip()]
    out: list[str] = []
    for fmt in formats:
        froot = conf.get(f"yarn.log-aggregation.{fmt}.remote-app-log-dir", root).rstrip("/")
        suffix = conf.get(f"yarn.log-aggregation.{fmt}.remote-app-log-dir-suffix") or f"{nm_suffix}-{fmt.lower()}"
        out.append(f"{froot}/{user}/bucket-{suffix}/{bucket(app_id)}/{app_id}")
        out.append(f"{froot}/{user}/{suffix}/{app_id}")
    out.append(f"{root}/{user}/{nm_suffix}/{app_id}")  # Hadoop 2.x / 3.0–3.2
    return list(dict.fromkeys(hdfs.qualify(d, conf) for d in out))


def parse_tfile_logs(data: bytes) -> dict[str, dict[str, str]] | None:
    """Container id → {file name: text} from one node's aggregated log file (uncompressed TFile), or None.

    The layout (``AggregatedLogFormat``): per container a key ``writeUTF(containerId)``, then per log file
    ``writeUTF(name) writeUTF(str(length))`` and ``length`` raw bytes. We scan for those records in order and skip
    any match that falls inside content already consumed, so log text that happens to look like a record is safe.
    A value longer than TFile's 1 MiB chunk size carries a few chunk-length bytes inside; we tolerate that.
    """
    marks: list[tuple[int, str, Any]] = []
    for m in _CONTAINER_RE.finditer(data):
        s = m.start()
        if s >= 2 and int.from_bytes(data[s - 2 : s], "big") == len(m.group(0)):
            marks.append((s - 2, "key", m))
    for m in _ENTRY_RE.finditer(data):
        if m.group(1)[0] == len(m.group(2)) and m.group(3)[0] == len(m.group(4)):
            marks.append((m.start(), "entry", m))
    marks.sort(key=lambda t: t[0])
    out: dict[str, dict[str, str]] = {}
    current: str | None = None
    consumed = 0
    for pos, kind, m in marks:
        if pos < consumed:
            continue
        if kind == "key":
            current = m.group(0).decode()
            consumed = m.end()
            continue
        if current is None:
            continue
        name, length = m.group(2).decode(), int(m.group(4))
        start = m.end()
        length = min(length, len(data) - start)
        text = data[start : start + length].decode("utf-8", "replace")
        files = out.setdefault(current, {})
        files[name] = files.get(name, "") + text
        consumed = start + length
    return out or None


def read_aggregated_logs(
    app_id: str, user: str, conf: dict[str, str], get_fs: Callable[..., tuple[Any, str]] = hdfs.get_fs
) -> list[ContainerLog] | None:
    """Parsed aggregated logs of a finished app from the first candidate dir that exists; None if unreadable."""
    for d in aggregated_log_dirs(app_id, user, conf):
        try:
            fs, path = get_fs(d, conf=conf)
            if not fs.exists(path):
                continue
            # a NodeManager uploads to <node>.tmp and renames it when complete: a .tmp file is not the whole log yet
            entries = [
                e for e in fs.ls(path, detail=True) if e.get("type") == "file" and not e["name"].endswith(".tmp")
            ]
        except (OSError, ValueError, RuntimeError) as exc:
            log.debug("cannot list %s: %s", d, exc)
            continue
        logs: dict[str, ContainerLog] = {}
        unparsed = 0
        for e in sorted(entries, key=lambda e: e["name"]):
            with fs.open(e["name"], "rb") as f:
                data = f.read()
            parsed = parse_tfile_logs(data)
            if parsed is None:
                unparsed += 1
                continue
            for cid, files in parsed.items():
                logs.setdefault(cid, ContainerLog(cid)).files.update(files)
        if unparsed and not logs:
            log.info("aggregated logs in %s are not plain TFile (compressed or IFile); falling back to `yarn logs`", d)
            return None
        return sorted(logs.values(), key=lambda c: c.container_id)
    return None


# ------------------------------------------------------------------------------------------------- `yarn logs` CLI


def yarn_logs_cli(app_id: str, container_id: str | None = None, timeout: float = 120.0) -> str:
    """Output of ``yarn logs -applicationId`` (bounded by ``timeout``); raises if the CLI is missing or fails."""
    exe = shutil.which("yarn")
    if not exe:
        raise FileNotFoundError(
            "the `yarn` command is not on PATH (needed to read aggregated logs that are "
            "compressed or not in TFile format)"
        )
    cmd = [exe, "logs", "-applicationId", app_id]
    if container_id:
        cmd += ["-containerId", container_id]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"timed out after {timeout:g}s waiting for `yarn logs -applicationId {app_id}`") from None
    if res.returncode != 0 and not res.stdout.strip():
        raise RuntimeError(
            f"`yarn logs -applicationId {app_id}` failed ({res.returncode}): {res.stderr.strip()[-500:]}"
        )
    return res.stdout


_CLI_CONTAINER_RE = re.compile(r"^Container: (container_\S+) on (\S+)", re.M)
_CLI_LOGTYPE_RE = re.compile(r"^LogType:\s*(\S+)\s*$", re.M)


def parse_yarn_logs_output(text: str) -> list[ContainerLog]:
    """Split ``yarn logs`` output into containers and files (``LogType:``/``LogContents:``/``End of LogType:``)."""
    out: dict[str, ContainerLog] = {}
    starts = list(_CLI_CONTAINER_RE.finditer(text))
    for i, m in enumerate(starts):
        block = text[m.end() : starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        cl = out.setdefault(m.group(1), ContainerLog(m.group(1)))
        for lt in _CLI_LOGTYPE_RE.finditer(block):
            name = lt.group(1)
            rest = block[lt.end() :]
            c = rest.find("LogContents:\n")
            if c < 0:
                continue
            body = rest[c + len("LogContents:\n") :]
            end = body.find(f"End of LogType:{name}")
            cl.files[name] = body[:end] if end >= 0 else body
    return list(out.values())


# -------------------------------------------------------------------------------------------- NodeManager web API


def _http_get(url: str, timeout: float, accept: str = "*/*") -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept})
    with webauth.urlopen(req, timeout=timeout) as resp:  # SPNEGO when the NodeManager asks for it
        return resp.read()


def _nm_base(nm_http_address: str) -> str:
    return nm_http_address if "://" in nm_http_address else f"http://{nm_http_address}"


def nm_container_state(
    nm_http_address: str,
    container_id: str,
    timeout: float = 2.0,
    http_get: Callable[[str, float, str], bytes] = _http_get,
) -> str | None:
    """The NodeManager's state of ``container_id`` (``RUNNING``, ``KILLING``, ``DONE``…; None: the NodeManager does
    not know it), read like the logs (SPNEGO when asked). ``HTTPError``/``OSError`` (no NodeManager,
    :class:`webauth.SpnegoUnavailable`) are the caller's."""
    url = f"{_nm_base(nm_http_address).rstrip('/')}/ws/v1/node/containers/{container_id}"
    try:
        body = http_get(url, timeout, "application/json")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return str((json.loads(body).get("container") or {}).get("state") or "").upper()


def nm_log_sizes(
    nm_http_address: str,
    container_id: str,
    timeout: float = 10.0,
    http_get: Callable[[str, float, str], bytes] = _http_get,
) -> dict[str, int | None]:
    """Names and sizes in bytes (None if not said) of a live container's log files, from its NodeManager
    (Hadoop 2.8+/3.x JSON shapes)."""
    url = f"{_nm_base(nm_http_address)}/ws/v1/node/containers/{container_id}/logs"
    doc = json.loads(http_get(url, timeout, "application/json"))
    infos = doc if isinstance(doc, list) else [doc]
    sizes: dict[str, int | None] = {}
    for info in infos:
        block = info.get("containerLogsInfo", info) if isinstance(info, dict) else {}
        files = block.get("containerLogInfo", [])
        if isinstance(files, dict):
            files = [files]
        for f in files:
            n = f.get("fileName")
            if n and n not in sizes:
                size = str(f.get("fileSize", "")).strip()
                sizes[n] = int(size) if size.isdigit() else None
    return sizes


_LOG_LENGTH_RE = re.compile(rb"^LogLength:\s*(\d+)\s*$", re.M)


def parse_nm_log_reply(raw: bytes, name: str) -> tuple[bytes, int | None]:
    """(the file's bytes, the file's whole length or None) from a NodeManager ``containerlogs`` reply: Hadoop 3 wraps
    the bytes in a header (``Container: …``, ``LogLength:<whole file>``, ``LogContents:``) and a footer (``End of
    LogType:<name>…``); offsets counted over the whole reply made ``logs -f`` print the footer at every poll. An older
    NodeManager's bare file comes back as it is."""
    marker = b"LogContents:\n"
    at = raw.find(marker)
    if not raw.startswith(b"Container: ") or at < 0:
        return raw, None
    m = _LOG_LENGTH_RE.search(raw, 0, at)
    body = raw[at + len(marker) :]
    end = body.rfind(b"End of LogType:" + name.encode())
    return (body[:end] if end >= 0 else body), (int(m.group(1)) if m else None)


def nm_read_log_bytes(
    nm_http_address: str,
    container_id: str,
    name: str,
    offset: int = 0,
    size: int | None = None,
    timeout: float = 10.0,
    http_get: Callable[[str, float, str], bytes] = _http_get,
) -> tuple[bytes, int]:
    """(bytes, where they start in the file): the file from about ``offset`` on. With ``offset`` and the listed
    ``size`` it asks only for the tail (the NodeManager's ``size=-N``: the last N bytes); when the file grew past
    ``size`` in between, so that tail starts after ``offset``, it reads the whole file instead."""
    url = f"{_nm_base(nm_http_address)}/ws/v1/node/containerlogs/{container_id}/{urllib.parse.quote(name)}"
    if offset > 0 and size is not None and size > offset:
        body, total = parse_nm_log_reply(http_get(f"{url}?size=-{size - offset}", timeout, "text/plain"), name)
        if total is not None and total - len(body) <= offset:
            return body, total - len(body)
    body, _ = parse_nm_log_reply(http_get(url, timeout, "text/plain"), name)
    return body, 0


def nm_container_log(
    nm_http_address: str,
    container_id: str,
    timeout: float = 10.0,
    http_get: Callable[[str, float, str], bytes] = _http_get,
) -> ContainerLog:
    """All log files of a live container; raises ``OSError``/``urllib.error.URLError`` when the NM can't serve."""
    cl = ContainerLog(container_id)
    for name in nm_log_sizes(nm_http_address, container_id, timeout, http_get):
        body, _ = nm_read_log_bytes(nm_http_address, container_id, name, timeout=timeout, http_get=http_get)
        cl.files[name] = body.decode("utf-8", "replace")
    return cl


def aggregation_disabled(conf: dict[str, str]) -> bool:
    """The client config says ``yarn.log-aggregation-enable=false``: finished containers' logs stay on their
    NodeManagers (``yarn.nodemanager.log.retain-seconds``), nothing will ever appear on HDFS to wait for."""
    return conf.get("yarn.log-aggregation-enable", "").strip().lower() == "false"


def nm_finished_logs(tasks: Iterable[dict]) -> list[tuple[str, ContainerLog]]:
    """(task, its container's logs) read from the NodeManagers, for the tasks of a status snapshot; a container the
    NodeManager cannot serve gets one ``[tfyarn] logs unavailable`` line saying why instead."""
    out = []
    for t in tasks:
        where = _NM_LOG_RE.match(t.get("log") or "")
        if where is None:
            continue
        addr, cid = where.groups()
        try:
            cl = nm_container_log(addr, cid)
        except (OSError, ValueError) as exc:  # urllib's errors are OSErrors
            cl = ContainerLog(
                cid,
                files={
                    "tfyarn": f"[tfyarn] logs unavailable: the NodeManager {addr} did not "
                    f"serve {cid} ({exc}); log aggregation is off"
                },
            )
        out.append((t["task"], cl))
    return out


class LogTail:
    """What a follower (``logs -f``) has shown of each (container, file): every line once, whole, in order.

    Offsets are in bytes of the file itself, and a partial last line is held back until its newline arrives (or
    :meth:`flush` at the end), so a poll that lands mid-line neither cuts nor repeats it.
    """

    def __init__(self) -> None:
        self.offsets: dict[tuple[str, str], int] = {}
        self.held: dict[tuple[str, str], bytes] = {}

    def offset(self, container_id: str, name: str) -> int:
        return self.offsets.get((container_id, name), 0)

    def feed(self, container_id: str, name: str, data: bytes, start: int = 0) -> list[str]:
        """The complete new lines in ``data`` (the file's bytes from offset ``start``, at most the shown offset)."""
        key = (container_id, name)
        seen = self.offsets.get(key, 0)
        if start > seen:
            raise ValueError(f"{container_id}/{name}: bytes from {start} leave a gap after {seen}")
        new = data[seen - start :]
        if not new:
            return []
        self.offsets[key] = seen + len(new)
        buf = self.held.pop(key, b"") + new
        cut = buf.rfind(b"\n") + 1
        if cut < len(buf):
            self.held[key] = buf[cut:]
        return buf[:cut].decode("utf-8", "replace").splitlines()

    def flush(self) -> list[tuple[str, str, str]]:
        """(container id, file, line) for every partial last line held back; nothing is held afterwards."""
        out = [(cid, name, b.decode("utf-8", "replace")) for (cid, name), b in self.held.items() if b]
        self.held.clear()
        return out


# ---------------------------------------------------------------------------------------------------- formatting


def select_files(cl: ContainerLog | Iterable[str], all_files: bool = False) -> list[str]:
    """The files worth showing, task output first (``*.log``, stdout, stderr), YARN housekeeping only on request."""
    files = cl.files if isinstance(cl, ContainerLog) else cl
    names = [n for n in files if all_files or n not in HOUSEKEEPING_FILES]
    return sorted(names, key=lambda n: (not n.endswith(".log"), n not in ("stdout", "stderr"), n))


def lines_of(cl: ContainerLog, all_files: bool = False, label: str | None = None) -> Iterator[str]:
    """``"<task> | <line>"`` for every line of the selected files."""
    task = label or cl.task
    for name in select_files(cl, all_files):
        for line in cl.files[name].splitlines():
            yield f"{task} | {line}"
