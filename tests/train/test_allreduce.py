"""allreduce mode with real processes over loopback gRPC (MultiWorkerMirroredStrategy), plus its pure helpers.

The done-when of issue 4 for this mode: files of 3000/2500/2000/1500/1000 records, batch 1000, 2 training workers,
3 epochs — the job finishes, every worker ran the same number of steps and the final global step is the planned one.
The seeds hung on exactly this skew (round-robin files gave one worker 6 steps, the other 4).
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from harness import RECOMMENDER_FEATURES, LocalCluster, write_recommender_files
from tfyarn.runtime.context import DONE_KEY, progress_key
from tfyarn.spec import load_spec_dict
from tfyarn.train.allreduce import model_variable_keys, position

SKEWED = [3000, 2500, 2000, 1500, 1000]


def make_spec(tmp: Path, epochs: int = 3, evaluator: bool = False, **over):
    train = write_recommender_files(tmp / "train", SKEWED)
    doc = {"name": "ar", "model": "tfyarn.models.recommender:model", "params": {"dim": 8}, "mode": "allreduce",
           "data": {"train": train, "features": RECOMMENDER_FEATURES, "batch_size": 1000, "epochs": epochs},
           "roles": {"chief": {"instances": 1}, "worker": {"instances": 1}},
           "checkpoint": {"dir": str(tmp / "ckpt"), "every_steps": 4, "every_secs": None, "keep": 2},
           "timeouts": {"step": 60, "rendezvous": 120, "shutdown": 30, "stall": 60}}
    if evaluator:
        doc["data"]["eval"] = write_recommender_files(tmp / "eval", [2000], seed=7)
        doc["roles"]["evaluator"] = {"instances": 1}
    for k, v in over.items():
        doc[k] = {**doc.get(k, {}), **v} if isinstance(v, dict) else v
    return load_spec_dict(doc)


def test_position_maps_global_step_to_epoch_and_offset():
    steps = [5, 5, 4]
    assert position(0, steps) == (0, 0)
    assert position(4, steps) == (0, 4)
    assert position(5, steps) == (1, 0)
    assert position(12, steps) == (2, 2)
    assert position(14, steps) == (3, 0)      # finished


def test_model_variable_keys_match_the_checkpointed_object_graph():
    assert model_variable_keys(2) == ["model/var_0/.ATTRIBUTES/VARIABLE_VALUE",
                                      "model/var_1/.ATTRIBUTES/VARIABLE_VALUE"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_skewed_files_two_workers_three_epochs_finish_with_equal_steps_and_evaluator(tmp_path):
    spec = make_spec(tmp_path, epochs=3, evaluator=True)
    with LocalCluster(spec, tmp_path / "run") as c:
        c.start()
        codes = c.wait(timeout=240)
        logs = {t: c.log(t) for t in c.procs}
        assert codes == {t: 0 for t in c.procs}, "\n".join(f"--- {t}\n{l[-3000:]}" for t, l in logs.items())
        progress = {t: json.loads(c.kv.get(progress_key(t))) for t in spec.training_tasks}
        assert c.kv.get(DONE_KEY) is not None
    planned = 3 * (sum(SKEWED) // (2 * 1000))              # 5 steps per epoch, nothing dropped
    summary = json.loads((tmp_path / "ckpt" / "summary.json").read_text())
    assert summary["planned_steps"] == planned == 15
    assert summary["global_step"] == planned
    assert summary["steps_per_epoch"] == [5, 5, 5]
    assert summary["global_batch"] == 2000 and summary["per_worker_batch"] == 1000
    for t in spec.training_tasks:                          # every worker ran the same, planned number of steps
        assert progress[t]["worker_steps"] == planned, (t, progress[t])
        assert progress[t]["global_step"] == planned
        assert summary["tasks"][t]["worker_steps"] == planned
    assert summary["chief"]["traces"] <= 2                 # fixed input signature: no retracing per batch
    assert summary["chief"]["last_loss"] < summary["chief"]["first_loss"]
    assert "global batch 2000" in logs["chief:0"] and "1000 x 2 workers" in logs["chief:0"]
    index = json.loads((tmp_path / "ckpt" / "tfyarn-checkpoint.json").read_text())
    assert index["latest"] == "ckpt-15" and len(index["checkpoints"]) == 2     # keep: 2
    # evaluator: evaluated the final checkpoint, metrics as JSON lines and as TF event files
    lines = [json.loads(l) for l in (tmp_path / "ckpt" / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert lines and lines[-1]["checkpoint"] == "ckpt-15" and lines[-1]["global_step"] == 15
    assert lines[-1]["examples"] == 2000 and 0 < lines[-1]["loss"] < 1.0 and 0 <= lines[-1]["accuracy"] <= 1
    assert list((tmp_path / "ckpt" / "eval").glob("events.out.tfevents.*"))
    assert list((tmp_path / "ckpt" / "train").glob("events.out.tfevents.*"))
