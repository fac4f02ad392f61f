"""The run report of a YARN job and its timeline: where the report is (next to the checkpoints, this machine's copy,
the staging dir), written by whoever followed the job to its end (now, or by a detached process), or copied from
the in-app supervisor's, which saw the whole run. Never changes a job's outcome.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from tfyarn.common import paths
from tfyarn.backends.yarn import phases, records
from tfyarn.backends.yarn.connection import YarnConnection
from tfyarn.contracts.status import AppStatus
from tfyarn.errors import TfyarnError
from tfyarn.report import (
    HISTORY_FILE,
    REPORT_JSON,
    REPORT_PNG,
    ProgressHistory,
    checkpoint_url,
    copy_report,
    report_at,
    write_report,
)

log = logging.getLogger(__name__)


class Reporter:
    """The report part of the YARN backend: ``status`` reads an app's (the status part's); ``detached``: the report
    of a followed job is written by a detached process (``YarnBackend``'s ``detached_report``)."""

    def __init__(self, conn: YarnConnection, status: Callable[[str], AppStatus], detached: bool = False):
        self.conn, self.status, self.detached = conn, status, detached

    def phases(self, app_id: str, st: AppStatus | None = None) -> dict[str, Any]:
        """Seconds of each phase of the job's timeline (:mod:`tfyarn.backends.yarn.phases`), from what this machine saw:
        its submit, the RM's times, the tasks' phase records in the last KV snapshot."""
        saved = records.load(app_id)
        st = st or self.status(app_id)
        rm = {"started": st.started, "launched": saved.get("am_launched"), "finished": st.finished}
        gw = {k: saved.get(k) for k in ("run_started", "env_ready", "submit_call", "submitted")}
        rec = (saved.get("snapshot") or {}).get("phases") or {}
        return phases.durations(phases.marks(gw, rm, rec))

    def report_location(self, st: AppStatus, build: bool = True) -> str | None:
        """Next to the checkpoints (a URL any machine can read, e.g. the next Airflow task's worker) when the report
        there is this app's, else this machine's copy. ``build``: an ended app nobody wrote a report for (the
        operator's deferred wait samples nothing) gets one now, from the points its tasks recorded."""
        ckpt = (st.summary or {}).get("checkpoint_dir")
        mine = paths.yarn_report_dir(st.app_id) / REPORT_JSON

        def found() -> str | None:
            return (report_at(ckpt, st.app_id) if ckpt else None) or (str(mine) if mine.exists() else None)

        where = found()
        if where is None and build and st.state.is_terminal:
            self.write_report(st)
            where = found()
        return where

    def saved_report(self, app_id: str) -> str:
        """This machine's copy (it followed the job to its end), else :meth:`report_location`'s."""
        mine = paths.yarn_report_dir(app_id) / REPORT_JSON
        where = str(mine) if mine.exists() else self.report_location(self.status(app_id))
        if where is None:
            raise TfyarnError(
                f"no report of {app_id}: it has not ended, or ended before any task recorded "
                f"progress (a report elsewhere: pass --from <the URL of its dir>)"
            )
        return where

    def keep(self, st: AppStatus) -> None:
        """An app this process followed has ended: its timeline logged, its run report written now, or by a detached
        process (``detached``) that outlives this one, so the caller's exit does not wait ~3 s for a plot and HDFS
        uploads."""
        log.debug("%s phases: %s", st.app_id, phases.text(self.phases(st.app_id, st)))
        if not self.detached:
            self.write_report(st)
            return
        d = paths.yarn_report_dir(st.app_id)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "report.log", "ab") as out:
            subprocess.Popen(
                [sys.executable, "-m", "tfyarn.backends.yarn.detached_report", st.app_id],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        log.debug("run report of %s: written by a detached process (log %s)", st.app_id, d / "report.log")

    def write_report(self, st: AppStatus) -> Path | None:
        """The run report of an ended job in ``$TFYARN_HOME/yarn/<app>/`` (None: nothing to report): a copy of the
        in-app supervisor's, which saw the whole run, else one written here and next to the checkpoints
        (:func:`tfyarn.report.write_report`) from the tasks' recorded points and this machine's samples. Called
        by whoever followed the job, and by the Airflow operator after a deferred wait. Never changes the outcome."""
        d = paths.yarn_report_dir(st.app_id)
        try:
            ckpt = checkpoint_url(records.saved_spec(st.app_id)) or (st.summary or {}).get("checkpoint_dir")
            extra = {"phases": self.phases(st.app_id, st)}
            if self._copy_in_app_report(st.app_id, ckpt, d, extra["phases"]):
                return d / REPORT_JSON
        except Exception:
            log.warning("could not write the run report of %s", st.app_id, exc_info=True)
            return None
        local = write_report(d, st, ProgressHistory.load(d / HISTORY_FILE).points, ckpt, extra)
        if local is not None:
            self._publish(st, d, ckpt)
        return local

    def _publish(self, st: AppStatus, report_dir: Path, ckpt: str | None) -> None:
        """What the in-app supervisor leaves for other machines when this follower ended the app: the report in the
        staging dir (unless next to the checkpoints), the last snapshot (tasks, progress) and final status in the
        app's record."""
        rec = records.read_record(self.conn.staging_dir, st.app_id)
        if not rec:  # an app without a supervisor, or another staging dir
            return
        records.publish_report(self.conn.staging_dir, st.app_id, report_dir, ckpt)
        if not rec.get("final"):  # the supervisor wrote its record at the start only: the end is ours
            snap = records.load(st.app_id).get("snapshot") or rec.get("snapshot")
            try:
                records.write_record(self.conn.staging_dir, st.app_id, rec | {"final": st.to_dict(), "snapshot": snap})
            except Exception as exc:  # noqa: BLE001 - a record is a convenience for other machines
                log.warning("could not write the final record of %s: %s", st.app_id, exc)

    def _copy_in_app_report(self, app_id: str, ckpt: str | None, dest: Path, phases: dict[str, Any]) -> bool:
        """The report the app's supervisor wrote (next to the checkpoints, else in the staging dir), copied here: it
        saw the whole run. ``phases``: this follower's, which add the gateway's (preflight, submit, ...)."""
        import fsspec

        for where in filter(None, (ckpt, records.report_url(self.conn.staging_dir, app_id))):
            try:
                url = report_at(where, app_id)
            except Exception as exc:  # noqa: BLE001 - e.g. HDFS unreachable (hdfs-native's RuntimeError): ours, then
                log.debug("no in-app report of %s in %s: %s", app_id, where, exc)
                continue
            if url is None:
                continue
            with fsspec.open(url, "rt") as f:
                report = json.load(f)
            theirs = report.get("phases") or {}
            report["phases"] = {k: v if v is not None else theirs.get(k) for k, v in (theirs | phases).items()}
            copy_report(report, f"{where.rstrip('/')}/{REPORT_PNG}" if report.get("plot") else None, dest)
            log.debug("run report of %s: the in-app supervisor's, from %s", app_id, where)
            return True
        return False
