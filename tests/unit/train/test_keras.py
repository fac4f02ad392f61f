"""A compiled Keras model as a tfyarn model (issue 27, item 1): the adapter's rules in one process, then real jobs
(processes over loopback gRPC) in both modes with resume, warm start, the evaluator and the export.

The model is :mod:`tfyarn.models.keras_recommender`: Embedding + Dense + a custom layer, compiled with a loss, an
optimizer and ``metrics=["accuracy"]``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from harness import RECOMMENDER_FEATURES, LocalCluster, write_recommender_files
from keras_helpers import require_tf_keras

from tfyarn.spec import load_spec_dict

MODEL = "tfyarn.models.keras_recommender:model"
SMALL = {"num_users": 60, "num_items": 60, "dim": 4, "hidden": 4, "learning_rate": 0.05}


def _spec(tmp: Path | None = None, mode: str = "ps", train: list[str] | None = None, **over):
    doc = {"name": "keras", "model": MODEL, "params": dict(SMALL), "mode": mode,
           "data": {"train": train or ["unused"], "features": RECOMMENDER_FEATURES, "batch_size": 200, "epochs": 1},
           "roles": {"chief": {"instances": 1}, "worker": {"instances": 1}},
           "timeouts": {"step": 60, "rendezvous": 120, "shutdown": 30, "stall": 60}}
    if mode == "ps":
        doc["roles"]["ps"] = {"instances": 2}
    for k, v in over.items():
        doc[k] = {**doc.get(k, {}), **v} if isinstance(v, dict) and isinstance(doc.get(k), dict) else v
    return load_spec_dict(doc)


def _load(spec):
    from tfyarn.train.model import load
    return load(spec.model, spec.params, data=spec.data)


def _graph_build(spec):
    """ps mode's way: load eagerly, then build (and make the optimizer) inside a fresh TF1 graph."""
    import tensorflow as tf

    from tfyarn.train.model import build_model
    model = _load(spec)
    with tf.Graph().as_default():
        build_model(model)
        return model, [v.op.name for v in model.variables], model.optimizer()


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
@pytest.mark.parametrize("kind", ["functional", "subclassed"])
def test_keras_model_names_are_stable_across_ps_builds_and_map_to_v1_optimizers(flavour, kind):
    import tensorflow as tf
    if flavour == "tf_keras":
        require_tf_keras()
    spec = _spec(params={**SMALL, "kind": kind, "keras": flavour, "optimizer": "SGD"})
    _, names1, opt = _graph_build(spec)
    _, names2, _ = _graph_build(spec)
    assert names1 == names2 and len(names1) == 6, (names1, names2)       # 2 embeddings, 2 dense x (kernel, bias)
    assert any("embeddings" in n for n in names1)
    # SGD(momentum=0.9, nesterov=True) → MomentumOptimizer with the same hyperparameters
    assert isinstance(opt, tf.compat.v1.train.MomentumOptimizer)
    assert opt._learning_rate == pytest.approx(0.05) and opt._momentum == pytest.approx(0.9) and opt._use_nesterov


def test_each_supported_keras_optimizer_maps_to_its_v1_twin_and_others_are_refused_naming_the_supported():
    import keras
    import tensorflow as tf

    from tfyarn.train.keras_optim import (
        UnsupportedOptimizer,
        optimizer_config,
        v1_equivalent,
    )
    v1 = tf.compat.v1.train
    cases = [(keras.optimizers.SGD(0.3), v1.GradientDescentOptimizer),
             (keras.optimizers.Adagrad(0.2, initial_accumulator_value=0.5), v1.AdagradOptimizer),
             (keras.optimizers.Adam(0.01, beta_1=0.8), v1.AdamOptimizer),
             (keras.optimizers.RMSprop(0.01, rho=0.8, centered=True), v1.RMSPropOptimizer),
             (keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01), v1.FtrlOptimizer)]
    for k_opt, v1_cls in cases:
        got = v1_equivalent(*optimizer_config(k_opt))
        assert type(got) is v1_cls, (k_opt, got)
    assert v1_equivalent(*optimizer_config(keras.optimizers.Adam(0.01, beta_1=0.8)))._beta1 == pytest.approx(0.8)
    assert v1_equivalent(*optimizer_config(keras.optimizers.RMSprop(0.01, rho=0.8)))._decay == pytest.approx(0.8)
    for bad, why in [(keras.optimizers.Adamax(0.01), "Adamax has no ps-mode equivalent"),
                     (keras.optimizers.Adam(0.01, amsgrad=True), "amsgrad=True"),
                     (keras.optimizers.SGD(0.01, clipnorm=1.0), "clipnorm=1.0"),
                     (keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)),
                      "constant learning rate")]:
        with pytest.raises(UnsupportedOptimizer) as err:
            v1_equivalent(*optimizer_config(bad), "m:f")
        assert why in str(err.value) and "Supported in ps mode: SGD" in str(err.value) and "Ftrl" in str(err.value)


