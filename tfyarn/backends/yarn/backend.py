"""YarnBackend: a tfyarn job as a skein application on YARN (:class:`~tfyarn.backends.base.Backend`).

A thin facade: it owns one part per job, each with its own state, and hands each verb to its part. The parts share
only the connection, and none knows another —

============================  ==========================================================================
:mod:`.connection`            Kerberos login, staging dir, skein driver and client, RM REST, the apps' AMs
:mod:`.submit`                dry run (the ApplicationSpec built by :mod:`.appspec`) and schedule
:mod:`.status`                status and list (YARN's states mapped by :mod:`.states`)
:mod:`.logs`                  logs by task, live or aggregated (files read by :mod:`.log_files`)
:mod:`.reports`               the run report and the job's timeline (:mod:`.phases`)
:mod:`.end`                   kill, the app's end as the runner decides it, the running app's KV
============================  ==========================================================================

This machine's and the staging dir's records of an app are :mod:`.records`; tfyarn's shared skein driver is
:mod:`.driver`. What runs inside every application besides the tasks, the job's in-app supervisor, is job control:
:mod:`tfyarn.runner.yarn_app`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from tfyarn.gateway import packaging
from tfyarn.backends.base import Backend, Request
from tfyarn.backends.yarn.connection import YarnConnection
from tfyarn.backends.yarn.end import Ender
from tfyarn.backends.yarn.logs import LogReader
from tfyarn.backends.yarn.reports import Reporter
from tfyarn.backends.yarn.status import StatusReader
from tfyarn.backends.yarn.submit import SubmittedThenInterrupted, Submitter, YarnRequest
from tfyarn.contracts.job_end import JobEnd
from tfyarn.contracts.status import AppStatus
from tfyarn.spec import JobSpec

__all__ = ["SubmittedThenInterrupted", "YarnBackend", "YarnRequest", "pack"]


class YarnBackend(Backend):
    """tfyarn on YARN through skein. Options: ``staging_dir`` (env archives, index cache, app records; default
    ``$TFYARN_STAGING_DIR`` or ``/user/<user>/.tfyarn``); ``driver``: "auto" (a global skein driver, else tfyarn's
    shared one) | "global" (start skein's global one, leave it running) | "private" (stopped by close());
    ``master_memory_mib``/``master_vcores`` (the AM's container); ``preflight`` (checks in submit); ``progress``
    (``callback(stage, done, total)`` while packing/uploading the env); ``client``/``cluster`` (an injected skein
    Client / preflight ClusterInfo); ``log_poll_s``/``aggregation_wait_s`` (logs); ``detached_report``: the run report
    of a followed job is written by a detached process (its plot and HDFS uploads took ~3 s on the CLI's exit path)."""

    name = "yarn"

    def __init__(
        self,
        staging_dir: str | None = None,
        hadoop_conf_dir: str | None = None,
        driver: str = "auto",
        master_memory_mib: int = 512,
        master_vcores: int = 1,
        preflight: bool = True,
        progress: packaging.Progress | None = None,
        client: Any = None,
        cluster: Any = None,
        log_poll_s: float = 1.0,
        aggregation_wait_s: float = 30.0,
        detached_report: bool = False,
    ):
        self.conn = YarnConnection(staging_dir, hadoop_conf_dir, driver, client, one_shot=detached_report)
        self.submitter = Submitter(self.conn, master_memory_mib, master_vcores, preflight, progress, cluster)
        self.reader = StatusReader(self.conn, aggregation_wait_s)
        self.log_reader = LogReader(self.conn, log_poll_s, aggregation_wait_s)
        self.reporter = Reporter(self.conn, self.reader.status, detached_report)
        self.ender = Ender(self.conn, self.reader.status)

    # ---------------------------------------------------------------------------------------------- the verbs
    def dryrun(self, spec: JobSpec, attempt: int = 0) -> YarnRequest:
        return self.submitter.dryrun(spec, attempt)

    def schedule(self, request: Request) -> str:
        return self.submitter.schedule(request)

    def status(self, app_id: str) -> AppStatus:
        return self.reader.status(app_id)

    def list(self, all_states: bool = False) -> list[AppStatus]:
        return self.reader.list(all_states)

    def logs(self, app_id: str, task: str | None = None, follow: bool = False) -> Iterator[str]:
        """The verb; the log reader's own options (every log file, a bound on following) are on ``log_reader``."""
        return self.log_reader.logs(app_id, task, follow)

    def kill(self, app_id: str) -> None:
        self.ender.kill(app_id)

    def end(self, app_id: str, end: JobEnd) -> AppStatus:
        return self.ender.end(app_id, end)

    def kv(self, app_id: str) -> Any:
        return self.ender.kv(app_id)

    def queue_note(self, queue: str | None) -> str:
        return self.ender.queue_note(queue)

    def keep_report(self, st: AppStatus) -> None:
        self.reporter.keep(st)

    def report_location(self, st: AppStatus, build: bool = True) -> str | None:
        return self.reporter.report_location(st, build)

    def saved_report(self, app_id: str) -> str:
        return self.reporter.saved_report(app_id)

    def write_report(self, st: AppStatus) -> Path | None:
        return self.reporter.write_report(st)

    def phases(self, app_id: str, st: AppStatus | None = None) -> dict[str, Any]:
        return self.reporter.phases(app_id, st)

    def index_cache_dir(self) -> str | None:
        return self.conn.index_cache_dir()

    def close(self) -> None:
        self.conn.close()

    @property
    def detached_report(self) -> bool:
        """A one-shot command (the CLI): the run report is written by a detached process and the skein driver is
        released once following needs no JVM. Set after construction too (``api.run``), so the parts follow it."""
        return self.reporter.detached

    @detached_report.setter
    def detached_report(self, on: bool) -> None:
        self.reporter.detached = self.conn.one_shot = on

    @property
    def preflight(self) -> bool:
        """Whether ``schedule`` runs the preflight checks first (a probe, or a test submitting past them, turns them
        off for one submit)."""
        return self.submitter.preflight

    @preflight.setter
    def preflight(self, on: bool) -> None:
        self.submitter.preflight = on

    # the connection's, for callers (pack, scripts, tests)
    conf = property(lambda self: self.conn.conf)
    user = property(lambda self: self.conn.user)
    staging_dir = property(lambda self: self.conn.staging_dir)

    def login(self, spec: JobSpec | None = None, app_id: str | None = None) -> Any:
        return self.conn.login(spec, app_id)

    def client(self, spec: JobSpec | None = None) -> Any:
        return self.conn.client(spec)


def pack(
    spec: JobSpec,
    staging_dir: str | None = None,
    progress: packaging.Progress | None = None,
    hadoop_conf_dir: str | None = None,
) -> packaging.EnvRef:
    """``tfyarn pack``: stage the spec's environment now (same cache as submit); 0 bytes when already staged."""
    conn = YarnConnection(staging_dir=staging_dir, hadoop_conf_dir=hadoop_conf_dir)
    conn.login(spec)
    return packaging.ensure_env(spec, conn.staging_dir, progress, conf=conn.conf)
