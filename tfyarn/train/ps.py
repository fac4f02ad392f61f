"""ps mode: between-graph replication in TF1 graph mode, every training task feeding its own ready batches.

Why each piece is the way it is (the seeds' failures and NOTES.md's measurements):

* **Placement by size** (:class:`SizeBalancer`): variables go to the ps with the least bytes so far, largest first
  (a dry build learns the sizes), instead of round-robin, which can put two big embeddings on one ps and make every
  worker wait on it (seed 001).
* **Placeholders fed from the Feeder** (its prefetch thread hides the fetch): no dataset or iterator op exists in the
  graph at all, so none can land on a ps (asserted in tests).
* **Sync without deadlock** (:class:`LockstepSync`): ``SyncReplicasOptimizer`` aggregates *any* N gradients and shares
  one token queue, so a fast worker takes a slow worker's token, runs ahead, and the job hangs at epoch end. Here each
  worker has its **own** token queue, receives exactly one token per aggregated round, and pushes exactly one gradient
  per round: rounds are lockstep, a fast worker cannot run an extra step, and every worker runs the planner's equal
  step count. Every task stops on the **global** step target (epochs x steps per epoch), never on local data.
* **Nothing unbounded**: ``operation_timeout_in_ms`` = ``timeouts.step`` turns a lost peer into an error; workers wait
  for the chief's initialisation with a 0.25 s poll (not 30 s); no MonitoredTrainingSession (its 120 s stop grace);
  device filters so a worker only talks to the ps tasks (and itself).
* **Resume**: a ``tfyarn_worker_steps`` variable on a ps counts each worker's steps and is checkpointed with the model,
  so a restarted job knows each worker's epoch and position in the epoch plan (sync: all equal the global step).
* **Worker rejoin** (async; a worker restarted in place, ``TFYARN_RESTART`` > 0): its counter on the ps survived, so it
  resumes at its own position in the epoch plan. The counter is bumped on the ps right after the update (same ps,
  no round trip to the worker), and a second counter ``tfyarn_worker_started`` is bumped on the ps when a step
  begins: started > counted after a kill means a step was in flight. That step's interrupted run is lost (it applied
  nothing, or — gradient transfer cut mid-step — part of the variables); the restarted worker runs it again from its
  counter and *reports* it (``rejoin/<task>/<n>`` in the KV, ``lost_steps``/``lost_records`` in the summary). The
  session carries the current ``cluster_def`` (ClusterSpec propagation), so the ps reach the restarted worker at its
  new address instead of the one their server was started with. Sync mode does not rejoin (see :func:`_rejoin`).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tfyarn.runtime.context import ABORT_KEY, DONE_KEY, STEPS_ALIGNED_KEY
from tfyarn.runtime.kv import KVUnavailable, put_json
from tfyarn.data.pipeline import EpochPipeline
from tfyarn.train import helpers
from tfyarn.train.model import build_model, split_features, tf_dtype
from tfyarn.train.progress import (NonFiniteLoss, ProgressReporter, publish_total_steps, run_summary,
                                   wait_for_final_progress, write_summary)

log = logging.getLogger("tfyarn.train.ps")

WORKER_STEPS_VAR = "tfyarn_worker_steps"
WORKER_STARTED_VAR = "tfyarn_worker_started"


def rejoin_key(task: str, restart: int) -> str:
    """``rejoin/worker:0/1`` → JSON of the worker's first restart: where it resumed and what it lost."""
    return f"rejoin/{task}/{restart}"
_VAR_OPS = ("VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable")
#: How often a ps polls the KV for done/abort, and how long it tolerates an unreachable KV before exiting.
PS_POLL_S = 0.25
PS_KV_GRACE_S = 30.0


def _tf():
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    return tf


# ------------------------------------------------------------------------------------------------------------ config

def session_config(ctx: Any) -> Any:
    """ConfigProto: device filters (a training task sees the ps tasks and itself only), bounded ops, few threads."""
    tf = _tf()
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
    tf = _tf()
    if not ctx.cluster or not ctx.cluster.get("ps"):
        raise ValueError(f"{ctx.task_id}: ps mode needs a cluster with ps tasks, got {ctx.cluster!r}")
    if ctx.role == "ps":
        server = tf.distribute.Server(tf.train.ClusterSpec(ctx.cluster), job_name=ctx.role, task_index=ctx.index,
                                      config=session_config(ctx), start=True)
    else:
        me = ctx.cluster[ctx.role][ctx.index]
        server = tf.distribute.Server(tf.train.ClusterSpec({BOOT_JOB: [me]}), job_name=BOOT_JOB, task_index=0,
                                      start=True)
    log.info("%s: TF server started at %s", ctx.task_id, server.target)
    return server


