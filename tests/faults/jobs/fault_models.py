"""Models for the fault-injection tests (shipped as the job's ``code`` dir, like a user's code).

``slow_recommender``: the built-in recommender with a fixed sleep inside every training step (a ``numpy_function``
on the training task's own device), so a short job still has enough wall time for a kill to land mid-epoch at a
chosen step. Nothing else differs from ``tfyarn.models.recommender``.
"""
import time

from tfyarn.models.recommender import Recommender


class SlowRecommender(Recommender):
    def __init__(self, step_delay_s: float = 0.05, **params):
        super().__init__(**params)
        self.step_delay_s = float(step_delay_s)

    def __call__(self, features, training):
        import numpy as np
        import tensorflow as tf

        out = super().__call__(features, training)
        if not training or self.step_delay_s <= 0:
            return out

        def sleep():
            time.sleep(self.step_delay_s)
            return np.int64(0)

        tick = tf.numpy_function(sleep, [], tf.int64, stateful=True)
        with tf.control_dependencies([tick]):
            return tf.identity(out)


def slow_recommender(**params) -> SlowRecommender:
    return SlowRecommender(**params)
