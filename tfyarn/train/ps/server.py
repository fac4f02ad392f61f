"""The ps-mode TF servers and session config (a worker talks only to the ps tasks; a lost peer is an error, not a
hang); the ps task serves its variables until the job ends."""

from __future__ import annotations

import logging
import time
from typing import Any

from tfyarn.tasklib.context import ABORT_KEY, DONE_KEY
from tfyarn.tasklib.kv import KVUnavailable

log = logging.getLogger("tfyarn.train.ps")

#: How often a ps polls the KV for done/abort, and how long it tolerates an unreachable KV before exiting.
PS_POLL_S = 0.25
PS_KV_GRACE_S = 30.0


def session_config(ctx: Any) -> Any:
    """ConfigProto: device filters (a training task sees the ps tasks and itself only), ops bounded by timeouts.step."""
    import tensorflow as tf

    cfg = tf.compat.v1.ConfigProto(allow_soft_placement=False, log_device_placement=False)
    if ctx.role in ("chief", "worker"):
        cfg.device_filters.extend(["/job:ps", f"/job:{ctx.role}/task:{ctx.index}"])
    cfg.operation_timeout_in_ms = int(ctx.spec.timeouts.step * 1000)
    cfg.experimental.share_cluster_devices_in_session = False
    return cfg


#: Job name a training task's TF server boots under (see :func:`start_server`).
BOOT_JOB = "tfyarn_boot"


def start_server(ctx: Any) -> Any:
    """The ps boot with the whole cluster. A chief or worker boots alone, as ``/job:tfyarn_boot/task:0`` at its
    address, and names the real cluster in each session (``cluster_def``, :func:`open_session`): TF's ClusterSpec
    propagation refuses a session cluster naming the very job/task the master's server booted as, and without it the
    ps would keep the address a worker had before it was restarted (the ps pulls gradients from the worker)."""
    import tensorflow as tf

    if not ctx.cluster or not ctx.cluster.get("ps"):
        raise ValueError(f"{ctx.task_id}: ps mode needs a cluster with ps tasks, got {ctx.cluster!r}")
    if ctx.role == "ps":
        server = tf.distribute.Server(
            tf.train.ClusterSpec(ctx.cluster),
            job_name=ctx.role,
            task_index=ctx.index,
            config=session_config(ctx),
            start=True,
        )
    else:
        me = ctx.cluster[ctx.role][ctx.index]
        server = tf.distribute.Server(
            tf.train.ClusterSpec({BOOT_JOB: [me]}), job_name=BOOT_JOB, task_index=0, start=True
        )
    log.info("%s: TF server started at %s", ctx.task_id, server.target)
    return server


def serve(ctx: Any) -> None:
    """The ps task: serve variables until the chief sets ``control/done`` (or anyone ``control/abort``); fails when
    the KV has been unreachable for ``PS_KV_GRACE_S`` (its launcher is gone: a ps must never outlive its job)."""
    server = start_server(ctx)  # serves while referenced; the gRPC server dies with the process
    wait_for_end(ctx.kv, ctx.task_id)
    del server


def wait_for_end(kv: Any, task: str, poll: float = PS_POLL_S, kv_grace: float = PS_KV_GRACE_S) -> str:
    """Poll the KV until done/abort; returns 'done' or 'abort'. Raises when the KV is unreachable for ``kv_grace``."""
    last_ok = time.monotonic()
    while True:
        try:
            if kv.get(DONE_KEY) is not None:
                log.info("%s: training done, exiting", task)
                return "done"
            reason = kv.get(ABORT_KEY)
            if reason is not None:
                log.warning("%s: job aborted (%s), exiting", task, reason)
                return "abort"
            last_ok = time.monotonic()
        except KVUnavailable as exc:
            if time.monotonic() - last_ok > kv_grace:
                raise RuntimeError(
                    f"{task}: KV unreachable for {kv_grace:g}s while waiting for {DONE_KEY} (launcher gone?): {exc}"
                ) from None
        time.sleep(poll)