# --------------------------------------------------------------------------------------------------------- ps task

def serve(ctx: Any) -> None:
    """The ps task: serve variables until the chief sets ``control/done`` (or anyone ``control/abort``).

    Exits with an error when the KV has been unreachable for ``PS_KV_GRACE_S``: the launcher (or the YARN AM) is gone,
    and a ps must never outlive its job.
    """
    server = start_server(ctx)
    try:
        wait_for_end(ctx.kv, ctx.task_id)
    finally:
        del server  # the process exits next; the gRPC server dies with it


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
                raise RuntimeError(f"{task}: KV unreachable for {kv_grace:g}s while waiting for {DONE_KEY} "
                                   f"(launcher gone?): {exc}") from None
        time.sleep(poll)


# ------------------------------------------------------------------------------------------------------- placement

def _op_bytes(op: Any) -> int:
    tf = _tf()
    try:
        n = tf.TensorShape(op.get_attr("shape")).num_elements()
        size = tf.as_dtype(op.get_attr("dtype")).size
    except (ValueError, TypeError):
        return 1
    return max(1, (n or 1) * size)


def plan_placement(sizes: dict[str, int], num_ps: int) -> dict[str, int]:
    """Largest-first greedy (LPT): each variable to the ps with the fewest bytes so far. name → ps index."""
    loads = [0] * num_ps
    out = {}
    for name, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        i = min(range(num_ps), key=lambda j: (loads[j], j))
        out[name] = i
        loads[i] += size
    return out


class SizeBalancer:
    """``ps_strategy`` for ``replica_device_setter``: planned variables go where :func:`plan_placement` said; any
    other variable (global step, counters, optimizer variables without a primary) to the least-loaded ps."""

    def __init__(self, num_ps: int, planned: dict[str, int] | None = None):
        self.num_ps = num_ps
        self.planned = dict(planned or {})
        self.loads = [0] * num_ps
        self.placed: dict[str, int] = {}

    def __call__(self, op: Any) -> int:
        if op.type not in _VAR_OPS:
            # accumulators, queues, hash tables: an explicit device scope (the variable's ps) overrides this choice
            return min(range(self.num_ps), key=lambda j: (self.loads[j], j))
        size = _op_bytes(op)
        i = self.planned.get(op.name)
        if i is None:
            i = self._primary(op.name)
        if i is None:
            i = min(range(self.num_ps), key=lambda j: (self.loads[j], j))
        self.loads[i] += size
        self.placed[op.name] = i
        return i


    def _primary(self, name: str) -> int | None:
        """Optimizer slots ('<var>/Adagrad') end up colocated with their variable (TF applies colocation after
        device functions), so account their bytes to the variable's ps."""
        best = None
        for var, i in self.placed.items():
            if name.startswith(var + "/") and (best is None or len(var) > len(best[0])):
                best = (var, i)
        return best[1] if best else None


def variable_sizes(model_factory: Any) -> dict[str, int]:
    """Build the model in a scratch graph: op name → bytes of each variable it creates (no session, no devices)."""
    tf = _tf()
    g = tf.Graph()
    with g.as_default():
        build_model(model_factory)
        return {op.name: _op_bytes(op) for op in g.get_operations() if op.type in _VAR_OPS}


# ---------------------------------------------------------------------------------------------------------- graph

@dataclass
class TrainGraph:
    graph: Any
    placeholders: dict[str, Any]
    loss: Any
    train_op: Any              # runs one local step; its value is the global step after it
    global_step: Any
    worker_steps: Any
    worker_started: Any
    reset_started: Any         # this worker's started := counted (after reading what was in flight)
    init_op: Any
    local_init_op: Any
    ready_op: Any
    saver: Any
    model_var_keys: list[str]
    align_steps: Any
    all_finite: Any            # every trainable variable free of NaN/inf (checked after a checkpoint is written)
    sync: "LockstepSync | None" = None
    placement: dict[str, int] = field(default_factory=dict)


