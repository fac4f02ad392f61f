"""Checks before anything is packed, uploaded or submitted: fail in seconds on the gateway, not after allocation.
Every problem found is reported at once, like spec errors:

* the data: each URL or glob matches files, the first record of its first files fits ``data.features``, and
  ``data.train`` holds one global batch; ``checkpoint.dir``/``export.dir`` writable; ``init_from`` a checkpoint;
* the queue RUNNING; each role's (and the application master's) memory / vcores within the queue's and the cluster's
  maxima; node labels the queue can use; the Kerberos keytab private (the login itself: :mod:`tfyarn.cluster.kerberos`);
* the model's module and the roles' packages in the tasks' Python, where that Python is this one; then (YARN, ps
  mode) that each ps can hold the variables, split tables' shards and optimizer slots placed on it.

The cluster is behind :class:`ClusterInfo` (two methods) so the rules are tested without a ResourceManager;
:class:`SkeinClusterInfo` asks a live one. File checks go through fsspec (``hdfs://`` via hdfs-native).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from tfyarn.cluster import hdfs, kerberos
from tfyarn.data import sources
from tfyarn.data.errors import DataError
from tfyarn.data.fileindex import DEFAULT_STRIDE
from tfyarn.data.index_cache import cached_or_indexed
from tfyarn.data.listing import Listing, data_files, mtime_of, side_file_hint
from tfyarn.data.manifest import load_manifest
from tfyarn.data.parse import decode_example, diagnose, schema
from tfyarn.data.tfrecord import first_record
from tfyarn.errors import PreflightError
from tfyarn.gateway import task_python
from tfyarn.predict.signature import mismatches, parse_signatures, resolve_latest
from tfyarn.spec import JobSpec
from tfyarn.task.warm_imports import code_refers, code_uses_keras, find_module
from tfyarn.train.checkpoint import CheckpointStore

log = logging.getLogger(__name__)

GetFs = Callable[..., tuple[Any, str]]


@dataclass(frozen=True)
class QueueInfo:
    name: str
    state: str = "RUNNING"
    max_memory_mib: int | None = None  # None: unknown (not checked)
    max_vcores: int | None = None
    node_labels: tuple[str, ...] | None = None  # accessible labels; None: unknown; ('*',): any


class ClusterInfo(Protocol):
    def queue(self, name: str) -> QueueInfo | None:
        """The queue, or None when it does not exist."""

    def max_allocation(self) -> tuple[int | None, int | None]:
        """The cluster's largest container: (memory MiB, vcores); None where unknown."""


# --------------------------------------------------------------------------------------------------- the checks


@dataclass(frozen=True)
class _Listed:
    """One ``data.train``/``data.eval`` URL, listed once for every data check."""

    section: str
    index: int
    url: str
    fs: Any = None
    files: tuple[str, ...] = ()
    error: str | None = None
    info: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)  # fsspec info of each file


def list_data(spec: JobSpec, get_fs: GetFs = hdfs.get_fs) -> list[_Listed]:
    """Every data URL's files (sorted), or why it could not be listed: one listing per URL (an RPC each on HDFS)."""

    out = []
    sections: tuple[tuple[str, list[str]], ...] = (("data.train", spec.data.train), ("data.eval", spec.data.eval))
    if spec.job == "predict":  # a predict job reads predict.input only (check_predict)
        sections = (("predict.input", spec.predict.input if spec.predict else []),)
    for section, urls in sections:
        for i, url in enumerate(urls):
            try:
                fs, path = get_fs(url)
                hits = data_files(fs, path)  # as the tasks list them: side files (.x, _SUCCESS, *.crc) left out
            except Exception as exc:  # noqa: BLE001 - any filesystem error is a reportable problem here
                out.append(_Listed(section, i, url, error=f"{type(exc).__name__}: {exc}"))
                continue
            out.append(_Listed(section, i, url, fs, tuple(sorted(hits)), info=hits))
    return out


def check_data(spec: JobSpec, get_fs: GetFs = hdfs.get_fs, listed: list[_Listed] | None = None) -> list[str]:
    problems = []
    for d in listed if listed is not None else list_data(spec, get_fs):
        if d.error is not None:
            problems.append(f"{d.section}[{d.index}]: cannot list {d.url}: {d.error}")
        elif not d.files:
            problems.append(f"{d.section}[{d.index}]: {d.url} matches no files")
    return problems


