"""tfyarn's shared skein driver: one JVM per gateway user, cluster and login, reused by later commands, stopped when
idle.

A skein driver (a JVM, plus a ``yarn classpath`` JVM at its start) cost every submit 2-4 s of wall and ~6 CPU s
(8-15 s on a loaded box). The first command that needs one starts a *keeper* (``python -m
tfyarn.backends.yarn.driver_keeper keep …``, its own session) that starts the JVM with skein's own code (stdin a pipe:
the JVM exits when the keeper dies, even by SIGKILL), records its address and stops it once unused for
``TFYARN_DRIVER_IDLE`` (default 15 min; ``0``: a private driver per command).

Files in :func:`tfyarn.common.paths.driver_dir`, per identity key: ``<key>.json`` the record; ``<key>.lock``, held
while a command checks or starts the driver and while the keeper decides to stop it (never two JVMs, never a stop
under a command that just took it); ``<key>.leases/<pid>``, one per command using it (its start time inside, against pid
reuse: the keeper never stops a driver with a live lease); ``<key>.used``, where the idle time starts; the logs. The
key covers the YARN user, the Kerberos login, the Hadoop configuration and the JVM options: a driver logged in as
someone else, or talking to another cluster, is never reused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tfyarn.common import paths
from tfyarn.errors import YarnUnavailable
from tfyarn.cluster._skein import skein

log = logging.getLogger(__name__)

IDLE_ENV = "TFYARN_DRIVER_IDLE"
DIR_ENV = "TFYARN_DRIVER_DIR"  # read by tfyarn.common.paths.driver_dir
DEFAULT_IDLE_S = 900.0
#: Bound on a driver start (the JVM + ``yarn classpath``: 5-15 s on a loaded gateway) and on the lock's wait.
START_TIMEOUT_S = 120.0
#: Bound on a reused driver's answer to a ping (an idle JVM answers in milliseconds).
PING_TIMEOUT_S = 10.0


def idle_seconds() -> float:
    """``TFYARN_DRIVER_IDLE``: seconds, or with a unit (``90s``, ``15m``, ``1h``); 0 turns the shared driver off."""
    raw = os.environ.get(IDLE_ENV, "").strip().lower()
    if not raw:
        return DEFAULT_IDLE_S
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([smh]?)", raw)
    if not m:
        raise YarnUnavailable(f"{IDLE_ENV}={raw!r}: expected seconds, or a number with s, m or h (e.g. 15m)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def identity(user: str, principal: str | None, hadoop_conf_dir: str | None, kw: dict[str, Any]) -> dict[str, Any]:
    """What a reused driver must match: who it logged in as, which cluster, which JVM options."""
    conf = hadoop_conf_dir or os.environ.get("HADOOP_CONF_DIR") or ""
    return {
        "user": user,
        "principal": principal or "",
        "hadoop_conf_dir": os.path.realpath(conf) if conf else "",
        "java_options": list(kw.get("java_options") or []),
        "keytab": kw.get("keytab") or "",
        "ccache": "" if kw.get("keytab") else os.environ.get("KRB5CCNAME", ""),
    }


def key_of(ident: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def cache_principal() -> str | None:
    """The ticket cache's principal (``klist``), for a driver that logs in from the cache: None without one."""
    if not shutil.which("klist"):
        return None
    try:
        out = subprocess.run(["klist"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^Default principal:\s*(\S+)", out, re.M)
    return m.group(1) if m else None


# ---------------------------------------------------------------------------------------------------- processes


def _start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), None if it is gone: a pid and this identify one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if sys.platform.startswith("linux"):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]  # a zombie has ended (its parent has not reaped it)


def _alive(pid: int | None, started: str | None = None) -> bool:
    if not pid:
        return False
    now = _start_time(pid)
    return now is not None and (not started or started == "?" or now == "?" or now == started)


@dataclass
class Record:
    """One shared driver, as its keeper wrote it."""

    key: str
    address: str
    jvm_pid: int
    keeper_pid: int
    keeper_started: str
    user: str
    principal: str
    hadoop_conf_dir: str
    idle_s: float
    started: float
    log: str

    @property
    def alive(self) -> bool:
        return _alive(self.keeper_pid, self.keeper_started) and _alive(self.jvm_pid) and _is_driver(self.jvm_pid)


