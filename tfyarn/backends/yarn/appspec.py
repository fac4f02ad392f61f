"""JobSpec → ``skein.ApplicationSpec``: one skein service per tfyarn role, plus the in-app supervisor's.

Pure: the result is a real skein object (``submit --dry-run`` prints its YAML, which
``skein.ApplicationSpec.from_yaml`` loads back to an equal object) and nothing touches the cluster. Every container
runs :func:`container_script` (the task contract of docs/ARCHITECTURE.md, ``TFYARN_KV=skein:``: the task uses
skein's KV). The task index is not in the env: skein gives a restarted container a new instance number, so the
runtime claims its index through the KV (:func:`tfyarn.task.yarn.kv_yarn.claim_task_index`).

Files every service gets: ``env/`` (the packed environment, visibility PRIVATE: NodeManagers cache it across runs),
``tfyarn_src/`` (the gateway's tfyarn, first on PYTHONPATH: the code that submits is what runs), ``code/`` (the
job's ``code:`` dir) and ``tfyarn-spec.json`` (without ``kerberos:``). No keytab is shipped: on a Kerberized cluster
the tasks use the delegation tokens skein gets at submit (:mod:`tfyarn.cluster.kerberos`).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import tfyarn
import yaml

from tfyarn.cluster._skein import JIT_OPTIONS, skein
from tfyarn.gateway.packaging import ENV_DIR, SKIP_DIRS, SKIP_SUFFIXES, EnvRef, hash_tree
from tfyarn.spec import ROLE_ORDER, SIDECAR_ROLES, JobSpec, Role
from tfyarn.contracts import startup

#: Every tfyarn application carries this YARN tag (``tfyarn list`` filters on it). YARN lower-cases tags.
TFYARN_TAG = "tfyarn"
SPEC_FILE = "tfyarn-spec.json"
CODE_DIR = "code"
SRC_DIR = "tfyarn_src"
#: ``tfyarn-attempt:<n>`` on the application of job attempt n > 0: ``status`` on any machine says the attempt.
ATTEMPT_TAG = "tfyarn-attempt:"
#: The in-app supervisor's skein service (:mod:`tfyarn.runner.yarn_app.supervise`): never a task of the job.
SUPERVISOR_SERVICE = "tfyarn-supervisor"
SUPERVISOR_MODULE = "tfyarn.runner.yarn_app.supervise"
#: Its container: Python + skein's gRPC client + matplotlib for the report's plot (~150 MB resident measured).
SUPERVISOR_MEMORY_MIB = 384
#: skein restarts an in-app supervisor whose container died (killed, preempted, its node lost): every task service
#: allows failures, so without one a container killed without its exit report would be left to its peers' timeouts
SUPERVISOR_RESTARTS = 3
#: On every app that has the supervisor: only those left a record in the staging dir worth reading (an HDFS client
#: costs ``status`` of an ended app ~1 s of imports).
SUPERVISED_TAG = "tfyarn-supervised"
#: The file the in-app supervisor writes in its container's directory once it has started: without it, a supervisor
#: that exited non-zero could not start, and its container fails the app (container_script).
SUPERVISOR_STARTED = ".tfyarn-supervisor-started"
#: First line every task container writes to its log: lets the log reader map YARN container ids to tasks.
LOG_HEADER = "[tfyarn] container"


@dataclass(frozen=True)
class Shipped:
    """Where the files a job ships are (local paths are uploaded by skein into its per-app staging dir)."""

    env: EnvRef
    spec_file: str
    tfyarn_src: str | None = None
    code: str | None = None


def container_script(env: EnvRef, *, code: bool, own_tmpdir: bool = True, supervisor: bool = False) -> str:
    """The bash every task container runs: the task contract's environment, then Python, then on a non-zero exit
    the report of how it ended (:mod:`tfyarn.task.yarn.exit_report`); the container exits with Python's code.
    ``own_tmpdir``: ``TMPDIR`` in the container's dir, deleted with it, so a killed task leaves nothing in the node's
    ``/tmp`` (TF's autograph writes a module per traced function there, deleted only at a clean exit).
    ``supervisor``: the in-app supervisor's container, which exits 0 once the supervisor has started (it must never
    fail the job), non-zero when it could not start (that must: contracts.startup says why in its log)."""
    py = _container_python(env)
    check = f"{py} -c {shlex.quote(start_check_source())}"
    missing_python = f'echo "[tfyarn] exit code $code: {startup.MARK}python {py} did not run (environment)" >&2'
    run = _supervisor_run if supervisor else _task_run
    return "\n".join([*_contract_env(code=code, own_tmpdir=own_tmpdir), *run(py, check, missing_python)]) + "\n"


def _container_python(env: EnvRef) -> str:
    """The Python a container runs, as the script spells it: the shipped env's (``./env/bin/python``) or the
    spec's, quoted."""
    py = f"./{ENV_DIR}/bin/python" if env.source in ("pack", "archive") else env.python
    return shlex.quote(py) if not py.startswith("./") else py


