"""The examples in docs/training.md's "Writing a model" (the model API's documentation) must actually run."""
from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import numpy as np

from tfyarn.tasklib.context import DONE_KEY, SUMMARY_KEY, TaskContext
from tfyarn.tasklib.kv import MemoryKV
from tfyarn.spec import load_spec_dict


def _examples() -> list[str]:
    """The python code blocks of docs/training.md's "Writing a model" section, in order."""
    readme = (Path(__file__).resolve().parents[3] / "docs" / "training.md").read_text()
    section = readme.split("## Writing a model", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def _module(name: str, code: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(code, f"<docstring {name}>", "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


def test_docstring_model_example_trains_in_graph_mode():
    import tensorflow as tf
    from tfyarn.train import build_model, load

    model_code, _ = _examples()
    _module("mymodels", model_code)
    m = load("mymodels:ctr", {"num_users": 50, "num_items": 50, "dim": 4, "lr": 0.5})
    rng = np.random.default_rng(0)
    u, i = rng.integers(0, 50, 256), rng.integers(0, 50, 256)
    y = ((u + i) % 2).astype("float32")
    g = tf.Graph()
    with g.as_default():
        build_model(m)
        assert len(m.variables) == 3
        up, ip = tf.compat.v1.placeholder(tf.int64, [None]), tf.compat.v1.placeholder(tf.int64, [None])
        yp = tf.compat.v1.placeholder(tf.float32, [None])
        loss = tf.reduce_mean(m.loss(yp, m({"user_id": up, "item_id": ip}, True)))
        train = m.optimizer().minimize(loss)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            losses = [s.run([loss, train], {up: u, ip: i, yp: y})[0] for _ in range(30)]
    assert losses[-1] < losses[0]


class _Feeder:
    def __init__(self, n):
        self.n = n

    def steps(self, epoch):
        return self.n

    def epoch(self, epoch, start_step=0):
        for _ in range(start_step, self.n):
            yield {"label": np.ones(8, np.float32), "user_id": np.zeros(8, np.int64), "item_id": np.zeros(8, np.int64)}

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_docstring_custom_train_example_runs_and_chief_finishes_the_job(tmp_path, monkeypatch):
    from tfyarn.train import helpers, run_task

    _, custom_code = _examples()
    _module("mytrain", custom_code)
    monkeypatch.setattr(helpers, "make_feeder", lambda ctx: _Feeder(3))
    spec = load_spec_dict({"name": "c", "model": "mytrain:train", "mode": "ps",
                           "data": {"train": ["x"], "batch_size": 8, "epochs": 2,
                                    "features": {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"},
                                                 "item_id": {"dtype": "int64"}}},
                           "roles": {"ps": {"instances": 1}, "worker": {"instances": 1}}})
    kv = MemoryKV()
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=kv, workdir=tmp_path)
    assert ctx.is_chief
    assert run_task(ctx) == {"steps": 6}
    assert kv.get(DONE_KEY) == "1"
    summary = json.loads(kv.get(SUMMARY_KEY))
    assert summary["custom"] is True and summary["steps"] == 6 and summary["last_loss"] == 1.0
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 6
