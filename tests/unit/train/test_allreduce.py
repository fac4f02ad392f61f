"""allreduce mode with real processes over loopback gRPC (MultiWorkerMirroredStrategy), plus its pure helpers.

The done-when of issue 4 for this mode: files of 3000/2500/2000/1500/1000 records, batch 1000, 2 training workers,
3 epochs — the job finishes, every worker ran the same number of steps and the final global step is the planned one.
The seeds hung on exactly this skew (round-robin files gave one worker 6 steps, the other 4).
"""
from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from harness import RECOMMENDER_FEATURES, LocalCluster, check_export_matches_checkpoint, write_recommender_files
from tfyarn.tasklib.context import DONE_KEY, progress_key
from tfyarn.spec import load_spec_dict
from tfyarn.train.allreduce import model_variable_keys
from tfyarn.train.helpers import position

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


def test_a_checkpoint_of_another_model_is_refused_naming_the_variable_and_the_way_out(tmp_path):
    """Object-based (allreduce) checkpoints, as the allreduce chief and the evaluator restore them: the model's
    variables under the entry's positional keys, named in the message by the model's own variable names."""
    import tensorflow as tf
    from tfyarn.train.checkpoint import CheckpointMismatch, check_fits, check_model_fits, restore_model_variables

    def variables(dim):
        return [tf.Variable(tf.zeros([10, dim]), name="user_embedding"), tf.Variable(tf.zeros([10]), name="bias")]

    written = variables(8)
    prefix = tf.train.Checkpoint(model=tf.train.Checkpoint(**{f"var_{i}": v for i, v in enumerate(written)})).write(
        str(tmp_path / "ckpt-5"))
    keys = model_variable_keys(2)
    check_model_fits(prefix, variables(8), keys, "ckpt-5")                                         # fits: no error
    with pytest.raises(CheckpointMismatch) as e:
        check_model_fits(prefix, variables(16), keys, "ckpt-5 in /c")
    assert str(e.value).startswith("checkpoint ckpt-5 in /c does not fit this job's model: user_embedding has shape "
                                   "[10, 8] in the checkpoint, [10, 16] in the model. It was written by another model")
    with pytest.raises(CheckpointMismatch, match="it has 2 model variables, the model built 3"):
        check_model_fits(prefix, variables(8) + [tf.Variable(1.0)], keys, "ckpt-5")
    with pytest.raises(CheckpointMismatch, match=r"model/var_2 is not in the checkpoint"):
        check_fits(prefix, {"model/var_2/.ATTRIBUTES/VARIABLE_VALUE": [1]}, "x")
    model = tf.Module()
    model.vs = variables(16)
    with pytest.raises(CheckpointMismatch, match="user_embedding has shape"):   # the evaluator's path
        restore_model_variables(model.variables, prefix, keys, "ckpt-5")
    model.vs = variables(8)
    written[0].assign(tf.ones([10, 8]))
    tf.train.Checkpoint(model=tf.train.Checkpoint(**{f"var_{i}": v for i, v in enumerate(written)})).write(
        str(tmp_path / "ckpt-6"))
    restore_model_variables(model.variables, str(tmp_path / "ckpt-6"), keys, "ckpt-6")
    assert float(tf.reduce_sum(model.vs[0])) == 80.0


class FakeFeeder:
    """Feeder stand-in: epoch e has steps[e] batches {'e': e, 'i': i}; records when each epoch was opened."""

    def __init__(self, steps, opened):
        self._steps, self.opened = steps, opened

    def steps(self, epoch):
        return self._steps[epoch]

    def epoch(self, epoch, start_step=0):
        self.opened.append(epoch)
        return iter([{"e": epoch, "i": i} for i in range(start_step, self._steps[epoch])])

    def close(self):
        pass


def test_epoch_pipeline_yields_the_plan_from_a_resume_point_and_opens_the_next_epoch_early():
    from tfyarn.data.pipeline import EpochPipeline
    opened: list[int] = []
    steps = [3, 2, 0, 2]
    pipe = EpochPipeline(lambda: FakeFeeder(steps, opened), epochs=4)
    seen, opened_when = [], {}
    for epoch, batch in pipe.run(0, 1):
        seen.append((epoch, batch["i"]))
        time.sleep(0.01)                      # let the opener thread run
        opened_when.setdefault(len(opened), len(seen))
    assert seen == [(0, 1), (0, 2), (1, 0), (1, 1), (3, 0), (3, 1)]
    assert opened == [0, 1, 2, 3]
    # epoch 1 was opened while epoch 0 was still being consumed (after its first batch, before its last)
    assert opened_when[2] <= 2


