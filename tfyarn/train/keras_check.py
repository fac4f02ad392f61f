"""``python -m tfyarn.train.keras_check SPEC_JSON_FILE``: what preflight asks of a Keras model before anything
starts (exit 2 with the problems, one per line, if any): compiled; every input named after a feature; its loss and
metrics usable; in ps mode an optimizer with a ``tf.compat.v1.train`` twin and no weight over what one ps variable
may hold (:func:`tfyarn.train.sharding.refuse_too_big`). Run in a child process by the gateway
(:func:`tfyarn.gateway.preflight.check_keras_model`) only when the model's code uses Keras and the tasks run this
Python: the gateway itself never imports TensorFlow."""

from __future__ import annotations

import sys

from tfyarn.spec import load_spec_json
from tfyarn.train import child_check, sharding
from tfyarn.train.keras_model import KerasModel, ModelSpecError
from tfyarn.train.keras_optim import UnsupportedOptimizer, v1_equivalent
from tfyarn.train.model import build_model, load_unbuilt


def problems(spec_json: str) -> list[str]:
    import tensorflow as tf

    spec = load_spec_json(spec_json)
    model: object = load_unbuilt(spec.model, spec.params, spec.code or None, data=spec.data)
    if not isinstance(model, KerasModel):
        return []
    # ps mode: built as its tasks build it (Embeddings split by the policy), so a weight no ps may hold in one
    # piece is said before the optimizer's eager twin would allocate it
    policy = sharding.policy_for(spec, spec.instances("ps")) if spec.mode == "ps" else None
    try:
        with tf.Graph().as_default(), sharding.sharding(policy, intercept=False):
            build_model(model)
            if policy is not None:
                sharding.refuse_too_big(tf.compat.v1.global_variables(), keras=True)
        if spec.mode == "ps":
            v1_equivalent(*model.ps_optimizer_config(), spec.model)
    except sharding.TooBigForPs as exc:
        return exc.lines
    except (ModelSpecError, UnsupportedOptimizer) as exc:
        return [f"model: {exc}"]
    return []


if __name__ == "__main__":
    sys.exit(child_check.run(problems))
