"""The model API: loading ``module:callable``, the custom-train marker, variable recording in both TF modes."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from tfyarn.train import Model, custom_train, is_custom_train, load


def test_load_builtin_models_without_importing_tensorflow():
    had_tf = "tensorflow" in sys.modules
    m = load("tfyarn.models.recommender:model", {"num_users": 10, "dim": 4})
    assert isinstance(m, Model) and m.num_users == 10 and m.dim == 4
    assert isinstance(load("tfyarn.models.logreg:model", {}), Model)
    if not had_tf:
        assert "tensorflow" not in sys.modules


def test_load_errors_name_the_reference(tmp_path):
    with pytest.raises(ImportError, match="nosuchmod"):
        load("nosuchmod:model")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        load("tfyarn.models.logreg:nope")
    (tmp_path / "badmodel.py").write_text("def model():\n    return 42\n")
    with pytest.raises(TypeError, match="not a tfyarn.train.Model"):
        load("badmodel:model", code_dir=str(tmp_path))


def test_custom_train_marker_from_code_dir(tmp_path):
    # a module name no other test uses: load() imports it into sys.modules
    (tmp_path / "marker_train.py").write_text(textwrap.dedent("""
        import tfyarn.train
        @tfyarn.train.custom_train
        def train(ctx, helpers):
            return {"ok": True}
    """))
    fn = load("marker_train:train", {"ignored": 1}, code_dir=str(tmp_path))
    assert is_custom_train(fn) and fn(None, None) == {"ok": True}
    assert not is_custom_train(lambda: 0)
    assert is_custom_train(custom_train(lambda ctx, h: None))


def test_a_custom_train_functions_numpy_results_reach_the_summary_as_numbers(tmp_path):
    """A loop's natural result ({"loss": np.float32, "steps": np.int64}) failed the job after training, in the
    summary writer; anything JSON cannot hold now fails naming the key."""
    import json
    from tfyarn.tasklib.context import TaskContext
    from tfyarn.tasklib.kv import MemoryKV
    from tfyarn.spec import load_spec_dict
    from tfyarn.train.helpers import run_custom
    spec = load_spec_dict({"name": "c", "model": "x:y", "mode": "allreduce", "roles": {"worker": {"instances": 1}},
                           "data": {"train": ["unused"], "batch_size": 1, "features": {"x": {"dtype": "float32"}}}})
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=MemoryKV(), workdir=tmp_path)
    run_custom(ctx, lambda c, h: {"loss": np.float32(0.25), "steps": np.int64(5), "curve": np.arange(3),
                                  "nested": {"auc": np.float64(0.5)}})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["loss"] == 0.25 and summary["steps"] == 5 and summary["curve"] == [0, 1, 2]
    assert summary["nested"] == {"auc": 0.5}
    with pytest.raises(TypeError, match="the custom train function's result: 'model' is a object, which the run "
                                        "summary"):
        run_custom(ctx, lambda c, h: {"model": object()})


def test_models_train_in_graph_mode_and_under_a_strategy():
    """Same model object, TF1 graph (placeholders, v1 optimizer) and TF2 tf.function under a strategy."""
    import tensorflow as tf
    from tfyarn.train import build_model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 16)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")

    m = load("tfyarn.models.logreg:model", {"learning_rate": 1.0})
    g = tf.Graph()
    with g.as_default():
        build_model(m)
        assert [v.op.name for v in m.variables] == ["weights", "bias"]
        xp = tf.compat.v1.placeholder(tf.float32, [None, 16])
        yp = tf.compat.v1.placeholder(tf.float32, [None])
        loss = tf.reduce_mean(m.loss(yp, m({"x": xp}, True)))
        train = m.optimizer().minimize(loss)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            losses = [s.run([loss, train], {xp: x, yp: y})[0] for _ in range(20)]
    assert losses[-1] < losses[0] * 0.7

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    m2 = load("tfyarn.models.logreg:model", {"learning_rate": 1.0})
    with strategy.scope():
        build_model(m2)
        opt = m2.optimizer()
    assert len(m2.trainable_variables) == 2

    @tf.function
    def step(xb, yb):
        def fn(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(m2.loss(yb, m2({"x": xb}, True)), global_batch_size=64)
            grads = tape.gradient(loss, m2.trainable_variables)
            opt.apply_gradients(zip(grads, m2.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(fn, (xb, yb)), axis=None)

    eager = [float(step(x, y)) for _ in range(20)]
    assert eager[-1] < eager[0] * 0.7
    metrics = m2.metrics(tf.constant(y), m2({"x": tf.constant(x)}, False))
    assert set(metrics) == {"loss", "accuracy"} and float(metrics["accuracy"]) > 0.7


def test_build_model_without_variables_fails():
    from tfyarn.train import build_model

    class Empty(Model):
        def build(self):
            pass
    with pytest.raises(ValueError, match="created no tf.Variable"):
        build_model(Empty())
