"""The Python API (the CLI, the Airflow operator and users' scripts all go through it).

    import tfyarn.api as tfy
    spec = tfy.load("specs/quickstart.yaml", overrides=["data.epochs=1"])
    status = tfy.run(spec)                  # local: foreground, returns the final AppStatus
    app_id = tfy.submit(spec, "yarn")       # returns at once; then tfy.status / tfy.wait / tfy.logs / tfy.kill

Backends are chosen by name (``local`` / ``yarn``) or, for an existing app, by its id (``local-…`` vs
``application_…``). With no name, YARN is used when a cluster is configured (``HADOOP_CONF_DIR``), else local.
"""

from __future__ import annotations

import json

import os
from pathlib import Path
from typing import Any, Callable, Iterator

from tfyarn import runner
from tfyarn.backends import registry
from tfyarn.backends.base import Backend, Request
from tfyarn.contracts.status import AppState, AppStatus
from tfyarn.errors import AppNotFound, TfyarnError
from tfyarn.spec import JobSpec, load_spec

__all__ = [
    "AppState",
    "AppStatus",
    "BACKENDS",
    "check_files",
    "dryrun",
    "export",
    "get_backend",
    "index_data",
    "kill",
    "list_apps",
    "load",
    "logs",
    "pack",
    "predict",
    "predict_job",
    "report",
    "report_location",
    "run",
    "status",
    "submit",
    "wait",
    "write_synthetic",
]

BACKENDS = tuple(registry.KNOWN)


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobSpec:
    """Load and validate a spec file; raises SpecError listing every problem. ``overrides``: ``key.path=value``
    strings (one string is one override)."""
    return load_spec(path, [overrides] if isinstance(overrides, str) else overrides)


def default_backend_name() -> str:
    return "yarn" if os.environ.get("HADOOP_CONF_DIR") else "local"


def get_backend(name: str | None = None, **options) -> Backend:
    """A backend by name (:mod:`tfyarn.backends.registry`); unknown or not installed → a one-line usage error."""
    return registry.get_backend(name or default_backend_name(), **options)


def backend_for_app(app_id: str) -> Backend:
    """The backend that owns ``app_id``: ``local-…`` ids are local apps, ``application_…`` ids YARN's."""
    return get_backend(registry.backend_name_for_app(app_id))


def dryrun(spec: JobSpec, backend: str | None = None) -> Request:
    """What ``submit`` would start (YARN: the skein ApplicationSpec and the files it ships; local: the processes);
    ``str()`` of it is readable (YARN: loadable skein YAML). Starts, uploads and writes nothing."""
    with get_backend(backend) as b:
        return b.dryrun(spec)


def run(
    spec: JobSpec,
    backend: str | None = None,
    echo: Callable[[str, str], None] | None = None,
    on_update: Callable[[AppStatus], None] | None = None,
    timeout: float | None = None,
    detach_report: bool = False,
) -> AppStatus:
    """Run a job to its end. Local: in the foreground (Ctrl-C stops every task). YARN: submit and follow, with
    the spec's job attempts (``retry.max_attempts``) as new applications; ``detach_report``: the run report is
    written by a detached process after this returns (the CLI's exit does not wait for it)."""
    with get_backend(backend) as b:
        b.detached_report = detach_report
        return runner.run(b, spec, echo=echo, on_update=on_update, timeout=timeout)


def submit(spec: JobSpec, backend: str | None = None) -> str:
    """Start the job (its dry-run request, exactly) and return its app id without waiting."""
    with get_backend(backend) as b:
        return b.submit(spec)


