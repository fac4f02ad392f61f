"""Built-in recommender (like the seed's): user and item embeddings → dot product + biases → click logit.

Data schema (``tfyarn.data.synth`` kind ``recommender``): ``label float32 ()``, ``user_id int64 ()``,
``item_id int64 ()``. Ids are taken modulo the table sizes so any id space trains. Embedding gradients are sparse
(IndexedSlices), so in ps mode a step only moves the looked-up rows over the network; the tables are declared with
:func:`tfyarn.train.table`, so in ps mode one of ``ps.min_shard_size`` or more is split by rows over the ps and each
shard is initialised on its own ps.

Optional ``history: <feature>``: a variable-length list of item ids the user saw (``{dtype: int64, shape: [null]}``,
a SparseTensor; or with ``pad_to`` a dense [B, N] padded with -1); the mean of their item embeddings is added to
the user's vector (``tf.nn.safe_embedding_lookup_sparse``: an empty history adds nothing).
"""

from __future__ import annotations

from tfyarn.models import binary_logit_metrics
from tfyarn.train.model import Model
from tfyarn.train.sharding import table


class Recommender(Model):
    def __init__(
        self,
        num_users: int = 1000,
        num_items: int = 1000,
        dim: int = 16,
        learning_rate: float = 0.1,
        seed: int = 1,
        history: str | None = None,
    ):
        self.num_users, self.num_items, self.dim = int(num_users), int(num_items), int(dim)
        self.history = history
        self.learning_rate, self.seed = float(learning_rate), int(seed)

    def build(self) -> None:
        import tensorflow as tf

        init = tf.random_normal_initializer(stddev=0.1, seed=self.seed)
        self.users = table("user_embedding", [self.num_users, self.dim], init)
        self.items = table("item_embedding", [self.num_items, self.dim], init)
        self.user_bias = table("user_bias", [self.num_users], tf.zeros_initializer())
        self.item_bias = table("item_bias", [self.num_items], tf.zeros_initializer())
        self.bias = tf.Variable(0.0, name="global_bias")

    def __call__(self, features, training):
        import tensorflow as tf

        u_ids = tf.math.floormod(tf.cast(features["user_id"], tf.int64), self.num_users)
        i_ids = tf.math.floormod(tf.cast(features["item_id"], tf.int64), self.num_items)
        u = tf.nn.embedding_lookup(self.users, u_ids)
        i = tf.nn.embedding_lookup(self.items, i_ids)
        if self.history is not None:
            u = u + self._history(features[self.history])
        return (
            tf.reduce_sum(u * i, axis=1)
            + tf.gather(self.user_bias, u_ids)
            + tf.gather(self.item_bias, i_ids)
            + self.bias
        )

    def _history(self, h):
        """Mean item embedding of the history (a SparseTensor, or dense ids padded with negatives)."""
        import tensorflow as tf

        if not isinstance(h, tf.SparseTensor):
            h = tf.cast(h, tf.int64)
            at = tf.where(h >= 0)
            h = tf.SparseTensor(at, tf.gather_nd(h, at), tf.shape(h, out_type=tf.int64))
        ids = tf.SparseTensor(h.indices, tf.math.floormod(tf.cast(h.values, tf.int64), self.num_items), h.dense_shape)
        return tf.nn.safe_embedding_lookup_sparse(self.items, ids, combiner="mean")

    def loss(self, labels, predictions):
        import tensorflow as tf

        return tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32), logits=predictions)

    def optimizer(self):
        import tensorflow as tf

        return tf.compat.v1.train.AdagradOptimizer(self.learning_rate)

    def metrics(self, labels, predictions):
        return binary_logit_metrics(self, labels, predictions)


def model(**params) -> Recommender:
    """``model: tfyarn.models.recommender:model``; params: num_users, num_items, dim, learning_rate, seed,
    history (the name of a variable-length feature of item ids, optional)."""
    return Recommender(**params)