def test_a_model_input_no_feature_feeds_and_an_uncompiled_model_are_refused_at_build():
    import keras

    from tfyarn.train.keras_model import ModelSpecError, wrap
    from tfyarn.train.model import build_model
    spec = _spec()

    def no_feature():
        u = keras.Input(shape=(), dtype="int64", name="user_id")
        c = keras.Input(shape=(), dtype="int64", name="country")
        net = keras.Model({"user_id": u, "country": c}, keras.layers.Dense(1)(keras.ops.stack([u, c], -1)))
        net.compile(optimizer="adam", loss="mse")
        return net

    with pytest.raises(ModelSpecError, match=r"model input\(s\) 'country' match no feature of data.features "
                                             r"\(user_id, item_id\)"):
        build_model(wrap(no_feature, no_feature(), spec.data, "m:f"))

    def uncompiled():
        return keras.Sequential([keras.Input(shape=(3,), name="user_id"), keras.layers.Dense(1)])

    with pytest.raises(ModelSpecError, match="uncompiled Keras model"):
        build_model(wrap(uncompiled, uncompiled(), spec.data, "m:f"))


def test_compiled_loss_is_per_example_and_metrics_are_the_compiled_ones():
    import tensorflow as tf

    from tfyarn.train.model import build_model
    model = build_model(_load(_spec()))
    feats = {"user_id": tf.constant([1, 2, 3], tf.int64), "item_id": tf.constant([4, 5, 6], tf.int64)}
    labels = tf.constant([1.0, 0.0, 1.0])
    pred = model(feats, training=False)
    per = model.loss(labels, pred)
    assert per.shape == (3,)                                   # tfyarn chooses the denominator
    want = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.reshape(pred, [-1]))
    np.testing.assert_allclose(per.numpy(), want.numpy(), rtol=1e-5)
    metrics = model.metrics(labels, pred)
    assert sorted(metrics) == ["accuracy", "loss"] and 0 <= float(metrics["accuracy"]) <= 1


def test_step_metrics_come_from_the_steps_predictions_packed_with_the_loss_and_a_plain_model_has_none(caplog):
    """The training step's compiled metrics (tfyarn.train.step_metrics): Keras's own value on the same
    predictions, one vector with the loss; the progress log line, record and final figures carry them."""
    import keras
    import tensorflow as tf

    from tfyarn.tasklib.kv import MemoryKV
    from tfyarn.train.model import Model, build_model
    from tfyarn.train.progress import ProgressReporter
    from tfyarn.train.step_metrics import metric_names, pack, step_metrics, unpack
    model = build_model(_load(_spec()))
    feats = {"user_id": tf.constant([1, 2, 3, 9], tf.int64), "item_id": tf.constant([4, 5, 6, 9], tf.int64)}
    labels = tf.constant([1.0, 0.0, 1.0, 0.0])
    pred = model(feats, training=True)
    assert metric_names(model) == ["accuracy"]
    values = step_metrics(model, labels, pred)
    loss, metrics = unpack(pack(tf.reduce_mean(model.loss(labels, pred)), values), metric_names(model))
    want = keras.metrics.BinaryAccuracy()(tf.expand_dims(labels, -1), pred)   # Keras's own, same predictions
    assert metrics == {"accuracy": pytest.approx(float(want))}
    assert loss == pytest.approx(float(tf.reduce_mean(model.loss(labels, pred))))

    class Plain(Model):
        def build(self):
            self.w = tf.Variable(1.0)

        def __call__(self, features, training):
            return self.w * tf.cast(features["x"], tf.float32)

        def loss(self, labels, predictions):
            return tf.square(labels - predictions)
    plain = build_model(Plain())
    assert metric_names(plain) == [] and step_metrics(plain, labels, plain({"x": labels}, True)) == {}
    assert unpack(pack(tf.constant(0.5), {}), []) == (0.5, None)

    kv = MemoryKV()
    rep = ProgressReporter(kv, "chief:0", log_every=0.0)
    with caplog.at_level("INFO", logger="tfyarn.train.progress"):
        rep.report(step=1, epoch=0, loss=loss, examples=4, metrics=metrics)
    assert f"accuracy {metrics['accuracy']:.4f}" in caplog.text
    assert rep.snapshot()["metrics"] == metrics and rep.final()["metrics"] == metrics
    bare = ProgressReporter(kv, "worker:0")
    bare.report(step=1, epoch=0, loss=0.5, examples=4)
    assert "metrics" not in bare.snapshot() and bare.final()["metrics"] == {}


