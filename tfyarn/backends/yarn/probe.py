"""Know the nodes before the job: one short container with the job's environment says what it can import.

Why: a job whose Python on the nodes lacks tfyarn's dependencies or TensorFlow fails only after its
application, its supervisor and every task have started (issue 41). ``tfyarn validate --yarn --probe``
(and ``tfyarn run --probe`` first) submits an app of one small container with the job's environment
(the same python, packed env or archive, tfyarn shipped the same way) that runs
:func:`tfyarn.contracts.startup.probe` as text and prints its report; the report is read from the
container's log on its NodeManager while the container waits, then the app is killed: a few seconds.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import time
from typing import Any

from tfyarn.backends.yarn import appspec, log_files
from tfyarn.cluster._skein import skein
from tfyarn.errors import WaitTimeout
from tfyarn.spec import JobSpec

log = logging.getLogger(__name__)

SERVICE = "tfyarn-probe"
#: The line of the probe's report in its container's log.
REPORT_MARK = "tfyarn-probe: "
#: How long the probe's container waits for its log to be read (the app is killed as soon as it is).
HOLD_S = 300
PROBE_MEMORY_MIB = 256


def probe_app(app: Any, training: bool) -> Any:
    """The job's ``skein.ApplicationSpec`` made a probe: one container of its first task service's files and
    environment, running the probe instead of a task; no supervisor, the job's queue, tags and ACLs."""
    sk = skein()
    first = next(s for name, s in app.services.items() if name != appspec.SUPERVISOR_SERVICE)
    head = first.script.split("code=0\n", 1)[0]  # the task contract's environment, before Python runs
    py = next(ln for ln in first.script.splitlines() if ln.endswith(" -m tfyarn.task || code=$?"))
    py = py[: -len(" -m tfyarn.task || code=$?")]
    src = appspec.start_check_source()
    script = (
        f"{head}{py} -c {shlex.quote(src)} probe {'' if training else 'no-tf'} >&2 "
        f'|| echo "{REPORT_MARK}{{\\"failed\\": \\"python {py} exited $?\\"}}" >&2\n'
        f"sleep {HOLD_S}\n"
    )
    service = sk.Service(
        resources=sk.Resources(memory=PROBE_MEMORY_MIB, vcores=1),
        script=script,
        instances=1,
        files={k: f for k, f in first.files.items() if k != appspec.CODE_DIR},
        env=dict(first.env),
        max_restarts=0,
        node_label=first.node_label,
    )
    return sk.ApplicationSpec(
        name=f"{app.name}-probe",
        queue=app.queue,
        user=app.user,
        tags=set(app.tags) - {appspec.SUPERVISED_TAG} | {SERVICE},
        services={SERVICE: service},
        acls=app.acls,
        file_systems=app.file_systems,
        master=app.master,
    )


def parse(text: str) -> dict[str, Any] | None:
    """The probe's report in its container's log (None until it is there)."""
    for line in reversed(text.splitlines()):
        if line.startswith(REPORT_MARK):
            try:
                got = json.loads(line[len(REPORT_MARK) :])
            except ValueError:
                return None
            return got if isinstance(got, dict) else None
    return None


def run_probe(backend: Any, spec: JobSpec, timeout: float = 180.0, poll: float = 1.0) -> dict[str, Any]:
    """Submit the probe of ``spec``'s environment with ``backend`` (a YarnBackend; no preflight), read its report
    from its container's log, kill it. The report: :func:`tfyarn.contracts.startup.probe`'s, plus ``app_id``."""
    request = backend.dryrun(spec)
    training = any(r in spec.roles for r in ("chief", "worker", "ps", "evaluator"))
    request = dataclasses.replace(request, app=probe_app(request.app, training))
    checked, backend.preflight = backend.preflight, False  # a probe reads no data
    try:
        app_id = backend.schedule(request)
    finally:
        backend.preflight = checked
    deadline = time.monotonic() + timeout
    try:
        while True:
            report = _read(backend, app_id)
            if report is not None:
                return {**report, "app_id": app_id}
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"timed out after {timeout:g}s waiting for the probe {app_id} to report from its container "
                    f"(queue {spec.queue}: no room for {PROBE_MEMORY_MIB} MiB?)"
                )
            time.sleep(poll)
    finally:
        try:
            backend.kill(app_id)
        except Exception as exc:  # noqa: BLE001 - the container ends by itself after HOLD_S
            log.warning("could not kill the probe %s: %s", app_id, exc)


def _read(backend: Any, app_id: str) -> dict[str, Any] | None:
    """The report, once the probe's container has written it; None before (or while its AM cannot be asked)."""
    rep = backend.conn.app_report(app_id)
    if str(rep.state) in ("FINISHED", "FAILED", "KILLED"):
        return {"failed": f"the probe's application ended {rep.state}: {rep.diagnostics}"}
    if str(rep.state) != "RUNNING":
        return None
    try:
        containers = backend.client().connect(app_id, wait=False).get_containers(services=[SERVICE])
    except Exception as exc:  # noqa: BLE001 - its AM is starting: ask again
        log.debug("probe %s: %s", app_id, exc)
        return None
    for c in containers:
        if str(c.state) in ("FAILED", "KILLED"):
            return {"failed": f"the probe's container {c.state}: {c.exit_message}"}
        if c.yarn_container_id and c.yarn_node_http_address:
            try:
                cl = log_files.nm_container_log(c.yarn_node_http_address, c.yarn_container_id)
            except (OSError, ValueError) as exc:
                log.debug("probe %s: its log: %s", app_id, exc)
                return None
            return parse("\n".join(cl.files.values()))
    return None