def predict_job(spec: JobSpec, overwrite: bool = False) -> JobSpec:
    """``spec`` as the scoring job ``tfyarn predict`` starts (docs/predict.md): ``job: predict`` (workers only),
    ``predict.saved_model``'s ``<dir>/latest`` fixed to the newest version now (every task and attempt scores with
    the same model), and the output dir checked once for the whole run: one holding anything is refused (exit 2)
    unless ``overwrite``, which removes it. Attempts and restarts after this keep what earlier ones committed."""
    from tfyarn.cluster import hdfs
    from tfyarn.errors import PreflightError
    from tfyarn.predict.output import check_output
    from tfyarn.predict.signature import resolve_latest
    from tfyarn.spec import load_spec_dict

    if spec.job != "predict":
        doc = json.loads(spec.to_json())
        base_dir = doc.pop("base_dir", None)
        spec = load_spec_dict(doc | {"job": "predict"}, base_dir=base_dir)
    p = spec.predict
    assert p is not None  # (validated: job predict needs the section)
    if spec.kerberos is not None:  # the output and the model are read with the gateway's login, as submit's are
        from tfyarn.cluster import kerberos

        kerberos.login(kerberos.resolved(spec), hdfs.load_hadoop_conf())
    if p.saved_model:
        try:
            fixed = resolve_latest(p.saved_model, hdfs.get_fs)
        except OSError as exc:
            raise PreflightError(f"predict.saved_model: {exc}", [str(exc)]) from None
        spec = spec.model_copy(update={"predict": p.model_copy(update={"saved_model": fixed})})
    problem = check_output(p.output, overwrite, hdfs.get_fs)
    if problem:
        raise PreflightError(problem, [problem])
    return spec


def predict(
    spec: JobSpec,
    backend: str | None = None,
    overwrite: bool = False,
    echo: Callable[[str, str], None] | None = None,
    on_update: Callable[[AppStatus], None] | None = None,
    timeout: float | None = None,
    detach_report: bool = False,
) -> AppStatus:
    """Score ``spec``'s ``predict.input`` with its model to the end (:func:`predict_job`, then :func:`run`)."""
    job = predict_job(spec, overwrite)
    return run(job, backend, echo=echo, on_update=on_update, timeout=timeout, detach_report=detach_report)


def status(app_id: str) -> AppStatus:
    with backend_for_app(app_id) as b:
        return b.status(app_id)


def wait(
    app_id: str,
    timeout: float | None = None,
    on_update: Callable[[AppStatus], None] | None = None,
    detach_report: bool = False,
) -> AppStatus:
    with backend_for_app(app_id) as b:
        b.detached_report = detach_report
        return runner.wait(b, app_id, timeout=timeout, on_update=on_update)


def logs(app_id: str, task: str | None = None, follow: bool = False) -> Iterator[str]:
    with backend_for_app(app_id) as b:  # closed once the caller has read (or abandoned) the lines
        yield from b.logs(app_id, task=task, follow=follow)


def kill(app_id: str) -> AppStatus:
    """Stop the app and every task; return its final status. An app that has already ended is left as it is and
    its status returned: killing is idempotent (a scheduler's ``on_kill`` may come after the end)."""
    with backend_for_app(app_id) as b:
        st = b.status(app_id)
        if not st.state.is_terminal:
            b.kill(app_id)
            st = b.status(app_id)
        return st


def report_location(st: AppStatus, build: bool = True) -> str | None:
    """Where the run report (report.json) of an ended app is, or None. Local: its app dir. YARN: next to the
    checkpoints (a URL any machine can read) when the report there is this app's, else this machine's copy.
    ``build``: an app nobody wrote a report for (a deferred wait samples nothing) gets one now."""
    with get_backend(st.backend) as b:
        return b.report_location(st, build)


def report(
    app_id: str | None = None, source: str | None = None, to: str | Path | None = None
) -> tuple[dict[str, Any], str | None]:
    """The report of an app and where its PNG is (a local path or a URL).

    ``source``: a directory URL holding ``report.json``; without it, where the backend of ``app_id`` finds its report
    (:meth:`Backend.saved_report`). ``to``: copy report.json and the PNG into this local dir (the PNG returned is
    then the copy).
    """
    import json

    import fsspec

    from tfyarn.report import REPORT_JSON, REPORT_PNG, copy_report

    where = _report_dir(app_id, source)
    try:
        with fsspec.open(f"{where}/{REPORT_JSON}", "rt") as f:
            rep = json.load(f)
    except FileNotFoundError:
        raise AppNotFound(f"no {REPORT_JSON} under {where}") from None
    png = f"{where}/{REPORT_PNG}" if rep.get("plot") else None
    if to is not None:
        written = copy_report(rep, png, Path(to))
        png = str(written[1]) if len(written) > 1 else None
    return rep, png


