"""JobSpec → ``skein.ApplicationSpec``: one skein service per tfyarn role.

Kept apart from the client code so it is pure: given the spec and where the shipped files are, the result is a real
skein object (``tfyarn submit --dry-run`` prints its YAML, which ``skein.ApplicationSpec.from_yaml`` loads back to an
equal object) and nothing touches the cluster.

Every container runs the same script (:func:`container_script`): it exports the task contract of
docs/ARCHITECTURE.md (``TFYARN_ROLE``, ``TFYARN_SPEC_FILE``, ``TFYARN_APP_ID``, ``TFYARN_CODE_DIR``; no
``TFYARN_KV_URL``, so the runtime uses skein's KV through :mod:`tfyarn.runtime.kv_yarn`) and runs
``python -m tfyarn.runtime`` from the unpacked environment (on a non-zero exit, also
:mod:`tfyarn.runtime.exit_report`). The task index is not in the env: on YARN it comes from
``SKEIN_CONTAINER_ID`` / a KV slot claim (:func:`tfyarn.runtime.kv_yarn.task_index_from_env`), because skein gives a
restarted container a new instance number.

Files every service gets (YARN localizes them into the container's working dir):

=================  =====================================================================================
``env/``           the packed environment archive (visibility PRIVATE: NodeManagers cache it across runs)
``tfyarn_src/``    the gateway's tfyarn source (zip), first on PYTHONPATH: the code that submits is what runs
``code/``          the job's ``code:`` directory (zip), ``TFYARN_CODE_DIR``
``tfyarn-spec.json``  the resolved spec, ``TFYARN_SPEC_FILE`` (without ``kerberos:``: tasks never see the keytab)
=================  =====================================================================================

Besides the roles' services, one small service :data:`SUPERVISOR_SERVICE` (no TensorFlow, not a task) runs
``python -m`` :mod:`tfyarn.backends.yarn.yarn_supervise` from the same environment: the job's stall watch, deadlines,
end and run report inside the application, so a job nobody follows is supervised too.

No keytab is shipped: on a Kerberized cluster the tasks read HDFS with the delegation tokens skein gets at submit
(``HADOOP_TOKEN_FILE_LOCATION``, see :mod:`tfyarn.kerberos`).
"""
from __future__ import annotations

import hashlib
import os
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from tfyarn._skein import skein
from tfyarn.packaging import ENV_DIR, SKIP_DIRS, SKIP_SUFFIXES, EnvRef
from tfyarn.spec import ROLE_ORDER, SIDECAR_ROLES, JobSpec

#: Every tfyarn application carries this YARN tag (``tfyarn list`` filters on it). YARN lower-cases tags.
TFYARN_TAG = "tfyarn"
SPEC_FILE = "tfyarn-spec.json"
CODE_DIR = "code"
SRC_DIR = "tfyarn_src"
#: ``tfyarn-attempt:<n>`` on the application of job attempt n > 0 (``retry.max_attempts``): the attempt is then part of
#: the app itself, so ``status`` says it from any machine (it said 0 for every application).
ATTEMPT_TAG = "tfyarn-attempt:"
#: The in-app supervisor's skein service (:mod:`tfyarn.backends.yarn.yarn_supervise`): never a task of the job.
SUPERVISOR_SERVICE = "tfyarn-supervisor"
SUPERVISOR_MODULE = "tfyarn.backends.yarn.yarn_supervise"
#: Its container: Python + skein's gRPC client + matplotlib for the report's plot (~150 MB resident measured).
SUPERVISOR_MEMORY_MIB = 384
#: On every app that has the supervisor: only those left a record in the staging dir worth reading (an HDFS client
#: costs ``status`` of an ended app ~1 s of imports).
SUPERVISED_TAG = "tfyarn-supervised"
#: First line every task container writes to its log: lets the log reader map YARN container ids to tasks.
LOG_HEADER = "[tfyarn] container"


@dataclass(frozen=True)
class Shipped:
    """Where the files a job ships are (local paths are uploaded by skein into its per-app staging dir)."""
    env: EnvRef
    spec_file: str
    tfyarn_src: str | None = None
    code: str | None = None


def _tag(s: str) -> str:
    return s.strip().lower()[:100]


def app_tags(spec: JobSpec, extra: Iterable[str] = ()) -> set[str]:
    """YARN tags: ``tfyarn``, ``tfyarn-name:<name>``, then the spec's and the caller's (lower-cased, ≤100 chars)."""
    tags = {TFYARN_TAG, _tag(f"tfyarn-name:{spec.name}")}
    tags.update(_tag(t) for t in (*spec.tags, *extra) if t.strip())
    return tags


