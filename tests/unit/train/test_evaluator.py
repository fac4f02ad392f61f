"""Evaluator unit behaviour (the full path — following checkpoints of a real allreduce job and evaluating the final
one — is in test_allreduce.py). Why: a follower role must end when training ends, however it ends, or the job hangs
on it; and it must not mistake a half-written checkpoint or a missing index for one to evaluate."""
from __future__ import annotations

import json
import threading
import time

import pytest

from harness import RECOMMENDER_FEATURES, write_recommender_files
from tfyarn.tasklib.context import ABORT_KEY, DONE_KEY, TaskContext, failure_key
from tfyarn.tasklib.kv import MemoryKV
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


def test_a_failure_that_will_be_restarted_does_not_stop_the_evaluator(tmp_path):
    """The record of a task its role restarts in place (nothing deletes it on YARN), or the evaluator's own from
    before its restart, stopped evaluation for good: the final checkpoint was never evaluated."""
    ctx = make_ctx(tmp_path)
    spec = ctx.spec.model_copy(update={"roles": {**ctx.spec.roles,
                                                 "worker": ctx.spec.roles["worker"].model_copy(
                                                     update={"max_restarts": 2})}})
    ctx = TaskContext(spec=spec, role="evaluator", index=0, kv=MemoryKV(), workdir=tmp_path)
    ctx.kv.put(failure_key("worker:0"), "RuntimeError: flaky")
    ctx.kv.put(failure_key("evaluator:0"), "MemoryError")
    assert training_ended_badly(ctx) is None


def test_a_failed_side_task_does_not_end_training_for_the_followers(tmp_path):
    """Issue 19: tensorboard:0 failing (no tensorboard package) made the evaluator log "training failed:
    tensorboard:0 ..." and evaluate nothing while training went on to SUCCEEDED. Only training tasks' and the ps'
    failures (or the job's abort) end training for a follower."""
    ctx = make_ctx(tmp_path)
    ctx.kv.put(failure_key("tensorboard:0"), "MissingTensorBoard: the tensorboard role needs the 'tensorboard' ...")
    ctx.kv.put(failure_key("evaluator:1"), "MemoryError")
    assert training_ended_badly(ctx) is None
    tb = TaskContext(spec=ctx.spec, role="tensorboard", index=0, kv=ctx.kv, workdir=tmp_path)
    assert training_ended_badly(tb) is None                      # nor TensorBoard on an evaluator's crash
    ctx.kv.put(failure_key("ps:0"), "UnavailableError: ps gone")
    assert training_ended_badly(ctx) == "training failed: ps:0: UnavailableError: ps gone"
    assert training_ended_badly(tb) == "training failed: ps:0: UnavailableError: ps gone"


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


def _write_allreduce_checkpoint(ctx, step: int, keep: int = 3) -> None:
    """A checkpoint in allreduce's object layout, uploaded through the CheckpointStore, as the chief writes it."""
    import tensorflow as tf
    from tfyarn.train.allreduce import CHECKPOINT_FORMAT, model_variable_keys, train_state
    from tfyarn.train.checkpoint import CheckpointStore
    from tfyarn.train.model import build_model, load
    model = build_model(load(ctx.spec.model, ctx.spec.params))
    opt = model.optimizer()
    gs = tf.Variable(step, dtype=tf.int64)
    prefix = train_state(model, opt, gs).write(str(ctx.workdir / "w" / f"ckpt-{step}"))
    CheckpointStore(ctx.spec.checkpoint.dir, keep=keep).upload(prefix, step, {
        "format": CHECKPOINT_FORMAT, "model_variables": model_variable_keys(len(model.variables)), "epoch": 0})


@pytest.mark.timeout(120)
def test_a_checkpoint_pruned_during_download_is_skipped_and_the_final_one_evaluated(tmp_path, monkeypatch):
    from tfyarn.train import evaluator
    from tfyarn.train.checkpoint import CheckpointStore
    ctx = make_ctx(tmp_path)
    _write_allreduce_checkpoint(ctx, 7)
    real, calls = CheckpointStore.download, []

    def flaky(self, entry, local_dir):
        calls.append(entry["name"])
        if len(calls) == 1:                      # the chief commits ckpt-9 with keep 1 meanwhile: ckpt-7 is pruned
            _write_allreduce_checkpoint(ctx, 9, keep=1)
            raise FileNotFoundError(f"{entry['name']}.data-00000-of-00001 (pruned)")
        return real(self, entry, local_dir)
    monkeypatch.setattr(CheckpointStore, "download", flaky)
    ctx.kv.put(DONE_KEY, "1")
    results = evaluator.run(ctx)
    assert calls == ["ckpt-7", "ckpt-9"]
    assert [r["checkpoint"] for r in results] == ["ckpt-9"] and results[0]["examples"] == 1000
    lines = (tmp_path / "ckpt" / "eval" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["global_step"] for line in lines] == [9]
    assert json.loads(ctx.kv.get("eval/latest"))["checkpoint"] == "ckpt-9"


def test_a_file_missing_for_another_reason_fails_the_evaluator_instead_of_spinning(tmp_path, monkeypatch):
    """Only a checkpoint pruned from the index is skipped; any other FileNotFoundError (eval data moved away, a
    checkpoint listed but incomplete) used to loop forever, re-downloading and logging "disappeared"."""
    from tfyarn.train import evaluator
    from tfyarn.train.checkpoint import CheckpointStore
    ctx = make_ctx(tmp_path)
    _write_allreduce_checkpoint(ctx, 7)
    calls = []

    def gone(self, entry, local_dir):
        calls.append(entry["name"])
        raise FileNotFoundError("hdfs:///eval/part-00003.tfrecord")
    monkeypatch.setattr(CheckpointStore, "download", gone)
    ctx.kv.put(DONE_KEY, "1")
    with pytest.raises(FileNotFoundError, match="part-00003"):
        evaluator.run(ctx)
    assert calls == ["ckpt-7"]