#: Files sampled per data URL (their first record each): enough to catch a data set that is not the one the spec
#: describes, cheap enough for a gateway (one small read per file, also on HDFS).
SAMPLE_FILES = 2


def check_data_schema(spec: JobSpec, get_fs: GetFs = hdfs.get_fs, listed: list[_Listed] | None = None) -> list[str]:
    """The first record of the first :data:`SAMPLE_FILES` files of each data URL must fit ``data.features``: a wrong
    data set otherwise fails a task at its first batch, after allocation and TF's import. With ``on_corrupt: skip``
    one bad sample is not a problem (the record may be one to skip); every sample of a URL not fitting is.
    """

    fields = schema(spec.data.features)
    problems = []
    for d in listed if listed is not None else list_data(spec, get_fs):
        found: list[str] = []
        for hit in d.files[:SAMPLE_FILES]:
            name = d.fs.unstrip_protocol(hit)
            if _table_problem(name, spec, fields, found):  # Parquet / ORC: columns from the footer
                continue
            try:
                with d.fs.open(hit, "rb") as f:
                    payload = first_record(f, name, spec.data.compression)
            except DataError as exc:
                named = d.files == (d.fs._strip_protocol(d.url),)  # the URL is this file
                found.append(str(exc) + ("" if named else side_file_hint(name, exc)))
                continue
            except Exception as exc:  # noqa: BLE001 - a filesystem error here is not this check's finding
                log.debug("preflight: sampling %s failed: %s", name, exc)
                continue
            if payload is None:
                continue  # an empty file: nothing to check
            bad = diagnose(payload, fields)
            if bad is not None:
                try:
                    has = ", ".join(repr(k) for k in sorted(decode_example(payload))) or "none"
                except Exception:  # noqa: BLE001 - not an Example at all: diagnose said so
                    has = None
                found.append(
                    f"{name} record 0 does not fit data.features: {bad[1]}"
                    + (f" (the record has: {has})" if has else "")
                )
            elif spec.data.on_corrupt == "skip":
                found = []
                break  # one sample fits: the data set is the one described
        problems += [f"{d.section}[{d.index}]: {p}" for p in found[:1]]  # the first is enough to act on
    return problems


def _table_problem(name: str, spec: JobSpec, fields: tuple, found: list[str]) -> bool:
    """For a file whose source checks the features without reading records (Parquet / ORC: from the footer), that
    check (a problem appended to ``found``); True when the source did (or could not here: no pyarrow on this host),
    False when records must be sampled (TFRecord)."""

    try:
        return sources.for_file(name, spec.data.format).check_file(name, fields)
    except DataError as exc:
        if "needs pyarrow" in str(exc):
            log.debug("preflight: %s", exc)  # the tasks check it (they need pyarrow anyway)
        else:
            found.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - a filesystem error here is not this check's finding
        log.debug("preflight: reading the footer of %s failed: %s", name, exc)
    return True


#: What counting ``data.train`` may cost (:func:`check_enough_records`): bytes of files whose index is not cached
#: (read to index them, and the index cached for the tasks, which would read them anyway), and cached indexes read
#: (one small read each). A data set with fewer records than one global batch is small; a large one reaches a
#: global batch within its first files, where counting stops.
COUNT_BUDGET_BYTES = 64 << 20
COUNT_MAX_FILES = 256


def check_enough_records(spec: JobSpec, listed: list[_Listed]) -> list[str]:
    """``data.train`` must hold at least one global batch (``batch_size`` x training tasks), or no step can be planned
    and every training task fails at start. Counted from the cached indexes, then by indexing the smallest files
    within :data:`COUNT_BUDGET_BYTES`; data that cannot be counted that cheaply, or not indexed (damaged data is the
    tasks' to report, with file and offset), passes."""

    train = [d for d in listed if d.section == "data.train"]
    if not train or any(d.error is not None or not d.files for d in train):
        return []  # check_data reports these
    files = _train_files(listed)
    need, data, opts = spec.global_batch_size, spec.data, _index_options(spec)
    count, uncounted = 0, []
    try:
        for i, (url, (size, mtime)) in enumerate(sorted(files.items())):
            if i == COUNT_MAX_FILES:
                return []  # too many files to count here
            fi = cached_or_indexed(url, size, mtime, read=False, **opts)
            if fi is None:
                uncounted.append((size, url, mtime))
                continue
            count += fi.records
            if count >= need:
                return []
        budget = COUNT_BUDGET_BYTES
        for size, url, mtime in sorted(uncounted):
            reads_all = sources.for_file(url, data.format).index_reads_data
            cost = size if reads_all else min(size, 1 << 16)  # (tables: a footer)
            if cost > budget:
                return []  # not cheap to know
            budget -= cost
            indexed = cached_or_indexed(url, size, mtime, **opts)
            count += indexed.records if indexed is not None else 0
            if count >= need:
                return []
    except (DataError, OSError) as exc:
        log.debug("preflight: counting the records of data.train stopped: %s", exc)
        return []
    n, b = spec.num_training_workers, data.batch_size
    fix = f"lower data.batch_size to at most {count // n} or give more data" if count >= n else "give more data"
    return [
        f"data.train: {count} records are fewer than one global batch ({n} training tasks x data.batch_size "
        f"{b} = {need}): no step can be planned; {fix}"
    ]