def container_script(env: EnvRef, *, code: bool, own_tmpdir: bool = True, supervisor: bool = False) -> str:
    """The bash every task container runs: the task contract's environment, then Python, then on a non-zero exit
    the report of how it ended (:mod:`tfyarn.runtime.exit_report`); the container exits with Python's code.

    ``own_tmpdir`` (unless the role's ``env`` sets ``TMPDIR``): temporary files go to ``tmp/`` in the container's
    working directory, which YARN deletes with the container — a killed task (preemption, ``tfyarn kill``) leaves
    nothing in the node's ``/tmp`` (TensorFlow's autograph writes a module per traced function there and deletes
    them only at a clean exit).

    ``supervisor``: the in-app supervisor's container (:data:`SUPERVISOR_MODULE`), which always exits 0 — its
    failure must never fail the job."""
    py = env.python
    lines = [
        "set -eu",
        'export TFYARN_CONTAINER_START="$(date +%s.%N)"',   # phase/<task>.start: when YARN started the container
        f'echo "{LOG_HEADER} ${{SKEIN_CONTAINER_ID:-?}} yarn=${{CONTAINER_ID:-?}} host=$(hostname)" >&2',
        'export TFYARN_APP_ID="${SKEIN_APPLICATION_ID:-}"',
        f'export TFYARN_SPEC_FILE="$PWD/{SPEC_FILE}"',
        f'export PYTHONPATH="$PWD/{SRC_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"',
        "export PYTHONUNBUFFERED=1",
        "unset TFYARN_KV_URL",
    ]
    if own_tmpdir:
        lines += ['mkdir -p "$PWD/tmp"', 'export TMPDIR="$PWD/tmp"']
    if code:
        lines.append(f'export TFYARN_CODE_DIR="$PWD/{CODE_DIR}"')
    if env.source in ("pack", "archive"):
        py = f"./{ENV_DIR}/bin/python"
    py = shlex.quote(py) if not py.startswith("./") else py
    if supervisor:
        return "\n".join([*lines, f"{py} -m {SUPERVISOR_MODULE} || true", "exit 0"]) + "\n"
    # Python runs as a child, not exec'd: when it dies (kill -9, the kernel's OOM killer, a crash) this shell says
    # how, in the log, the app's KV and the app's diagnostics (tfyarn.runtime.exit_report; skein keeps no exit
    # status). YARN signals the container's whole process group, so a kill still reaches Python directly.
    lines += [
        "code=0",
        f"{py} -m tfyarn.runtime || code=$?",
        'if [ "$code" -ne 0 ]; then',
        f'  {py} -m tfyarn.runtime.exit_report "$code" "$(date +%s.%N)" || true',
        "fi",
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def _files(shipped: Shipped) -> dict[str, Any]:
    sk = skein()
    files: dict[str, Any] = {SPEC_FILE: sk.File(shipped.spec_file, type="file")}
    if shipped.env.archive_url:
        # PRIVATE: the NodeManager keeps the unpacked archive in the user's cache, keyed by URL + timestamp, so the
        # next run of the same (content-hashed) env starts without downloading or extracting anything.
        files[ENV_DIR] = sk.File(shipped.env.archive_url, type="archive", visibility="private")
    if shipped.tfyarn_src:
        files[SRC_DIR] = sk.File(shipped.tfyarn_src, type="archive")
    if shipped.code:
        files[CODE_DIR] = sk.File(shipped.code, type="archive")
    return files


def build_application_spec(spec: JobSpec, shipped: Shipped, *, master_memory_mib: int = 512,
                           master_vcores: int = 1, file_systems: Iterable[str] = (), extra_tags: Iterable[str] = (),
                           attempt: int = 0, max_attempts: int = 1, supervise: bool = True,
                           staging_dir: str | None = None) -> Any:
    """A validated ``skein.ApplicationSpec`` for ``spec``; pure (no cluster, no upload). ``supervise`` adds the
    in-app supervisor's service; ``staging_dir`` is where it records the app for other machines
    (:func:`tfyarn.backends.yarn.yarn_supervise.record_url`)."""
    sk = skein()
    files = _files(shipped)
    scripts = {own: container_script(shipped.env, code=bool(shipped.code), own_tmpdir=own) for own in (True, False)}
    services = {}
    for role in ROLE_ORDER:
        r = spec.roles.get(role)  # type: ignore[call-overload]
        if r is None or r.instances == 0:
            continue
        env = dict(r.env)
        env.update({"TFYARN_ROLE": role, "TFYARN_ATTEMPT": str(attempt)})
        services[role] = sk.Service(
            resources=sk.Resources(memory=r.memory_mib, vcores=r.vcores, gpus=r.gpus),
            script=scripts["TMPDIR" not in r.env], instances=r.instances, files=dict(files), env=env,
            # skein counts restarts per service (all instances share one budget), tfyarn's spec per task:
            # the role gets max_restarts x instances. skein restarts on any failure (no exit_code policy on YARN).
            max_restarts=r.max_restarts * r.instances if r.restart != "never" else 0,
            allow_failures=role in SIDECAR_ROLES,
            node_label=r.node_label or "")
    if supervise:
        env = {"TFYARN_ATTEMPT": str(attempt), **({"TFYARN_STAGING_DIR": staging_dir} if staging_dir else {})}
        services[SUPERVISOR_SERVICE] = sk.Service(
            resources=sk.Resources(memory=SUPERVISOR_MEMORY_MIB, vcores=1),
            script=container_script(shipped.env, code=False, supervisor=True), instances=1,
            files={k: f for k, f in files.items() if k != CODE_DIR}, env=env, max_restarts=0,
            allow_failures=True)              # a supervisor that dies leaves the job running (followers still watch)
    acls = sk.ACLs(enable=spec.acls.enable, view_users=list(spec.acls.view_users),
                   view_groups=list(spec.acls.view_groups), modify_users=list(spec.acls.modify_users),
                   modify_groups=list(spec.acls.modify_groups), ui_users=list(spec.acls.ui_users))
    return sk.ApplicationSpec(
        name=spec.name, queue=spec.queue, user=spec.user or "",
        tags=app_tags(spec, extra_tags) | ({f"{ATTEMPT_TAG}{attempt}"} if attempt else set())
        | ({SUPERVISED_TAG} if supervise else set()),
        services=services, acls=acls, file_systems=list(file_systems), max_attempts=max_attempts,
        master=sk.Master(resources=sk.Resources(memory=master_memory_mib, vcores=master_vcores)))


# ----------------------------------------------------------------------------------------------------- shipped files

def _zip_tree(root: Path, dest: Path, arc_prefix: str = "") -> None:
    """Deterministic zip (sorted names, fixed timestamps) so equal trees give byte-equal archives."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(SKIP_SUFFIXES))
            for fn in sorted(filenames):
                if fn.endswith(SKIP_SUFFIXES):
                    continue
                fp = Path(dirpath) / fn
                info = zipfile.ZipInfo(arc_prefix + fp.relative_to(root).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = (fp.stat().st_mode & 0o777 | 0o100000) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, fp.read_bytes())
    os.replace(tmp, dest)


def _tree_digest(root: Path) -> str:
    from tfyarn.packaging import hash_tree
    return hash_tree(root)[:24]


def build_code_zip(code_dir: str | os.PathLike, dest_dir: str | os.PathLike, write: bool = True) -> str:
    """Zip the job's code dir into ``dest_dir/code-<hash>.zip`` (content-addressed: reused when unchanged).

    ``write=False`` only computes the path (dry run).
    """
    root = Path(code_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"code: {code_dir} is not a directory")
    dest = Path(dest_dir) / f"code-{_tree_digest(root)}.zip"
    if write and not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        _zip_tree(root, dest)
    return str(dest)


def build_tfyarn_zip(dest_dir: str | os.PathLike, write: bool = True) -> str:
    """Zip this tfyarn package (``tfyarn/…`` at the archive root) into ``dest_dir/tfyarn-<hash>.zip``."""
    import tfyarn

    pkg = Path(tfyarn.__file__).resolve().parent
    dest = Path(dest_dir) / f"tfyarn-{_tree_digest(pkg)}.zip"
    if write and not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        _zip_tree(pkg, dest, arc_prefix="tfyarn/")
    return str(dest)


def shipped_spec_json(spec: JobSpec) -> str:
    """The spec the tasks read: the resolved spec without ``kerberos`` (the gateway's login, not theirs)."""
    return spec.model_copy(update={"kerberos": None}).to_json()


def spec_file_path(spec: JobSpec, dest_dir: str | os.PathLike) -> Path:
    """Content-addressed path of the resolved spec JSON (same spec → same path, so dry-run YAML = submitted YAML)."""
    text = shipped_spec_json(spec)
    return Path(dest_dir) / f"spec-{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"


def write_spec_file(spec: JobSpec, dest_dir: str | os.PathLike, write: bool = True) -> str:
    p = spec_file_path(spec, dest_dir)
    if write and not p.is_file():
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.partial")
        tmp.write_text(shipped_spec_json(spec))
        os.replace(tmp, p)
    return str(p)


def to_yaml(app_spec: Any) -> str:
    """Stable, readable YAML of ``app_spec`` (sorted keys and tags, scripts as literal blocks).

    skein's own ``to_yaml`` writes ``tags`` in set order (differs between runs) and folds scripts; this output loads
    back with ``skein.ApplicationSpec.from_yaml`` to an equal object.
    """
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, data: str) -> Any:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, _str)
    d = app_spec.to_dict()
    d["tags"] = sorted(d.get("tags", []))
    return yaml.dump(d, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=120)
