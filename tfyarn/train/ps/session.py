"""Opening the training session: the chief initialises or restores; the others wait, bounded and in slices."""

from __future__ import annotations

import contextlib
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
        sess = _initialised(ctx, tg, sm, server, cfg, restore_prefix, init_fn)
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
            with contextlib.suppress(tf.errors.DeadlineExceededError):  # not yet: look at control/done again
                sess = sm.wait_for_session(server.target, config=cfg, max_wait_secs=min(2.0, left))
    log.info(
        "%s: session ready in %.2fs%s",
        ctx.task_id,
        time.monotonic() - t0,
        f" (restored {restore_prefix})" if restore_prefix else "",
    )
    return sess


def _initialised(
    ctx: Any, tg: TrainGraph, sm: Any, server: Any, cfg: Any, restore_prefix: str | None, init_fn: Any
) -> Any:
    """The chief's training session, on variables initialised (or restored) in a session of their own, closed
    before training. Why: the ps keep the graphs of a session's runs until it closes, and with them each
    constant an initializer holds (Adagrad's accumulators start as one full-size ``Const``; TF folds a ``fill`` of
    zeros into one); a variable sharing its buffer with such a constant is copied whole at its first sparse update.
    Closed first, each ps holds every variable once. The variables outlive the session (each ps keeps its
    sessions' state: ``share_session_state_in_clusterspec_propagation``), as the workers' sessions rely on."""
    import tensorflow as tf

    def staged(sess: Any) -> None:  # (graph.init_stages: one initial value at a time on each ps)
        for ops in tg.init_stages:
            sess.run(ops)
        if init_fn is not None:
            init_fn(sess)

    first = sm.prepare_session(
        server.target,
        saver=tg.saver,
        checkpoint_filename_with_path=restore_prefix,
        config=cfg,
        max_wait_secs=ctx.spec.timeouts.rendezvous,
        init_fn=staged,
    )
    first.close()
    sess = tf.compat.v1.Session(server.target, graph=tg.graph, config=cfg)
    missing = sess.run(tg.ready_op)
    if len(missing):
        sess.close()
        raise RuntimeError(f"{ctx.task_id}: variables initialised in the first session are gone in the next: {missing}")
    return sess
