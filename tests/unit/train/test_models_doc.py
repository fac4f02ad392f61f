"""docs/models.md's model examples and spec snippets must work as written (its scripts run as jobs in
test_entrypoint.py): the Keras model trains through tfyarn's adapter, the plain-TF class in graph mode, and every
YAML block is a valid spec."""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import yaml

from tfyarn.spec import load_spec_dict

DOC = Path(__file__).resolve().parents[3] / "docs" / "models.md"


def _blocks(lang: str) -> list[str]:
    """Code blocks of ``lang`` not marked as a script example (those are files run as jobs)."""
    text = DOC.read_text()
    return list(re.findall(rf"(?<!-->\n)```{lang}\n(.*?)```", text, re.DOTALL))


def _module(name: str, code: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(code, f"<docs/models.md {name}>", "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


def _data(n: int = 256):
    rng = np.random.default_rng(0)
    u, i = rng.integers(0, 50, n), rng.integers(0, 50, n)
    return u, i, ((u + i) % 2).astype("float32")


def test_every_yaml_block_is_a_valid_spec():
    blocks = _blocks("yaml")
    assert len(blocks) == 3
    specs = [load_spec_dict(yaml.safe_load(b)) for b in blocks]
    assert specs[0].model == "mymodels:recommender" and specs[1].entrypoint == "mwms_fit.py --epochs 2"
    tutorial = specs[2]   # the MWMS tutorial: its features are what its script reads (test_entrypoint runs it)
    assert tutorial.entrypoint == "mwms_tutorial.py" and tutorial.data.features["image"].shape == (28, 28)
    assert tutorial.data.epochs == 3 and set(tutorial.roles) == {"worker"}


def _train_in_graph(model, steps: int = 40) -> list[float]:
    import tensorflow as tf

    from tfyarn.train import build_model
    u, i, y = _data()
    with tf.Graph().as_default():
        build_model(model)
        up, ip = tf.compat.v1.placeholder(tf.int64, [None]), tf.compat.v1.placeholder(tf.int64, [None])
        yp = tf.compat.v1.placeholder(tf.float32, [None])
        loss = tf.reduce_mean(model.loss(yp, model({"user_id": up, "item_id": ip}, True)))
        train = model.optimizer().minimize(loss, var_list=model.trainable_variables)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            return [s.run([loss, train], {up: u, ip: i, yp: y})[0] for _ in range(steps)]


def test_the_keras_example_trains_in_both_modes_ways():
    import tensorflow as tf

    from tfyarn.train import build_model, load
    keras_code, ctr_code = _blocks("python")[0], _blocks("python")[-1]
    assert "keras.Model" in keras_code and "class CTR" in ctr_code
    _module("mymodels", keras_code)
    spec = load_spec_dict(yaml.safe_load(_blocks("yaml")[0]))
    params = {"num_users": 50, "num_items": 50, "dim": 4, "learning_rate": 0.05}
    ps_model = load(spec.model, params, data=spec.data)                    # ps: v1 Adam in a TF1 graph
    losses = _train_in_graph(ps_model)
    assert losses[-1] < losses[0] * 0.9, losses
    model = build_model(load(spec.model, params, data=spec.data))          # allreduce's way: eager, Keras Adam
    opt = model.optimizer()
    assert type(opt).__name__ == "Adam" and type(opt).__module__.startswith("keras")
    u, i, y = _data(64)
    feats = {"user_id": tf.constant(u), "item_id": tf.constant(i)}
    metrics = model.metrics(tf.constant(y), model(feats, training=False))
    assert sorted(metrics) == ["accuracy", "loss"]


def test_the_plain_tf_class_example_trains_in_graph_mode():
    from tfyarn.train import load
    _module("myctr", _blocks("python")[-1])
    losses = _train_in_graph(load("myctr:ctr", {"num_users": 50, "num_items": 50, "dim": 4, "lr": 0.5}), 30)
    assert losses[-1] < losses[0]
