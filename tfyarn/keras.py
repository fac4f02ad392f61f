"""Keras ``fit`` reporting to tfyarn without a callback of your own, for ``entrypoint:`` programs::

    model.fit(tfyarn.data.train_dataset(), epochs=..., steps_per_epoch=tfyarn.data.steps_per_epoch(),
              callbacks=[tfyarn.keras.callback()])

Why a callback and not a hook tfyarn attaches itself: ``fit`` is Keras's, and which Keras a program trains with
(Keras 3, or tf_keras with ``TF_USE_LEGACY_KERAS=1``) is the program's choice; one line the program adds is plain to
read and works outside tfyarn too (``tfyarn.progress`` is a no-op there). Without it tfyarn still counts what each
worker took from ``train_dataset()``; with it the run report also has steps, the loss and the compiled metrics.
TensorFlow is imported when the callback is made, not when this module is.
"""

from __future__ import annotations

import math
from typing import Any

import tfyarn


def callback() -> Any:
    """A ``tf.keras.callbacks.Callback`` (tf_keras's under ``TF_USE_LEGACY_KERAS=1``, else Keras 3's) that reports
    each training batch to ``tfyarn.progress``: the step (batches since ``fit`` began), the epoch, the loss and the
    other scalar logs (the compiled metrics) by name."""
    import tensorflow as tf

    class TfyarnProgress(tf.keras.callbacks.Callback):
        """Steps, loss and metrics of ``fit`` to tfyarn (status, history, the run report, the stall watchdog)."""

        def __init__(self) -> None:
            super().__init__()
            self.step = self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = int(epoch)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.step += 1
            values = _scalars(logs or {})
            loss = values.pop("loss", None)
            tfyarn.progress(step=self.step, loss=loss, epoch=self.epoch, metrics=values or None)

    return TfyarnProgress()


def _scalars(logs: dict[str, Any]) -> dict[str, float]:
    """The logs that are finite numbers (a loss may be NaN: kept, so fail_on_nan_loss sees it)."""
    out = {}
    for name, value in logs.items():
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if name == "loss" or math.isfinite(v):
            out[name] = v
    return out
