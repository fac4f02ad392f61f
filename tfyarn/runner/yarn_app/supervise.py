"""``python -m tfyarn.runner.yarn_app.supervise``: the job's supervisor inside its own YARN application.

Why: the gateway that submitted a job may be gone (a bare ``submit``, a ``wait`` from elsewhere, Airflow's deferrable
trigger), so what supervises it runs in the app: a small skein service (no TensorFlow, not a task) that applies
:class:`tfyarn.runner.supervisor.Supervisor` every second — stall watch, active deadline, allocation timeout (each
shuts the app down FAILED with a ``timed out: …`` diagnosis: TIMED_OUT, exit 4) — writes the run report and then ends
the app once every task is done (unless a live follower does it first), and publishes the spec (KV :data:`SPEC_KEY`,
:func:`~tfyarn.backends.yarn.records.record_url` on HDFS) for followers on other machines. Once started it never fails
the job: errors are logged and it exits 0. One that cannot start (its Python lacks a module, no spec, no application
master) fails the app at once with why (:func:`cannot_start`; its container's exit, else): the tasks never run
unsupervised. A follower that sees its heartbeat (``control/supervisor``) leaves the stall watch to
it; the job's end is the follower's while one is alive.

**Attempts**: a task failure that would end the app (its exit report, a container that died without one, a lost
node) or a timeout (stall, allocation; never the deadline) is the attempt's end when triage retries it and the budget
allows (:mod:`tfyarn.contracts.in_app`): the supervisor kills every task container, clears the attempt's KV keys,
records its end and starts every task again in the same application (:mod:`.attempts`; ``control/attempt``
says the attempt), so a bare ``submit`` gets the attempts ``tfyarn run`` does.

**What it cannot do**: outlive its application master: an AM killed or lost ends the app FAILED, and only a gateway
that follows the job (``tfyarn run``) starts another attempt, as a new YARN application; a bare ``submit``'s failed
app says so (:func:`no_more_attempts_note`). A supervisor that died leaves the job to the tasks' exit reports (no
further attempt in the app).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tfyarn.backends.tasks import settle
from tfyarn.backends.yarn.records import publish_report, write_record
from tfyarn.backends.yarn.states import ALL_CONTAINER_STATES, snapshot, in_app_attempts
from tfyarn.contracts import job_end, startup
from tfyarn.contracts.in_app import handover_record, parse_attempt
from tfyarn.contracts.kv_keys import ATTEMPT_END_KEY, ATTEMPT_KEY, END_KEY, SPEC_KEY
from tfyarn.contracts.status import AppState, AppStatus, TaskStatus
from tfyarn.errors import timeout_message
from tfyarn.report import HISTORY_FILE, checkpoint_url, write_report, preload_plotting
from tfyarn.runner.supervisor import Supervisor
from tfyarn.runner.yarn_app.node_watch import NodeWatch, last_heard
from tfyarn.runner.yarn_app.rerequest import Rerequest
from tfyarn.task.yarn import app_end
from tfyarn.tasklib.kv import KV, KVUnavailable
from tfyarn.spec import JobSpec, load_spec_json
from tfyarn.backends.yarn.appspec import SUPERVISOR_STARTED, SUPERVISOR_SERVICE
from tfyarn.runner.yarn_app.attempts import absorb, lost_task, restart
from tfyarn.runner.yarn_app.page import MemoryWatch
from tfyarn.backends.yarn import phases
from tfyarn.backends.yarn import rest
from tfyarn.cluster._skein import skein
from tfyarn.task.yarn.kv_yarn import SkeinKV
from tfyarn.runner.yarn_app import page as job_page

log = logging.getLogger(__name__)

POLL_S = 1.0
#: How often the tasks' ``control/all_done`` is looked for between rounds (the job ends within this of it).
DONE_CHECK_S = 0.2
_ENDED = ("SUCCEEDED", "FAILED", "KILLED")


class InAppSupervisor:
    """One job's checks inside its application: :meth:`round` reads the app once and decides; :meth:`run` loops.

    ``app`` is a ``skein.ApplicationClient`` (``get_containers``, ``shutdown``); ``kv`` the tfyarn KV over its store;
    ``started`` the app's start (epoch s). ``staging_dir`` None: no HDFS record."""

    def __init__(
        self,
        spec: JobSpec,
        app: Any,
        kv: KV,
        app_id: str,
        started: float,
        attempt: int = 0,
        staging_dir: str | None = None,
        clock: Callable[[], float] = time.time,
        report_dir: Path | None = None,
        ack_wait_s: float = 3.0,
    ):
        self.spec, self.app, self.kv, self.app_id, self.started = spec, app, kv, app_id, started
        self.attempt, self.staging_dir, self.clock = attempt, staging_dir, clock
        self.report_dir = report_dir or Path(tempfile.mkdtemp(prefix="tfyarn-report-"))
        self.sup = Supervisor(
            spec, started=started, clock=clock, history_path=self.report_dir / HISTORY_FILE, ack_wait_s=ack_wait_s
        )
        self.sup.begin_attempt(kv)  # no pids: the tasks are asked for their stacks through the KV
        self.sup.attempt = attempt  # further attempts run in this app (.attempts): numbered on from the app's
        self.attempt_started = started
        #: has a NodeManager stopped a killed container (nm address, YARN id)? None: ask it (.attempts)
        self.container_gone: Callable[[str, str], bool] | None = None
        self.snap: dict[str, Any] = {}
        self.outcome: tuple[str, str] | None = None  # (YARN final status, diagnosis) it ended the app with
        self._done_seen: float | None = None  # when it first saw every task done (monotonic)
        self.memory_watch = MemoryWatch()
        self.nodes = NodeWatch(spec.timeouts.node_lost)  # a lost node noticed in seconds, not at YARN's expiry
        self.requests = Rerequest(spec, app, app_id, clock=clock)  # skein's lost requests, asked again

    # -- the record other machines read ------------------------------------------------------------------------------
    def publish(self) -> None:
        """The spec into the KV and the HDFS record: a follower elsewhere knows the job from its first poll."""
        self.kv.put(SPEC_KEY, self.spec.to_json())
        self._record()

    def _record(self, final: dict[str, Any] | None = None) -> None:
        if not self.staging_dir:
            return
        try:
            write_record(
                self.staging_dir,
                self.app_id,
                {
                    "app_id": self.app_id,
                    "name": self.spec.name,
                    "spec": self.spec.to_json(),
                    "started": self.started,
                    "snapshot": self.snap,
                    "final": final,
                },
            )
        except Exception as exc:  # noqa: BLE001 - a record is a convenience for other machines
            log.warning("could not write the app record to %s: %s", self.staging_dir, exc)

    # -- one round ---------------------------------------------------------------------------------------------------
    def verdict(self, snap: dict[str, Any]) -> str | None:
        """A ``timed out: …`` diagnosis when the job's rules end it (deadline, allocation, stall), else None."""
        tasks = [TaskStatus(**t) for t in snap["tasks"]]
        for t in tasks:
            if t.state == "SUCCEEDED":
                self.sup.task_ended(t.task)
        pending = any(t.state == "PENDING" for t in tasks)
        raw = AppStatus(
            app_id=self.app_id,
            backend="yarn",
            name=self.spec.name,
            tasks=tasks,
            state=AppState.PENDING if pending else AppState.RUNNING,
        )
        v = self.sup.check(raw)
        return None if v is None else timeout_message(v.diagnosis)

    def round(self) -> bool:
        """One look at the app: heartbeat, read, checks. True when the supervisor's work is over (app ended by it,
        or every task's container ended: skein ends the app from their exits once this one exits too)."""
        self._beat()
        kv = self.kv.items()
        containers = self.app.get_containers(states=ALL_CONTAINER_STATES)
        snap = self.snap = snapshot(containers, kv, self.spec, progress=self.sup.progress(kv))
        self.memory_watch(snap["tasks"])  # 90 % of a container's memory: warned (issue 32)
        if app_end.ALL_DONE_KEY in kv or self.done_without_report(kv):
            if self._follower_ends_it():
                return False
            self.finish("SUCCEEDED", app_end.DONE_DIAGNOSTICS)
            return True
        ended = self.attempt_ended(kv, containers)
        if ended is not None:
            return self.attempt_failed(ended)
        self.requests.check(containers, snap.get("taskmap") or {})
        lost = self.nodes.check(containers, snap.get("taskmap") or {}, last_heard(kv))
        if lost is not None:  # the attempt ends now, before a peer's error says something else
            log.error("%s: %s; ending the attempt", self.app_id, lost)
            return self.attempt_failed(lost)
        diag = self.verdict(snap)
        if diag is not None:  # a timeout: retried as `tfyarn run` retries it (never past the deadline)
            log.error("%s: %s; ending the attempt", self.app_id, diag)
            return self.attempt_failed(diag, AppState.TIMED_OUT)
        return bool(snap["tasks"]) and all(x["state"] in _ENDED for x in snap["tasks"])

    def done_without_report(self, kv: dict[str, str]) -> bool:
        """Is the job done although no task said so: every other task reported done and a side task's container
        (tensorboard's) has failed, ended without its exit report (YARN killed it whole: memory, a preemption)
        whose check (:func:`tfyarn.task.yarn.app_end.done_in`) would have said so? Then ``control/all_done`` is put
        (a follower ends the app on it), else the app would end as skein decides, without an end record: FAILED."""
        tasks = self.snap.get("tasks", [])
        gone = [t["task"] for t in tasks if t["state"] in ("FAILED", "KILLED") and app_end.side_task(t["task"])]
        if not gone or not app_end.done_in(kv, self.spec.tasks(), gone):
            return False
        log.info("%s: every task is done (%s failed)", self.app_id, ", ".join(gone))
        self.kv.put(app_end.ALL_DONE_KEY, json.dumps({"time": round(time.time(), 3), "by": job_end.SUPERVISOR}))
        return True

    # -- in-app attempts ---------------------------------------------------------------------------------------------
    def attempt_ended(self, kv: dict[str, str], containers: list[Any]) -> str | None:
        """The running attempt's end, when it has one: the diagnosis a failed task handed over
        (``control/attempt_end``), or the failure of containers that died without an exit report and that
        skein did not replace (what skein would have failed the app for: its services here allow failures)."""
        if END_KEY in kv:
            return None  # the app is ending (a failed task's exit report, a follower): skein ends it next
        rec = kv.get(ATTEMPT_END_KEY) or self.kv.get(ATTEMPT_END_KEY)
        if rec is not None:
            try:
                return str(json.loads(rec).get("diagnosis") or "") or "a task failed"
            except ValueError:
                return "a task failed"
        lost = lost_task(self.spec, containers, parse_attempt(kv.get(ATTEMPT_KEY)))
        if not lost or self.kv.get(ATTEMPT_END_KEY) is not None or self.kv.get(END_KEY) is not None:
            return None  # (an exit report may have spoken since the KV was read: the next round reads it)
        tasks = {t["task"]: t for t in self.snap.get("tasks", [])}
        taskmap = self.snap.get("taskmap") or {}
        parts = []
        for c in lost:
            task = taskmap.get(f"{c.service_name}_{c.instance}", f"{c.service_name}:{c.instance}")
            words = (tasks.get(task) or {}).get("diagnostics") or c.exit_message or "failed"
            parts.append(f"{task}: {words}")
        return "; ".join(parts)

    def attempt_failed(self, diagnosis: str, state: AppState = AppState.FAILED) -> bool:
        """The running attempt ended ``state`` (FAILED; TIMED_OUT: a verdict) with ``diagnosis``: the next
        one starts in this application when :meth:`tfyarn.runner.supervisor.Supervisor.next_attempt` says so
        (triage, budgets, deadline: the runner's rules), else the app ends so with it. True when the
        supervisor's work is over."""
        self.sup.progress(self.kv.items())  # the step the attempt reached: the steps redone
        ended = self.attempt
        if not self.sup.next_attempt(state, diagnosis, label=f"attempt {ended}"):
            log.error("%s: attempt %d ended: %s; ending the application", self.app_id, ended, diagnosis)
            if state is AppState.TIMED_OUT:  # YARN: FAILED with the `timed out: …` diagnosis
                self.finish("FAILED", self.sup.final_diagnosis(diagnosis) if self.sup.earlier else diagnosis)
            else:
                self.finish("FAILED", self.sup.final_diagnosis(diagnosis), AppState.FAILED)
            return True
        self.attempt = self.sup.attempt
        if self.kv.get(ATTEMPT_END_KEY) is None:  # (a lost node, a container dead without its report)
            # the containers about to be killed must not report their ends as the attempt's, nor end the app
            self.kv.put(ATTEMPT_END_KEY, handover_record("supervisor", diagnosis, time.time()))
        ok = restart(
            self.app,
            self.kv,
            self.spec,
            self.attempt,
            diagnosis,
            self.attempt_started,
            self.sup.redone[-1],
            backoff=self._backoff,
            gone=self.container_gone,
            beat=self._beat,
        )
        self.attempt_started = time.time()
        self.sup.begin_attempt(self.kv)
        self.nodes = NodeWatch(self.spec.timeouts.node_lost)
        self.requests = Rerequest(self.spec, self.app, self.app_id, clock=self.clock)
        self._done_seen = None
        return not ok

    def _beat(self) -> None:
        self.kv.put(app_end.SUPERVISOR_KEY, f"{time.time():.3f}")

    def _backoff(self) -> bool:
        """``retry.backoff`` before the next in-app attempt, the heartbeat kept fresh meanwhile."""
        end = time.monotonic() + self.spec.retry.backoff
        while (left := end - time.monotonic()) > 0:
            self._beat()
            time.sleep(min(POLL_S, left))
        return True

    def _follower_ends_it(self) -> bool:
        """True while a live follower (``tfyarn run``/``wait``) still has time to end the app itself: it reads the KV
        last, shuts the app down at once and writes the report off the job's critical path (this supervisor's report
        first cost the job's end ~2.3 s on an idle box). Past that grace, the supervisor ends it as usual."""
        now = time.monotonic()
        self._done_seen = self._done_seen or now
        follower = app_end.follower_alive(self.kv, time.time())
        return (
            now - self._done_seen < app_end.FOLLOWER_GRACE_S + POLL_S
            and job_end.leave_to(job_end.SUPERVISOR, True, follower) == job_end.FOLLOWER
        )

    def finish(self, final_status: str, diagnosis: str, state: AppState | None = None) -> None:
        """The run report and the record (at once, two threads), then the app's end: the shutdown ends this
        container, so they come first — the job's end waits for them (~0.5-1 s)."""
        t0 = time.monotonic()
        state = state or (AppState.SUCCEEDED if final_status == "SUCCEEDED" else AppState.TIMED_OUT)
        end = job_end.decide(
            job_end.SUPERVISOR,
            done=state is AppState.SUCCEEDED,
            failure=diagnosis if state is AppState.FAILED else None,
            verdict=diagnosis,
            exits=self.snap.get("exits"),
        )
        self.snap["end"] = end.to_json()  # in the staging-dir record: readers after the end
        st = self.status(state, "" if state is AppState.SUCCEEDED else diagnosis)
        record = threading.Thread(target=self._record, args=(st.to_dict(),), name="tfyarn-record", daemon=True)
        record.start()
        self.write_report(st)
        record.join(30.0)
        log.info(
            "%s: report and record written in %.2fs; ending the application %s",
            self.app_id,
            time.monotonic() - t0,
            final_status,
        )
        self.outcome = (final_status, diagnosis)
        job_end.end_job(self.kv, end, self.app.shutdown, diagnosis)

    def status(self, state: AppState, diagnosis: str) -> AppStatus:
        tasks = [TaskStatus(**t) for t in self.snap.get("tasks", [])]
        st = settle(
            AppStatus(
                app_id=self.app_id,
                backend="yarn",
                name=self.spec.name,
                state=state,
                diagnostics=diagnosis,
                tasks=tasks,
                progress=self.snap.get("progress") or {},
                started=self.started,
                finished=time.time(),
                attempt=self.attempt,
                summary=self.snap.get("summary") or self.sup.summary,
            )
        )
        return self.sup.fold_totals(st)  # wall time and work redone over every attempt

    def write_report(self, st: AppStatus) -> None:
        """report.json (+ PNG when matplotlib imports) next to the checkpoints (:func:`tfyarn.report.write_report`:
        not there when training never ran), else under the staging dir's ``apps/<app>/`` (readers look next to the
        checkpoints first; the app's end waits for these uploads). Never raises."""
        rm = {"started": self.started, "finished": st.finished}
        extra = {"phases": phases.durations(phases.marks({}, rm, self.snap.get("phases") or {}))}
        ckpt = checkpoint_url(self.spec)
        local = write_report(self.report_dir, st, self.sup.history.points, ckpt, extra=extra)
        if local is not None and self.staging_dir:
            publish_report(self.staging_dir, self.app_id, self.report_dir, ckpt)

    def run(self, poll: float = POLL_S, check_s: float = DONE_CHECK_S) -> None:
        """Rounds every ``poll`` s, looking for ``control/all_done`` every ``check_s`` s between them, until the
        supervisor's work is over or the application master is gone."""
        while True:
            try:
                if self.round():
                    return
                end = time.monotonic() + poll
                while time.monotonic() < end:
                    time.sleep(check_s)
                    if self.kv.get(app_end.ALL_DONE_KEY) is not None:
                        break
            except KVUnavailable as exc:
                log.info("the application master of %s is gone (%s): the application has ended", self.app_id, exc)
                return