#: Files whose cached index :func:`index_notes` looks for (one small read each); beyond, it estimates from a sample.
INDEX_PROBE_FILES = 200


def _train_files(listed: list[_Listed]) -> dict[str, tuple[int, str]]:
    """Every non-empty file ``data.train`` lists: URL → (size, mtime)."""

    return {
        d.fs.unstrip_protocol(p): (int(d.info[p]["size"]), mtime_of(d.info[p]))
        for d in listed
        if d.section == "data.train" and d.error is None
        for p in d.files
        if int(d.info.get(p, {}).get("size") or 0) > 0
    }


def _index_options(spec: JobSpec) -> dict[str, Any]:
    """How the tasks index ``data.train`` (the cache keys and where the indexes are cached)."""
    data = spec.data
    return {
        "compression": data.compression,
        "format": data.format,
        "on_corrupt": data.on_corrupt,
        "cache_dir": data.index_cache or None,
    }


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def index_notes(spec: JobSpec, listed: list[_Listed]) -> list[str]:
    """How much of ``data.train`` is not indexed yet: what the training tasks will read (1/N each) before their first
    step — once, the indexes are then cached. Nothing when the whole manifest is cached (one read)."""

    files = _train_files(listed)
    if not files:
        return []
    data, opts = spec.data, _index_options(spec)
    cache = opts["cache_dir"]
    listing = Listing(tuple((u, s, m) for u, (s, m) in sorted(files.items())), (), frozenset())
    try:
        option = sources.cache_option(data.format, data.compression)
        if load_manifest(cache, listing.digest(DEFAULT_STRIDE, option, data.on_corrupt)) is not None:
            return []
        step = max(1, len(listing.files) // INDEX_PROBE_FILES)
        sample = listing.files[::step]
        with ThreadPoolExecutor(8, thread_name_prefix="tfyarn-preflight") as ex:
            hits = list(ex.map(lambda f: cached_or_indexed(*f, read=False, **opts), sample))
    except Exception as exc:  # noqa: BLE001 - a note, never a reason to refuse the job
        log.debug("preflight: cannot tell how much data is indexed: %s", exc)
        return []
    missing: float = sum(f[1] for f, hit in zip(sample, hits) if hit is None)
    if not missing:
        return []
    sampled = len(sample) < len(listing.files)
    total = listing.total_bytes
    if sampled:
        missing = missing * total / max(1, sum(f[1] for f in sample))
    n = spec.num_training_workers
    return [
        f"data.train: {'~' if sampled else ''}{_mb(missing)} of {_mb(total)} ({len(listing.files)} files) not "
        f"indexed yet{f' (from {len(sample)} files sampled)' if sampled else ''}: the {n} training tasks read "
        f"~{_mb(missing / n)} each to index it before their first step, once (then cached in "
        f"{cache or 'this machine'}); `tfyarn data index` does it ahead of time"
    ]


def check_output_dirs(spec: JobSpec, get_fs: GetFs = hdfs.get_fs) -> list[str]:
    """``checkpoint.dir`` and ``export.dir``: create each and write + delete a probe file, the only reliable test of
    'writable' across filesystems (an export dir that is not writable would fail the job after all its training)."""
    dirs = [("checkpoint.dir", spec.checkpoint.dir), ("export.dir", spec.export.dir if spec.export else None)]
    problems = []
    for where, d in dirs:
        if not d:
            continue
        try:
            fs, path = get_fs(d)
            fs.makedirs(path, exist_ok=True)
            probe = path.rstrip("/") + f"/.tfyarn-write-test-{uuid.uuid4().hex[:12]}"
            with fs.open(probe, "wb") as f:
                f.write(b"ok")
            fs.rm(probe)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{where}: {d} is not writable: {type(exc).__name__}: {exc}")
    return problems


def check_resources(
    spec: JobSpec, cluster: ClusterInfo, master_memory_mib: int = 512, master_vcores: int = 1
) -> list[str]:
    problems = []
    q = cluster.queue(spec.queue)
    if q is None:
        return [f"queue: {spec.queue!r} does not exist on this cluster"]
    if q.state.upper() != "RUNNING":
        problems.append(f"queue: {spec.queue!r} is {q.state}, not RUNNING (it accepts no applications)")
    cmem, cvc = cluster.max_allocation()
    asks = [
        (f"roles.{name}", r.memory_mib, r.vcores, r.node_label) for name, r in spec.roles.items() if r.instances > 0
    ]
    asks.append(("application master", master_memory_mib, master_vcores, None))
    for where, mem, vc, label in asks:
        sep = "." if where.startswith("roles.") else " "
        for limit, scope in ((q.max_memory_mib, f"queue {spec.queue!r}"), (cmem, "the cluster")):
            if limit is not None and mem > limit:
                problems.append(
                    f"{where}{sep}memory: {mem} MiB exceeds the maximum container size of {scope} ({limit} MiB)"
                )
        for limit, scope in ((q.max_vcores, f"queue {spec.queue!r}"), (cvc, "the cluster")):
            if limit is not None and vc > limit:
                problems.append(f"{where}{sep}vcores: {vc} exceeds the maximum of {scope} ({limit})")
        if label and q.node_labels is not None and "*" not in q.node_labels and label not in q.node_labels:
            problems.append(
                f"{where}.node_label: {label!r} is not accessible from queue {spec.queue!r} "
                f"(accessible: {', '.join(q.node_labels) or 'none'})"
            )
    return problems


def check_kerberos(spec: JobSpec) -> list[str]:
    if not spec.kerberos:
        return []
    try:
        hdfs.check_keytab(spec.kerberos.keytab)
    except PreflightError as exc:
        return [str(exc)]
    return []


def check_warm_start(spec: JobSpec) -> list[str]:
    """``checkpoint.init_from`` is used when ``checkpoint.dir`` has no checkpoint yet; it must then hold a committed
    one listing its model variables (two small reads here, instead of every task failing after TF's import)."""
    if not spec.checkpoint.init_from:
        return []
    try:
        if spec.checkpoint.dir and CheckpointStore(spec.checkpoint.dir).latest() is not None:
            return []  # the job resumes from its own checkpoint: init_from is not read
        src = CheckpointStore(spec.checkpoint.init_from)
        latest = src.latest()
    except Exception as exc:  # noqa: BLE001 - any filesystem error is a reportable problem here
        return [f"checkpoint.init_from: cannot read {spec.checkpoint.init_from}: {type(exc).__name__}: {exc}"]
    if latest is None:
        return [
            f"checkpoint.init_from: no committed checkpoint in {src.url} (a tfyarn job's checkpoint.dir, "
            f"holding tfyarn-checkpoint.json)"
        ]
    if not latest.get("model_variables"):
        return [f"checkpoint.init_from: {latest['name']} in {src.url} does not list its model variables"]
    return []


def _installed(module: str) -> bool:
    return find_module(module, sys.path) is not None


def check_task_env(spec: JobSpec) -> list[str]:
    """The model's module and the packages the roles need, in this Python plus the spec's ``code:`` dir (call it only
    where the tasks run this env). Found without importing anything: the gateway may have no TensorFlow, and the
    job's code must not run here."""

    problems = []
    target = spec.entrypoint_parts()[0] if spec.entrypoint else spec.model
    path = ([spec.code] if spec.code else []) + sys.path
    if target.endswith(".py"):  # an entrypoint script: in code: (or a path of its own)
        script = Path(spec.code or spec.base_dir or ".") / target
        if not script.is_file():
            problems.append(
                f"entrypoint: {target} not found in {spec.code or 'the spec directory'} (set 'code:' to "
                f"the directory holding it)"
            )
        target = ""
    module = target.partition(":")[0]
    if module and find_module(module, path) is None:
        where = f"the code dir {spec.code} or " if spec.code else ""
        key = "entrypoint" if spec.entrypoint else "model"
        problems.append(
            f"{key}: module {module!r} not found in {where}the Python environment the tasks run "
            f"(a typo? its package not installed? set 'code:' to the directory holding it)"
        )
    elif module and not spec.entrypoint:
        problems += check_keras_model(spec)
    for package, extra, why in needed_packages(spec):
        if not _installed(package):
            problems.append(
                f"{why}: the '{package}' package is not installed in the Python environment the tasks run"
                + (" (it is no longer installed with TensorFlow)" if package == "tensorboard" else "")
                + f": pip install 'tfyarn[{extra}]' (or {package})"
                + (", or remove roles.tensorboard" if why == "roles.tensorboard" else "")
            )
    return problems


def check_ps_memory(spec: JobSpec, timeout: float = 120.0) -> list[str]:
    """ps mode: the model's graph built in a child process of this Python (``tfyarn.train.ps.memory_check``) to
    see what each ps would hold (variables, split tables' shards, optimizer slots) against ``roles.ps.memory``: a
    job whose tables cannot fit, or with a weight over what one ps variable may hold (1 GiB), is refused here, in
    one line, not killed by YARN or failed by TF's gRPC mid-run."""
    if spec.mode != "ps" or not spec.instances("ps") or spec.entrypoint or not spec.model:
        return []
    found, failed = _child_check(spec, "tfyarn.train.ps.memory_check", "sizing the ps of", timeout)
    if failed:  # the sizing itself failed: said, not a refusal
        log.warning("preflight: ps memory not checked: %s", failed)
    return found


def _child_check(spec: JobSpec, module: str, what: str, timeout: float) -> tuple[list[str], str | None]:
    """Run ``python -m module SPEC_JSON``: (the problems it found: its lines when it exits 2, why the check itself
    failed or None)."""

    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        f.write(spec.to_json())
        f.flush()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", module, f.name],
                check=False,
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
        except subprocess.TimeoutExpired:
            return [], f"model: {what} {spec.model} took over {timeout:g}s"
    if proc.returncode == 2:
        return [line for line in proc.stdout.splitlines() if line.strip()], None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [], f"model: {spec.model} failed when called to check it: {last}"
    return [], None


#: Packages a job's code may import that TensorFlow does not bring: (package, tfyarn's extra, what in an
#: entrypoint program's code refers to it).
_CODE_PACKAGES = (
    (
        "tensorboard",
        "tensorboard",
        re.compile(
            rb"\bTensorBoard\s*\(|\bsummary\.(?:scalar|histogram|image|text|audio)\s*\(|"
            rb"^[ \t]*(?:import|from)[ \t]+tensorboard\b",
            re.M,
        ),
    ),
    ("mlflow", "tracking", re.compile(rb"^[ \t]*(?:import|from)[ \t]+mlflow\b", re.M)),
)


def needed_packages(spec: JobSpec) -> list[tuple[str, str, str]]:
    """What the job's code will import that the env may lack, where the gateway can know it: (package, extra,
    why). A tensorboard role needs ``tensorboard``; ``tracking: {mlflow: ...}`` needs ``mlflow`` (the chief logs the
    run); an entrypoint program (its script or module, and the modules of ``code:`` it imports; read, not run)
    that refers to TensorBoard (``tf.keras.callbacks.TensorBoard``, ``tf.summary.scalar`` ...: a Keras callback
    fails at its first summary with TBNotInstalledError) or imports mlflow. The evaluator needs neither: tfyarn
    writes its event files itself."""

    out: list[tuple[str, str, str]] = []
    if spec.instances("tensorboard"):
        out.append(("tensorboard", "tensorboard", "roles.tensorboard"))
    if spec.tracking is not None and spec.tracking.mlflow:
        out.append(("mlflow", "tracking", "tracking.mlflow"))
    if spec.entrypoint:
        target = spec.entrypoint_parts()[0]
        if target.endswith(".py"):  # a script of code: (a missing one is check_task_env's problem)
            script = Path(target) if Path(target).is_absolute() else Path(spec.code or spec.base_dir or ".") / target
            target = str(script) if script.is_file() else ""
        else:
            target = target.partition(":")[0]
        for package, extra, pattern in _CODE_PACKAGES:
            if not target or any(package == p for p, _, _ in out):
                continue
            found = code_refers(target, pattern, spec.code)
            if found:
                out.append((package, extra, f"entrypoint: {Path(found).name} uses {package}"))
    return out


def unchecked_packages(spec: JobSpec) -> list[str]:
    """Warnings for a job whose tasks run a Python the gateway cannot see (``environment.python`` on the nodes, a
    prebuilt ``environment.archive``): what its code needs is named, not checked."""
    env = spec.environment
    if runs_this_python(spec) or env.source not in ("python", "archive"):
        return []
    where = f"environment.python {env.python}" if env.source == "python" else f"environment.archive {env.archive}"
    return [
        f"{why} needs the '{package}' package: preflight cannot list the packages of {where} (not this Python "
        f"environment); install 'tfyarn[{extra}]' there"
        for package, extra, why in needed_packages(spec)
    ]


def check_keras_model(spec: JobSpec, timeout: float = 300.0) -> list[str]:
    """A model whose code uses Keras: checked in a child process of this Python (``tfyarn.train.keras_check``:
    compiled, inputs named after features, in ps mode an optimizer with a v1 twin), so that a model tfyarn cannot
    train fails here (exit 2) instead of in every task. The gateway imports no TensorFlow; a job without Keras pays
    nothing."""

    if not code_uses_keras(spec.model.partition(":")[0], spec.code):
        return []
    found, failed = _child_check(spec, "tfyarn.train.keras_check", "checking the Keras model", timeout)
    return found + ([failed] if failed else [])


def runs_this_python(spec: JobSpec) -> bool:
    """Whether the YARN tasks run this very Python environment: a packed copy of it, or ``environment.python``
    naming an interpreter of this environment (the same bin directory and executable; a shared install on the nodes,
    as on a single-host or NFS cluster). Only then can the gateway check the tasks' packages."""
    env = spec.environment
    if env.source == "pack":
        return True
    if env.source != "python" or not env.python:
        return False
    theirs, ours = os.path.abspath(env.python), os.path.abspath(sys.executable)
    # a venv's python is a symlink to its base interpreter: compare the bin dir itself, then the executable
    real = os.path.realpath
    return real(os.path.dirname(theirs)) == real(os.path.dirname(ours)) and real(theirs) == real(ours)


def local_path_warnings(spec: JobSpec) -> list[str]:
    """Paths on the gateway's own disk: YARN containers on other hosts cannot read them (fine on a shared mount)."""
    urls: list[tuple[str, str | None]] = [("data.train", u) for u in spec.data.train]
    urls += [("data.eval", u) for u in spec.data.eval]
    urls += [("checkpoint.dir", spec.checkpoint.dir), ("export.dir", spec.export.dir if spec.export else None)]
    return [
        f"{where}: {u} is a local path; YARN containers on other hosts cannot see it unless it is a shared mount"
        for where, u in urls
        if u and ("://" not in u or u.startswith("file://"))
    ]


def run_preflight(
    spec: JobSpec,
    cluster: ClusterInfo | None = None,
    get_fs: GetFs = hdfs.get_fs,
    *,
    master_memory_mib: int = 512,
    master_vcores: int = 1,
    check_files: bool = True,
    size_ps: bool = False,
) -> list[str]:
    """Run every check (``cluster=None``: no queue/resource checks); raise :class:`PreflightError` listing all
    problems, else return warnings (may be empty). ``size_ps`` (a YARN submit: containers have a memory to
    exceed): also :func:`check_ps_memory`, in a child process importing TF, beside the other checks."""

    ps_memory = None
    if size_ps and runs_this_python(spec):
        sizing = ThreadPoolExecutor(1, thread_name_prefix="tfyarn-ps-sizing")
        ps_memory = sizing.submit(check_ps_memory, spec)
        sizing.shutdown(wait=False)
    problems = check_kerberos(spec)
    # can the containers' account (LinuxContainerExecutor) run the tasks' Python?
    problems += task_python.check(spec, hdfs.load_hadoop_conf())
    env_problems = check_task_env(spec) if runs_this_python(spec) else []  # the env the containers will run
    problems += env_problems
    if cluster is not None:
        problems += check_resources(spec, cluster, master_memory_mib, master_vcores)
    if check_files:
        listed = list_data(spec, get_fs)
        problems += _file_checks(spec, get_fs, listed)
    if ps_memory is not None and not env_problems:  # (a model that cannot load has said so above)
        problems += ps_memory.result()
    _raise(problems, "nothing was uploaded or submitted")
    warnings = local_path_warnings(spec) + unchecked_packages(spec)
    for w in warnings + (index_notes(spec, listed) if check_files else []):  # notes are said, not returned
        log.warning("preflight: %s", w)
    return warnings


def run_file_checks(spec: JobSpec, get_fs: GetFs = hdfs.get_fs, task_env: bool = False) -> None:
    """``tfyarn validate --check-files``: the data, checkpoint-dir and warm-start checks (no cluster to ask);
    ``task_env``: also the model module and the roles' packages, when the tasks would run this Python."""

    kerberos.login(kerberos.resolved(spec), hdfs.load_hadoop_conf())  # a keytab-only gateway lists with it
    _raise(
        _file_checks(spec, get_fs, list_data(spec, get_fs)) + (check_task_env(spec) if task_env else []),
        "validate --check-files: nothing was started",
    )


def local_resource_warnings(spec: JobSpec) -> list[str]:
    """What a local run does not do of what the spec asks: YARN gives a role's containers ``gpus`` GPUs each and
    hides the others; the local backend starts plain processes, which see every GPU of the machine (or none)."""
    asked = {r: role.gpus for r, role in spec.roles.items() if role.gpus and spec.instances(r)}
    if not asked:
        return []
    roles = ", ".join(f"roles.{r}.gpus: {n}" for r, n in asked.items())
    return [
        f"{roles}: not enforced by the local backend — its tasks see every GPU of this machine (with none, "
        f"TensorFlow runs them on the CPU); on YARN each container gets its own"
    ]


def run_local_preflight(spec: JobSpec, get_fs: GetFs = hdfs.get_fs, count_records: bool = False) -> None:
    """Before a local run starts any process: the data, checkpoint-dir and task-env checks (no cluster to ask, no
    Kerberos, and local paths are what a local run uses). ``count_records``: also :func:`check_enough_records` (it
    may index the data: the local backend asks for it, right before a start)."""
    listed = list_data(spec, get_fs)
    # the tasks' own Python (environment.python) is asked what it imports; this one is looked into without running
    env = task_python.check_local(spec) if task_python.local_python(spec) != sys.executable else check_task_env(spec)
    _raise(_file_checks(spec, get_fs, listed, count_records) + env, "nothing was started")
    for w in local_resource_warnings(spec) + index_notes(spec, listed):
        log.warning("preflight: %s", w)


def check_predict(spec: JobSpec, get_fs: GetFs = hdfs.get_fs) -> list[str]:
    """A predict job's model against ``predict.features``, before any container starts: the SavedModel's signature
    read from its ``saved_model.pb`` here (protobuf, no TensorFlow: :mod:`tfyarn.predict.signature`); one line per
    mismatch, naming both sides. A ``predict.checkpoint`` model is served on the features themselves (as ``tfyarn
    export`` does): nothing to compare before the task builds it."""

    p = spec.predict
    if p is None or not p.saved_model:
        return []
    try:
        url = resolve_latest(p.saved_model, get_fs)
        fs, path = get_fs(url)
        with fs.open(path.rstrip("/") + "/saved_model.pb", "rb") as f:
            sigs = parse_signatures(f.read())
    except Exception as exc:  # noqa: BLE001 - any filesystem or parse error is a reportable problem here
        return [f"predict.saved_model: cannot read {p.saved_model}/saved_model.pb: {type(exc).__name__}: {exc}"]
    if p.signature not in sigs:
        return [f"predict.signature: {url} has no signature {p.signature!r} (it has: {', '.join(sorted(sigs))})"]
    return [f"predict.saved_model: {m} ({url})" for m in mismatches(spec.scoring_features, sigs[p.signature][0])]


def _file_checks(spec: JobSpec, get_fs: GetFs, listed: list[_Listed], count_records: bool = True) -> list[str]:
    """The checks of the data and the output directories, every caller's (records counted unless told not to)."""
    if spec.job == "predict":
        return check_data(spec, get_fs, listed) + check_predict(spec, get_fs)
    return (
        check_data(spec, get_fs, listed)
        + check_data_schema(spec, get_fs, listed)
        + (check_enough_records(spec, listed) if count_records else [])
        + check_output_dirs(spec, get_fs)
        + check_warm_start(spec)
    )


def _raise(problems: list[str], consequence: str) -> None:
    if problems:
        n = len(problems)
        raise PreflightError(
            f"{n} problem{'s' if n != 1 else ''} found before starting the job ({consequence}):\n"
            + "\n".join(f"  - {p}" for p in problems),
            problems,
        )