class LockstepSync:
    """Synchronous aggregation in lockstep rounds (see the module docstring for why not SyncReplicasOptimizer).

    Per trainable variable a (Sparse)ConditionalAccumulator on that variable's ps; per worker a token queue on the
    global step's ps. A worker step = push its gradients (stamped with its local step) → dequeue its own token (blocks
    until the round is aggregated) → local step := token. The chief's :meth:`aggregate` op takes N gradients from
    every accumulator (their mean), applies them, increments the global step and enqueues one token per worker.
    """

    def __init__(self, opt: Any, grads_and_vars: list, num_workers: int, rank: int, global_step: Any,
                 worker_device: str):
        tf = _tf()
        self.n = num_workers
        with tf.compat.v1.device(global_step.device):
            start = tf.identity(global_step.read_value())   # a tensor, not a callable: no colocation with the var
        with tf.compat.v1.device(worker_device):
            self.local_step = tf.compat.v1.Variable(
                initial_value=start, trainable=False, name="tfyarn_local_step",
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES], use_resource=True, dtype=tf.int64)
        pushes, takes = [], []
        for g, v in grads_and_vars:
            with tf.compat.v1.device(v.device):
                shared = f"{v.op.name}/tfyarn_sync_accum"
                if isinstance(g, tf.IndexedSlices):
                    acc = tf.compat.v1.SparseConditionalAccumulator(g.dtype, shape=v.shape, shared_name=shared)
                    pushes.append(acc.apply_indexed_slices_grad(g, local_step=self.local_step))
                    takes.append((acc.take_indexed_slices_grad(self.n), v))
                else:
                    acc = tf.compat.v1.ConditionalAccumulator(g.dtype, shape=v.shape, shared_name=shared)
                    pushes.append(acc.apply_grad(g, local_step=self.local_step))
                    takes.append((acc.take_grad(self.n), v))
        with tf.compat.v1.device(global_step.device):
            self.queues = [tf.queue.FIFOQueue(self.n + 2, [tf.int64], shapes=[()],
                                              shared_name=f"tfyarn_sync_token_{w}", name=f"tfyarn_sync_token_{w}")
                           for w in range(num_workers)]
        with tf.control_dependencies(pushes):
            token = self.queues[rank].dequeue()
        self.step_op = self.local_step.assign(token)   # value: the global step this round produced
        self.apply_op = opt.apply_gradients(takes, global_step=global_step)
        with tf.control_dependencies([self.apply_op]):
            gs = tf.identity(global_step.read_value())
            self.aggregate = tf.group(*[q.enqueue(gs) for q in self.queues], name="tfyarn_sync_aggregate")