def test_epoch_pipeline_resume_after_the_last_epoch_yields_nothing():
    from tfyarn.data.pipeline import EpochPipeline
    pipe = EpochPipeline(lambda: FakeFeeder([1], []), epochs=1)
    assert list(pipe.run(1, 0)) == []


def test_small_sparse_gradients_are_densified_large_ones_stay_sparse():
    import tensorflow as tf
    from types import SimpleNamespace
    from tfyarn.train.allreduce import densify_if_small
    g = tf.IndexedSlices(tf.ones([2, 4]), tf.constant([0, 3], tf.int64), tf.constant([10, 4], tf.int64))
    small = SimpleNamespace(shape=tf.TensorShape([10, 4]), dtype=tf.float32, name="small")
    big = SimpleNamespace(shape=tf.TensorShape([10_000_000, 4]), dtype=tf.float32, name="big")
    dense = densify_if_small(g, small, global_batch=2000, workers=2)
    assert not isinstance(dense, tf.IndexedSlices) and dense.shape == (10, 4)
    assert float(tf.reduce_sum(dense)) == 8.0
    assert isinstance(densify_if_small(g, big, global_batch=2000, workers=2), tf.IndexedSlices)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_skewed_files_two_workers_three_epochs_finish_with_equal_steps_and_evaluator(tmp_path):
    spec = make_spec(tmp_path, epochs=3, evaluator=True, export={"dir": str(tmp_path / "models"), "keep": 1})
    with LocalCluster(spec, tmp_path / "run") as c:
        c.start()
        codes = c.wait(timeout=240)
        logs = {t: c.log(t) for t in c.procs}
        assert codes == {t: 0 for t in c.procs}, "\n".join(f"--- {t}\n{log[-3000:]}" for t, log in logs.items())
        progress = {t: json.loads(c.kv.get(progress_key(t))) for t in spec.training_tasks}
        assert c.kv.get(DONE_KEY) is not None
    planned = 3 * (sum(SKEWED) // (2 * 1000))              # 5 steps per epoch, nothing dropped
    summary = json.loads((tmp_path / "ckpt" / "summary.json").read_text())
    assert summary["total_steps"] == planned == 15
    assert summary["global_step"] == planned
    assert summary["steps_per_epoch"] == [5, 5, 5]
    assert summary["global_batch_size"] == 2000 and summary["batch_size"] == 1000
    for t in spec.training_tasks:                          # every worker ran the same, planned number of steps
        assert progress[t]["worker_steps"] == planned, (t, progress[t])
        assert progress[t]["global_step"] == planned
        assert summary["tasks"][t]["worker_steps"] == planned
    assert summary["chief"]["traces"] <= 2                 # fixed input signature: no retracing per batch
    assert summary["chief"]["last_loss"] < summary["chief"]["first_loss"]
    # the keys every mode's summary has (tfyarn.train.progress.run_summary), as the ps tests check them too
    assert summary["last_loss"] == summary["chief"]["last_loss"] and summary["mode"] == "allreduce"
    assert summary["checkpoint_dir"] == str(tmp_path / "ckpt") and summary["last_checkpoint"] == f"ckpt-{planned}"
    assert summary["resumed_from"] is None and summary["num_workers"] == 2
    assert "global batch 2000" in logs["chief:0"] and "1000 x 2 workers" in logs["chief:0"]
    index = json.loads((tmp_path / "ckpt" / "tfyarn-checkpoint.json").read_text())
    assert index["latest"] == "ckpt-15" and len(index["checkpoints"]) == 2     # keep: 2
    # evaluator: evaluated the final checkpoint, metrics as JSON lines and as TF event files
    lines = [json.loads(line) for line in (tmp_path / "ckpt" / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert lines and lines[-1]["checkpoint"] == "ckpt-15" and lines[-1]["global_step"] == 15
    assert lines[-1]["examples"] == 2000 and 0 < lines[-1]["loss"] < 1.0 and 0 <= lines[-1]["accuracy"] <= 1
    assert list((tmp_path / "ckpt" / "eval").glob("events.out.tfevents.*"))
    assert list((tmp_path / "ckpt" / "train").glob("events.out.tfevents.*"))
    # export: the final (object-based) checkpoint as a SavedModel serving exactly its model
    assert summary["export"]["url"] == str(tmp_path / "models" / "15") and summary["export"]["checkpoint"] == "ckpt-15"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["15"]
    assert summary["export"]["downloaded"] is False          # from the chief's local copy of what it uploaded
    kept = [p.name for p in tmp_path.rglob("ckpt-allreduce-*/ckpt-*.index")]
    assert kept == ["ckpt-15.index"], kept                    # local copies do not pile up: only the last one stays
    check_export_matches_checkpoint(spec, tmp_path / "models" / "15", "ckpt-15")


def _wait_for(cond, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def _latest_step(ckpt: Path) -> int:
    try:
        idx = json.loads((ckpt / "tfyarn-checkpoint.json").read_text())
    except (OSError, ValueError):
        return -1
    return max((c["global_step"] for c in idx["checkpoints"] if c["name"] == idx["latest"]), default=-1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killed_job_resumes_at_the_checkpointed_epoch_and_step(tmp_path):
    # 5 steps per epoch; a checkpoint every 7 steps lands mid-epoch (7 = epoch 1 step 2, 14 = epoch 2 step 4, ...)
    spec = make_spec(tmp_path, epochs=40, checkpoint={"every_steps": 7})
    ckpt = tmp_path / "ckpt"
    with LocalCluster(spec, tmp_path / "run1") as c:
        c.start()
        _wait_for(lambda: _latest_step(ckpt) >= 7 or any(p.poll() is not None for p in c.procs.values()),
                  timeout=180, what="the first checkpoint of run 1")
        for t in c.procs:                                     # stopped mid-run as the launcher and YARN stop
            c.signal(t, signal.SIGTERM)                       # a task; TF's preemption notifier swallowed it
        codes = c.wait(timeout=20, stop_on_failure=False)     # (they trained on to the end) until make_strategy
        assert codes == {t: -signal.SIGTERM for t in c.procs}, codes  # put the default back
        chief_log = c.log("chief:0")
    resumed = _latest_step(ckpt)
    # the chief checkpoints at once on the SIGTERM (train.stop_notice), mid-epoch, not at a multiple of 7; when its
    # peer's SIGTERM broke its step first, the step it had completed ("already saved" when it was a periodic one)
    assert 7 <= resumed < 200, resumed
    assert re.search(rf"SIGTERM \(a preemption or a stop\) at global step {resumed}\b", chief_log), chief_log[-2000:]
    epoch, in_epoch = position(resumed, [5] * 40)
    with LocalCluster(spec, tmp_path / "run2") as c:
        c.start()
        codes = c.wait(timeout=240)
        logs = {t: c.log(t) for t in c.procs}
        assert codes == {t: 0 for t in c.procs}, "\n".join(f"--- {t}\n{log[-3000:]}" for t, log in logs.items())
        progress = {t: json.loads(c.kv.get(progress_key(t))) for t in spec.training_tasks}
    summary = json.loads((ckpt / "summary.json").read_text())
    assert summary["resumed_from"] == f"ckpt-{resumed}"
    assert summary["global_step"] == summary["total_steps"] == 200
    for t in spec.training_tasks:
        assert progress[t]["steps_this_attempt"] == 200 - resumed, (t, progress[t])
        assert progress[t]["worker_steps"] == 200, (t, progress[t])          # over both runs, as in ps mode
        assert f"starting at global step {resumed} (epoch {epoch}, step {in_epoch})" in logs[t]
    assert summary["steps_per_worker"] == {t: 200 for t in spec.training_tasks}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigstopped_worker_fails_the_job_within_stall_timeout_with_stacks(tmp_path):
    """A frozen worker: TF's coordination-service heartbeat (5-10 s) notices first in allreduce mode; the chief's
    step fails, tfyarn translates TF's '/job:worker/replica:0/task:0' into 'worker:0' and dumps its stacks. The stall
    watchdog runs as the launcher runs it, as the backstop (its own SIGSTOP test is in test_watchdog.py)."""
    from tfyarn.tasklib.context import failure_key
    from tfyarn.tasklib.watchdog import StallWatchdog
    stall_s, margin = 20.0, 10.0
    spec = make_spec(tmp_path, epochs=400, timeouts={"stall": stall_s, "step": 120})
    with LocalCluster(spec, tmp_path / "run") as c:
        c.start()
        _wait_for(lambda: all((json.loads(c.kv.get(progress_key(t)) or "{}").get("step") or 0) >= 3
                              for t in spec.training_tasks), timeout=180, what="both workers past step 3")
        pids = {t: p.pid for t, p in c.procs.items()}
        wd = StallWatchdog(c.kv, {t: pids[t] for t in spec.training_tasks}, spec.timeouts.stall,
                           on_stall=lambda r: c.kill(), all_tasks=pids)
        stop = threading.Event()
        poller = threading.Thread(target=lambda: [wd.poll() for _ in iter(lambda: stop.wait(0.5), True)],
                                  daemon=True)         # the supervisor's loop polls it as often in the launcher
        poller.start()
        frozen_at = time.monotonic()
        c.signal("worker:0", signal.SIGSTOP)
        codes = c.wait(timeout=stall_s + margin + 30)          # like the launcher: one failure stops the others
        failed_after = time.monotonic() - frozen_at
        stop.set()
        poller.join(timeout=10)
        failure = c.kv.get(failure_key("chief:0")) or (wd.report.message if wd.report else "")
        chief_log = c.log("chief:0")
    assert failed_after <= stall_s + margin, failed_after
    assert all(code != 0 for code in codes.values()), codes    # the job failed, nothing kept running
    assert "worker:0" in failure, failure
    assert "tfyarn stack dump" in chief_log                    # the blocked chief's Python stacks are in its log
    assert "allreduce.py" in chief_log.split("tfyarn stack dump", 1)[1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_strategy_start_up_without_a_peer_is_bounded_although_it_holds_the_gil(tmp_path):
    """Only the chief of a 2-task job starts: MultiWorkerMirroredStrategy waits for the worker holding the GIL, so no
    Python timer can fire; faulthandler's C thread ends the task GIL_FREE_BACKSTOP_S past timeouts.rendezvous."""
    from tfyarn.train.strategy import GIL_FREE_BACKSTOP_S
    rendezvous_s = 5.0
    spec = make_spec(tmp_path, timeouts={"rendezvous": rendezvous_s})
    with LocalCluster(spec, tmp_path / "run") as c:
        c.start(["chief:0"])
        t0 = time.monotonic()
        codes = c.wait(timeout=rendezvous_s + GIL_FREE_BACKSTOP_S + 45, tasks=["chief:0"])
        took = time.monotonic() - t0
        log = c.log("chief:0")
    assert codes["chief:0"] not in (0, None), codes
    assert took <= rendezvous_s + GIL_FREE_BACKSTOP_S + 25, took         # + TF import and start-up on 2 cores
    assert "waiting up to 5s for MultiWorkerMirroredStrategy start-up" in log
    assert "Timeout (0:00:15)!" in log and "make_strategy" in log, log[-3000:]   # where it was stuck, from C


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_custom_loop_gets_the_strategy_allreduce_mode_uses(tmp_path):
    """``helpers.strategy()`` in a ``@custom_train`` function: a working all-reduce over both training tasks, and
    SIGTERM no longer caught by TF's handler (with a bare MultiWorkerMirroredStrategy() it is)."""
    jobs = Path(__file__).resolve().parents[2] / "helpers" / "jobs"
    spec = make_spec(tmp_path, epochs=1, model="custom_jobs:allreduce_sum", code=str(jobs))
    with LocalCluster(spec, tmp_path / "run", target="tfyarn.train:run_task") as c:
        c.start()
        codes = c.wait(timeout=150)
        assert codes == {t: 0 for t in c.procs}, "\n".join(f"--- {t}\n{c.log(t)[-3000:]}" for t in c.procs)
        summary = json.loads(c.kv.get("summary"))
    assert summary["custom"] is True and summary["replicas"] == 2
    assert summary["sum"] == 3.0                      # chief (rank 0) contributes 1, worker:0 (rank 1) 2
    assert summary["sigterm_caught"] is False
