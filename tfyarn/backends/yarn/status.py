"""What a YARN app is doing: its status (the RM's report, the running AM's containers and KV, this machine's record of
it) and the list of tfyarn apps.

A running app's status is read live (containers and KV from its application master) and saved in this machine's
record (:mod:`~tfyarn.backends.yarn.records`); an ended app's comes from that record, else from the record its
in-app supervisor left in the staging dir. The mapping of YARN's states is pure and lives in
:mod:`~tfyarn.backends.yarn.states`.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from tfyarn.cluster import hdfs
from tfyarn.common import paths
from tfyarn.backends.tasks import settle
from tfyarn.backends.yarn import appspec, outcome, records, rest, start_causes
from tfyarn.backends.yarn.cluster_events import rm_events
from tfyarn.backends.yarn.connection import YarnConnection
from tfyarn.backends.yarn.states import (
    ACTIVE_APP_STATES,
    ALL_APP_STATES,
    ALL_CONTAINER_STATES,
    app_state,
    app_status,
    attempt_of,
    failure_diagnosis,
    snapshot,
    timestamp,
)
from tfyarn.contracts import job_end
from tfyarn.contracts.in_app import no_more_attempts_note
from tfyarn.contracts.kv_keys import SPEC_KEY
from tfyarn.contracts.progress import GlobalStepRate, attempt_totals, read_progress
from tfyarn.contracts.status import AppState, AppStatus, TaskStatus
from tfyarn.errors import without_timeout_mark
from tfyarn.report import HISTORY_FILE, ProgressHistory, checkpoint_step, checkpoint_url
from tfyarn.task.yarn import app_end
from tfyarn.spec import JobSpec

log = logging.getLogger(__name__)


class StatusReader:
    """The status part of the YARN backend: ``status`` and ``list`` over the connection ``conn``. It keeps, per app
    this process reads, the global step's rate (the ETA across reads) and the progress points of its run report;
    ``aggregation_wait_s`` bounds the wait for an ended app's container logs (why its tasks could not start)."""

    def __init__(self, conn: YarnConnection, aggregation_wait_s: float = 30.0):
        self.conn, self.aggregation_wait_s = conn, aggregation_wait_s
        self._progress: dict[str, tuple[GlobalStepRate, ProgressHistory]] = {}
        self._no_record: set[str] = set()  # apps whose in-app supervisor record was looked for (_recover)

    def _recover(self, app_id: str, running: bool, tags: Any = ()) -> dict[str, Any]:
        """This machine's state of ``app_id``, with the spec (and the last snapshot) of an app submitted elsewhere
        recovered from the app itself: KV ``spec`` while it runs, else the record its in-app supervisor left in the
        staging dir (:mod:`tfyarn.backends.yarn.records`; only an app ``tags`` say has one). Saved here."""
        saved = records.load(app_id)
        if saved.get("spec"):
            return saved
        text = running and self.conn.on_am(app_id, "spec in the KV", lambda app: app.kv.get(SPEC_KEY))
        found: dict[str, Any] = {"spec": text.decode()} if text else {}
        if not found and not running and appspec.SUPERVISED_TAG in (tags or ()) and app_id not in self._no_record:
            self._no_record.add(app_id)  # read once: an app with no supervisor has none
            rec = records.read_record(self.conn.staging_dir, app_id)
            found = {k: rec[k] for k in ("spec", "snapshot") if rec.get(k) and not saved.get(k)}
        if found:
            log.debug("%s: spec recovered from the application", app_id)
            records.save(app_id, **found)
            saved.update(found)
        return saved

    def status(self, app_id: str) -> AppStatus:
        rep = self.conn.app_report(app_id)
        # the end record an ender left in the final diagnostics (contracts.job_end), read apart
        diag_end, rm_diag = job_end.from_diagnostics(rep.diagnostics)
        saved = self._recover(app_id, running=str(rep.state) == "RUNNING", tags=rep.tags)
        spec = records.saved_spec(app_id, saved)
        live = self._live(app_id, spec) if str(rep.state) == "RUNNING" else None
        snap = live or saved.get("snapshot") or {}
        task_states = [t["state"] for t in snap.get("tasks", [])] if live else None
        events = rm_events(rep, snap.get("events")) if str(rep.state) != "RUNNING" else None
        diag = failure_diagnosis(rm_diag, snap.get("failures") or {}, snap.get("exits") or {}, events)
        state = app_state(rep.state, rep.final_status, diag, task_states)
        diag = _without_marks(state, diag)
        # the ender's record read first (the text above: apps without one)
        recorded = outcome.from_record(rep.state, rep.final_status, snap, events, diag_end)
        causes: dict[str, tuple[int, str]] = {}
        if recorded is not None:
            state, recorded_diag = recorded
            if state is not AppState.SUCCEEDED:  # a success keeps only what YARN did (cluster_events, above)
                diag = recorded_diag
        elif state.is_terminal and state is not AppState.KILLED:
            # no end record (issue 41): never SUCCEEDED; why its tasks could not start, from their logs
            causes = self._start_causes(app_id, rep, saved, snap)
            order = spec.tasks() if spec is not None else [t["task"] for t in snap.get("tasks") or []]
            state, diag = outcome.verdict(
                state, diag, outcome.ended_by(snap, diag_end), start_causes.diagnosis(causes, order)
            )
        final = saved.get("final") or {}
        if state is AppState.KILLED and final.get("state") == AppState.TIMED_OUT.value:
            state, diag = AppState.TIMED_OUT, final.get("diagnostics", diag)  # tfyarn killed it for a deadline
        if state in (AppState.FAILED, AppState.TIMED_OUT) and spec is not None and not saved.get("run_started"):
            # a bare submit: nobody resubmits
            note = no_more_attempts_note(spec, max(attempt_of(rep.tags), snap.get("attempt") or 0), diag)
            diag = f"{diag}\n{note}".strip() if note and note not in diag else diag
        summary = snap.get("summary") or final.get("summary")
        if summary is None and state.is_terminal:
            summary = self._summary_from_checkpoints(app_id, spec)
        tasks = [TaskStatus(**t) for t in snap.get("tasks", [])]
        for t in tasks:
            if t.task in causes:  # its container's script said why it could not start
                t.state, t.exit_code, t.diagnostics = "FAILED", causes[t.task][0], causes[t.task][1]
        st = settle(
            app_status(
                rep,
                state,
                diag,
                tasks=tasks,
                progress=snap.get("progress") or {},
                summary=summary,
                causes=snap.get("causes") or [],
            ),
            end=outcome.ended_by(snap, diag_end) if recorded is not None else None,
        )
        st = fold_in_app(st, snap, spec)  # attempts the in-app supervisor ran: the number, the totals
        _save(app_id, rep, live, st, first_final=state.is_terminal and not saved.get("final"))
        return st

    def _start_causes(
        self, app_id: str, rep: Any, saved: dict[str, Any], snap: dict[str, Any]
    ) -> dict[str, tuple[int, str]]:
        """Task → (exit code, why it could not start) from the ended app's container logs (start_causes), read
        once and kept in this machine's record."""
        found = saved.get("start_causes")
        if found is None:
            found = start_causes.read(
                app_id,
                rep.user or self.conn.user,
                self.conn.conf,
                snap,
                self.aggregation_wait_s,
                timestamp(rep.finish_time),
            )
            if found is not None:
                records.save(app_id, start_causes=found)
        return start_causes.by_task(found or {}, snap)

    def _live(self, app_id: str, spec: JobSpec | None) -> dict[str, Any] | None:
        """Tasks, progress, summary and failures from the running application master; None if unreachable."""
        got = self.conn.on_am(
            app_id,
            "containers and KV",
            lambda app: (app.get_containers(states=ALL_CONTAINER_STATES), app.kv.get_range()),
        )
        if got is None:
            return None
        kv = {k: v.decode("utf-8", "replace") for k, v in got[1].items()}
        return snapshot(got[0], kv, spec, progress=self._read_progress(app_id, spec, kv))

    def _read_progress(self, app_id: str, spec: JobSpec | None, kv: dict[str, str]) -> dict[str, Any]:
        """The job's progress from its KV; its points appended to this machine's history of the app (the run
        report's curves, ``$TFYARN_HOME/yarn/<app>/``)."""
        got = self._progress.get(app_id)
        if got is None:
            d = paths.yarn_report_dir(app_id)
            d.mkdir(parents=True, exist_ok=True)
            got = self._progress[app_id] = (GlobalStepRate(), ProgressHistory(d / HISTORY_FILE))
        out, _, items = read_progress(kv, spec.training_tasks if spec is not None else [], got[0])
        got[1].record(items)
        return out

    def _summary_from_checkpoints(self, app_id: str, spec: JobSpec | None) -> dict[str, Any] | None:
        """The chief's ``summary.json`` beside the checkpoints, when it is this app's: an app that ended before anyone
        read its KV (``submit``, then ``wait`` or ``status`` later) has no snapshot holding the summary."""
        if spec is None or not spec.checkpoint.dir:
            return None
        import fsspec

        url = hdfs.join(spec.checkpoint.dir, "summary.json")
        try:
            with fsspec.open(url, "rt") as f:
                summary = json.load(f)
        except (OSError, ValueError) as exc:
            log.debug("no summary of %s at %s: %s", app_id, url, exc)
            return None
        return summary if isinstance(summary, dict) and summary.get("app_id") == app_id else None

    def list(self, all_states: bool = False) -> list[AppStatus]:
        """tfyarn applications (YARN tag ``tfyarn``): active ones, or every one the RM still knows."""
        self.conn.login()
        states = ALL_APP_STATES if all_states else ACTIVE_APP_STATES
        reps = None
        rm = self.conn.rm()
        if rm is not None:
            try:
                reps = rm.apps(states, tags=[appspec.TFYARN_TAG])
            except rest.RestUnavailable as exc:
                log.debug("RM REST list: %s; asking the skein driver", exc)
        if reps is None:
            reps = self.conn.client().get_applications(states=states)
        out = []
        for r in reps:
            if appspec.TFYARN_TAG in {t.lower() for t in r.tags}:
                end, diag = job_end.from_diagnostics(r.diagnostics)  # the end record's line: not for people
                state, diag = outcome.verdict(app_state(r.state, r.final_status, diag), diag, end)
                out.append(app_status(r, state, diag))
        return sorted(out, key=lambda s: s.started or 0)


