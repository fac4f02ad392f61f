"""A plain model with one wide variable ``[rows, cols]`` (shipped as the job's `code` dir, like a user's code): ps mode
splits variables by rows, so with few rows of many columns no cut keeps a piece under gRPC's limit. Its value is a
graph op (``tf.zeros``): nothing of it is allocated until a session initialises it, which these tests never reach
with a big one."""
import tensorflow as tf

import tfyarn.train


class Wide(tfyarn.train.Model):
    def __init__(self, rows: int, cols: int):
        self.rows, self.cols = rows, cols

    def build(self):
        self.wide = tf.Variable(tf.zeros([self.rows, self.cols]), name="wide")
        self.bias = tf.Variable(tf.zeros([1]), name="bias")

    def __call__(self, features, training):
        ids = tf.math.floormod(features["user_id"], self.rows)
        return tf.nn.embedding_lookup(self.wide, ids)[:, 0] + self.bias

    def loss(self, labels, predictions):
        return tf.square(labels - predictions)


def model(rows: int = 1, cols: int = 2**28 + 1) -> Wide:
    """``model: big_weights:model``; the default is 1 row of 1 GiB + 4 bytes."""
    return Wide(rows, cols)