def resume(sup: InAppSupervisor) -> None:
    """A supervisor skein restarted (appspec.SUPERVISOR_RESTARTS: the last one's container died) takes up the app's
    in-app attempts from the KV: the running attempt's number and the ended ones in its budget, as a follower absorbs
    them. A first supervisor finds none."""
    rec = in_app_attempts(sup.kv.items())
    if not rec:
        return
    absorb(sup.sup, rec, "this application's")
    sup.attempt = sup.sup.attempt
    log.warning(
        "%s: supervising again from attempt %d (the previous supervisor's container died)", sup.app_id, sup.attempt
    )


def app_started(app_id: str) -> float | None:
    """The app's start (epoch s) from the ResourceManager (the active deadline counts from there); None when the RM
    cannot say (then the supervisor's own start, seconds later, is used)."""
    try:
        rm = rest.in_container()
        rep = rm.report(app_id)
        how = "with the app's RM delegation token" if rm.has_token else "as user.name"
        log.info("%s started at %s (the ResourceManager's report, read %s)", app_id, rep.start_time, how)
        return rep.start_time.timestamp() if rep.start_time is not None else None
    except Exception as exc:  # noqa: BLE001 - (no Hadoop conf in the container, an RM down)
        log.info("no start time of %s from the ResourceManager (%s): counting from now", app_id, exc)
        return None