def _contract_env(*, code: bool, own_tmpdir: bool) -> list[str]:
    """The script's first lines: the task contract's environment (docs/ARCHITECTURE.md)."""
    lines = [
        "set -eu",
        'export TFYARN_CONTAINER_START="$(date +%s.%N)"',  # phase/<task>.start: when YARN started the container
        f'echo "{LOG_HEADER} ${{SKEIN_CONTAINER_ID:-?}} yarn=${{CONTAINER_ID:-?}} host=$(hostname)" >&2',
        'export TFYARN_APP_ID="${SKEIN_APPLICATION_ID:-}"',
        f'export TFYARN_SPEC_FILE="$PWD/{SPEC_FILE}"',
        f'export PYTHONPATH="$PWD/{SRC_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"',
        "export PYTHONUNBUFFERED=1",
        "export TFYARN_KV=skein:",  # the task's KV: the app's skein KV (tfyarn.task.main.make_kv)
    ]
    if own_tmpdir:
        lines += ['mkdir -p "$PWD/tmp"', 'export TMPDIR="$PWD/tmp"']
    if code:
        lines.append(f'export TFYARN_CODE_DIR="$PWD/{CODE_DIR}"')
    return lines


def _supervisor_run(py: str, check: str, missing_python: str) -> list[str]:
    """The in-app supervisor's run: it never fails the job once it runs (``|| true``); one that cannot start (no
    marker file: its imports or set-up failed) fails the app at once (its service allows no failure): says why,
    exits non-zero."""
    return [
        "code=0",
        f"{py} -m {SUPERVISOR_MODULE} || code=$?",
        f'if [ "$code" -ne 0 ] && [ "$code" -lt 128 ] && [ ! -e {SUPERVISOR_STARTED} ]; then',
        f'  {check} "$code" supervisor || {missing_python}',
        '  exit "$code"',
        "fi",
        "exit 0",
    ]


def _task_run(py: str, check: str, missing_python: str) -> list[str]:
    """A task's run. Python runs as a child, not exec'd: when it dies (kill -9, the kernel's OOM killer, a crash)
    this shell says how, in the log, the app's KV and the app's diagnostics (tfyarn.task.yarn.exit_report; skein
    keeps no exit status). YARN signals the container's whole process group, so a kill still reaches Python
    directly. A report that could not run (this Python lacks tfyarn or its dependencies) is followed by the stdlib
    check that says which module is missing (contracts.startup: the gateway reads that line from the log); the
    container exits with Python's code whatever the report did."""
    return [
        "code=0",
        f"{py} -m tfyarn.task || code=$?",
        'if [ "$code" -ne 0 ]; then',
        "  reported=0",
        f'  {py} -m tfyarn.task.yarn.exit_report "$code" "$(date +%s.%N)" || reported=$?',
        '  if [ "$reported" -ne 0 ]; then',
        f'    {check} "$code" || {missing_python}',
        "  fi",
        "fi",
        'exit "$code"',
    ]


def start_check_source() -> str:
    """The stdlib check a container runs after a Python that could not start (:mod:`tfyarn.contracts.startup`, as
    text: it must run where ``tfyarn`` itself does not import)."""
    return Path(startup.__file__).read_text()


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


