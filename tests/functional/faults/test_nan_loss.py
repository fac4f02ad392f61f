"""A diverging job (NaN in the data here; a too-high learning rate in life) fails at the step the loss turns NaN,
naming the task and the step, instead of training to the end on NaN and reporting SUCCEEDED; ``fail_on_nan_loss:
false`` trains on. Real processes on the local backend (1 ps + chief + 1 worker, logreg)."""
import math

import pytest

import numpy as np

from tfyarn import api
from tfyarn.backends.base import AppState
from tfyarn.data import build_manifest, plan
from tfyarn.data.example import encode_example
from tfyarn.data.tfrecord import TFRecordWriter
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(240)


def _write(path, n, nan_at=None, seed=0):
    rng = np.random.default_rng(seed)
    with TFRecordWriter(str(path)) as w:
        for i in range(n):
            x = rng.normal(size=16).astype(np.float32).tolist()
            if i == nan_at:
                x[3] = float("nan")
            w.write(encode_example({"label": [float(x[0] > 0)], "x": x}))


def _spec(tmp_path, **over):
    """4 files of 300 records; one record gets a NaN feature where worker rank 0 meets it at its 12th (last) step of
    epoch 0 (found with the planner), so the job first runs — and checkpoints — finite steps. (At its 7th step, a
    chief slow to start on a loaded CI box had not committed its first checkpoint yet: async ps lets the worker run
    ahead.)"""
    d = tmp_path / "data"
    d.mkdir()
    paths = [d / f"part-{i}.tfrecord" for i in range(4)]
    for i, p in enumerate(paths):
        _write(p, 300, seed=i)
    doc = {"name": "nan", "model": "tfyarn.models.logreg:model", "mode": "ps",
           "data": {"train": [str(d / "part-*.tfrecord")], "batch_size": 50, "epochs": 2,
                    "features": {"label": {"dtype": "float32"}, "x": {"dtype": "float32", "shape": [16]}}},
           "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 1}},
           "timeouts": {"rendezvous": 90, "stall": 60, "shutdown": 15}, **over}
    spec = load_spec_dict(doc)
    share = plan(build_manifest(spec.data.train, use_cache=False), 2, 0, spec.data.shuffle_seed, 50).shares[0]
    at = 11 * 50 + 10
    for r in share:
        if at < len(r):
            path = r.path.removeprefix("file://")
            _write(path, 300, nan_at=r.start + at, seed=int(path.rsplit("-", 1)[1].split(".")[0]))
            return spec
        at -= len(r)
    raise AssertionError("worker 0's share is shorter than 12 batches")


def test_a_nan_loss_fails_the_job_at_that_step_naming_it_and_no_nan_checkpoint_is_committed(tmp_path):
    """Checkpoints every step: in async ps mode the chief may save just after the other worker's NaN update reached
    the ps; such a checkpoint must not be committed (a resumed attempt would start from NaN)."""
    import json

    import tensorflow as tf
    ck = tmp_path / "ck"
    st = api.run(_spec(tmp_path, checkpoint={"dir": str(ck), "every_steps": 1, "every_secs": None, "keep": 100}),
                 backend="local")
    assert st.state is AppState.FAILED, st.diagnostics
    assert "NonFiniteLoss" in st.diagnostics, st.diagnostics
    assert (": loss is nan at step " in st.diagnostics and "training diverged" in st.diagnostics
            and "fail_on_nan_loss: false" in st.diagnostics) or "hold NaN/inf after the checkpoint" in st.diagnostics
    entries = json.loads((ck / "tfyarn-checkpoint.json").read_text())["checkpoints"]
    assert entries, "the job ran some finite steps first: there are checkpoints"
    for e in entries:
        reader = tf.train.load_checkpoint(str(ck / e["name"]))
        for key in e["model_variables"]:
            assert np.isfinite(reader.get_tensor(key)).all(), f"{e['name']}: {key} holds NaN/inf"


def test_fail_on_nan_loss_false_trains_on(tmp_path):
    st = api.run(_spec(tmp_path, fail_on_nan_loss=False), backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.summary["global_step"] == st.summary["total_steps"]
    assert math.isnan(st.summary["last_loss"])                          # what it used to do by default