def main() -> int:
    """Supervise the application this container belongs to: 0 once it has started, whatever happens after
    (see the module docstring); 1 when it could not start (after failing the app with why, when it can)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.time()
    os.nice(10)  # its imports and matplotlib preload must not delay the tasks' TF imports on a shared node
    app: Any = None
    try:
        app = skein().ApplicationClient.from_current()
        spec = load_spec_json(Path(os.environ["TFYARN_SPEC_FILE"]).read_text())
        app_id = os.environ.get("TFYARN_APP_ID") or os.environ["SKEIN_APPLICATION_ID"]
        sup = InAppSupervisor(
            spec,
            app,
            SkeinKV(app.kv),
            app_id,
            app_started(app_id) or t0,
            attempt=int(os.environ.get("TFYARN_ATTEMPT") or 0),
            staging_dir=os.environ.get("TFYARN_STAGING_DIR"),
        )
    except BaseException as exc:  # noqa: BLE001 - it cannot supervise: the job must not run unsupervised
        return cannot_start(app, exc)
    Path(SUPERVISOR_STARTED).touch()  # (the container script: a later exit leaves the job running)
    try:
        resume(sup)
        threading.Thread(target=preload_plotting, name="tfyarn-preload-matplotlib", daemon=True).start()
        sup.publish()
        page = job_page.serve(sup)  # the job's page, under skein's web UI (issue 32)
        log.info(
            "supervising %s (%s): stall %gs, deadline %s, allocation %s",
            app_id,
            spec.name,
            spec.timeouts.stall,
            spec.timeouts.active_deadline,
            spec.timeouts.allocation,
        )
        sup.run()
        if page is not None:
            page.close()
        log.info("supervisor of %s done%s", app_id, f": ended it {sup.outcome[0]}" if sup.outcome else "")
    except BaseException:
        log.exception("the in-app supervisor failed; the job goes on without it")
    return 0


def cannot_start(app: Any, exc: BaseException) -> int:
    """A supervisor that could not start: its log says why (contracts.startup's line, which the gateway reads) and,
    with the application's client, the app is ended FAILED with that reason at once (an end record); else its
    container's non-zero exit fails it (skein: its service allows no failure). Returns the exit code, 1."""
    why = startup.cannot_start(
        startup.import_error_text(exc) if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
    )
    log.error("the in-app supervisor cannot start", exc_info=exc)
    print(startup.log_line(1, why), file=sys.stderr, flush=True)
    if app is not None:
        try:
            reason = f"{SUPERVISOR_SERVICE}: {why}"
            end = job_end.decide(job_end.SUPERVISOR, failure=reason)
            job_end.end_job(SkeinKV(app.kv), end, app.shutdown, reason)
        except Exception as err:  # noqa: BLE001 - the container's exit fails the app anyway
            log.warning("could not end the application: %s", err)
    return 1


if __name__ == "__main__":
    sys.exit(main())
