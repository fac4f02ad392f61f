"""``python -m tfyarn.train.keras_check SPEC_JSON_FILE``: what preflight asks of a Keras model before anything
starts (exit 2 with the problems, one per line, if any): compiled; every input named after a feature; its loss and
metrics usable; in ps mode an optimizer with a ``tf.compat.v1.train`` twin. Run in a child process by the gateway
(:func:`tfyarn.gateway.preflight.check_keras_model`) only when the model's code uses Keras and the tasks run this
Python: the gateway itself never imports TensorFlow."""

from __future__ import annotations

import sys

from tfyarn.spec import load_spec_json
from tfyarn.train import child_check
from tfyarn.train.keras_model import KerasModel, ModelSpecError
from tfyarn.train.keras_optim import UnsupportedOptimizer, v1_equivalent
from tfyarn.train.model import build_model, load_unbuilt


def problems(spec_json: str) -> list[str]:
    import tensorflow as tf

    spec = load_spec_json(spec_json)
    model: object = load_unbuilt(spec.model, spec.params, spec.code or None, data=spec.data)
    if not isinstance(model, KerasModel):
        return []
    try:
        with tf.Graph().as_default():
            build_model(model)
        if spec.mode == "ps":
            v1_equivalent(*model.ps_optimizer_config(), spec.model)
    except (ModelSpecError, UnsupportedOptimizer) as exc:
        return [f"model: {exc}"]
    return []


if __name__ == "__main__":
    sys.exit(child_check.run(problems))
