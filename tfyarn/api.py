"""The Python API (the CLI, the Airflow operator and users' scripts all go through it).

    import tfyarn.api as tfy
    spec = tfy.load("specs/quickstart.yaml", overrides=["data.epochs=1"])
    status = tfy.run(spec)                  # local: foreground, returns the final AppStatus
    app_id = tfy.submit(spec, "yarn")       # returns at once; then tfy.status / tfy.wait / tfy.logs / tfy.kill

Backends are chosen by name (``local`` / ``yarn``) or, for an existing app, by its id (``local-…`` vs
``application_…``). With no name, YARN is used when a cluster is configured (``HADOOP_CONF_DIR``), else local.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

from tfyarn import paths
from tfyarn.backends import registry
from tfyarn.backends.base import AppStatus, Backend, Request
from tfyarn.spec import JobSpec, load_spec

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


def _detached(b: Backend, detach_report: bool) -> Backend:
    """``b``, writing a YARN run report from a detached process when asked (the local backend writes its own)."""
    if detach_report and hasattr(b, "detached_report"):
        b.detached_report = True  # type: ignore[attr-defined]
    return b


def backend_for_app(app_id: str) -> Backend:
    """The backend that owns ``app_id``: ``local-…`` ids are local apps, ``application_…`` ids YARN's."""
    return get_backend(registry.backend_name_for_app(app_id))


def dryrun(spec: JobSpec, backend: str | None = None) -> Request:
    """What ``submit`` would start (YARN: the skein ApplicationSpec and the files it ships; local: the processes);
    ``str()`` of it is readable (YARN: loadable skein YAML). Starts, uploads and writes nothing."""
    with get_backend(backend) as b:
        return b.dryrun(spec)


def run(spec: JobSpec, backend: str | None = None, echo: Callable[[str, str], None] | None = None,
        on_update: Callable[[AppStatus], None] | None = None, timeout: float | None = None,
        detach_report: bool = False) -> AppStatus:
    """Run a job to its end. Local: in the foreground (Ctrl-C stops every task). YARN: submit and follow, with
    the spec's job attempts (``retry.max_attempts``) as new applications; ``detach_report``: the run report is
    written by a detached process after this returns (the CLI's exit does not wait for it)."""
    with _detached(get_backend(backend), detach_report) as b:
        return b.run(spec, echo=echo, on_update=on_update, timeout=timeout)


def submit(spec: JobSpec, backend: str | None = None) -> str:
    """Start the job (its dry-run request, exactly) and return its app id without waiting."""
    with get_backend(backend) as b:
        return b.schedule(b.dryrun(spec))


def status(app_id: str) -> AppStatus:
    with backend_for_app(app_id) as b:
        return b.status(app_id)


def wait(app_id: str, timeout: float | None = None,
         on_update: Callable[[AppStatus], None] | None = None, detach_report: bool = False) -> AppStatus:
    with _detached(backend_for_app(app_id), detach_report) as b:
        return b.wait(app_id, timeout=timeout, on_update=on_update)


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
    checkpoints (a URL any machine can read, e.g. the next Airflow task's worker) when the report there is this
    app's, else this machine's copy (``$TFYARN_HOME/yarn/<app>/``). ``build``: a YARN app nobody wrote a report for
    (the operator's deferred wait follows from the triggerer and samples nothing) gets one now, from the points its
    training tasks recorded next to the checkpoints."""
    from tfyarn.report import REPORT_JSON, report_at
    if st.backend == "local":
        p = Path(st.tracking_url) / REPORT_JSON if st.tracking_url else None
        return str(p) if p is not None and p.exists() else None
    ckpt = (st.summary or {}).get("checkpoint_dir")
    local = paths.yarn_report_dir(st.app_id) / REPORT_JSON
    for attempt in range(2 if build else 1):
        found = report_at(ckpt, st.app_id) if ckpt else None
        if found or local.exists():
            return found or str(local)
        if attempt == 0 and build and st.state.is_terminal:
            with get_backend(st.backend) as b:
                b.write_report(st)  # type: ignore[attr-defined]
    return None


def list_apps(backend: str | None = None) -> list[AppStatus]:
    with get_backend(backend) as b:
        return b.list()


def export(spec: JobSpec, checkpoint: str | None = None, to: str | None = None) -> dict:
    """Export a committed checkpoint of ``spec.checkpoint.dir`` (by name, e.g. ``ckpt-120``; default the latest) as a
    SavedModel under ``to`` (a URL or a path relative to the current directory; default ``spec.export.dir``, which
    is relative to the spec file like every path in it), version = its global step. Needs TensorFlow here.

    Returns ``{"url", "version", "checkpoint", "seconds", "downloaded"}``. Raises :class:`ExportError` when there
    is nothing to export (no checkpoint dir, no such checkpoint, no destination, no TensorFlow)."""
    import importlib.util
    from tfyarn.errors import ExportError
    if importlib.util.find_spec("tensorflow") is None:
        raise ExportError("export builds the model with TensorFlow, which is not installed here "
                          "(pip install 'tfyarn[tf-cpu]', or run it where the job's environment is)")
    from tfyarn.runtime.warm_imports import keep_matplotlib_out_of_keras
    from tfyarn.train.checkpoint import CheckpointStore
    from tfyarn.train.export import export_checkpoint
    keep_matplotlib_out_of_keras()          # TF imports Keras, which would import matplotlib: nothing is drawn here
    entry = None
    if spec.checkpoint.dir:                 # (without one, export_checkpoint says so)
        store = CheckpointStore(spec.resolve_path(spec.checkpoint.dir), keep=spec.checkpoint.keep)
        idx = store.index()                 # read once: the named or the latest entry, and the list for messages
        entries = idx.get("checkpoints", [])
        if not entries:
            raise ExportError(f"export: no committed checkpoint in {store.url}")
        name = checkpoint or idx.get("latest")
        entry = next((e for e in reversed(entries) if e["name"] == name), None)
        if entry is None:
            raise ExportError(f"export: no checkpoint {name!r} in {store.url} (committed: "
                              f"{', '.join(e['name'] for e in entries)})")
    if to and "://" not in to:
        to = str(Path(to).resolve())        # a path given here is relative to the caller's cwd, not the spec's dir
    from tfyarn.train.checkpoint import CheckpointMismatch
    try:
        return export_checkpoint(spec, entry, to=to)
    except (CheckpointMismatch, OSError) as exc:
        # the spec's model does not fit the checkpoint (params changed), or the destination cannot be written
        raise ExportError(f"export: {exc}") from exc