class _Files:
    def __init__(self, directory: Path, key: str):
        self.dir, self.key = directory, key
        self.record = directory / f"{key}.json"
        self.lock = directory / f"{key}.lock"
        self.leases = directory / f"{key}.leases"
        self.used = directory / f"{key}.used"
        self.log = directory / f"{key}.log"  # the keeper's
        self.jvm_log = directory / f"{key}.jvm.log"  # the driver's (skein truncates it at each start)

    def read(self) -> Record | None:
        try:
            return Record(**json.loads(self.record.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self, rec: Record) -> None:
        tmp = self.record.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(rec.__dict__))
        os.replace(tmp, self.record)

    def remove_record(self, keeper_pid: int) -> None:
        """Remove the record if it is still this keeper's (a replacement may have written its own)."""
        rec = self.read()
        if rec is not None and rec.keeper_pid == keeper_pid:
            with contextlib.suppress(OSError):
                self.record.unlink()

    @contextlib.contextmanager
    def locked(self, timeout: float = START_TIMEOUT_S) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() > deadline:
                    raise YarnUnavailable(
                        f"timed out after {timeout:g}s waiting for {self.lock} (another tfyarn "
                        f"command starting the shared skein driver?)"
                    )
                time.sleep(0.1)
            yield
        finally:
            os.close(fd)

    def live_leases(self) -> list[int]:
        """Pids of the commands using the driver; a dead command's lease is removed (its mtime marks last use)."""
        live = []
        for p in self.leases.glob("*") if self.leases.is_dir() else ():
            try:
                pid, started = int(p.name), p.read_text().strip()
            except (ValueError, OSError):
                continue
            if _alive(pid, started or None):
                live.append(pid)
            else:
                with contextlib.suppress(OSError):
                    self.mark_used(p.stat().st_mtime)
                    p.unlink()
        return live

    def mark_used(self, when: float | None = None) -> None:
        """The idle time starts at ``when`` (default now) unless a later use is already marked."""
        when = time.time() if when is None else when
        if when > self.last_used():
            self.used.touch()
            os.utime(self.used, (when, when))

    def last_used(self) -> float:
        try:
            return self.used.stat().st_mtime
        except OSError:
            return 0.0


class Lease:
    """A command's use of the shared driver: its skein Client, and the lease file the keeper sees."""

    def __init__(self, client: Any, files: _Files, record: Record):
        self.client, self.record, self._files = client, record, files
        self._path: Path | None = files.leases / str(os.getpid())
        files.leases.mkdir(exist_ok=True)
        self._path.write_text(_start_time(os.getpid()) or "")
        files.mark_used()

    def release(self) -> None:
        """The command no longer needs the driver: its idle time starts now (unless another command holds it)."""
        if self._path is None:
            return
        with contextlib.suppress(OSError):
            self._path.unlink()
        with contextlib.suppress(OSError):
            self._files.mark_used()
        self._path = None
        with contextlib.suppress(Exception):
            self.client.close()  # the channel only: the JVM is the keeper's


def acquire(ident: dict[str, Any], kw: dict[str, Any], env: dict[str, str] | None = None) -> Lease:
    """A lease on the shared driver of ``ident``: the running one if it answers, else a new keeper + JVM (waited
    for, bounded by :data:`START_TIMEOUT_S`). ``kw``: skein driver options (keytab, principal, java_options)."""
    sk = skein()
    files = _Files(paths.driver_dir(), key_of(ident))
    with files.locked():
        rec = files.read()
        if rec is not None and rec.alive and not answers(rec.address):
            log.warning(
                "the shared skein driver at %s (pid %d) does not answer within %gs: replacing it",
                rec.address,
                rec.jvm_pid,
                PING_TIMEOUT_S,
            )
        elif rec is not None and rec.alive:
            try:
                client = sk.Client(address=rec.address)
                log.debug("using tfyarn's shared skein driver at %s (pid %d)", rec.address, rec.jvm_pid)
                return Lease(client, files, rec)
            except sk.exceptions.ConnectionError as exc:
                log.warning(
                    "the shared skein driver at %s (pid %d) does not answer (%s): replacing it",
                    rec.address,
                    rec.jvm_pid,
                    exc,
                )
        if rec is not None:
            _kill(rec)
            files.remove_record(rec.keeper_pid)
        rec = _start_keeper(files, ident, kw, env)
        return Lease(sk.Client(address=rec.address), files, rec)