def fold_in_app(st: AppStatus, snap: dict[str, Any], spec: JobSpec | None) -> AppStatus:
    """``st`` with the in-app attempts of its snapshot (:func:`~tfyarn.backends.yarn.states.in_app_attempts`): the
    attempt running or last run, and the summary's totals over every attempt (as the runner's
    ``Supervisor.fold_totals`` counts them)."""
    n = snap.get("attempt")
    if isinstance(n, int):
        st.attempt = max(st.attempt, n)
    ended = snap.get("attempts") or []
    if not ended or st.summary is None or spec is None or "attempts" in st.summary:
        return st
    st.started = st.started or time.time()
    redone = [{k: int(r.get(k) or 0) for k in ("attempt", "reached", "resumes_at", "lost_steps")} for r in ended]
    step = st.summary.get("resumed_step")
    if not isinstance(step, int):
        step = checkpoint_step(checkpoint_url(spec), str(st.summary.get("resumed_from") or ""))
    wall = (st.finished or time.time()) - st.started
    st.summary = {**st.summary, "attempts": attempt_totals(st.attempt + 1, wall, redone, step)}
    return st


def _without_marks(state: AppState, diag: str) -> str:
    """YARN's diagnostics without what tfyarn wrote there for itself, once the state says it."""
    if state is AppState.TIMED_OUT:
        diag = without_timeout_mark(diag)  # the in-app supervisor's marker: the state says it now
    if state is AppState.SUCCEEDED and diag.strip().endswith(app_end.DONE_DIAGNOSTICS):
        # ended early by tfyarn (task.yarn.app_end): nothing to diagnose but what YARN did (cluster_events)
        diag = diag.strip()[: -len(app_end.DONE_DIAGNOSTICS)].strip()
    return diag


def _save(app_id: str, rep: Any, live: dict[str, Any] | None, st: AppStatus, first_final: bool) -> None:
    """Keep what this read learnt: a running app's snapshot, an ended app's final status (once)."""
    launched = timestamp(getattr(rep, "launch_time", None))  # the RM's REST report has it, skein's not
    if live is not None:
        records.save(app_id, name=rep.name, snapshot=live, **({"am_launched": launched} if launched else {}))
    if first_final:
        records.save(app_id, name=rep.name, final=st.to_dict())