#: The application master's environment. skein 0.8.2's web UI (its overview: the page the RM's tracking link opens)
#: reads its proxied pages' map entries by reflection, which Java 17 refuses (HTTP 500 once a page has a link): the
#: launcher of Java 9+ reads JDK_JAVA_OPTIONS (Java 8 ignores it), so the job's page gets its link there. The
#: client JIT halves the master's start-up CPU (:data:`~tfyarn.cluster._skein.JIT_OPTIONS`).
MASTER_ENV = {"JDK_JAVA_OPTIONS": " ".join(("--add-opens=java.base/java.util=ALL-UNNAMED", *JIT_OPTIONS))}


def free_restarts(spec: JobSpec, role: str) -> bool:
    """Does skein get ``retry.cluster_faults`` more restarts per task for this role? A role that can rejoin and
    whose failures end the app once the spec's budget is spent (so not a side role, whose failures are allowed)."""
    return rejoins(spec, role) and role not in SIDECAR_ROLES


def rejoins(spec: JobSpec, role: str) -> bool:
    """Can a replacement of this role's task join the running job (spec.py allows it ``max_restarts``)? Async ps
    workers and the side roles; not a ps, the chief, a sync ps or allreduce worker (those need a new attempt)."""
    return role in ("evaluator", *SIDECAR_ROLES) or (role == "worker" and spec.mode == "ps" and not spec.sync)


def build_application_spec(
    spec: JobSpec,
    shipped: Shipped,
    *,
    master_memory_mib: int = 512,
    master_vcores: int = 1,
    file_systems: Iterable[str] = (),
    attempt: int = 0,
    supervise: bool = True,
    staging_dir: str | None = None,
) -> Any:
    """A validated ``skein.ApplicationSpec`` for ``spec``; pure (no cluster, no upload). ``supervise`` adds the
    in-app supervisor's service; ``staging_dir`` is where it records the app for other machines
    (:func:`tfyarn.backends.yarn.records.record_url`)."""
    sk = skein()
    files = _files(shipped)
    scripts = {own: container_script(shipped.env, code=bool(shipped.code), own_tmpdir=own) for own in (True, False)}
    services: dict[str, Any] = {}
    for role in ROLE_ORDER:
        r = spec.roles.get(role)
        if r is not None and r.instances > 0:
            services[role] = _role_service(spec, role, r, files, scripts["TMPDIR" not in r.env], attempt, supervise)
    if supervise:
        services[SUPERVISOR_SERVICE] = _supervisor_service(shipped, files, attempt, staging_dir)
    return sk.ApplicationSpec(
        name=spec.name,
        queue=spec.queue,
        user=spec.user or "",
        tags=_tags(spec, attempt, supervise),
        services=services,
        acls=_acls(spec),
        file_systems=list(file_systems),
        master=sk.Master(resources=sk.Resources(memory=master_memory_mib, vcores=master_vcores), env=MASTER_ENV),
    )


def _role_service(
    spec: JobSpec, role: str, r: Role, files: dict[str, Any], script: str, attempt: int, supervise: bool
) -> Any:
    """The skein service of one tfyarn role: its instances, resources, files, env and restart budget."""
    sk = skein()
    env = dict(r.env)
    env.update({"TFYARN_ROLE": role, "TFYARN_ATTEMPT": str(attempt)})
    return sk.Service(
        resources=sk.Resources(memory=r.memory_mib, vcores=r.vcores, gpus=r.gpus),
        script=script,
        instances=r.instances,
        files=dict(files),
        env=env,
        # skein counts restarts per service (all instances share one budget), tfyarn's spec per task:
        # max_restarts x instances, enforced by the container's exit report (task/yarn/exit_report.py), which
        # counts only the failures triage puts on the task. A role that can rejoin gets retry.cluster_faults more
        # per task from skein: a preempted container or a lost node's is replaced without using the budget.
        # Not a side role (allow_failures): its failures never end the app, so no exit report could hold
        # a failing one (a tensorboard that cannot start) to the spec's budget.
        max_restarts=(r.max_restarts + (spec.retry.cluster_faults * free_restarts(spec, role))) * r.instances
        if r.restart != "never"
        else 0,
        # with the in-app supervisor, skein never fails the app on its own: a task's exit report (or the
        # supervisor, for a container that died without one) ends the app, or the supervisor runs the job's
        # next attempt in it (contracts.in_app); skein's "Failure in service" would end that too
        allow_failures=role in SIDECAR_ROLES or supervise,
        node_label=r.node_label or "",
    )