def answers(address: str, timeout: float = PING_TIMEOUT_S) -> bool:
    """The driver at ``address`` answers a ping within ``timeout`` (skein's own Client pings with no bound: a hung
    JVM would hang every command that reuses it)."""
    sk = skein()
    from skein import proto
    from skein.core import secure_channel

    channel = secure_channel(address, sk.Security.from_default())
    try:
        proto.DriverStub(channel).ping(proto.Empty(), timeout=timeout)
        return True
    except Exception as exc:  # noqa: BLE001 - grpc.RpcError (unavailable, deadline) or a TLS failure: not ours
        log.debug("shared driver ping at %s: %s", address, exc)
        return False
    finally:
        channel.close()


def _start_keeper(files: _Files, ident: dict[str, Any], kw: dict[str, Any], env: dict[str, str] | None) -> Record:
    idle = idle_seconds()
    log.info(
        "starting tfyarn's shared skein driver (JVM); later commands reuse it, it stops after %gs unused "
        "(%s; `tfyarn driver stop` stops it now)",
        idle,
        IDLE_ENV,
    )
    args = json.dumps({"dir": str(files.dir), "key": files.key, "ident": ident, "kw": kw, "idle": idle})
    with open(files.log, "ab") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfyarn.backends.yarn.driver_keeper", "keep", args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=logf,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    line = b""
    while b"\n" not in line and time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
    proc.stdout.close()
    rec = files.read()
    if rec is None or rec.keeper_pid != proc.pid or not line.startswith(b"ready"):
        if proc.poll() is None:
            proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        why = (
            ("timed out after %gs" % START_TIMEOUT_S)
            if proc.returncode is None or proc.returncode < 0
            else f"exit code {proc.returncode}"
        )
        raise YarnUnavailable(
            f"cannot reach YARN: the shared skein driver did not start ({why}; {_tail(files.log)}; "
            f"{_tail(files.jvm_log)})"
            f"; check HADOOP_CONF_DIR, `yarn` and java on PATH, or use --local"
        )
    # the keeper outlives this command on purpose (its own session); a long-lived caller reaps it when it exits
    threading.Thread(target=proc.wait, name="tfyarn-driver-keeper-reaper", daemon=True).start()
    return rec


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return f"{path}: " + " / ".join(lines[-n:]) if lines else f"{path} is empty"


def _is_driver(pid: int) -> bool:
    """The pid is a skein driver JVM (a recorded pid may have been reused by any process since)."""
    if not os.path.isdir("/proc/self"):
        return True  # no /proc to ask (not Linux): trust the record
    try:
        return b"com.anaconda.skein.Driver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _kill(rec: Record, grace: float = 10.0) -> None:
    """Stop a keeper (SIGTERM: it stops its JVM), and the JVM itself if it outlives its keeper."""
    for pid, started in ((rec.keeper_pid, rec.keeper_started), (rec.jvm_pid, None)):
        if not _alive(pid, started) or (pid == rec.jvm_pid and not _is_driver(pid)):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _alive(pid, started) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid, started) and (pid != rec.jvm_pid or _is_driver(pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------- status and stop


def records(directory: Path | None = None) -> list[Record]:
    d = directory or paths.driver_dir()
    out = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else ():
        rec = _Files(d, p.stem).read()
        if rec is not None:
            out.append(rec)
    return out


def skein_global() -> dict[str, Any] | None:
    """The user's own global skein driver (``skein driver start``) as ``~/.skein/driver`` records it, or None:
    preferred by tfyarn when it answers, never stopped by tfyarn."""
    path = Path(os.environ.get("SKEIN_CONFIG") or Path.home() / ".skein") / "driver"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {"address": doc.get("address"), "pid": doc.get("pid"), "alive": _alive(doc.get("pid"))}


def describe(rec: Record) -> dict[str, Any]:
    """A record for ``tfyarn driver status``: alive, in use by which pids, idle since, stops in."""
    files = _Files(Path(rec.log).parent, rec.key)
    leases = files.live_leases() if rec.alive else []
    idle_for = max(0.0, time.time() - files.last_used())
    return {
        **rec.__dict__,
        "alive": rec.alive,
        "used_by": leases,
        "idle_for_s": round(idle_for, 1),
        "stops_in_s": None if leases else round(max(0.0, rec.idle_s - idle_for), 1),
    }


def stop_all(directory: Path | None = None) -> list[Record]:
    """Stop every shared driver recorded in ``directory`` (default: this machine's); returns those stopped."""
    d = directory or paths.driver_dir()
    stopped = []
    for rec in records(d):
        files = _Files(d, rec.key)
        with files.locked():
            _kill(rec)
            files.remove_record(rec.keeper_pid)
        stopped.append(rec)
    return stopped
