"""The between-graph replica a chief or worker builds: placeholders, the model on the ps (by size), the train op in
async or lockstep-sync form, the per-worker step counters that make resume and rejoin exact, init/ready ops, Saver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tfyarn.train import sharding
from tfyarn.train.inputs import placeholders as input_placeholders
from tfyarn.train.model import build_model, split_features
from tfyarn.train.ps.packing import pack_gradients
from tfyarn.train.ps.placement import SizeBalancer, plan_placement, variable_sizes
from tfyarn.train.ps.saver import read_no_copy
from tfyarn.train.ps.saver import saver as no_copy_saver
from tfyarn.train.step_metrics import step_metrics


@dataclass
class TrainGraph:
    graph: Any
    placeholders: dict[str, Any]
    feeds: dict[str, list[Any]]  # the placeholders fed per feature (inputs.placeholders)
    loss: Any
    train_op: Any  # runs one local step; its value is the global step after it
    global_step: Any
    worker_steps: Any
    worker_started: Any
    reset_started: Any  # this worker's started := counted (after reading what was in flight)
    init_op: Any
    init_stages: list[list[Any]]  # the variables' initializers in the order the chief runs them (init_stages())
    local_init_op: Any
    ready_op: Any
    saver: Any
    model_var_keys: list[str]
    model_vars: list  # the model's variables, creation order (a warm start loads them by this order)
    align_steps: Any
    all_finite: Any  # every trainable variable free of NaN/inf (checked after a checkpoint is written)
    sync: "LockstepSync | None" = None
    placement: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # compiled metrics of the step's batch, fetched with loss
    predictions: Any = None  # the model's output on the fed batch (tests compare it with an export's)


class LockstepSync:
    """Synchronous aggregation in lockstep rounds (see the module docstring for why not SyncReplicasOptimizer).

    Per trainable variable a (Sparse)ConditionalAccumulator on that variable's ps; per worker a token queue on the
    global step's ps. A worker step = push its gradients (stamped with its local step) → dequeue its own token (blocks
    until the round is aggregated) → local step := token. The chief's :meth:`aggregate` op takes N gradients from
    every accumulator (their mean), applies them, increments the global step and enqueues one token per worker.
    """

    def __init__(
        self, opt: Any, grads_and_vars: list, num_workers: int, rank: int, global_step: Any, worker_device: str
    ):
        import tensorflow as tf

        self.n = num_workers
        with tf.compat.v1.device(global_step.device):
            start = tf.identity(global_step.read_value())  # a tensor, not a callable: no colocation with the var
        with tf.compat.v1.device(worker_device):
            self.local_step = tf.compat.v1.Variable(
                initial_value=start,
                trainable=False,
                name="tfyarn_local_step",
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                use_resource=True,
                dtype=tf.int64,
            )
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
            self.queues = [
                tf.queue.FIFOQueue(
                    self.n + 2,
                    [tf.int64],
                    shapes=[()],
                    shared_name=f"tfyarn_sync_token_{w}",
                    name=f"tfyarn_sync_token_{w}",
                )
                for w in range(num_workers)
            ]
        with tf.control_dependencies(pushes):
            token = self.queues[rank].dequeue()
        self.step_op = self.local_step.assign(token)  # value: the global step this round produced
        self.apply_op = opt.apply_gradients(takes, global_step=global_step)
        with tf.control_dependencies([self.apply_op]):
            gs = tf.identity(global_step.read_value())
            self.aggregate = tf.group(*[q.enqueue(gs) for q in self.queues], name="tfyarn_sync_aggregate")


#: A variable of this many bytes or more is initialised in a run of its own on its ps (init_stages).
BIG_INIT_BYTES = 16 * 2**20


def init_stages(variables: list[Any]) -> list[list[Any]]:
    """The initializers of ``variables`` in runs the chief makes one after the other: the first run initialises
    every small variable and the biggest of each ps, each next run the next biggest of each ps. Why: a variable's
    initial value is a tensor of its size beside it (a random one a second copy while it is scaled), and TF's CPU
    allocator keeps what it freed for reuse rather than return it; one ``global_variables_initializer`` computes
    every initial value of a ps at once, so its peak holds them all, while in turns one at a time is reused."""
    small: list[Any] = []
    big: dict[str, list[tuple[int, str, Any]]] = {}
    for v in variables:
        nbytes = (v.shape.num_elements() or 0) * v.dtype.size if v.shape.is_fully_defined() else 0
        if nbytes < BIG_INIT_BYTES:
            small.append(v.initializer)
        else:
            big.setdefault(v.device, []).append((nbytes, v.name, v.initializer))
    for on_ps in big.values():
        on_ps.sort(key=lambda x: (-x[0], x[1]))
    turns = max((len(x) for x in big.values()), default=0)
    stages = [[on_ps[k][2] for on_ps in big.values() if k < len(on_ps)] for k in range(turns)]
    return [small + stages[0], *stages[1:]] if stages else [small]


def build_graph(ctx: Any, model: Any) -> TrainGraph:
    """The between-graph replica for this task (every task builds the same variables, so names agree)."""
    import tensorflow as tf

    spec = ctx.spec
    num_ps = len(ctx.cluster["ps"])
    policy = sharding.policy_for(spec, num_ps)
    # (one ps: everything goes to it; skip building the model a second time just to size its variables)
    planned = plan_placement(variable_sizes(model, policy), num_ps) if num_ps > 1 else {}
    balancer = SizeBalancer(num_ps, planned)
    worker_device = f"/job:{ctx.role}/task:{ctx.index}"
    graph = tf.Graph()
    with graph.as_default():
        setter = tf.compat.v1.train.replica_device_setter(
            ps_tasks=num_ps,
            worker_device=worker_device,
            cluster=tf.train.ClusterSpec(ctx.cluster),
            ps_strategy=balancer,
        )
        with tf.compat.v1.device(setter):
            # big variables split by rows over the ps (sharding.py), each shard placed by the balancer's plan
            with sharding.sharding(policy, intercept=not sharding.builds_own_tables(model)):
                build_model(model)
            # a weight over gRPC's limit: said now, from its shape, before the optimizer (a Keras model's eager
            # twin would allocate it) and any session
            sharding.refuse_too_big(tf.compat.v1.global_variables(), keras=sharding.builds_own_tables(model))
            global_step = tf.compat.v1.train.get_or_create_global_step()
            counters = _step_counters(ctx, global_step)
            fwd = _forward(model, spec.data)
            opt = sharding.touched_rows_only(model.optimizer())  # (Adam: lazy on split tables)
            trainable = model.trainable_variables  # (a split table: its shards, each with its own sparse gradient)
            gvs = [(g, v) for g, v in opt.compute_gradients(fwd["loss"], var_list=trainable) if g is not None]
            if not gvs:
                raise ValueError(f"{type(model).__name__}: the loss depends on no trainable variable")
            train_op, sync = _train_op(ctx, opt, gvs, global_step, counters, worker_device)
            align_steps = _align_steps(ctx, global_step, counters.worker_steps)
        session = _session_ops(worker_device)
        all_finite = _all_finite(model, worker_device)
    graph.finalize()
    return TrainGraph(
        graph=graph,
        **fwd,
        train_op=train_op,
        global_step=global_step,
        worker_steps=counters.worker_steps,
        worker_started=counters.worker_started,
        reset_started=counters.reset_started,
        **session,
        model_var_keys=[sharding.checkpoint_key(v) for v in model.variables],
        model_vars=list(model.variables),
        align_steps=align_steps,
        all_finite=all_finite,
        sync=sync,
        placement=dict(balancer.placed),
    )


def _forward(model: Any, data: Any) -> dict[str, Any]:
    """The step's forward pass on fed placeholders: its loss, and the compiled metrics from the same predictions (no
    second pass); the placeholders fed per feature (sparse: 3 each)."""
    import tensorflow as tf

    placeholders, feeds = input_placeholders(data.features)
    feats, labels = split_features(placeholders, data.label)
    predictions = model(feats, training=True)
    return {
        "placeholders": placeholders,
        "feeds": feeds,
        "loss": tf.reduce_mean(model.loss(labels, predictions), name="loss"),
        "metrics": step_metrics(model, labels, predictions),
        "predictions": predictions,
    }


@dataclass
class _Counters:
    worker_steps: Any
    worker_started: Any
    reset_started: Any
    started: Any  # this worker's step has started (a dependency of its count)
    rank: Any  # this worker's index into both, as a tensor


def _step_counters(ctx: Any, global_step: Any) -> _Counters:
    """Each worker's steps counted and started, beside the global step (counted in the ps's partition of a step):
    what makes resume and rejoin exact."""
    import tensorflow as tf

    with tf.compat.v1.device(global_step.device):
        worker_steps = tf.Variable(
            tf.zeros([ctx.num_data_workers], tf.int64), trainable=False, name="tfyarn_worker_steps"
        )
        worker_started = tf.Variable(
            tf.zeros([ctx.num_data_workers], tf.int64), trainable=False, name="tfyarn_worker_started"
        )
        rank = tf.constant([ctx.data_rank])
        # no input from this worker: runs as soon as the ps partition of a step starts
        started = worker_started.scatter_add(tf.IndexedSlices(tf.constant([1], tf.int64), rank))
        reset_started = worker_started.scatter_update(
            tf.IndexedSlices(tf.gather(worker_steps.read_value(), rank), rank)
        )
    return _Counters(worker_steps, worker_started, reset_started, started, rank)


def _train_op(
    ctx: Any, opt: Any, gvs: list, global_step: Any, counters: _Counters, worker_device: str
) -> tuple[Any, LockstepSync | None]:
    """One local step (lockstep-sync or async), then this worker's count; its value is the global step after it."""
    import tensorflow as tf

    sync = None
    if ctx.spec.sync:
        sync = LockstepSync(opt, gvs, ctx.num_data_workers, ctx.data_rank, global_step, worker_device)
        step_value = sync.step_op
        counted_after = step_value
    else:
        # each gradient part crossing to a ps is an RPC: packed, 2 per ps (packing.py)
        apply = opt.apply_gradients(pack_gradients(gvs, worker_device), global_step=global_step)
        counted_after = apply  # on the ps, right after the update: no round trip to this worker between
    with tf.control_dependencies([counted_after, counters.started]), tf.compat.v1.device(global_step.device):
        count = counters.worker_steps.scatter_add(tf.IndexedSlices(tf.constant([1], tf.int64), counters.rank))
    if not ctx.spec.sync:  # the global step read after the count, on its ps: one tensor back, one RPC
        with tf.control_dependencies([count]), tf.compat.v1.device(global_step.device):
            step_value = tf.identity(global_step.read_value())
    with tf.control_dependencies([count, step_value]):
        return tf.identity(step_value, name="train_step"), sync