def _report_dir(app_id: str | None, source: str | None) -> str:
    if source:
        return source.rstrip("/")
    if app_id:
        with backend_for_app(app_id) as b:
            return b.saved_report(app_id).rpartition("/")[0]
    raise TfyarnError("give an app id or --from URL")


def report_page(app_id: str | None = None, source: str | None = None, host: str = "127.0.0.1", port: int = 0):
    """The job's page (:mod:`tfyarn.web`) of an ended app, from its run report: the final status and the curves
    (the follower's samples, with the tasks' own history from next to the checkpoints). Returns the started
    :class:`tfyarn.web.StatusPage` (``.url``; ``.close()`` ends it)."""
    import fsspec

    from tfyarn.report import HISTORY_FILE, load_task_history, merge_points
    from tfyarn.web import StatusPage

    rep, _ = report(app_id, source)
    where = _report_dir(app_id, source)
    followed = []
    try:
        with fsspec.open(f"{where}/{HISTORY_FILE}", "rt") as f:
            followed = [json.loads(line) for line in f.read().splitlines() if line.strip().startswith("{")]
    except (FileNotFoundError, ValueError):
        pass
    recorded = load_task_history(rep["checkpoint_dir"], rep["app_id"]) if rep.get("checkpoint_dir") else []
    points = merge_points(followed, recorded)
    doc = rep.get("status") or {  # a report written before it kept the final status
        "schema": "tfyarn.status/1",
        "app_id": rep.get("app_id"),
        "name": rep.get("name"),
        "state": rep.get("state"),
        "exit_code": rep.get("exit_code"),
        "diagnostics": rep.get("diagnostics", ""),
        "tasks": [],
        "progress": {},
        "started": rep.get("started"),
        "finished": rep.get("finished"),
        "summary": rep.get("summary"),
    }
    return StatusPage(lambda: doc, lambda: points, host=host, port=port).start()


def check_files(spec: JobSpec, backend: str | None = None) -> None:
    """What run/submit check before starting (data globs, first records, writable dirs, init_from, and — when the
    tasks run this Python: locally, or a packed env on YARN — the model's module and the roles' packages)."""
    from tfyarn.gateway.preflight import run_file_checks

    run_file_checks(spec, task_env=(backend or default_backend_name()) == "local" or spec.environment.source == "pack")


def probe(spec: JobSpec, timeout: float = 180.0) -> dict[str, Any]:
    """What the nodes' Python of ``spec``'s environment can import, from one short YARN container (issue 41):
    ``{python, version, modules: {name: {ok, version | error}}, missing, app_id}`` (``missing``: the first module a
    task needs that does not import, as a diagnosis says it; None when it can start), or ``{failed, app_id}``."""
    from tfyarn.backends.yarn.probe import run_probe

    with get_backend("yarn") as b:
        return run_probe(b, spec, timeout=timeout)


def probe_problem(report: dict[str, Any]) -> str | None:
    """What a probe's report says stops the job (None: its tasks can start)."""
    return report.get("missing") or report.get("failed")


def pack(spec: JobSpec, staging_dir: str | None = None, progress: Callable[[str, int, int | None], None] | None = None):
    """Pack the spec's environment and stage it for YARN now (the cache submit uses); 0 bytes when already staged.
    Returns the :class:`tfyarn.gateway.packaging.EnvRef`."""
    from tfyarn.backends.yarn.backend import pack as pack_env

    return pack_env(spec, staging_dir, progress=progress)


