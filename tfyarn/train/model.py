"""The model API: one definition that trains in both modes (ps: TF1 graph; allreduce: TF2 ``tf.function``).

A compiled Keras model returned by the factory is wrapped into this contract (:mod:`tfyarn.train.keras_model`).
The contract itself is plain TensorFlow ops:

* :meth:`Model.build` creates every ``tf.Variable``. tfyarn calls it **inside the placement scope** (ps: the size-aware
  device function; allreduce: ``strategy.scope()``) and records what it creates in ``model.variables``.
* :meth:`Model.__call__` maps ``features`` (every feature of ``data.features`` but the label, leading dim = batch) to
  predictions, on graph tensors (placeholders) and inside a ``tf.function`` alike.
* :meth:`Model.loss` returns the **per-example** loss, shape ``(B,)``: only tfyarn knows the right denominator (in
  allreduce mode the **global** batch: dividing by the local batch makes the gradients N times too large).
* :meth:`Model.optimizer` returns a ``tf.compat.v1.train.Optimizer``: it works in graph mode and under strategies
  (``apply_gradients`` in replica context aggregates across replicas). Called once, in the scope, after :meth:`build`.
* :meth:`Model.metrics` (optional): scalar batch metrics for logs and the evaluator; default ``{"loss": mean}``.

The spec's ``model: module:callable`` is called with ``**spec.params`` and returns a :class:`Model`. Escape hatch:
a function decorated with :func:`custom_train` runs as ``fn(ctx, helpers)`` on every training task instead of tfyarn's
loop (``helpers``: :class:`tfyarn.train.helpers.Helpers`); when the chief's returns, tfyarn writes the summary and
sets ``control/done``. README's "Writing a model" has a complete example of each (run by the test suite).

Nothing here imports TensorFlow at module import: the gateway may import model modules to validate a spec.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from tfyarn.train.inputs import spec_of
from tfyarn.train.sharding import flatten, tables

if TYPE_CHECKING:
    from typing_extensions import TypeIs

_CUSTOM_ATTR = "__tfyarn_custom_train__"


class Model:
    """Base class of a tfyarn model (the contract: the module docstring). ``variables`` / ``trainable_variables``
    are filled by :func:`build_model` (creation order), so a model registers nothing itself."""

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
        """A tf.compat.v1.train optimizer (works in graph mode and under strategies)."""
        import tensorflow as tf

        return tf.compat.v1.train.AdagradOptimizer(0.1)

    def metrics(self, labels: Any, predictions: Any) -> dict[str, Any]:
        """Scalar metrics of one batch (batch means) for logs and the evaluator. Default: the mean loss."""
        import tensorflow as tf

        return {"loss": tf.reduce_mean(self.loss(labels, predictions))}


class CustomTrain(Protocol):
    """A function marked by :func:`custom_train`: ``fn(ctx, helpers)`` runs instead of the loop."""

    __tfyarn_custom_train__: bool

    def __call__(self, ctx: Any, helpers: Any) -> Any: ...


class _Buildable(Protocol):
    """What :func:`build_model` needs: a :class:`Model`, or one duck-typed (the Keras adapter)."""

    variables: list[Any]
    trainable_variables: list[Any]

    def build(self) -> None: ...


_M = TypeVar("_M", bound=_Buildable)


def custom_train(fn: Callable) -> Callable:
    """Mark ``fn(ctx, helpers)`` as a custom training loop (the escape hatch; see the module docstring)."""
    setattr(fn, _CUSTOM_ATTR, True)
    return fn


def is_custom_train(obj: Any) -> TypeIs[CustomTrain]:
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


def load(
    ref: str, params: dict[str, Any] | None = None, code_dir: str | None = None, data: Any = None
) -> Model | CustomTrain:
    """Resolve the spec's ``model``: a custom train function as is, else what it returns when called with ``params``
    (anything with build/__call__/loss passes: duck typing). A compiled Keras model is wrapped
    (:mod:`tfyarn.train.keras_model`, bound to the spec's ``data``: features and label). Call it where the model's
    variables belong (allreduce: in the strategy scope): a Keras model creates them in the factory."""
    target = resolve_ref(ref, code_dir)
    if is_custom_train(target):
        return target
    if not callable(target):
        raise TypeError(f"model {ref!r} is not callable")
    model = target(**(params or {}))
    if is_custom_train(model):
        return model
    # by name, not an import statement: warm_imports.code_uses_keras follows the job's imports into tfyarn, and
    # tfyarn's own adapter must not count as a plain model's use of Keras (every job would preload Keras)
    keras_model = importlib.import_module("tfyarn.train.keras_model")
    if keras_model.is_keras_model(model):
        return keras_model.wrap(lambda: target(**(params or {})), model, data, ref)
    missing = [m for m in ("build", "loss") if not callable(getattr(model, m, None))]
    if missing or not callable(model):
        raise TypeError(
            f"model {ref!r} returned {type(model).__name__}, not a tfyarn.train.Model "
            f"(missing: {', '.join(missing) or '__call__'})"
        )
    return model


def load_unbuilt(
    ref: str, params: dict[str, Any] | None = None, code_dir: str | None = None, data: Any = None
) -> Model | CustomTrain:
    """:func:`load` in a scratch graph, for ps mode (whose build makes the model again in the training graph): a
    Keras factory's weights are graph variables there, never allocated, so neither a worker nor preflight holds a
    table that only the ps should."""
    import tensorflow as tf

    with tf.Graph().as_default():
        return load(ref, params, code_dir, data)


def load_model(spec: Any) -> Model:
    """The spec's model (:func:`load`) where the model itself is needed (the evaluator, an export):
    a custom train function has none tfyarn could build, so it is refused here, by name."""
    model = load(spec.model, spec.params, spec.code or None, data=spec.data)
    if is_custom_train(model):
        raise TypeError(f"model {spec.model!r} is a custom train function: no model to build")
    return model


def build_model(model: _M) -> _M:
    """Call ``model.build()`` (inside the placement scope) recording the variables it creates, in graph mode and
    under a strategy alike. A build that creates none fails here, before any step runs."""
    import tensorflow as tf

    created: list = []

    def record(next_creator, **kwargs):
        created.append(next_creator(**kwargs))
        return created[-1]

    with tf.variable_creator_scope(record):
        model.build()
    created = tables(created)  # a table split over the ps (tfyarn.train.sharding): one variable of the model
    own = getattr(model, "tfyarn_variables", None)  # a Keras model: its weights, not compile's or the optimizer's
    if callable(own):
        created = list(own())
    if not created:
        raise ValueError(f"{type(model).__name__}.build() created no tf.Variable")
    model.variables = created
    own_trainable = getattr(model, "tfyarn_trainable_variables", None)  # in the optimizer's order
    trainable = (
        list(own_trainable()) if callable(own_trainable) else [v for v in created if getattr(v, "trainable", True)]
    )
    # a table split over the ps (ps mode, tfyarn.train.sharding) is one of ``variables``; the optimizer gets its shards
    model.trainable_variables = flatten(trainable)
    return model


def split_features(batch: dict[str, Any], label: str | None) -> tuple[dict[str, Any], Any]:
    """A batch dict → (features without the label, labels or None)."""
    feats = {k: v for k, v in batch.items() if k != label}
    return feats, (batch[label] if label is not None else None)


def input_signature(features: dict[str, Any], batch_size: int | None, exclude: str | None = None) -> dict[str, Any]:
    """One TensorSpec per spec feature (but ``exclude``), leading dim ``batch_size``: a fixed signature is traced
    once for the run. A variable-length feature: a SparseTensorSpec (``tfyarn.train.inputs``)."""

    return {name: spec_of(f, batch_size, name) for name, f in features.items() if name != exclude}