def build_graph(ctx: Any, model: Any) -> TrainGraph:
    """The between-graph replica for this task (every task builds the same variables, so names agree)."""
    tf = _tf()
    spec = ctx.spec
    num_ps = len(ctx.cluster["ps"])
    # (one ps: everything goes to it; skip building the model a second time just to size its variables)
    planned = plan_placement(variable_sizes(model), num_ps) if num_ps > 1 else {}
    balancer = SizeBalancer(num_ps, planned)
    worker_device = f"/job:{ctx.role}/task:{ctx.index}"
    graph = tf.Graph()
    with graph.as_default():
        setter = tf.compat.v1.train.replica_device_setter(
            ps_tasks=num_ps, worker_device=worker_device, cluster=tf.train.ClusterSpec(ctx.cluster),
            ps_strategy=balancer)
        with tf.compat.v1.device(setter):
            build_model(model)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            with tf.compat.v1.device(global_step.device):  # with the global step: counted in the ps's partition
                worker_steps = tf.Variable(tf.zeros([ctx.num_data_workers], tf.int64), trainable=False,
                                           name=WORKER_STEPS_VAR)
                worker_started = tf.Variable(tf.zeros([ctx.num_data_workers], tf.int64), trainable=False,
                                             name=WORKER_STARTED_VAR)
                rank = tf.constant([ctx.data_rank])
                # no input from this worker: runs as soon as the ps partition of a step starts
                started = worker_started.scatter_add(tf.IndexedSlices(tf.constant([1], tf.int64), rank))
                reset_started = worker_started.scatter_update(
                    tf.IndexedSlices(tf.gather(worker_steps.read_value(), rank), rank))
            placeholders = {name: tf.compat.v1.placeholder(tf_dtype(f.dtype), [None, *f.shape], name=f"in_{name}")
                            for name, f in spec.data.features.items()}
            feats, labels = split_features(placeholders, spec.data.label)
            predictions = model(feats, training=True)
            loss = tf.reduce_mean(model.loss(labels, predictions), name="loss")
            opt = model.optimizer()
            gvs = [(g, v) for g, v in opt.compute_gradients(loss, var_list=model.trainable_variables)
                   if g is not None]
            if not gvs:
                raise ValueError(f"{type(model).__name__}: the loss depends on no trainable variable")
            sync = None
            if spec.sync:
                sync = LockstepSync(opt, gvs, ctx.num_data_workers, ctx.data_rank, global_step, worker_device)
                step_value = sync.step_op
                counted_after = step_value
            else:
                apply = opt.apply_gradients(gvs, global_step=global_step)
                with tf.control_dependencies([apply]):
                    step_value = tf.identity(global_step.read_value())
                counted_after = apply   # on the ps, right after the update: no round trip to this worker between
            with tf.control_dependencies([counted_after, started]), tf.compat.v1.device(global_step.device):
                count = worker_steps.scatter_add(tf.IndexedSlices(tf.constant([1], tf.int64), rank))
            with tf.control_dependencies([count, step_value]):
                train_op = tf.identity(step_value, name="train_step")
            # Resume: a checkpoint is read while steps run, so it may catch the global step and the worker counters
            # a step apart. sync: every worker is exactly at the global step (a counter caught mid-round). async: the
            # global step is the sum of the worker counters, which say where each worker is in its plan (seen: a
            # resumed job ending at global step 191 of 192 with every worker at its planned step).
            with tf.compat.v1.device(global_step.device):
                if spec.sync:
                    align_steps = worker_steps.assign(tf.fill([ctx.num_data_workers], global_step.read_value()))
                else:
                    align_steps = global_step.assign(tf.reduce_sum(worker_steps.read_value()))
        with tf.compat.v1.device(worker_device):
            init_op = tf.compat.v1.global_variables_initializer()
            local_init_op = tf.group(tf.compat.v1.local_variables_initializer(),
                                     tf.compat.v1.tables_initializer())
            ready_op = tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables())
            saver = tf.compat.v1.train.Saver(tf.compat.v1.global_variables(), sharded=False, max_to_keep=2,
                                             save_relative_paths=True)
        model_var_keys = [v.op.name for v in model.variables]
        finite = []
        for v in model.trainable_variables:          # each check runs where its variable lives: one bool travels
            with tf.compat.v1.device(v.device):
                finite.append(tf.reduce_all(tf.math.is_finite(v.read_value())))
        with tf.compat.v1.device(worker_device):
            all_finite = tf.reduce_all(tf.stack(finite))
    graph.finalize()
    return TrainGraph(graph=graph, placeholders=placeholders, loss=loss, train_op=train_op, global_step=global_step,
                      worker_steps=worker_steps, worker_started=worker_started, reset_started=reset_started,
                      init_op=init_op, local_init_op=local_init_op, ready_op=ready_op,
                      saver=saver, model_var_keys=model_var_keys, align_steps=align_steps, all_finite=all_finite,
                      sync=sync,
                      placement=dict(balancer.placed))


# -------------------------------------------------------------------------------------------------------- session

def open_session(ctx: Any, tg: TrainGraph, server: Any, restore_prefix: str | None) -> Any:
    """Chief: initialise (or restore) the variables. Others: wait (bounded, in 2 s slices) until the chief has;
    None when control/done appears meanwhile (a worker restarted after training finished)."""
    tf = _tf()
    sm = tf.compat.v1.train.SessionManager(local_init_op=tg.local_init_op, ready_op=tg.ready_op,
                                           ready_for_local_init_op=tg.ready_op, graph=tg.graph,
                                           recovery_wait_secs=0.25)
    cfg = session_config(ctx)
    # ClusterSpec propagation: the ps use *these* addresses for this session (a restarted worker's new port), not
    # the ones their server started with. Device filters still limit whom this session talks to.
    cfg.cluster_def.CopyFrom(tf.train.ClusterSpec(ctx.cluster).as_cluster_def())
    cfg.experimental.share_session_state_in_clusterspec_propagation = True  # one set of variables for all sessions
    t0 = time.monotonic()
    if ctx.is_chief:
        sess = sm.prepare_session(server.target, init_op=tg.init_op, saver=tg.saver,
                                  checkpoint_filename_with_path=restore_prefix, config=cfg,
                                  max_wait_secs=ctx.spec.timeouts.rendezvous)
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
                raise TimeoutError(f"{ctx.task_id}: the chief did not initialise the variables within "
                                   f"{ctx.spec.timeouts.rendezvous:g}s (timeouts.rendezvous)")
            try:
                sess = sm.wait_for_session(server.target, config=cfg, max_wait_secs=min(2.0, left))
            except tf.errors.DeadlineExceededError:
                sess = None
    log.info("%s: session ready in %.2fs%s", ctx.task_id, time.monotonic() - t0,
             f" (restored {restore_prefix})" if restore_prefix else "")
    return sess


