"""A compiled Keras model (Keras 3 or tf_keras) as a tfyarn :class:`~tfyarn.train.model.Model`.

The spec's ``model:`` factory may return a ``keras.Model`` (Sequential, functional or subclassed) compiled with
``loss=``, ``optimizer=`` and optionally ``metrics=``. tfyarn keeps its own fed loops (equal steps, global-batch
loss, timeouts) and takes from the model what it declares:

* **Build.** The factory is called *inside* the placement scope (ps: the size-aware device function of each graph;
  allreduce: ``strategy.scope()``, after the strategy exists: Keras touching the eager context first is what made
  MultiWorkerMirroredStrategy fail with "Collective ops must be configured at program startup"). Keras 3 numbers
  auto-named layers per process (``dense`` → ``dense_1`` on ps mode's second build), so every call starts from
  fresh name counters: names, hence ps checkpoint keys, are the same in every build and every task.
* **Inputs** are the spec's features matched by name: a functional model's ``Input(name=...)`` each name a feature
  of ``data.features`` (a missing one is an error at build, before the first step); an unbuilt Sequential gets the
  single non-label feature; a subclassed model the dict of every feature but the label.
* **Loss**: the compiled loss, per example (tfyarn divides by the global batch). **Metrics**: the compiled ones
  whose value is a per-example function (``accuracy``, ``mae``, ``binary_accuracy``... and their Metric classes),
  as batch means for the evaluator and, computed in the training step from its own predictions and fetched with
  its loss, for the chief's log lines and the run summary's ``metrics``.
* **Optimizer**: allreduce mode uses the compiled Keras optimizer itself (built in the strategy scope, its slots in
  the checkpoint). Keras optimizers do not update in a TF1 graph, so ps mode uses the ``tf.compat.v1.train``
  equivalent with the same hyperparameters (:mod:`tfyarn.train.keras_optim`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tfyarn.train import sharding
from tfyarn.train.inputs import dims, is_sparse, tf_dtype
from tfyarn.train.keras_optim import optimizer_config, v1_equivalent
from tfyarn.train.sharding import as_tf_variable, tables


def keras_flavour(obj: Any) -> str | None:
    """``'keras'`` (Keras 3), ``'tf_keras'`` or None: which Keras ``obj``'s class comes from (no import needed)."""
    for cls in type(obj).__mro__:
        root = cls.__module__.split(".", 1)[0]
        if cls.__name__ == "Model" and root in ("keras", "tf_keras"):
            return root
    return None


def is_keras_model(obj: Any) -> bool:
    return keras_flavour(obj) is not None


class ModelSpecError(ValueError):
    """A Keras model tfyarn cannot train as declared (uncompiled, an input no feature feeds, an unsupported loss,
    metric or ps-mode optimizer): raised at build, before any step."""


