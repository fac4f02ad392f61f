"""A training step's compiled metrics: computed from the step's own predictions and fetched with its loss.

Why this way: a second forward pass (or a second fetch per step) would cost as much as the step on a small model.
allreduce packs ``[loss, *metrics]`` into one float32 vector (one device-to-host read per step, as the loss alone);
ps mode adds the metric scalars to the step's session run. A model that declares no compiled metrics (the plain-TF
:class:`~tfyarn.train.model.Model`) keeps its step unchanged and reports none.
"""

from __future__ import annotations

from typing import Any


def metric_names(model: Any) -> list[str]:
    """The names of the metrics the step computes (a Keras model's compiled ones; none for a plain model)."""
    return list(getattr(model, "metric_names", None) or [])


def step_metrics(model: Any, labels: Any, predictions: Any) -> dict[str, Any]:
    """Scalar float32 tensors of the model's compiled metrics on this batch, in :func:`metric_names` order."""
    if not metric_names(model):
        return {}
    values = model.train_metrics(labels, predictions)
    return {n: values[n] for n in metric_names(model)}


def pack(loss: Any, metrics: dict[str, Any]) -> Any:
    """The loss alone (no metrics: the step's output is as before), else the vector ``[loss, *metrics]``."""
    if not metrics:
        return loss
    import tensorflow as tf

    return tf.stack([tf.cast(loss, tf.float32), *(tf.cast(v, tf.float32) for v in metrics.values())])


def unpack(out: Any, names: list[str]) -> tuple[float, dict[str, float] | None]:
    """A step's output (see :func:`pack`) → (loss, {metric: value} or None)."""
    if not names:
        return float(out), None
    values = out.numpy() if hasattr(out, "numpy") else out
    return float(values[0]), {n: float(v) for n, v in zip(names, values[1:])}
