"""A diverging job (NaN in the data here; a too-high learning rate in life) fails at the step the loss turns NaN,
naming the task and the step, instead of training to the end on NaN and reporting SUCCEEDED; ``fail_on_nan_loss:
false`` trains on. Real processes on the local backend (1 ps + chief + 1 worker, logreg)."""
import math

import pytest

from tfyarn import api
from tfyarn.backends.base import AppState
from tfyarn.data import write_synthetic
from tfyarn.data.example import encode_example
from tfyarn.data.tfrecord import TFRecordWriter
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(240)


def _spec(tmp_path, **over):
    d = tmp_path / "data"
    urls = write_synthetic(str(d), "logreg", files=2, records=1000, seed=3)
    with TFRecordWriter(str(d / "part-nan.tfrecord")) as w:           # one record with a NaN feature
        for i in range(100):
            x = [float("nan") if i == 37 else 0.1] * 16
            w.write(encode_example({"label": [1.0], "x": x}))
    doc = {"name": "nan", "model": "tfyarn.models.logreg:model", "mode": "ps",
           "data": {"train": urls + [str(d / "part-nan.tfrecord")], "batch_size": 50, "epochs": 2,
                    "features": {"label": {"dtype": "float32"}, "x": {"dtype": "float32", "shape": [16]}}},
           "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 1}},
           "timeouts": {"rendezvous": 90, "stall": 60, "shutdown": 15}, **over}
    return load_spec_dict(doc)


def test_a_nan_loss_fails_the_job_at_that_step_naming_it(tmp_path):
    st = api.run(_spec(tmp_path), backend="local")
    assert st.state is AppState.FAILED, st.diagnostics
    assert "NonFiniteLoss" in st.diagnostics and ": loss is nan at step " in st.diagnostics, st.diagnostics
    assert "training diverged" in st.diagnostics and "fail_on_nan_loss: false" in st.diagnostics


def test_fail_on_nan_loss_false_trains_on(tmp_path):
    st = api.run(_spec(tmp_path, fail_on_nan_loss=False), backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.summary["global_step"] == st.summary["total_steps"]
    assert math.isnan(st.summary["last_loss"])                          # what it used to do by default