def _run(spec, workdir: Path, timeout: float = 200, logs: dict | None = None) -> dict:
    with LocalCluster(spec, workdir) as c:
        c.start()
        codes = c.wait(timeout=timeout)
        assert codes == {t: 0 for t in c.procs}, "\n".join(f"--- {t}\n{c.log(t)[-4000:]}" for t in c.procs)
        if logs is not None:
            logs.update({t: c.log(t) for t in c.procs})
    return json.loads((Path(spec.checkpoint.dir.removeprefix("file://")) / "summary.json").read_text())


def _model_values(spec, scratch: Path, entry: dict | None = None) -> list:
    """The model variables' values in a checkpoint (default: the latest) of ``spec``'s checkpoint dir, in creation
    order."""
    import tensorflow as tf

    from tfyarn.train.checkpoint import CheckpointStore, download_model_checkpoint
    prefix, _, keys = download_model_checkpoint(CheckpointStore(spec.checkpoint.dir), scratch, "test", entry)
    reader = tf.train.load_checkpoint(prefix)
    return [reader.get_tensor(k) for k in keys]


def _check_export(spec, version_dir: Path) -> None:
    """The SavedModel serves the spec's features (not the label) and what the Keras model restored from the
    final checkpoint predicts."""
    import tensorflow as tf

    from tfyarn.train.checkpoint import CheckpointStore, restore_model_variables
    from tfyarn.train.model import build_model
    store = CheckpointStore(spec.checkpoint.dir)
    entry = store.latest()
    prefix = store.download(entry, version_dir.parent / "check")
    model = build_model(_load(spec))
    restore_model_variables(model.variables, prefix, entry["model_variables"])
    feats = {k: tf.constant(np.arange(64) * 7 % 60, tf.int64) for k in ("user_id", "item_id")}
    serve = tf.saved_model.load(str(version_dir)).signatures["serving_default"]
    assert sorted(serve.structured_input_signature[1]) == ["item_id", "user_id"]
    got = serve(**feats)["predictions"].numpy()
    np.testing.assert_allclose(got, model(feats, training=False).numpy(), rtol=1e-5, atol=1e-6)
    assert np.std(got) > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_keras_model_trains_in_allreduce_with_keras_optimizer_evaluator_export_and_resume(tmp_path):
    train = write_recommender_files(tmp_path / "train", [1200, 800])
    ev = write_recommender_files(tmp_path / "eval", [400], seed=7)
    ckpt = tmp_path / "ckpt"
    over = {"checkpoint": {"dir": str(ckpt), "every_steps": 2, "every_secs": None, "keep": 2},
            "data": {"train": train, "eval": ev, "features": RECOMMENDER_FEATURES, "batch_size": 200, "epochs": 1},
            "export": {"dir": str(tmp_path / "models")}}
    spec = _spec(mode="allreduce", **over, roles={"chief": {"instances": 1}, "worker": {"instances": 1},
                                                  "evaluator": {"instances": 1}})
    logs: dict = {}
    first = _run(spec, tmp_path / "run1", logs=logs)
    assert first["global_step"] == first["total_steps"] == 5 and first["mode"] == "allreduce"
    # the compiled metric, from the training step itself: in the chief's log and in the summary
    assert list(first["metrics"]) == ["accuracy"] and 0 <= first["metrics"]["accuracy"] <= 1
    assert re.search(r"ran 5 steps .*last loss \S+, accuracy \d\.\d{4}", logs["chief:0"]), logs["chief:0"][-3000:]
    assert first["last_loss"] < first["first_loss"] * 1.05
    keys = [k for k, _ in __import__("tensorflow").train.list_variables(str(ckpt / "ckpt-5"))]
    assert any(k.startswith("optimizer/") and "_variables" in k for k in keys), keys   # Adam's slots checkpointed
    lines = [json.loads(x) for x in (ckpt / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["global_step"] == 5 and 0 <= lines[-1]["accuracy"] <= 1 and lines[-1]["loss"] > 0
    _check_export(spec, tmp_path / "models" / "5")
    # resume: the same job with 2 epochs continues from ckpt-5 (model, Keras optimizer slots, global step)
    spec2 = _spec(mode="allreduce", **{**over, "data": {**over["data"], "epochs": 2}})
    second = _run(spec2, tmp_path / "run2")
    assert second["resumed_from"] == "ckpt-5" and second["global_step"] == 10


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_keras_model_trains_in_sync_ps_mode_with_the_v1_twin_export_and_warm_start(tmp_path):
    train = write_recommender_files(tmp_path / "train", [1200, 800])
    data = {"train": train, "features": RECOMMENDER_FEATURES, "batch_size": 200, "epochs": 1}
    # 0.1, not 1.0: SGD at 1.0 on random labels could kill all 4 hidden ReLUs (seen once in CI: the export then
    # served one constant, as the restored model did)
    params = {**SMALL, "optimizer": "SGD", "learning_rate": 0.1}
    spec = _spec(mode="ps", sync=True, data=data, params=params, export={"dir": str(tmp_path / "models")},
                 checkpoint={"dir": str(tmp_path / "ckpt"), "every_steps": 2, "every_secs": None})
    logs: dict = {}
    first = _run(spec, tmp_path / "run1", logs=logs)
    assert first["global_step"] == first["total_steps"] == 5 and first["num_ps"] == 2
    assert list(first["metrics"]) == ["accuracy"] and 0 <= first["metrics"]["accuracy"] <= 1
    assert re.search(r"training done: .*loss \S+ -> \S+, accuracy \d\.\d{4}", logs["chief:0"]), logs["chief:0"][-3000:]
    assert np.isfinite([first["first_loss"], first["last_loss"]]).all(), first
    # the v1 SGD twin updated the model (Keras optimizers do nothing in a TF1 Session): its variables at step 5
    # differ from those of the earliest checkpoint kept (5 steps on random labels: the loss itself is noise)
    from tfyarn.train.checkpoint import CheckpointStore
    earliest = CheckpointStore(spec.checkpoint.dir).index()["checkpoints"][0]
    assert earliest["global_step"] < 5, earliest
    moved = [not np.array_equal(a, b) for a, b in zip(_model_values(spec, tmp_path / "early", earliest),
                                                         _model_values(spec, tmp_path / "final"))]
    assert len(moved) == 6 and all(moved), moved
    _check_export(spec, tmp_path / "models" / "5")
    # warm start: a new job (own checkpoint dir) starts its model from the first job's final checkpoint. With a
    # learning rate of 0 its model cannot move, so its final model variables are the first job's, value for value
    # (a fresh initialisation cannot match them; comparing losses over 5 steps is noise).
    spec2 = _spec(mode="ps", sync=True, data=data, params={**params, "learning_rate": 0.0},
                  checkpoint={"dir": str(tmp_path / "ckpt2"), "init_from": str(tmp_path / "ckpt"),
                              "every_steps": 2, "every_secs": None})
    second = _run(spec2, tmp_path / "run2")
    assert second["warm_started_from"].endswith("ckpt-5") and second["global_step"] == 5
    trained, warm = (_model_values(s, tmp_path / f"check-{i}") for i, s in enumerate((spec, spec2)))
    assert len(trained) == len(warm) == 6
    for a, b in zip(trained, warm):
        np.testing.assert_array_equal(a, b)


def test_a_keras_model_tfyarn_cannot_train_is_refused_before_anything_starts_with_exit_2(tmp_path):
    """Preflight checks a model whose code uses Keras in a child process: ps mode with an optimizer that has no v1
    twin (and a model input no feature feeds) → exit 2, nothing started, the message naming what is supported."""
    import os
    import subprocess
    import sys

    import yaml
    train = write_recommender_files(tmp_path / "train", [400])
    doc = {"name": "refused", "model": MODEL, "params": {**SMALL, "optimizer": "Adamax"}, "mode": "ps",
           "data": {"train": train, "features": RECOMMENDER_FEATURES, "batch_size": 100},
           "roles": {"ps": {"instances": 1}, "worker": {"instances": 1}}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "tfyarn.cli", "run", str(tmp_path / "spec.yaml")],
                          check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "TFYARN_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Adamax has no ps-mode equivalent" in proc.stderr and "Supported in ps mode: SGD" in proc.stderr
    assert "nothing was started" in proc.stderr
    assert not (tmp_path / "home" / "apps").exists() or not any((tmp_path / "home" / "apps").iterdir())


def test_a_ps_mode_keras_weight_over_1_gib_is_refused_by_tfyarn_run_local_with_exit_2(tmp_path):
    """A Dense kernel of 1.22 GiB (ps mode splits only Embeddings; TF's gRPC moves no tensor over 2 GiB): preflight's
    Keras check refuses it from its shape before its optimizer's eager twin would allocate it, exit 2, nothing started
    (the rule itself: test_ps_sharding's test_a_weight_over_1_gib_...)."""
    import os
    import subprocess
    import sys

    import yaml
    doc = {"name": "wide", "model": MODEL, "mode": "ps",
           "params": {**SMALL, "dim": 8192, "hidden": 20_000},  # hidden/kernel: 16384 x 20000 float32
           "data": {"train": write_recommender_files(tmp_path / "train", [200]), "features": RECOMMENDER_FEATURES,
                    "batch_size": 100},
           "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "tfyarn.cli", "run", str(tmp_path / "spec.yaml"), "--local"],
                          check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "TFYARN_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "1 problem found before starting the job (nothing was started):\n  - model: weight hidden/kernel is " \
           "1.22 GiB (16384 x 20000 float32) and ps mode would keep it whole on one ps, over the 1 GiB" in proc.stderr
    assert "make it a keras.layers.Embedding if it is a lookup table" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "home" / "apps").exists() or not any((tmp_path / "home" / "apps").iterdir())


def test_a_sequential_model_with_or_without_an_input_trains_on_its_one_feature():
    """Sequential: with ``keras.Input(name=<feature>)`` it is fed by name; without one (unbuilt) it takes the single
    non-label feature and is built on it."""
    import keras
    import tensorflow as tf
    from tfyarn.train.keras_model import wrap
    spec = load_spec_dict({"name": "seq", "model": "m:f", "mode": "ps",
                           "roles": {"ps": {"instances": 1}, "worker": {"instances": 1}},
                           "data": {"train": ["x"], "batch_size": 8, "features": {
                               "x": {"dtype": "float32", "shape": [3]}, "label": {"dtype": "float32"}}}})

    def with_input():
        m = keras.Sequential([keras.Input(shape=(3,), name="x"), keras.layers.Dense(1)])
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
        return m

    def unbuilt():
        m = keras.Sequential([keras.layers.Dense(1)])
        m.compile(optimizer=keras.optimizers.RMSprop(0.05), loss="mse")
        return m

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = x @ np.array([1.0, -2.0, 0.5], "float32")
    for factory in (with_input, unbuilt):
        from tfyarn.train.model import build_model
        model = wrap(factory, factory(), spec.data, "m:f")
        with tf.Graph().as_default():
            build_model(model)
            assert len(model.variables) == 2
            xp, yp = tf.compat.v1.placeholder(tf.float32, [None, 3]), tf.compat.v1.placeholder(tf.float32, [None])
            pred = model({"x": xp}, True)
            loss = tf.reduce_mean(model.loss(yp, pred))
            metrics = model.metrics(yp, pred)
            train = model.optimizer().minimize(loss, var_list=model.trainable_variables)
            with tf.compat.v1.Session() as s:
                s.run(tf.compat.v1.global_variables_initializer())
                losses = [s.run([loss, train], {xp: x, yp: y})[0] for _ in range(40)]
                names = sorted(s.run(metrics, {xp: x, yp: y}))
        assert losses[-1] < losses[0] * 0.5, (factory.__name__, losses[0], losses[-1])
        assert names == (["loss", "mae"] if factory is with_input else ["loss"])