def _align_steps(ctx: Any, global_step: Any, worker_steps: Any) -> Any:
    """Resume: a checkpoint is read while steps run, so it may catch the global step and the worker counters a step
    apart. sync: every worker is exactly at the global step (a counter caught mid-round). async: the global step is
    the sum of the worker counters, which say where each worker is in its plan (else a resumed job can end a step
    short of its target with every worker at its planned step)."""
    import tensorflow as tf

    with tf.compat.v1.device(global_step.device):
        if ctx.spec.sync:
            return worker_steps.assign(tf.fill([ctx.num_data_workers], global_step.read_value()))
        return global_step.assign(tf.reduce_sum(worker_steps.read_value()))


def _session_ops(worker_device: str) -> dict[str, Any]:
    """The ops a session starts from: initializers (in the chief's stages), readiness, the Saver."""
    import tensorflow as tf

    with tf.compat.v1.device(worker_device):
        return {
            "init_op": tf.compat.v1.global_variables_initializer(),
            "init_stages": init_stages(tf.compat.v1.global_variables()),
            "local_init_op": tf.group(tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer()),
            "ready_op": tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables()),
            # (TF1's Saver reading each variable without copying it on its ps)
            "saver": no_copy_saver(
                tf.compat.v1.global_variables(), sharded=False, max_to_keep=2, save_relative_paths=True
            ),
        }


def _all_finite(model: Any, worker_device: str) -> Any:
    """Every trainable variable free of NaN/inf; each check runs where its variable lives: one bool travels."""
    import tensorflow as tf

    finite = []
    for v in model.trainable_variables:
        with tf.compat.v1.device(v.device):
            finite.append(tf.reduce_all(tf.math.is_finite(read_no_copy(v))))
    with tf.compat.v1.device(worker_device):
        return tf.reduce_all(tf.stack(finite))
