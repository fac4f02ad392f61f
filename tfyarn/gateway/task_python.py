"""Can the containers' OS account run the tasks' Python? Checked on the gateway before anything is packed.

On a secure cluster the LinuxContainerExecutor runs containers as the submitting user's account (the principal's
short name, or the proxy user of ``user:``), not as the NodeManager's. A packed venv keeps ``bin/python`` as a link
to its base interpreter: when that lies where the account cannot read it (a pyenv under a 0700 ``/root``), the
container dies before the task starts and YARN reports only "Invalid argument number" (the launch script's
``find -L`` fails under ``set -e``). ``environment.python`` naming such an interpreter fails the same way.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

from tfyarn.cluster import kerberos
from tfyarn.contracts import startup
from tfyarn.spec import JobSpec

FIX = (
    "use a relocatable env (conda-pack, as environment.archive), environment.python naming an interpreter "
    "the nodes' users can run, or a base Python readable by others (chmod o+rx on the path)"
)


def _can(st: os.stat_result, user: str | None, bits: int) -> bool:
    """Whether ``user`` (None: anybody, the others' bits) has ``bits`` (``stat.S_IRUSR``-style owner bits)."""
    try:
        pw = pwd.getpwnam(user) if user else None
    except KeyError:
        pw = None
    if pw is not None:
        if pw.pw_uid == 0 or pw.pw_uid == st.st_uid:
            return pw.pw_uid == 0 or st.st_mode & bits == bits
        if st.st_gid in os.getgrouplist(pw.pw_name, pw.pw_gid):
            return st.st_mode & (bits >> 3) == bits >> 3
    return st.st_mode & (bits >> 6) == bits >> 6


def blocker(path: str | os.PathLike, user: str | None = None, execute: bool = True) -> str | None:
    """The first component of ``path`` (links resolved) that ``user`` cannot pass — a dir it cannot search, or the
    file itself it cannot read (and execute) — as ``"<path> (mode 0700, owner root)"``; None when it can."""
    real = Path(os.path.realpath(path))
    for p in [*reversed(real.parents), real]:
        try:
            st = p.stat()
        except OSError:
            return None  # not on this machine: nothing to say
        need = stat.S_IXUSR if stat.S_ISDIR(st.st_mode) else stat.S_IRUSR | (stat.S_IXUSR if execute else 0)
        if not _can(st, user, need):
            try:
                owner = pwd.getpwuid(st.st_uid).pw_name
            except KeyError:
                owner = str(st.st_uid)
            return f"{p} (mode {stat.S_IMODE(st.st_mode):04o}, owner {owner})"
    return None


def check(spec: JobSpec, conf: dict[str, str]) -> list[str]:
    """One line per interpreter the containers' account could not run, on a Kerberized cluster (only there do
    containers run as the user: elsewhere as the NodeManager's account, which reads what the gateway reads)."""
    if not kerberos.secure(conf):
        return []
    env, user = spec.environment, spec.user or (kerberos.short_name(spec.kerberos.principal) if spec.kerberos else None)
    who = f"the account {user!r}" if user else "other users"
    if env.source == "python" and env.python:
        what, path = "environment.python", env.python
    elif env.source == "pack" and sys.prefix != sys.base_prefix:  # a venv: its bin/python is a link
        what, path = "the packed venv's bin/python", sys.executable
    else:
        return []
    where = blocker(path, user)
    if where is None and what.startswith("the packed"):
        where = blocker(
            Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}", user, execute=False
        )  # the base's standard library, which the link leads to
    if where is None:
        return []
    return [
        f"environment: {what} is {os.path.realpath(path)}, which {who} cannot read ({where}): on a "
        f"Kerberized cluster containers run as the submitting user's account; {FIX}"
    ]


def local_python(spec: JobSpec) -> str:
    """The interpreter a local run starts its tasks with: ``environment.python`` when the spec names one (the same
    Python a YARN job's containers would run), else this one. A packed env or an archive is YARN's: locally the
    tasks run this Python, which is what would be packed."""
    return (
        spec.environment.python if spec.environment.source == "python" and spec.environment.python else sys.executable
    )


def check_local(spec: JobSpec, timeout: float = 120.0) -> list[str]:
    """``environment.python`` on a local run: it must run, and import what a task imports (tfyarn's dependencies,
    TensorFlow for training), else one line saying which module is missing in which Python — the words a YARN
    container that cannot start leaves in its log (:mod:`tfyarn.contracts.startup`, run there as text too)."""
    python = local_python(spec)
    if python == sys.executable:
        return []
    if not os.access(python, os.X_OK) or os.path.isdir(python):
        return [
            f"environment.python: {python} is not an executable file on this machine (a local run starts its "
            "tasks with it)"
        ]
    training = spec.job != "predict"
    argv = [python, "-c", Path(startup.__file__).read_text(), "1", *([] if training else ["supervisor"])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [f"environment.python: {python} did not finish its start-up check within {timeout:g}s"]
    except OSError as exc:
        return [f"environment.python: {python} does not run: {exc}"]
    said = startup.parse_log(done.stderr)
    if said is not None:
        return [f"environment.python: {said[1]}: the tasks of a local run start with it"]
    if done.returncode != 0:
        return [f"environment.python: {python} exited {done.returncode}: {done.stderr.strip()[-300:]}"]
    return []
