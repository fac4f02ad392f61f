"""YarnBackend: a tfyarn job as a skein application on YARN (:class:`~tfyarn.backends.base.Backend`).

One class for callers, one file per job for readers: each part is a subclass of the one below it and uses only the
parts below it —

============================  ==========================================================================
:mod:`.connection`            Kerberos login, staging dir, skein driver and client, RM REST, the app's AM
:mod:`.submit`                dry run (the ApplicationSpec built by :mod:`.appspec`) and schedule
:mod:`.status`                status, list, kill (YARN's states mapped by :mod:`.states`)
:mod:`.logs`                  logs by task, live or aggregated (files read by :mod:`.log_files`)
:mod:`.reports`               the run report and the job's timeline (:mod:`.phases`)
:mod:`.end`                   the runner's hooks (attempts, follow, pause, followed) and the app's end
============================  ==========================================================================

This machine's and the staging dir's records of an app are :mod:`.records`; the supervisor inside every application
is :mod:`.supervise`; tfyarn's shared skein driver is :mod:`.driver`.
"""

from __future__ import annotations

from tfyarn.gateway import packaging
from tfyarn.backends.yarn.end import Follower
from tfyarn.backends.yarn.submit import SubmittedThenInterrupted, YarnRequest
from tfyarn.spec import JobSpec

__all__ = ["SubmittedThenInterrupted", "YarnBackend", "YarnRequest", "pack"]


class YarnBackend(Follower):
    """tfyarn on YARN through skein. Options: ``staging_dir`` (env archives, index cache, app records; default
    ``$TFYARN_STAGING_DIR`` or ``/user/<user>/.tfyarn``); ``driver``: "auto" (a global skein driver, else tfyarn's
    shared one) | "global" (start skein's global one, leave it running) | "private" (stopped by close());
    ``master_memory_mib``/``master_vcores`` (the AM's container); ``preflight`` (checks in submit); ``progress``
    (``callback(stage, done, total)`` while packing/uploading the env); ``client``/``cluster`` (an injected skein
    Client / preflight ClusterInfo); ``log_poll_s``/``aggregation_wait_s`` (logs); ``detached_report``: the run report
    of a followed job is written by a detached process (its plot and HDFS uploads took ~3 s on the CLI's exit path)."""

    name = "yarn"


def pack(
    spec: JobSpec,
    staging_dir: str | None = None,
    progress: packaging.Progress | None = None,
    hadoop_conf_dir: str | None = None,
) -> packaging.EnvRef:
    """``tfyarn pack``: stage the spec's environment now (same cache as submit); 0 bytes when already staged."""
    b = YarnBackend(staging_dir=staging_dir, hadoop_conf_dir=hadoop_conf_dir, progress=progress)
    b.login(spec)
    return packaging.ensure_env(spec, b.staging_dir, progress, conf=b.conf)