def index_data(
    urls: list[str],
    compression: str = "auto",
    on_corrupt: str = "fail",
    cache_dir: str | None = None,
    staging_dir: str | None = None,
    *,
    format: str = "auto",
) -> tuple[Any, str, dict[str, int], str | None]:
    """Index data files (``format``: ``data.format``) ahead of the jobs that read them: (the manifest, its summary
    for people, what it took — files_indexed, bytes_read, cache_hits —, the cache dir of read-only data). HDFS/viewfs
    data with no ``cache_dir``: the YARN staging dir's ``index/`` (what YARN jobs read)."""
    from tfyarn.data import build_manifest, summarize
    from tfyarn.data.fileindex import STATS

    if cache_dir is None and any(u.split(":", 1)[0] in ("hdfs", "viewfs") for u in urls):
        with get_backend("yarn", staging_dir=staging_dir) as b:
            cache_dir = b.index_cache_dir()
    before = STATS.snapshot()
    m = build_manifest(
        urls, compression=compression, format=format, on_corrupt=on_corrupt, cache_dir=cache_dir, whole=True
    )
    got = STATS.snapshot()
    return m, summarize(m), {k: got[k] - before[k] for k in ("files_indexed", "bytes_read", "cache_hits")}, cache_dir


def write_synthetic(out_dir: str, **options: Any) -> list[str]:
    """A synthetic, learnable TFRecord data set (:func:`tfyarn.data.synth.write_synthetic`)."""
    from tfyarn.data import write_synthetic as write

    return write(out_dir, **options)


def list_apps(backend: str | None = None) -> list[AppStatus]:
    with get_backend(backend) as b:
        return b.list()


def driver_status() -> dict[str, Any]:
    """tfyarn's shared skein drivers on this machine (:mod:`tfyarn.backends.yarn.driver`): ``drivers``, each
    with address, pids, login, which commands use it (pids), when it stops; ``skein_global``: a user's own ``skein
    driver start`` (used first), or None."""
    from tfyarn.backends.yarn import driver

    return {"drivers": [driver.describe(r) for r in driver.records()], "skein_global": driver.skein_global()}


def driver_stop() -> list[dict]:
    """Stop tfyarn's shared skein drivers now (a user's own ``skein driver start`` is left running)."""
    from tfyarn.backends.yarn import driver

    return [r.__dict__ for r in driver.stop_all()]


def export(spec: JobSpec, checkpoint: str | None = None, to: str | None = None) -> dict:
    """Export a committed checkpoint of ``spec.checkpoint.dir`` (by name, e.g. ``ckpt-120``; default the latest) as a
    SavedModel under ``to`` (a URL or a path relative to the current directory; default ``spec.export.dir``, relative
    to the spec file), version = its global step. Needs TensorFlow here. Returns ``{"url", "version", "checkpoint",
    "seconds", "downloaded"}``; :class:`ExportError` when there is nothing to export."""
    import importlib.util
    from tfyarn.errors import ExportError

    if importlib.util.find_spec("tensorflow") is None:
        raise ExportError(
            "export builds the model with TensorFlow, which is not installed here "
            "(pip install 'tfyarn[tf-cpu]', or run it where the job's environment is)"
        )
    from tfyarn.task.warm_imports import keep_matplotlib_out_of_keras
    from tfyarn.train.checkpoint import CheckpointMismatch, CheckpointStore
    from tfyarn.train.export import export_checkpoint

    keep_matplotlib_out_of_keras()  # TF imports Keras, which would import matplotlib: nothing is drawn here
    entry = None
    if spec.checkpoint.dir:  # (without one, export_checkpoint says so)
        store = CheckpointStore(spec.checkpoint.dir, keep=spec.checkpoint.keep)
        idx = store.index()  # read once: the named or the latest entry, and the list for messages
        entries = idx.get("checkpoints", [])
        if not entries:
            raise ExportError(f"export: no committed checkpoint in {store.url}")
        name = checkpoint or idx.get("latest")
        entry = next((e for e in reversed(entries) if e["name"] == name), None)
        if entry is None:
            raise ExportError(
                f"export: no checkpoint {name!r} in {store.url} (committed: {', '.join(e['name'] for e in entries)})"
            )
    if to and "://" not in to:
        to = str(Path(to).resolve())  # a path given here is relative to the caller's cwd, not the spec's dir
    try:
        return export_checkpoint(spec, entry, to=to)
    except (CheckpointMismatch, OSError) as exc:
        # the spec's model does not fit the checkpoint (params changed), or the destination cannot be written
        raise ExportError(f"export: {exc}") from exc
