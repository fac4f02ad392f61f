"""An app's records: this machine's (``$TFYARN_HOME/yarn/<app>.json``) and the one its in-app supervisor leaves in the
staging dir (``<staging dir>/apps/<app>.json``, plus the run report beside it) for machines that did not submit it.

Why: the application master, and the KV with the tasks' progress, is gone once the app ends. Every status read of a
running app is saved here (with the spec at submit), so ``status`` of a finished app still shows its tasks, last
progress, summary and failure diagnoses; another machine finds the spec and the last snapshot in the staging dir.
Light imports only: the in-app supervisor (no TF, a small container) writes the staging-dir record.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from tfyarn.common import paths
from tfyarn.spec import JobSpec, load_spec_json
from tfyarn.cluster import hdfs
from tfyarn.common.fsio import replace
from tfyarn.report import report_at

log = logging.getLogger(__name__)

#: ``<staging dir>/apps/<app id>.json``: the app's record for machines that did not submit it.
RECORD_DIR = "apps"


# ------------------------------------------------------------------------------------------- this machine's record
def load(app_id: str) -> dict[str, Any]:
    """This machine's record of ``app_id`` ({} when it has none)."""
    try:
        return json.loads(paths.yarn_state_file(app_id).read_text())
    except (OSError, ValueError):
        return {}


def save(app_id: str, **updates: Any) -> None:
    """Merge ``updates`` into this machine's record of ``app_id`` (renamed into place: readers never see half)."""
    p = paths.yarn_state_file(app_id)
    p.parent.mkdir(parents=True, exist_ok=True)
    d = {**load(app_id), "app_id": app_id, **updates}
    tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(d, indent=1, default=str))
    os.replace(tmp, p)


def saved_spec(app_id: str, saved: dict[str, Any] | None = None) -> JobSpec | None:
    """The spec this machine submitted ``app_id`` with (None for an app submitted elsewhere)."""
    saved = load(app_id) if saved is None else saved
    return load_spec_json(saved["spec"]) if saved.get("spec") else None


# ------------------------------------------------------------------------------------ the staging dir's record
def record_url(staging_dir: str, app_id: str) -> str:
    return hdfs.join(staging_dir, RECORD_DIR, f"{app_id}.json")


def report_url(staging_dir: str, app_id: str) -> str:
    """Where the supervisor puts the app's run report (any job: one without a checkpoint dir has it only here)."""
    return hdfs.join(staging_dir, RECORD_DIR, app_id)


def read_record(staging_dir: str, app_id: str) -> dict[str, Any]:
    """The record the app's supervisor wrote ({} when there is none: an app without one, or another staging dir)."""
    import fsspec

    try:
        with fsspec.open(record_url(staging_dir, app_id), "rt") as f:
            d = json.load(f)
    except Exception as exc:  # noqa: BLE001 - (no such file, no HDFS configured here: hdfs-native's RuntimeError)
        log.debug("no supervisor record of %s in %s: %s", app_id, staging_dir, exc)
        return {}
    return d if isinstance(d, dict) and d.get("app_id") == app_id else {}


def write_record(staging_dir: str, app_id: str, record: dict[str, Any]) -> None:
    import fsspec

    url = record_url(staging_dir, app_id)
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with fs.open(tmp, "wb") as f:
        f.write(json.dumps(record, default=str).encode())
    replace(fs, tmp, path)


def publish_report(staging_dir: str, app_id: str, report_dir: Path, ckpt: str | None) -> None:
    """Copy a written run report into the staging dir's ``apps/<app>/`` unless one of this app is next to the
    checkpoints (where readers look first). Never raises: a report is a convenience."""
    try:
        if ckpt and report_at(ckpt, app_id):
            return
        import fsspec

        fs, root = fsspec.core.url_to_fs(report_url(staging_dir, app_id))
        fs.makedirs(root, exist_ok=True)
        for f in sorted(Path(report_dir).glob("report.*")):
            fs.put_file(str(f), f"{root}/{f.name}")
    except Exception as exc:  # noqa: BLE001 - the job's outcome stands
        log.warning("could not upload the run report of %s to %s: %s", app_id, staging_dir, exc)
