"""The model API: one definition that trains in both modes (ps: TF1 graph; allreduce: TF2 eager/tf.function).

Why this shape
--------------
ps mode is between-graph replication in TF1 graph mode (``tf.compat.v1``: ``replica_device_setter``, placeholders
fed with ready numpy batches, ``MonitoredTrainingSession``) because that is what still runs on TF 2.21 with Python in
the input path (``../shared/NOTES.md``). allreduce mode is ``MultiWorkerMirroredStrategy`` with a ``tf.function`` step.
Keras 3 models and optimizers fail under these strategies, so the contract is plain TensorFlow ops:

* :meth:`Model.build` creates every ``tf.Variable``. tfyarn calls it **inside the placement scope** (ps: the size-aware
  ps device function; allreduce: ``strategy.scope()``) and records the variables it creates (``model.variables``), so
  a model needs no base class from TF and no Keras.
* :meth:`Model.__call__` maps ``features: dict[str, Tensor]`` (every feature of ``data.features`` except the label,
  leading dim = batch) to predictions. It must work on graph tensors (placeholders) and in a ``tf.function``.
* :meth:`Model.loss` returns the **per-example** loss, shape ``(B,)``. tfyarn does the reduction, because only tfyarn
  knows the right denominator: in allreduce mode the sum over a worker's batch divided by the **global** batch size
  (per-worker batch x training workers; dividing by the local batch was seed 003's bug: gradients N times too large),
  in ps mode the local batch mean (each worker's update, or SyncReplicasOptimizer's average of them, is a mean).
* :meth:`Model.optimizer` returns a ``tf.compat.v1.train.Optimizer`` (Adagrad, Adam, GradientDescent, ...): it works in
  graph mode (and wrapped by ``SyncReplicasOptimizer`` for ``sync: true``) and under distribution strategies in a
  ``tf.function`` (``apply_gradients`` in replica context aggregates across replicas). It is called once, inside the
  placement scope, after :meth:`build`.
* :meth:`Model.metrics` (optional) returns scalar batch metrics for logs and the evaluator; default ``{"loss": mean}``.

The spec's ``model: module:callable`` is called with ``**spec.params`` and returns a :class:`Model`.

Example (a complete model; ``model: mymodels:ctr`` with ``params: {num_users: 1000, dim: 8}``)::

    import tensorflow as tf
    import tfyarn.train

    class CTR(tfyarn.train.Model):
        def __init__(self, num_users=1000, num_items=1000, dim=8, lr=0.1):
            self.num_users, self.num_items, self.dim, self.lr = num_users, num_items, dim, lr

        def build(self):
            init = tf.random_normal_initializer(stddev=0.1, seed=1)
            self.users = tf.Variable(init([self.num_users, self.dim]), name="users")
            self.items = tf.Variable(init([self.num_items, self.dim]), name="items")
            self.bias = tf.Variable(0.0, name="bias")

        def __call__(self, features, training):
            u = tf.nn.embedding_lookup(self.users, features["user_id"] % self.num_users)
            i = tf.nn.embedding_lookup(self.items, features["item_id"] % self.num_items)
            return tf.reduce_sum(u * i, axis=1) + self.bias          # logits, shape (B,)

        def loss(self, labels, predictions):                          # per-example, shape (B,)
            return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=predictions)

        def optimizer(self):
            return tf.compat.v1.train.AdagradOptimizer(self.lr)

    def ctr(**params):
        return CTR(**params)

Escape hatch: a custom training loop
------------------------------------
Decorate a function with :func:`custom_train` and name it as the spec's ``model``; tfyarn calls it on every training
task (chief and workers) as ``fn(ctx, helpers)`` instead of its own loop; ps tasks (ps mode) still serve variables
until the chief's function returns. ``helpers`` is a :class:`tfyarn.train.helpers.Helpers` (``params``: the spec's
params; ``feeder()``: this task's share of the data as numpy batches; ``progress``: rate-limited progress reporting;
``checkpoint_dir()`` / ``upload_checkpoint(local_dir, step)`` / ``latest_checkpoint()``). When the chief's function
returns, tfyarn writes the summary and sets ``control/done``. Example (``model: mytrain:train``)::

    import logging
    import numpy as np
    import tfyarn.train

    log = logging.getLogger("tfyarn.user")

    @tfyarn.train.custom_train
    def train(ctx, helpers):
        # ctx: tfyarn.runtime.context.TaskContext (cluster, role, index, data_rank, num_data_workers, kv, spec)
        feeder = helpers.feeder()
        step, label = 0, ctx.spec.data.label
        with feeder:
            for epoch in range(ctx.spec.data.epochs):
                for batch in feeder.epoch(epoch):
                    step += 1
                    mean = float(np.mean(batch[label]))          # your own TF/numpy/anything step here
                    helpers.progress.report(step=step, epoch=epoch, loss=mean, examples=len(batch[label]))
        log.info("%s ran %d steps", ctx.task_id, step)
        return {"steps": step}                                     # merged into the summary (chief)

Nothing here imports TensorFlow at module import: the gateway may import model modules to validate a spec.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any, Callable, Iterator

_CUSTOM_ATTR = "__tfyarn_custom_train__"


class Model:
    """Base class of a tfyarn model (see the module docstring for the contract and a full example).

    Subclasses implement :meth:`build`, :meth:`__call__`, :meth:`loss` and :meth:`optimizer`; :meth:`metrics` is
    optional. ``variables`` / ``trainable_variables`` are filled by :func:`build_model` with every variable
    :meth:`build` created (in creation order), so checkpoints and gradient lists need no registration by the user.
    """

    variables: list = []
    trainable_variables: list = []

    def build(self) -> None:
        """Create the variables. Called once, inside the placement scope; no ops on data here."""
        raise NotImplementedError(f"{type(self).__name__}.build() must create the model's variables")

    def __call__(self, features: dict[str, Any], training: bool) -> Any:
        """features (label excluded) → predictions; graph tensors in ps mode, inside a tf.function in allreduce."""
        raise NotImplementedError(f"{type(self).__name__}.__call__(features, training) must return predictions")

    def loss(self, labels: Any, predictions: Any) -> Any:
        """Per-example loss, shape (B,). tfyarn reduces it (global batch size in allreduce mode)."""
        raise NotImplementedError(f"{type(self).__name__}.loss(labels, predictions) must return a (B,) loss")

    def optimizer(self) -> Any:
        """A tf.compat.v1.train optimizer (works in graph mode, in SyncReplicasOptimizer and under strategies)."""
        import tensorflow as tf
        return tf.compat.v1.train.AdagradOptimizer(0.1)

    def metrics(self, labels: Any, predictions: Any) -> dict[str, Any]:
        """Scalar metrics of one batch (batch means) for logs and the evaluator. Default: the mean loss."""
        import tensorflow as tf
        return {"loss": tf.reduce_mean(self.loss(labels, predictions))}


def custom_train(fn: Callable) -> Callable:
    """Mark ``fn(ctx, helpers)`` as a custom training loop (the escape hatch; see the module docstring)."""
    setattr(fn, _CUSTOM_ATTR, True)
    return fn


def is_custom_train(obj: Any) -> bool:
    return bool(getattr(obj, _CUSTOM_ATTR, False))


def resolve_ref(ref: str, code_dir: str | None = None) -> Any:
    """``'module:callable'`` → the callable. ``code_dir`` (the job's shipped code) is put first on ``sys.path``."""
    if code_dir and code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    mod_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ImportError(f"model {ref!r}: cannot import module {mod_name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"model {ref!r}: module {mod_name!r} has no attribute {attr!r}") from None


def load(ref: str, params: dict[str, Any] | None = None, code_dir: str | None = None) -> Model | Callable:
    """Resolve the spec's ``model``: a custom train function is returned as is; otherwise call it with ``params``.

    Returns a :class:`Model` (anything with build/__call__/loss/optimizer is accepted: duck typing) or the custom
    train function (check with :func:`is_custom_train`).
    """
    target = resolve_ref(ref, code_dir)
    if is_custom_train(target):
        return target
    if not callable(target):
        raise TypeError(f"model {ref!r} is not callable")
    model = target(**(params or {}))
    if is_custom_train(model):
        return model
    missing = [m for m in ("build", "loss") if not callable(getattr(model, m, None))]
    if missing or not callable(model):
        raise TypeError(f"model {ref!r} returned {type(model).__name__}, not a tfyarn.train.Model "
                        f"(missing: {', '.join(missing) or '__call__'})")
    return model


@contextlib.contextmanager
def _recording_variables(out: list) -> Iterator[None]:
    """Record every variable created inside (works in graph mode and under a strategy: records what it returns)."""
    import tensorflow as tf

    def creator(next_creator, **kwargs):
        v = next_creator(**kwargs)
        out.append(v)
        return v

    with tf.variable_creator_scope(creator):
        yield


def build_model(model: Model) -> Model:
    """Call ``model.build()`` recording its variables into ``model.variables`` / ``model.trainable_variables``.

    Call it inside the placement scope. Raises if build created no variables (a model with nothing to train is a
    mistake worth failing on before any step runs).
    """
    created: list = []
    with _recording_variables(created):
        model.build()
    if not created:
        raise ValueError(f"{type(model).__name__}.build() created no tf.Variable")
    model.variables = created
    model.trainable_variables = [v for v in created if getattr(v, "trainable", True)]
    return model


def split_features(batch: dict[str, Any], label: str | None) -> tuple[dict[str, Any], Any]:
    """A batch dict → (features without the label, labels or None)."""
    feats = {k: v for k, v in batch.items() if k != label}
    return feats, (batch[label] if label is not None else None)


def tf_dtype(name: str) -> Any:
    """Spec dtype name → tf.DType (``bytes`` and ``string`` are both tf.string)."""
    import tensorflow as tf
    return {"float32": tf.float32, "float64": tf.float64, "int64": tf.int64, "int32": tf.int32,
            "string": tf.string, "bytes": tf.string}[name]
