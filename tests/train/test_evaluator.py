"""Evaluator unit behaviour (the full path — following checkpoints of a real allreduce job and evaluating the final
one — is in test_allreduce.py). Why: a follower role must end when training ends, however it ends, or the job hangs
on it; and it must not mistake a half-written checkpoint or a missing index for one to evaluate."""
from __future__ import annotations

import json
import threading
import time

import pytest

from harness import RECOMMENDER_FEATURES, write_recommender_files
from tfyarn.runtime.context import ABORT_KEY, DONE_KEY, TaskContext, failure_key
from tfyarn.runtime.kv import MemoryKV
from tfyarn.spec import load_spec_dict
from tfyarn.train.evaluator import training_ended_badly


def make_ctx(tmp_path, kv=None):
    spec = load_spec_dict({
        "name": "ev", "model": "tfyarn.models.recommender:model", "params": {"dim": 4}, "mode": "allreduce",
        "data": {"train": ["unused"], "eval": write_recommender_files(tmp_path / "eval", [1000]),
                 "features": RECOMMENDER_FEATURES, "batch_size": 500},
        "roles": {"worker": {"instances": 1}, "evaluator": {"instances": 1}},
        "checkpoint": {"dir": str(tmp_path / "ckpt")}})
    return TaskContext(spec=spec, role="evaluator", index=0, kv=kv or MemoryKV(), workdir=tmp_path)


def test_training_ended_badly_names_the_failed_task_or_the_abort_reason(tmp_path):
    ctx = make_ctx(tmp_path)
    assert training_ended_badly(ctx) is None
    ctx.kv.put(failure_key("worker:0"), "UnavailableError: peer gone")
    assert training_ended_badly(ctx) == "training failed: worker:0: UnavailableError: peer gone"
    ctx.kv.put(ABORT_KEY, "killed by user")
    assert training_ended_badly(ctx) == "job aborted: killed by user"


@pytest.mark.timeout(120)
def test_evaluator_ends_when_training_fails_and_when_done_without_checkpoints(tmp_path):
    from tfyarn.train import evaluator
    ctx = make_ctx(tmp_path)
    results: list = []
    t = threading.Thread(target=lambda: results.append(evaluator.run(ctx)), daemon=True)
    t.start()
    time.sleep(3 * evaluator.POLL_S)
    assert t.is_alive(), "the evaluator ended while training was still running"
    ctx.kv.put(failure_key("worker:0"), "boom")
    t.join(timeout=60)
    assert not t.is_alive() and results == [[]]
    # and with control/done but no checkpoint ever written: ends too, evaluating nothing
    ctx2 = make_ctx(tmp_path / "b")
    ctx2.kv.put(DONE_KEY, "1")
    assert evaluator.run(ctx2) == []
    assert not (tmp_path / "b" / "ckpt" / "eval" / "metrics.jsonl").exists()