def _fresh_names(flavour: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` with Keras 3's layer-name counters reset, then put them back (tf_keras counts per graph)."""
    if flavour != "keras":
        return fn()
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # a Keras without that module: names may differ between builds
        return fn()
    old = global_state.get_global_attribute("object_name_uids")
    global_state.set_global_attribute("object_name_uids", None)
    try:
        return fn()
    finally:
        global_state.set_global_attribute("object_name_uids", old)


def keras_module(flavour: str) -> Any:
    """The Keras package of ``flavour`` (``'keras'`` or ``'tf_keras'``), imported."""
    if flavour == "tf_keras":
        import tf_keras

        return tf_keras
    import keras

    return keras


class KerasModel:
    """The adapter (see the module docstring; duck-typed :class:`tfyarn.train.model.Model`: that module imports
    this one). ``factory()`` returns a compiled Keras model; ``first`` is one it
    already returned (used for the first build when it was made in the same graph context, else discarded)."""

    variables: list[Any]  # set by build_model, as on a Model
    trainable_variables: list[Any]
    # ps mode: its Embeddings' tables are split here (sharding.keras_tables), not by a creator
    tfyarn_shards_itself = True

    def __init__(
        self,
        factory: Callable[[], Any],
        first: Any,
        features: dict[str, Any] | None = None,
        label: str | None = None,
        ref: str = "model",
    ):
        self.factory, self.ref = factory, ref
        self.flavour = keras_flavour(first) or "keras"
        self._pending: Any = first
        self._pending_graph = _current_graph()
        self.features, self.label = dict(features or {}), label
        self.keras: Any = first
        self.keras_trainable: list = []
        self._loss_fn: Callable | None = None
        self._metric_fns: dict[str, Callable] = {}
        self._opt_config: tuple[str, dict[str, Any]] | None = None
        if self._pending_graph is None and getattr(first, "optimizer", None) is not None:
            self._opt_config = optimizer_config(first.optimizer)

    # -- the contract ------------------------------------------------------------------------------------------------
    def build(self) -> None:
        """Make (or take) the Keras model in the current scope, build it on the spec's features, check it."""

        policy = sharding.current() if _current_graph() is not None else None  # (ps mode's graph only)
        with sharding.keras_tables(keras_module(self.flavour), policy):
            if self._pending is not None and self._pending_graph is _current_graph() and policy is None:
                km = self._pending
            else:
                km = _fresh_names(self.flavour, self.factory)
            self._pending = None
            if not is_keras_model(km):
                raise ModelSpecError(f"{self.ref} returned a {type(km).__name__} on a later call (a Keras model first)")
            self.keras = km
            self._check_compiled()
            if not km.weights or not getattr(km, "built", True):
                km(self._example_inputs(), training=False)  # an unbuilt Sequential or subclassed model
        self._check_inputs()
        self.keras_trainable = list(km.trainable_weights)
        self._loss_fn = self._resolve_loss()
        self._metric_fns = self._resolve_metrics()

    def tfyarn_variables(self) -> list:
        """The model's variables in Keras's weight order (what checkpoints, warm start and export key on): not every
        variable the factory created (compile and the optimizer create some too)."""

        return tables([as_tf_variable(w) for w in self.keras.weights])  # (a split table: one of them)

    def tfyarn_trainable_variables(self) -> list:
        """The trainable ones, in the order the Keras optimizer gets them (``keras_trainable``)."""
        return [as_tf_variable(w) for w in self.keras_trainable]

    def __call__(self, features: dict[str, Any], training: bool) -> Any:
        out = self.keras(self._inputs(features), training=training)
        if isinstance(out, dict) and len(out) == 1:
            out = next(iter(out.values()))
        if isinstance(out, (list, tuple)) and len(out) == 1:
            out = out[0]
        return out

    def loss(self, labels: Any, predictions: Any) -> Any:
        import tensorflow as tf

        y, p = self._align(labels, predictions, sparse=self._sparse(self._loss_name))
        assert self._loss_fn is not None
        per = self._loss_fn(y, p)
        while per.shape.rank is not None and per.shape.rank > 1:
            per = tf.reduce_mean(per, axis=-1)
        return per

    def metrics(self, labels: Any, predictions: Any) -> dict[str, Any]:
        import tensorflow as tf

        return {"loss": tf.reduce_mean(self.loss(labels, predictions)), **self.train_metrics(labels, predictions)}

    @property
    def metric_names(self) -> list[str]:
        """The compiled metrics' names, in the order :meth:`train_metrics` returns them (known after build)."""
        return list(self._metric_fns)

    def train_metrics(self, labels: Any, predictions: Any) -> dict[str, Any]:
        """The compiled metrics as float32 batch means, without the loss: the training step computes them from its
        own predictions (:mod:`tfyarn.train.step_metrics`)."""
        import tensorflow as tf

        out = {}
        for name, fn in self._metric_fns.items():
            y, p = self._align(labels, predictions, sparse=self._sparse(name) or self._sparse(fn.__name__))
            out[name] = tf.reduce_mean(tf.cast(fn(y, p), tf.float32))
        return out

    def optimizer(self) -> Any:
        """allreduce (eager, in the strategy scope): the compiled Keras optimizer, built on the model's variables;
        ps (a TF1 graph): its ``tf.compat.v1.train`` equivalent."""
        import tensorflow as tf

        opt = self.keras.optimizer
        if tf.executing_eagerly():
            opt.build(self.keras_trainable)
            return opt
        name, config = self.ps_optimizer_config()
        return v1_equivalent(name, config, self.ref)

    def ps_optimizer_config(self) -> tuple[str, dict[str, Any]]:
        """The compiled optimizer's class and config, read eagerly: from the model :func:`load` made, or else from
        one made in a thread of its own (TF's default graph is per thread: a new thread is eager), its Embedding
        tables one row each (:func:`sharding.stub_tables`)."""
        if self._opt_config is None:
            keras = keras_module(self.flavour)

            def read() -> tuple[str, dict[str, Any]]:
                with sharding.stub_tables(keras):  # eager: a real table would be allocated here, whole
                    return optimizer_config(self.factory().optimizer)

            with ThreadPoolExecutor(1, thread_name_prefix="tfyarn-keras-config") as pool:
                self._opt_config = pool.submit(read).result()
        return self._opt_config

    # -- helpers -----------------------------------------------------------------------------------------------------
    def _check_compiled(self) -> None:
        km = self.keras
        if getattr(km, "optimizer", None) is None or getattr(km, "loss", None) is None:
            raise ModelSpecError(
                f"{self.ref} returned an uncompiled Keras model: call model.compile(optimizer=..., "
                f"loss=..., metrics=[...]) in it (tfyarn trains with what is compiled)"
            )

    def _input_names(self) -> Any:
        """The model's input structure with each Keras input replaced by its name, or None (no declared inputs)."""
        import tensorflow as tf

        try:
            struct = self.keras.input
        except (AttributeError, ValueError):
            return None
        if struct is None:
            return None
        return tf.nest.map_structure(lambda t: str(getattr(t, "name", "")).split(":")[0], struct)

    def _feature_names(self) -> list[str]:
        return [n for n in self.features if n != self.label]

    def _check_inputs(self) -> None:
        import tensorflow as tf

        names = self._input_names()
        if names is None or not self.features:
            return
        missing = [n for n in tf.nest.flatten(names) if n not in self.features or n == self.label]
        if missing:
            raise ModelSpecError(
                f"{self.ref}: model input(s) {', '.join(map(repr, missing))} match no feature of "
                f"data.features ({', '.join(self._feature_names())}); name each keras.Input after "
                f"the feature that feeds it"
            )

    def _inputs(self, features: dict[str, Any]) -> Any:
        import tensorflow as tf

        names = self._input_names()
        if names is not None:
            return tf.nest.map_structure(lambda n: features[n], names)
        if type(self.keras).__name__ == "Sequential":
            if len(features) != 1:
                raise ModelSpecError(
                    f"{self.ref}: a Sequential model without a keras.Input takes one feature, the "
                    f"spec has {len(features)} ({', '.join(features)}); start it with "
                    f"keras.Input(shape=..., name=<feature>) or use a functional model"
                )
            return next(iter(features.values()))
        return dict(features)

    def _example_inputs(self) -> Any:
        import tensorflow as tf

        feats = {  # a variable-length feature: an empty SparseTensor [1, 1] (dense [1, pad_to] with pad_to)
            n: tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf_dtype(f.dtype)), [1, 1])
            if is_sparse(f)
            else tf.zeros((1, *dims(f)), tf_dtype(f.dtype))
            for n, f in self.features.items()
            if n != self.label
        }
        if not feats:
            raise ModelSpecError(
                f"{self.ref}: the Keras model is not built and tfyarn does not know the spec's features to build it on"
            )
        return self._inputs(feats)

    @property
    def _compiled(self) -> dict[str, Any]:
        cfg = getattr(getattr(self.keras, "_compile_config", None), "config", None)
        if isinstance(cfg, dict):
            return dict(cfg)
        # tf_keras in a TF1 graph keeps no compile config: its loss and the metrics it was given
        metrics = (
            getattr(getattr(self.keras, "compiled_metrics", None), "_user_metrics", None)
            or getattr(self.keras, "_compile_metrics", None)
            or []
        )  # (its v1 graph-mode model)
        return {"loss": self.keras.loss, "metrics": metrics}

    @property
    def _loss_name(self) -> str:
        loss = self._compiled.get("loss")
        if isinstance(loss, str):
            return loss
        if not callable(loss) or hasattr(loss, "get_config"):
            return type(loss).__name__
        return getattr(loss, "__name__", "loss")

    @staticmethod
    def _sparse(name: str) -> bool:
        return "sparse" in name.lower()

    def _resolve_loss(self) -> Callable:
        keras = keras_module(self.flavour)
        loss = self._compiled.get("loss")
        if isinstance(loss, (dict, list, tuple)):
            raise ModelSpecError(
                f"{self.ref}: compiled with {type(loss).__name__} of losses (several outputs); "
                f"tfyarn trains one output with one loss"
            )
        if isinstance(loss, str):
            loss = keras.losses.get(loss)
        if loss is not None and hasattr(loss, "call") and hasattr(loss, "get_config"):  # a Loss: unreduced call
            return loss.call
        if callable(loss):
            return loss
        raise ModelSpecError(f"{self.ref}: cannot use the compiled loss {loss!r}")

    def _resolve_metrics(self) -> dict[str, Callable]:
        keras = keras_module(self.flavour)
        metrics = self._compiled.get("metrics") or []
        if isinstance(metrics, dict):
            raise ModelSpecError(f"{self.ref}: metrics per output (a dict) are not supported; give a list")
        out: dict[str, Callable] = {}
        for m in metrics:
            name = m if isinstance(m, str) else getattr(m, "name", None) or getattr(m, "__name__", repr(m))
            if m in ("accuracy", "acc"):
                m = self._accuracy_name()
            obj = keras.metrics.get(m) if isinstance(m, str) else m
            fn = getattr(obj, "_fn", None) or (obj if callable(obj) and not hasattr(obj, "update_state") else None)
            if fn is None:
                raise ModelSpecError(
                    f"{self.ref}: metric {name!r} keeps state across batches ({type(obj).__name__});"
                    f" tfyarn reports batch means of per-example metrics (accuracy, "
                    f"binary_accuracy, mae, mse, ...): compute {name} in the evaluator's data or "
                    f"with an entrypoint script"
                )
            out[str(name)] = _with_kwargs(fn, dict(getattr(obj, "_fn_kwargs", {}) or {}))
        return out

    def _accuracy_name(self) -> str:
        """Keras's own choice for ``'accuracy'``: by the loss and the output's last dimension."""
        loss = self._loss_name.lower()
        outputs = getattr(self.keras, "outputs", None) or []
        last = outputs[0].shape[-1] if outputs and len(outputs[0].shape) > 1 else 1
        if "sparse" in loss:
            return "sparse_categorical_accuracy"
        return "binary_accuracy" if "binary" in loss or last == 1 else "categorical_accuracy"

    def _align(self, labels: Any, predictions: Any, sparse: bool) -> tuple[Any, Any]:
        """Labels (B,) against predictions (B, 1) get a last axis, as Keras does; a non-sparse loss gets labels in
        the predictions' dtype."""
        import tensorflow as tf

        y, p = labels, predictions
        if sparse:
            return y, p
        if y.shape.rank is not None and p.shape.rank == y.shape.rank + 1 and p.shape[-1] == 1:
            y = tf.expand_dims(y, -1)
        return (y if y.dtype == p.dtype else tf.cast(y, p.dtype)), p


def _with_kwargs(fn: Callable, kwargs: dict[str, Any]) -> Callable:
    """A Metric class's per-example function with its keyword arguments bound (its ``__name__`` kept)."""
    return functools.update_wrapper(functools.partial(fn, **kwargs), fn) if kwargs else fn


def _current_graph() -> Any:
    """The graph ops go to now (None when eager): a Keras model made in another one cannot be reused here."""
    if "tensorflow" not in sys.modules:
        return None
    import tensorflow as tf

    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def wrap(factory: Callable[[], Any], first: Any, data: Any, ref: str) -> KerasModel:
    """``first`` (what ``factory()`` returned) as a tfyarn model bound to the spec's ``data`` (features, label)."""
    return KerasModel(factory, first, getattr(data, "features", None), getattr(data, "label", None), ref)
