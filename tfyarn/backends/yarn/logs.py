"""A YARN app's logs, by task: live from the NodeManagers while it runs (``follow``: new lines as they are written),
from the aggregated logs once it has ended, every line once. Reading the files themselves (the NodeManager's web
API, Hadoop's aggregated log layouts) is :mod:`~tfyarn.backends.yarn.log_files`.
"""

from __future__ import annotations

import logging
import time
import urllib.error
from typing import Any, Iterator

from tfyarn.backends.tasks import select_tasks, task_matches
from tfyarn.backends.yarn import appspec, log_files, records, rest
from tfyarn.backends.yarn.connection import YarnConnection
from tfyarn.backends.yarn.states import ALL_CONTAINER_STATES
from tfyarn.contracts.kv_keys import TASKMAP_PREFIX
from tfyarn.errors import AppNotFound, WaitTimeout

log = logging.getLogger(__name__)


class LogReader:
    """The logs part of the YARN backend: ``log_poll_s`` between two reads of followed logs, ``aggregation_wait_s``
    for the aggregated logs of an ended app."""

    def __init__(self, conn: YarnConnection, log_poll_s: float = 1.0, aggregation_wait_s: float = 30.0):
        self.conn, self.log_poll_s, self.aggregation_wait_s = conn, log_poll_s, aggregation_wait_s

    def logs(
        self,
        app_id: str,
        task: str | None = None,
        follow: bool = False,
        all_files: bool = False,
        follow_timeout: float | None = None,
    ) -> Iterator[str]:
        """``<task> | <line>`` for one task (``worker:1``), one role (``worker``) or all; ``follow`` streams new lines
        of running containers until the app ends (or ``follow_timeout`` s)."""
        rep = self.conn.app_report(app_id)
        spec = records.saved_spec(app_id)
        if task is not None and spec is not None and not task.startswith("container_"):
            select_tasks(spec.tasks(), task, app_id)  # an unknown task: AppNotFound naming the app's tasks
        user = rep.user or self.conn.user
        if str(rep.state) not in rest.TERMINAL:
            yield from self._tail_live(app_id, task, user, follow, all_files, follow_timeout)
        else:
            for label, cl in self._finished_logs(app_id, task, user):
                yield from log_files.lines_of(cl, all_files, label)

    def _live_containers(self, app_id: str, task: str | None) -> list[tuple[str, Any]]:
        """(task label, skein container) of the running app's containers that have a log on a NodeManager."""
        got = self.conn.on_am(
            app_id,
            "containers and task map",
            lambda app: (app.get_containers(states=ALL_CONTAINER_STATES), app.kv.get_prefix(TASKMAP_PREFIX)),
        )
        if got is None:
            return []
        taskmap = {k[len(TASKMAP_PREFIX) :]: v.decode() for k, v in got[1].items()}
        out = []
        for c in got[0]:
            label = taskmap.get(f"{c.service_name}_{c.instance}") or f"{c.service_name}:{c.instance}"
            if c.yarn_container_id and c.yarn_node_http_address and _shows(task, label, c.yarn_container_id):
                out.append((label, c))
        return out

    def _read_live(self, app_id: str, label: str, c: Any, tail: log_files.LogTail, all_files: bool) -> Iterator[str]:
        """New complete lines of one live container's files (NodeManager web API; ``yarn logs`` if it fails)."""
        cid, nm = c.yarn_container_id, c.yarn_node_http_address
        try:
            sizes = log_files.nm_log_sizes(nm, cid)
            for name in log_files.select_files(sizes, all_files):
                size = sizes[name]
                if size is not None and size <= tail.offset(cid, name):
                    continue
                data, start = log_files.nm_read_log_bytes(nm, cid, name, tail.offset(cid, name), sizes[name])
                for line in tail.feed(cid, name, data, start):
                    yield f"{label} | {line}"
            return
        except (OSError, ValueError, urllib.error.URLError) as exc:
            log.debug("NodeManager logs of %s: %s; trying `yarn logs`", cid, exc)
            nm_error = exc
        try:
            cls = log_files.parse_yarn_logs_output(log_files.yarn_logs_cli(app_id, cid, timeout=60))
        except (OSError, RuntimeError, TimeoutError) as exc2:
            yield f"{label} | [tfyarn] logs unavailable: {nm_error}; {exc2}"
            return
        for cl in cls[:1]:
            yield from _new_lines(tail, label, cl, all_files)

    def _finished_logs(self, app_id: str, task: str | None, user: str) -> list[tuple[str, log_files.ContainerLog]]:
        snap = records.load(app_id).get("snapshot") or {}
        taskmap = snap.get("taskmap") or {}
        if log_files.aggregation_disabled(self.conn.conf):  # nothing to wait for: the logs stay on the NodeManagers
            found = log_files.nm_finished_logs(snap.get("tasks") or [])
            if not found:
                raise AppNotFound(
                    f"no logs of {app_id}: log aggregation is off on this cluster and this machine has "
                    f"no status of it naming its containers"
                )
            return [(t, cl) for t, cl in found if _shows(task, t, cl.container_id)]
        deadline = time.monotonic() + self.aggregation_wait_s
        ran = {t["task"] for t in snap.get("tasks") or [] if t.get("state") != "PENDING"}
        while True:
            logs = log_files.read_aggregated_logs(app_id, user, self.conn.conf)
            if (
                logs
                and ran - {taskmap.get(cl.task.replace(":", "_"), cl.task) for cl in logs}
                and time.monotonic() < deadline
            ):  # one NodeManager uploaded, another not yet: every task that ran
                time.sleep(2.0)  # has a log to come (after the deadline: what is there)
                continue
            if logs:
                break
            try:
                logs = log_files.parse_yarn_logs_output(log_files.yarn_logs_cli(app_id, timeout=120))
            except (OSError, RuntimeError, TimeoutError) as exc:
                log.debug("`yarn logs` for %s: %s", app_id, exc)
            if logs:
                break
            if time.monotonic() >= deadline:
                dirs = ", ".join(log_files.aggregated_log_dirs(app_id, user, self.conn.conf))
                raise WaitTimeout(
                    f"timed out after {self.aggregation_wait_s:g}s waiting for the aggregated logs of "
                    f"{app_id} (looked in {dirs}; is yarn.log-aggregation-enable true?)"
                )
            time.sleep(2.0)
        labelled = [(taskmap.get(cl.task.replace(":", "_"), cl.task), cl) for cl in logs]
        return [(label, cl) for label, cl in labelled if _shows(task, label, cl.container_id)]

    def _tail_live(
        self, app_id: str, task: str | None, user: str, follow: bool, all_files: bool, follow_timeout: float | None
    ) -> Iterator[str]:
        """Lines of the running app's containers; with ``follow`` new ones every ``log_poll_s`` until the app ends,
        then what its containers wrote after the last poll (from the aggregated logs), so every line comes once."""
        tail = log_files.LogTail()
        labels: dict[str, str] = {}
        deadline = None if follow_timeout is None else time.monotonic() + follow_timeout
        while True:
            for label, c in self._live_containers(app_id, task):
                labels[c.yarn_container_id] = label
                yield from self._read_live(app_id, label, c, tail, all_files)
            if not follow:
                break
            if str(self.conn.app_report(app_id).state) in rest.TERMINAL:
                yield from self._tail_after_end(app_id, task, user, tail, labels, all_files)
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(self.log_poll_s)
        for cid, _name, text in tail.flush():
            yield f"{labels.get(cid, cid)} | {text}"

    def _tail_after_end(
        self, app_id: str, task: str | None, user: str, tail: log_files.LogTail, labels: dict[str, str], all_files: bool
    ) -> Iterator[str]:
        """After the end: the lines written since the last poll, from the aggregated logs once they hold every
        container followed (bounded by ``aggregation_wait_s``; a warning, not an error, when they cannot be read)."""
        deadline = time.monotonic() + self.aggregation_wait_s
        while True:
            try:
                finished = self._finished_logs(app_id, None, user)
            except WaitTimeout as exc:
                log.warning("the last lines of %s may be missing: %s", app_id, exc)
                return
            missing = set(labels) - {cl.container_id for _, cl in finished}
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(2.0)
        if missing:
            log.warning(
                "the last lines of %s may be missing: no aggregated logs of %s after %gs",
                app_id,
                ", ".join(sorted(missing)),
                self.aggregation_wait_s,
            )
        for label, cl in finished:
            if cl.container_id in labels or task_matches(task, label, cl.container_id):
                yield from _new_lines(tail, labels.get(cl.container_id, label), cl, all_files)


def _shows(task: str | None, label: str, container_id: str) -> bool:
    """``task`` selects the log of ``label``; the in-app supervisor's and the application master's only when asked
    for by name (they are no tasks; the master's JVM notes its JDK_JAVA_OPTIONS on stderr)."""
    if task is None:
        return label.split(":")[0] not in (appspec.SUPERVISOR_SERVICE, "master")
    return task_matches(task, label, container_id)


def _new_lines(tail: log_files.LogTail, label: str, cl: log_files.ContainerLog, all_files: bool) -> Iterator[str]:
    """``<label> | <line>`` for the lines of ``cl`` that ``tail`` has not shown yet."""
    for name in log_files.select_files(cl, all_files):
        for line in tail.feed(cl.container_id, name, cl.files[name].encode()):
            yield f"{label} | {line}"
