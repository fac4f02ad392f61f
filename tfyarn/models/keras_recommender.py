"""The built-in recommender as a compiled Keras model (Keras 3, or tf_keras with ``keras: tf_keras``): what a user
brings to ``model:`` — Embedding + Dense + a custom layer, compiled with a loss, an optimizer and metrics.

Same data schema as :mod:`tfyarn.models.recommender` (``label``, ``user_id``, ``item_id``). ``kind`` picks the
Keras style: ``functional`` (inputs named after the features), ``subclassed`` (takes the feature dict).
``history: hist`` (functional only) adds a variable-length feature of item ids (``shape: [null]``) as a sparse Keras
input, ``keras.Input(shape=(None,), sparse=True, dtype="int64", name="hist")``, fed a ``tf.SparseTensor``: the
mean of its item embeddings (``tf.nn.safe_embedding_lookup_sparse``) is added to the item's.
"""

from __future__ import annotations

from typing import Any

from tfyarn.train.keras_model import keras_module


def _optimizer(keras: Any, name: str, lr: float) -> Any:
    extra = {"SGD": {"momentum": 0.9, "nesterov": True}}.get(name, {})
    return getattr(keras.optimizers, name)(learning_rate=lr, **extra)


def model(
    num_users: int = 1000,
    num_items: int = 1000,
    dim: int = 16,
    hidden: int = 16,
    learning_rate: float = 0.01,
    optimizer: str = "Adam",
    kind: str = "functional",
    keras: str = "keras",
    history: str | None = None,
) -> Any:
    """``model: tfyarn.models.keras_recommender:model``; params as the signature (``optimizer``: a Keras optimizer
    class name; ``keras``: ``keras`` or ``tf_keras``)."""
    K = keras_module(keras)
    ModuloIds = _modulo_ids(K)
    user_emb = K.layers.Embedding(num_users, dim, name="user_embedding")
    item_emb = K.layers.Embedding(num_items, dim, name="item_embedding")
    mlp = K.layers.Dense(hidden, activation="relu", name="hidden")
    head = K.layers.Dense(1, name="logit")
    users, items = ModuloIds(num_users, name="user_rows"), ModuloIds(num_items, name="item_rows")
    parts = [users, items, user_emb, item_emb, mlp, head]
    if history is not None and kind != "functional":
        raise ValueError("history: only with kind: functional")
    if kind == "functional":
        net = _functional(K, parts, history, num_items)
    elif kind == "subclassed":
        net = _subclassed(K, parts)
    else:
        raise ValueError(f"kind: {kind!r} is not 'functional' or 'subclassed'")
    net.compile(
        optimizer=_optimizer(K, optimizer, learning_rate),
        loss=K.losses.BinaryCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return net


def _modulo_ids(K: Any) -> Any:
    """The custom layer's class (its base comes from the Keras chosen at run time)."""
    layer_base: Any = K.layers.Layer

    class ModuloIds(layer_base):
        """The custom layer: any id space → table rows (ids modulo the table size)."""

        def __init__(self, size: int, **kw: Any):
            super().__init__(**kw)
            self.size = int(size)

        def call(self, ids: Any) -> Any:
            return K.ops.mod(ids, self.size) if hasattr(K, "ops") else ids % self.size

    return ModuloIds


def _functional(K: Any, parts: list[Any], history: str | None, num_items: int) -> Any:
    """``kind: functional``: inputs named after the features (and the sparse ``history`` input, if any)."""
    users, items, user_emb, item_emb, mlp, head = parts
    u = K.Input(shape=(), dtype="int64", name="user_id")
    i = K.Input(shape=(), dtype="int64", name="item_id")
    inputs, item = {"user_id": u, "item_id": i}, item_emb(items(i))
    if history is not None:
        inputs[history] = K.Input(shape=(None,), sparse=True, dtype="int64", name=history)
        item = K.layers.Add()([item, _history_bag(K, item_emb, num_items)(inputs[history])])
    x = K.layers.Concatenate()([user_emb(users(u)), item])
    return K.Model(inputs, head(mlp(x)), name="keras_recommender")


def _subclassed(K: Any, parts: list[Any]) -> Any:
    """``kind: subclassed``: a ``Model`` subclass that takes the feature dict."""
    users, items, user_emb, item_emb, mlp, head = parts
    model_base: Any = K.Model

    class Recommender(model_base):
        def __init__(self, **kw: Any):
            super().__init__(**kw)
            self.parts = [users, items, user_emb, item_emb, mlp, head]  # tracked: their weights are ours

        def call(self, features: Any, training: bool = False) -> Any:
            x = K.layers.concatenate([user_emb(users(features["user_id"])), item_emb(items(features["item_id"]))])
            return head(mlp(x))

    return Recommender(name="keras_recommender")


def _history_bag(K: Any, emb: Any, size: int) -> Any:
    """A layer: a SparseTensor of item ids [B, any] → the mean of their rows of ``emb`` [B, dim] (an empty
    history: zeros), as TF embedding code does for a VarLenFeature."""
    import tensorflow as tf

    class HistoryBag(K.layers.Layer):
        def call(self, hist: Any) -> Any:
            ids = tf.SparseTensor(hist.indices, tf.math.floormod(hist.values, size), hist.dense_shape)
            # ps mode with the table split over the ps: look up on its shards (never a read of the whole table)
            table = getattr(emb, "tfyarn_table", None)
            weights = table if table is not None else tf.convert_to_tensor(emb.embeddings)
            return tf.nn.safe_embedding_lookup_sparse(weights, ids, combiner="mean")

    return HistoryBag(name="history_bag")