def _supervisor_service(shipped: Shipped, files: dict[str, Any], attempt: int, staging_dir: str | None) -> Any:
    """The in-app supervisor's skein service (:data:`SUPERVISOR_SERVICE`): one small container, restarted if
    killed, without the job's code."""
    sk = skein()
    env = {"TFYARN_ATTEMPT": str(attempt), **({"TFYARN_STAGING_DIR": staging_dir} if staging_dir else {})}
    return sk.Service(
        resources=sk.Resources(memory=SUPERVISOR_MEMORY_MIB, vcores=1),
        script=container_script(shipped.env, code=False, supervisor=True),
        instances=1,
        files={k: f for k, f in files.items() if k != CODE_DIR},
        env=env,
        max_restarts=SUPERVISOR_RESTARTS,
        # a supervisor killed is restarted (it takes up the app's attempts); its script exits non-zero otherwise
        # only when the supervisor could not start: that fails the app (skein's "Failure in service", after its
        # restarts failed the same way), never leaving the tasks unsupervised; one that fails later exits 0
        allow_failures=False,
    )


def _acls(spec: JobSpec) -> Any:
    return skein().ACLs(
        enable=spec.acls.enable,
        view_users=list(spec.acls.view_users),
        view_groups=list(spec.acls.view_groups),
        modify_users=list(spec.acls.modify_users),
        modify_groups=list(spec.acls.modify_groups),
        ui_users=list(spec.acls.ui_users),
    )


def _tags(spec: JobSpec, attempt: int, supervise: bool) -> set[str]:
    """The app's YARN tags: tfyarn's, the job's name and the spec's tags (YARN lower-cases tags and takes at most
    100 characters), the attempt's and the supervised mark."""
    tags = {t.strip().lower()[:100] for t in (TFYARN_TAG, f"tfyarn-name:{spec.name}", *spec.tags) if t.strip()}
    return tags | ({f"{ATTEMPT_TAG}{attempt}"} if attempt else set()) | ({SUPERVISED_TAG} if supervise else set())


# ----------------------------------------------------------------------------------------------------- shipped files


def _zip(root: Path, dest_dir: str | os.PathLike, name: str, write: bool, arc_prefix: str = "") -> str:
    """``dest_dir/<name>-<hash of root>.zip``, content-addressed (reused when unchanged; ``write=False`` only names
    it): a deterministic zip (sorted names, fixed timestamps), so equal trees give byte-equal archives."""
    dest = Path(dest_dir) / f"{name}-{hash_tree(root)[:24]}.zip"
    if not write or dest.is_file():
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
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
    return str(dest)


def build_code_zip(code_dir: str | os.PathLike, dest_dir: str | os.PathLike, write: bool = True) -> str:
    """The job's code dir, zipped (:func:`_zip`)."""
    root = Path(code_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"code: {code_dir} is not a directory")
    return _zip(root, dest_dir, "code", write)


def build_tfyarn_zip(dest_dir: str | os.PathLike, write: bool = True) -> str:
    """This tfyarn package, zipped with ``tfyarn/…`` at the archive root (:func:`_zip`)."""
    return _zip(Path(tfyarn.__file__).resolve().parent, dest_dir, "tfyarn", write, arc_prefix="tfyarn/")


def write_spec_file(spec: JobSpec, dest_dir: str | os.PathLike, write: bool = True) -> str:
    """The spec the tasks read: the resolved spec without ``kerberos`` (the gateway's login, not theirs), at a
    content-addressed path (same spec, same path: the dry run's YAML is the submitted one)."""
    text = spec.model_copy(update={"kerberos": None}).to_json()
    p = Path(dest_dir) / f"spec-{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"
    if write and not p.is_file():
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.partial")
        tmp.write_text(text)
        os.replace(tmp, p)
    return str(p)


def to_yaml(app_spec: Any) -> str:
    """Stable, readable YAML of ``app_spec`` (sorted keys and tags, scripts as literal blocks; skein's own writes
    tags in set order and folds scripts); ``skein.ApplicationSpec.from_yaml`` loads it back to an equal object."""

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, data: str) -> Any:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, _str)
    d = app_spec.to_dict()
    d["tags"] = sorted(d.get("tags", []))
    return yaml.dump(d, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=120)
