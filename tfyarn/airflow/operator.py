"""``TfyarnOperator``: run a tfyarn job from an Airflow task — submit, follow, fail with the job's diagnosis (what it
pushes to XCom and returns: docs/schedulers.md).

What it guarantees:

* no duplicate apps on retry: every app carries its task instance's tags (:mod:`tfyarn.airflow.tags`), and a retry
  adopts (``on_existing="adopt"``) or kills (``"kill"``) an earlier try's app that is still running;
* the app id is in XCom (``app_id``) before any waiting, so it is known even if the worker dies while waiting;
* killing the task kills the app (``on_kill``; when deferred, the trigger's, which Airflow 3.3+ calls);
* ``wait_timeout`` bounds the wait and then kills the app: nothing keeps running unattended.

``deferrable=True`` waits in :class:`tfyarn.airflow.trigger.TfyarnTrigger` (no worker slot held while a long job
trains); the triggerer then needs tfyarn and, for the local backend, the same ``TFYARN_HOME``.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from tfyarn import api, runner
from tfyarn.airflow._compat import AirflowException, BaseOperator
from tfyarn.airflow.progress_log import progress_logger
from tfyarn.airflow.tags import airflow_tags, matches, merge_tags
from tfyarn.airflow.trigger import TfyarnTrigger
from tfyarn.errors import WaitTimeout

ON_EXISTING = ("adopt", "kill")


class TfyarnOperator(BaseOperator):
    """Submit a tfyarn spec (with ``--set``-style overrides) to a backend and wait for its outcome."""

    template_fields: Sequence[str] = ("spec", "overrides", "backend")
    ui_color = "#f4c96b"

    def __init__(
        self,
        *,
        spec: str,
        overrides: Sequence[str] = (),
        backend: str | None = None,
        on_existing: str = "adopt",
        deferrable: bool = False,
        poll_interval: float = 5.0,
        log_interval: float = 30.0,
        wait_timeout: float | None = None,
        predict: bool = False,
        overwrite: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if on_existing not in ON_EXISTING:
            raise ValueError(f"on_existing must be one of {ON_EXISTING}, not {on_existing!r}")
        self.spec, self.overrides, self.backend = spec, list(overrides), backend  # the template_fields
        self.on_existing, self.deferrable = on_existing, deferrable
        #: how the job is followed: seconds between two polls and two progress lines, and the wait's bound
        self.poll_interval, self.log_interval, self.wait_timeout = poll_interval, log_interval, wait_timeout
        #: ``tfyarn predict``: score the spec's predict.input (docs/predict.md); ``overwrite`` replaces an output dir
        #: an earlier try left (a retry of a failed scoring run is refused without it)
        self.predict, self.overwrite = predict, overwrite
        self._app_id: str | None = None

    # ------------------------------------------------------------------------------------------------ execute
    def execute(self, context: Any) -> Any:
        ti = context["ti"]
        tags = airflow_tags(ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", None))
        app_id = self._find_running(tags) or self._submit(tags)
        self._app_id = app_id
        ti.xcom_push(key="app_id", value=app_id)
        if self.deferrable:
            self.defer(
                trigger=TfyarnTrigger(
                    app_id=app_id,
                    poll_interval=self.poll_interval,
                    log_interval=self.log_interval,
                    timeout=self.wait_timeout,
                ),
                method_name="execute_complete",
            )
        return self._finish(self._wait(app_id), context)

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Resumed after the trigger fired: read the final status and finish like the polling path."""

        event = event or {}
        app_id = event.get("app_id") or context["ti"].xcom_pull(task_ids=self.task_id, key="app_id")
        self._app_id = app_id
        if event.get("status") == "timeout":
            self._kill(app_id, "wait_timeout ran out")
            raise AirflowException(event.get("message") or f"timed out waiting for tfyarn app {app_id}")
        if event.get("status") == "error":
            raise AirflowException(event.get("message") or f"lost track of tfyarn app {app_id}")
        return self._finish(api.status(app_id), context)

    def on_kill(self) -> None:
        """Airflow is killing this task (SIGTERM, mark failed, execution_timeout): kill the app with it."""
        if self._app_id:
            self._kill(self._app_id, "the Airflow task was killed")

    # ------------------------------------------------------------------------------------------------ steps
    def _find_running(self, tags: list[str]) -> str | None:

        running = [a for a in api.list_apps(self.backend) if not a.state.is_terminal and matches(a.tags, tags)]
        if not running:
            return None
        if self.on_existing == "adopt":
            app = running[-1]
            for other in running[:-1]:
                self._kill(other.app_id, f"a newer app {app.app_id} of the same task instance is adopted")
            self.log.info(
                "adopting tfyarn app %s (%s), still running from an earlier try of this task instance",
                app.app_id,
                app.state.value,
            )
            return app.app_id
        for app in running:
            self._kill(app.app_id, "on_existing='kill': an earlier try's app is still running")
        return None

    def _submit(self, tags: list[str]) -> str:

        overrides = [*self.overrides, "job=predict"] if self.predict else list(self.overrides)
        spec = api.load(self.spec, overrides)
        all_tags = merge_tags(spec.tags, tags)
        spec = api.load(self.spec, [*overrides, f"tags={json.dumps(all_tags)}"])
        if self.predict:
            spec = api.predict_job(spec, self.overwrite)
        app_id = api.submit(spec, self.backend)
        self.log.info("submitted tfyarn job %r as %s (tags %s)", spec.name, app_id, ", ".join(all_tags))
        return app_id

    def _wait(self, app_id: str) -> Any:

        try:
            with api.backend_for_app(app_id) as backend:  # a private skein driver is stopped afterwards
                return runner.wait(
                    backend,
                    app_id,
                    timeout=self.wait_timeout,
                    poll=self.poll_interval,
                    on_update=progress_logger(self.log, self.log_interval),
                )
        except WaitTimeout as exc:
            self._kill(app_id, "wait_timeout ran out")
            raise AirflowException(str(exc)) from None

    def _kill(self, app_id: str, why: str) -> None:

        self.log.warning("killing tfyarn app %s: %s", app_id, why)
        try:
            api.kill(app_id)
        except Exception:
            self.log.exception("could not kill tfyarn app %s", app_id)

    def _finish(self, st: Any, context: Any) -> dict[str, Any]:
        ti = context["ti"]
        ti.xcom_push(key="summary", value=st.summary)
        if st.state.value != "SUCCEEDED":
            lines = [f"tfyarn app {st.app_id} {st.state.value}: {st.diagnostics or '(no diagnosis)'}"]
            lines += [f"  {t.task} FAILED (exit {t.exit_code}); log: {t.log}" for t in st.tasks if t.state == "FAILED"]
            raise AirflowException("\n".join(lines))
        self.log.info("tfyarn app %s SUCCEEDED; summary: %s", st.app_id, json.dumps(st.summary, sort_keys=True))

        try:
            report = api.report_location(st)  # written now if the wait was deferred
        except Exception:
            self.log.warning("no run report for tfyarn app %s", st.app_id, exc_info=True)
            report = None
        return {
            "app_id": st.app_id,
            "state": st.state.value,
            "exit_code": int(st.state.exit_code),
            "summary": st.summary,
            "report": report,
        }
