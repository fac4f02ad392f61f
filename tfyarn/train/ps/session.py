"""Opening the training session: the chief initialises or restores; the others wait, bounded and in slices."""

from __future__ import annotations

import logging
import time
from typing import Any

from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.context import DONE_KEY
from tfyarn.train.ps.graph import TrainGraph
from tfyarn.train.ps.server import session_config

log = logging.getLogger("tfyarn.train.ps")


def open_session(ctx: Any, tg: TrainGraph, server: Any, restore_prefix: str | None, init_fn: Any = None) -> Any:
    """Chief: initialise (or restore) the variables. Others: wait (bounded, in 2 s slices) until the chief has;
    None when control/done appears meanwhile (a worker restarted after training finished)."""
    import tensorflow as tf

    sm = tf.compat.v1.train.SessionManager(
        local_init_op=tg.local_init_op,
        ready_op=tg.ready_op,
        ready_for_local_init_op=tg.ready_op,
        graph=tg.graph,
        recovery_wait_secs=0.25,
    )
    cfg = session_config(ctx)
    # ClusterSpec propagation: the ps use *these* addresses for this session (a restarted worker's new port), not
    # the ones their server started with. Device filters still limit whom this session talks to.
    cfg.cluster_def.CopyFrom(tf.train.ClusterSpec(ctx.cluster).as_cluster_def())
    cfg.experimental.share_session_state_in_clusterspec_propagation = True  # one set of variables for all sessions
    t0 = time.monotonic()
    if ctx.is_chief:
        sess = sm.prepare_session(
            server.target,
            init_op=tg.init_op,
            saver=tg.saver,
            checkpoint_filename_with_path=restore_prefix,
            config=cfg,
            max_wait_secs=ctx.spec.timeouts.rendezvous,
            init_fn=init_fn,
        )
    else:
        # in slices, so a worker restarted after training finished (killed on its way out) notices control/done
        # and leaves instead of waiting for a chief and ps that are gone
        deadline = t0 + ctx.spec.timeouts.rendezvous
        sess = None
        while sess is None:
            if ctx.kv.get(DONE_KEY) is not None:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(
                    f"{ctx.task_id}: the chief did not initialise the variables within "
                    f"{ctx.spec.timeouts.rendezvous:g}s (timeouts.rendezvous)"
                )
            try:
                sess = sm.wait_for_session(server.target, config=cfg, max_wait_secs=min(2.0, left))
            except tf.errors.DeadlineExceededError:
                sess = None
    log.info(
        "%s: session ready in %.2fs%s",
        ctx.task_id,
        time.monotonic() - t0,
        f" (restored {restore_prefix})" if restore_prefix else "",
    )
    return sess
