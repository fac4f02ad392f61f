"""Built-in logistic regression on a dense feature vector.

Data schema (``tfyarn.data.synth`` kind ``logreg``): ``label float32 ()``, ``x float32 (16,)``. The feature name and
width are parameters so the same model trains any ``(k,)`` float feature.
"""

from __future__ import annotations

from tfyarn.models import binary_logit_metrics
from tfyarn.train.model import Model


class LogReg(Model):
    def __init__(self, feature: str = "x", dim: int = 16, learning_rate: float = 0.5, l2: float = 0.0):
        self.feature, self.dim = feature, int(dim)
        self.learning_rate, self.l2 = float(learning_rate), float(l2)

    def build(self) -> None:
        import tensorflow as tf

        self.w = tf.Variable(tf.zeros([self.dim]), name="weights")
        self.b = tf.Variable(0.0, name="bias")

    def __call__(self, features, training):
        import tensorflow as tf

        x = tf.cast(features[self.feature], tf.float32)
        return tf.linalg.matvec(x, self.w) + self.b

    def loss(self, labels, predictions):
        import tensorflow as tf

        per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32), logits=predictions)
        if self.l2:
            per_example = per_example + self.l2 * tf.reduce_sum(tf.square(self.w))
        return per_example

    def optimizer(self):
        import tensorflow as tf

        return tf.compat.v1.train.GradientDescentOptimizer(self.learning_rate)

    def metrics(self, labels, predictions):
        return binary_logit_metrics(self, labels, predictions)


def model(**params) -> LogReg:
    """``model: tfyarn.models.logreg:model``; params: feature, dim, learning_rate, l2."""
    return LogReg(**params)