# ----------------------------------------------------------------------------------------------------- checkpoints

class Checkpointer:
    """The chief's periodic checkpoints: Saver to a local dir, then :class:`CheckpointStore` upload (atomic)."""

    def __init__(self, ctx: Any, tg: TrainGraph, steps: list[int]):
        from tfyarn.train.checkpoint import CheckpointStore, local_dir_for

        ck = ctx.spec.checkpoint
        self.ctx, self.tg, self.steps = ctx, tg, steps
        self.store = CheckpointStore(ctx.spec.resolve_path(ck.dir), keep=ck.keep) if ck.dir else None
        self.every_steps, self.every_secs = ck.every_steps, ck.every_secs
        self.local = local_dir_for(ctx.workdir, "save") if self.store else None
        self.last_step = -1
        self.last_time = time.monotonic()
        self.resumed_from: str | None = None   # the checkpoint the chief restored, for the summary

    def restore_prefix(self) -> str | None:
        """Download the latest checkpoint (if any) for the chief to restore from."""
        if self.store is None:
            return None
        entry = self.store.latest()
        if entry is None:
            return None
        from tfyarn.train.checkpoint import check_fits, local_dir_for
        prefix = self.store.download(entry, local_dir_for(self.ctx.workdir, "restore"))
        tf = _tf()
        expected = {v.op.name: v.shape.as_list()        # the Saver's list: every global variable of the graph
                    for v in self.tg.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        check_fits(prefix, expected, f"{entry['name']} in {self.store.url}")
        log.info("%s: resuming from %s (global step %d)", self.ctx.task_id, entry["name"], entry["global_step"])
        self.resumed_from = entry["name"]
        return prefix

    def due(self, global_step: int) -> bool:
        if self.store is None or global_step == self.last_step:
            return False
        if self.every_steps and global_step - max(self.last_step, 0) >= self.every_steps:
            return True
        return bool(self.every_secs) and time.monotonic() - self.last_time >= self.every_secs

    def save(self, sess: Any, global_step: int | None = None) -> dict[str, Any] | None:
        if self.store is None:
            return None
        gs, ws = sess.run([self.tg.global_step, self.tg.worker_steps])
        gs = int(gs)
        if gs == self.last_step:
            return None
        prefix = self.tg.saver.save(sess, str(self.local / "ckpt"), global_step=gs, write_meta_graph=False,
                                    write_state=False)
        # Async: another worker's diverged update may have reached the ps after this task's last (finite) loss. A NaN
        # never leaves a variable once in it (every later update keeps it), so variables finite *after* the save
        # were finite during it; otherwise the files are not committed and the last committed checkpoint stays good.
        if self.ctx.spec.fail_on_nan_loss and not sess.run(self.tg.all_finite):
            raise NonFiniteLoss(f"{self.ctx.task_id}: the model's variables hold NaN/inf after the checkpoint at "
                                f"global step {gs} was written (a worker's update diverged): not committed, the "
                                f"latest committed checkpoint is the last good one")
        # Async workers keep stepping while the Saver reads the ps: the counters in the files can be a step or two
        # past what was read above. The index must describe what was saved, so read them back from the files.
        gs, ws = self._saved_counters(prefix)
        ws = [gs] * len(ws) if self.ctx.spec.sync else [int(x) for x in ws]
        meta = {"format": "v1-saver", "model_variables": self.tg.model_var_keys, "worker_steps": ws,
                "epoch": helpers.position(min(ws), self.steps)[0], "mode": "ps", "sync": self.ctx.spec.sync}
        entry = self.store.upload(prefix, gs, meta)
        self.last_step, self.last_time = gs, time.monotonic()
        return entry


    def _saved_counters(self, prefix: str) -> tuple[int, list[int]]:
        import tensorflow as tf
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        gs = int(reader.get_tensor(self.tg.global_step.op.name))
        ws = [int(x) for x in reader.get_tensor(self.tg.worker_steps.op.name)]
        return gs, ws


# ----------------------------------------------------------------------------------------------------- train loop

class _Aggregator(threading.Thread):
    """Chief only, sync mode: runs the aggregate op round after round until the global step target."""

    def __init__(self, sess: Any, tg: TrainGraph, target: int, start_step: int):
        super().__init__(name="tfyarn-sync-aggregator", daemon=True)
        self.sess, self.tg, self.target, self.gs = sess, tg, target, start_step
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while self.gs < self.target:
                self.sess.run(self.tg.sync.aggregate)
                self.gs += 1
        except BaseException as exc:  # reported by the main loop
            self.error = exc
            log.error("sync aggregator failed at global step %d: %s", self.gs, exc)


def train(ctx: Any, model: Any) -> dict[str, Any] | None:
    """A chief or worker task in ps mode. Returns the summary on the chief, this task's figures otherwise."""
    spec = ctx.spec
    t_start = time.monotonic()
    # two feeders alternating epochs: the next epoch is read while this one trains (no cold start at a boundary)
    feeder = EpochPipeline(lambda: helpers.make_feeder(ctx), spec.data.epochs)
    with feeder:
        steps = helpers.epoch_steps(feeder, spec.data.epochs)
        per_worker = sum(steps)
        target = per_worker if spec.sync else per_worker * ctx.num_data_workers
        if ctx.is_chief:
            publish_total_steps(ctx.kv, target)
        log.info("%s: ps mode, %s, %d epochs x %s steps per worker, global step target %d, batch %d per worker "
                 "(global %d)", ctx.task_id, "sync" if spec.sync else "async", spec.data.epochs, steps, target,
                 spec.data.batch_size, spec.global_batch_size)
        server = start_server(ctx)
        tg = build_graph(ctx, model)
        if ctx.is_chief:
            log.info("variable placement (ps index): %s", tg.placement)
        ckpt = Checkpointer(ctx, tg, steps) if ctx.is_chief else None
        # Saver.save/restore refuse to run while TF2's eager mode is current: stay in the training graph
        with tg.graph.as_default():
            try:
                sess = open_session(ctx, tg, server, ckpt.restore_prefix() if ckpt else None)
                if sess is None:
                    log.warning("%s: training already finished (%s is set); nothing to rejoin", ctx.task_id,
                                DONE_KEY)
                    return {"steps": 0, "already_finished": True}
                try:
                    return _run(ctx, tg, sess, feeder, steps, target, ckpt, t_start)
                finally:
                    sess.close()
            except _tf().errors.UnavailableError:
                if ctx.is_chief or ctx.kv.get(DONE_KEY) is None:
                    raise
                # The ps left because training finished while this worker was starting: a re-run of a finished job
                # (the chief restores the final checkpoint and is done at once) or a restart at the very end. The
                # chief sets done only once every worker's counter is complete, so nothing is left for this one.
                log.warning("%s: training finished while this worker was starting (%s is set, the ps have exited); "
                            "nothing left to run", ctx.task_id, DONE_KEY)
                return {"steps": 0, "already_finished": True}


def _wait_for_aligned_steps(ctx: Any, poll: float = 0.05) -> None:
    """A worker's first step waits for the chief's ``control/steps_aligned``: the async resume alignment (global step
    := sum of the worker counters) reads and writes the global step, and a worker step in between would be lost from
    the count. Bounded by ``timeouts.rendezvous``; a job already done needs no wait (the loop then finds nothing)."""
    from tfyarn.errors import WaitTimeout
    deadline = time.monotonic() + ctx.spec.timeouts.rendezvous
    while ctx.kv.get(STEPS_ALIGNED_KEY) is None and ctx.kv.get(DONE_KEY) is None:
        if ctx.kv.get(ABORT_KEY) is not None:
            raise RuntimeError(f"{ctx.task_id}: job aborted while waiting for the chief to start: "
                               f"{ctx.kv.get(ABORT_KEY)}")
        if time.monotonic() > deadline:
            raise WaitTimeout(f"{ctx.task_id}: timed out after {ctx.spec.timeouts.rendezvous:g}s waiting for the "
                              f"chief to start its training loop ({STEPS_ALIGNED_KEY})")
        time.sleep(poll)


def _rejoin(ctx: Any, tg: TrainGraph, sess: Any, steps: list[int]) -> int:
    """Before the first step: what did this worker's previous process leave in flight? Returns the lost steps.

    started > counted on the ps = a step began and was never counted (the process died in it). The restarted worker
    resumes at its counter, i.e. runs that step again; the interrupted run is reported (log + ``rejoin/`` key, read
    into the summary by the chief). Then started := counted. A fresh attempt only resets: a checkpoint can catch a
    live step between the two counters, which is not a loss of this attempt (that is bounded by the checkpoint).

    Sync mode refuses: a dead process may have pushed gradients for a round that completes only after the restarted
    one read the global step, so it would push a second gradient into that round or wait for a token it drained —
    extra steps or a deadlock. The spec forbids worker restarts in sync ps mode; ``retry.max_attempts`` restarts the
    whole job from its checkpoint instead.
    """
    import os
    restart = int(os.environ.get("TFYARN_RESTART", "0") or 0)
    if restart and ctx.spec.sync:
        raise RuntimeError(f"{ctx.task_id}: a restarted worker cannot rejoin a sync (lockstep) ps job; "
                           f"use retry.max_attempts (a job attempt from the latest checkpoint)")
    started, counted = (int(x[ctx.data_rank]) for x in sess.run([tg.worker_started, tg.worker_steps]))
    sess.run(tg.reset_started)
    if not restart:
        return 0
    lost = max(0, started - counted)
    epoch, step = helpers.position(counted, steps)
    record = {"restart": restart, "resume_at": counted, "epoch": epoch, "step": step, "lost_steps": lost,
              "lost_records": lost * ctx.spec.data.batch_size}
    if lost:
        log.warning("%s: restart %d rejoins; its previous process died with %d step(s) in flight (epoch %d step %d, "
                    "%d records): that run is lost, the step runs again from the worker's counter %d", ctx.task_id,
                    restart, lost, epoch, step, record["lost_records"], counted)
    else:
        log.warning("%s: restart %d rejoins at epoch %d step %d (counter %d); no step was in flight", ctx.task_id,
                    restart, epoch, step, counted)
    put_json(ctx.kv, rejoin_key(ctx.task_id, restart), record)
    return lost


def _rejoins(kv: Any, tasks: list[str]) -> dict[str, Any]:
    """Summary fields from the ``rejoin/`` keys: per training task, restarts rejoined and steps/records lost."""
    out: dict[str, Any] = {"rejoins": {t: 0 for t in tasks}, "lost_steps": {t: 0 for t in tasks},
                           "lost_records": {t: 0 for t in tasks}}
    for key, raw in kv.items("rejoin/").items():
        task = key.split("/")[1]
        rec = json.loads(raw)
        out["rejoins"][task] = out["rejoins"].get(task, 0) + 1
        out["lost_steps"][task] = out["lost_steps"].get(task, 0) + int(rec["lost_steps"])
        out["lost_records"][task] = out["lost_records"].get(task, 0) + int(rec["lost_records"])
    return out


def _run(ctx: Any, tg: TrainGraph, sess: Any, feeder: Any, steps: list[int], target: int,
         ckpt: Checkpointer | None, t_start: float) -> dict[str, Any] | None:
    spec = ctx.spec
    if ctx.is_chief:
        if spec.sync or (ckpt is not None and ckpt.resumed_from):
            sess.run(tg.align_steps)
        ctx.kv.put(STEPS_ALIGNED_KEY, "1")
    else:
        _wait_for_aligned_steps(ctx)
    lost = _rejoin(ctx, tg, sess, steps)
    gs0, ws0 = sess.run([tg.global_step, tg.worker_steps])
    gs0 = int(gs0)
    if spec.sync:
        ws0 = [gs0] * ctx.num_data_workers
    done = gs0 if spec.sync else int(ws0[ctx.data_rank])
    epoch, start = helpers.position(done, steps)
    if done:
        log.info("%s: resuming at epoch %d step %d (global step %d)", ctx.task_id, epoch, start, gs0)
    if ckpt:
        ckpt.last_step = gs0
    names = list(tg.placeholders)
    step_fn = sess.make_callable([tg.train_op, tg.loss], feed_list=[tg.placeholders[n] for n in names])
    aggregator = None
    if spec.sync and ctx.is_chief:
        aggregator = _Aggregator(sess, tg, target, gs0)
        aggregator.start()
    progress = ProgressReporter(ctx.kv, ctx.task_id, fail_on_nan_loss=ctx.spec.fail_on_nan_loss)
    local = done
    gs = gs0
    label = spec.data.label
    progress.begin()
    t_first = None
    for e, batch in feeder.run(epoch, start):
        gs, loss = step_fn(*[batch[n] for n in names])
        gs = int(gs)
        local += 1
        if t_first is None:
            t_first = time.monotonic()
            log.info("%s: first step %.2fs after start, loss %.4f", ctx.task_id, t_first - t_start, loss)
        if spec.sync and gs != local:
            raise RuntimeError(f"{ctx.task_id}: sync lockstep broken: local step {local} but global step {gs}")
        progress.report(step=local, epoch=e, loss=loss, global_step=gs,
                        examples=len(batch[label]) if label else spec.data.batch_size)
        if aggregator is not None and aggregator.error is not None:
            raise RuntimeError(f"sync aggregation failed: {aggregator.error}") from aggregator.error
        if ckpt and ckpt.due(gs):
            ckpt.save(sess)
        if spec.sync and gs >= target:
            break
    mine = progress.final()
    mine["start_worker_steps"] = [int(x) for x in ws0]
    mine["lost_steps"] = lost
    mine["train_start"] = progress.start
    log.info("%s: finished %d local steps (global step %d), %.0f examples/s, loss %s -> %s", ctx.task_id,
             mine["steps"], gs, mine["examples_per_sec"], mine["first_loss"], mine["last_loss"])
    if not ctx.is_chief:
        return mine
    if aggregator is not None:
        aggregator.join(timeout=spec.timeouts.step)
        if aggregator.is_alive():
            raise TimeoutError(f"sync aggregator still running {spec.timeouts.step:g}s after the last step")
    worker_steps = _wait_for_workers(ctx, tg, sess, steps, ckpt)
    return _finish(ctx, tg, sess, ckpt, mine, worker_steps, target, t_start)


def _wait_for_workers(ctx: Any, tg: TrainGraph, sess: Any, steps: list[int],
                      ckpt: Checkpointer | None) -> list[int]:
    """Chief: wait until every worker has run its share (async workers finish at their own pace). Bounded: fails
    when no worker step happened for ``timeouts.step`` (a stopped worker, named in the error)."""
    want = sum(steps)
    last, last_change = None, time.monotonic()
    while True:
        ws = [int(x) for x in sess.run(tg.worker_steps)]
        if all(n >= want for n in ws):
            return ws
        if ws != last:
            last, last_change = ws, time.monotonic()
        elif time.monotonic() - last_change > ctx.spec.timeouts.step:
            behind = {t: n for t, n in zip(ctx.training_tasks, ws) if n < want}
            raise TimeoutError(f"waited {ctx.spec.timeouts.step:g}s (timeouts.step) for workers to finish their "
                               f"{want} steps; no progress from: {behind}")
        if ckpt:
            gs = int(sess.run(tg.global_step))
            if ckpt.due(gs):
                ckpt.save(sess)
        time.sleep(0.1)


def _finish(ctx: Any, tg: TrainGraph, sess: Any, ckpt: Checkpointer | None, mine: dict[str, Any],
            worker_steps: list[int], target: int, t_start: float) -> dict[str, Any]:
    """Chief: final checkpoint, summary (file + KV), then ``control/done`` so the ps tasks exit."""
    spec = ctx.spec
    gs = int(sess.run(tg.global_step))
    entry = ckpt.save(sess) if ckpt else None
    elapsed = time.monotonic() - t_start
    train_s = time.monotonic() - mine["train_start"]   # before the wait for the workers' final records
    progress = wait_for_final_progress(ctx, spec.timeouts.shutdown)
    trained = (sum(worker_steps) - sum(mine["start_worker_steps"])) * spec.data.batch_size
    latest = entry or (ckpt.store.latest() if ckpt and ckpt.store else None)   # None: saved at this step already
    summary = run_summary(
        ctx, global_step=gs, total_steps=target, steps_per_worker=dict(zip(ctx.training_tasks, worker_steps)),
        examples_per_sec=round(trained / train_s, 1) if train_s > 0 else 0.0,
        first_loss=mine["first_loss"], last_loss=mine["last_loss"], train_s=round(train_s, 3),
        last_checkpoint=(latest or {}).get("name"), resumed_from=ckpt.resumed_from if ckpt else None,
        loss_by_worker={t: p.get("loss") for t, p in progress.items()} | {ctx.task_id: mine["last_loss"]},
        elapsed_s=round(elapsed, 3), num_ps=len(ctx.cluster.get("ps", [])), **_rejoins(ctx.kv, ctx.training_tasks))
    log.info("training done: global step %d/%d, steps per worker %s, %.0f examples/s, loss %s -> %s, %.1fs",
             gs, target, summary["steps_per_worker"], summary["examples_per_sec"], summary["first_loss"],
             summary["last_loss"], elapsed)
    if any(summary["rejoins"].values()):
        log.warning("workers restarted and rejoined: %s; in-flight steps lost (run again): %s",
                    summary["rejoins"], summary["lost_steps"])
    summary["summary_url"] = write_summary(ctx, summary)
    ctx.kv.put(DONE_KEY, "1")
    return summary
