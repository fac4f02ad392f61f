"""A job whose model code uses Keras (through ``tf.keras``): the forkserver must preload Keras for it
(tfyarn.task.warm_imports), and a task must be able to use it. Kept apart from custom_jobs, which must not."""
import json
import os
import sys

import tfyarn.train


@tfyarn.train.custom_train
def dense(ctx, helpers):
    """Record whether Keras was already imported when the task started, then run a Keras layer once."""
    preloaded = "keras" in sys.modules
    import tensorflow as tf
    out = tf.keras.layers.Dense(2, kernel_initializer="ones")(tf.ones([1, 3]))
    with open("probe.json", "w") as f:
        json.dump({"pid": os.getpid(), "keras_preloaded": preloaded, "out": out.numpy().tolist(),
                   "matplotlib": "matplotlib" in sys.modules}, f)
    helpers.progress.report(step=1, epoch=0, loss=1.0, examples=1)
