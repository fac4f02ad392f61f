"""ps-mode building blocks without TF processes: placement, epoch positions, checkpoints, progress, ps shutdown."""
from __future__ import annotations

import json
import time

import pytest

from tfyarn.tasklib.context import ABORT_KEY, DONE_KEY, SUMMARY_KEY, progress_key
from tfyarn.tasklib.kv import KVUnavailable, MemoryKV
from tfyarn.train import helpers
from tfyarn.train.checkpoint import INDEX, CheckpointStore
from tfyarn.train.ps.placement import plan_placement
from tfyarn.train.ps.server import wait_for_end
from tfyarn.train.progress import ProgressReporter


# --------------------------------------------------------------------------------------------------------- placement
def test_placement_balances_bytes_largest_first():
    # round-robin in creation order would put both big tables on ps 0 (a:0, b:1, c:0, d:1 -> 1000+900 vs 10+10)
    sizes = {"a": 1000, "b": 10, "c": 900, "d": 10}
    out = plan_placement(sizes, 2)
    loads = [sum(s for n, s in sizes.items() if out[n] == i) for i in range(2)]
    assert out["a"] != out["c"]
    assert max(loads) == 1000


def test_placement_one_ps_and_many():
    assert set(plan_placement({"x": 5, "y": 7}, 1).values()) == {0}
    sizes = {f"v{i}": 100 for i in range(6)}
    out = plan_placement(sizes, 3)
    assert sorted(list(out.values()).count(i) for i in range(3)) == [2, 2, 2]


# ------------------------------------------------------------------------------------------------------ resume position
@pytest.mark.parametrize("done,expected", [(0, (0, 0)), (3, (0, 3)), (4, (1, 0)), (6, (1, 2)), (9, (2, 0)),
                                           (12, (3, 0))])
def test_position_in_epoch_plan(done, expected):
    assert helpers.position(done, [4, 5, 3]) == expected


# ------------------------------------------------------------------------------------------------------- checkpoints
def _fake_ckpt(d, name, payload=b"x"):
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.index").write_bytes(payload)
    (d / f"{name}.data-00000-of-00001").write_bytes(payload * 10)
    return str(d / name)


def test_checkpoint_upload_commit_keep_and_download(tmp_path):
    store = CheckpointStore(f"file://{tmp_path}/ckpts", keep=2)
    assert store.latest() is None
    for step in (10, 20, 30):
        store.upload(_fake_ckpt(tmp_path / "local", f"ckpt-{step}", str(step).encode()), step, {"epoch": step // 10})
    latest = store.latest()
    assert latest["name"] == "ckpt-30" and latest["global_step"] == 30 and latest["epoch"] == 3
    names = sorted(p.name for p in (tmp_path / "ckpts").iterdir())
    # keep=2: ckpt-10 pruned; no temporary files left behind
    assert names == sorted([INDEX, "ckpt-20.index", "ckpt-20.data-00000-of-00001", "ckpt-30.index",
                            "ckpt-30.data-00000-of-00001"])
    prefix = store.download(latest, tmp_path / "restore")
    assert (tmp_path / "restore" / "ckpt-30.index").read_bytes() == b"30"
    assert prefix.endswith("ckpt-30")


def test_checkpoint_index_names_only_complete_uploads(tmp_path, monkeypatch):
    """A crash between file uploads must leave the previous checkpoint as the latest (temp names, then index)."""
    store = CheckpointStore(str(tmp_path / "ck"), keep=3)
    store.upload(_fake_ckpt(tmp_path / "l", "ckpt-1"), 1)
    calls = {"n": 0}
    real_put = store.fs.put_file

    def failing_put(src, dst, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("connection reset (simulated)")
        return real_put(src, dst, **kw)

    monkeypatch.setattr(store.fs, "put_file", failing_put)
    with pytest.raises(OSError):
        store.upload(_fake_ckpt(tmp_path / "l", "ckpt-2"), 2)
    assert store.latest()["name"] == "ckpt-1"
    assert not (tmp_path / "ck" / "ckpt-2.index").exists()


def test_checkpoint_missing_files_is_an_error(tmp_path):
    store = CheckpointStore(str(tmp_path / "ck"))
    entry = store.upload(_fake_ckpt(tmp_path / "l", "ckpt-5"), 5)
    for p in (tmp_path / "ck").glob("ckpt-5.*"):
        p.unlink()
    with pytest.raises(FileNotFoundError, match="ckpt-5"):
        store.download(entry, tmp_path / "r")


# ---------------------------------------------------------------------------------------------------------- progress
def test_progress_is_rate_limited_and_final_is_published():
    kv = MemoryKV()
    puts = []
    orig = kv.put
    kv.put = lambda k, v: (puts.append(k), orig(k, v))
    p = ProgressReporter(kv, "worker:0", interval=0.2)
    p.begin()
    t_end = time.monotonic() + 0.5
    step = 0
    while time.monotonic() < t_end:
        step += 1
        p.report(step=step, epoch=0, loss=1.0 / step, examples=10, global_step=2 * step)
        time.sleep(0.001)
    assert step > 50
    assert 1 <= len(puts) <= 4          # ~0.5 s / 0.2 s, not one per step
    figures = p.final()
    last = json.loads(kv.get(progress_key("worker:0")))
    assert last["step"] == step and last["global_step"] == 2 * step and last["done"] is True
    assert figures["steps"] == step and figures["first_loss"] == 1.0 and figures["examples"] == 10 * step
    assert set(last) >= {"step", "global_step", "epoch", "examples_per_sec", "loss", "time"}


def test_progress_survives_unreachable_kv():
    class DeadKV(MemoryKV):
        def put(self, key, value):
            raise KVUnavailable("gone")
    p = ProgressReporter(DeadKV(), "worker:1", interval=0.0)
    p.report(step=1, epoch=0, loss=0.5, examples=1)
    assert p.final()["steps"] == 1


# -------------------------------------------------------------------------------------------------------- ps shutdown
def test_ps_returns_on_done_and_on_abort():
    kv = MemoryKV()
    kv.put(DONE_KEY, "1")
    assert wait_for_end(kv, "ps:0", poll=0.01) == "done"
    kv2 = MemoryKV()
    kv2.put(ABORT_KEY, "worker:1 failed")
    assert wait_for_end(kv2, "ps:0", poll=0.01) == "abort"


def test_ps_exits_with_error_when_kv_is_gone():
    class GoneKV(MemoryKV):
        def get(self, key):
            raise KVUnavailable("KV service at http://127.0.0.1:1 unreachable")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="KV unreachable for 0.3s while waiting for control/done"):
        wait_for_end(GoneKV(), "ps:0", poll=0.05, kv_grace=0.3)
    assert time.monotonic() - t0 < 5


def test_summary_goes_next_to_checkpoints_and_to_kv(tmp_path):
    from tfyarn.spec import load_spec_dict
    from tfyarn.tasklib.context import TaskContext
    from tfyarn.train.progress import write_summary
    spec = load_spec_dict({"name": "s", "model": "tfyarn.models.logreg:model",
                           "data": {"train": ["x"], "features": {"label": {"dtype": "float32"}}, "batch_size": 1},
                           "checkpoint": {"dir": str(tmp_path / "ck")},
                           "roles": {"ps": {"instances": 1}, "worker": {"instances": 1}}})
    kv = MemoryKV()
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=kv, workdir=tmp_path / "wd")
    url = write_summary(ctx, {"global_step": 7})
    assert url == str(tmp_path / "ck" / "summary.json")
    assert json.loads((tmp_path / "ck" / "summary.json").read_text()) == {"global_step": 7}
    assert json.loads(kv.get(SUMMARY_KEY)) == {"global_step": 7}


def test_a_worker_steps_only_once_the_chief_has_aligned_the_step_counters(tmp_path):
    """The async resume alignment (global step := sum of the worker counters) must not interleave with a worker's
    step (that step would be lost from the count): workers wait for control/steps_aligned (or done), bounded."""
    import threading

    from tfyarn.errors import WaitTimeout
    from tfyarn.tasklib.context import STEPS_ALIGNED_KEY, TaskContext
    from tfyarn.spec import load_spec_dict
    from tfyarn.train.ps.loop import _wait_for_aligned_steps
    spec = load_spec_dict({"name": "s", "model": "tfyarn.models.logreg:model", "timeouts": {"rendezvous": 0.5},
                           "data": {"train": ["x"], "features": {"label": {"dtype": "float32"}}, "batch_size": 1},
                           "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 1}}})
    kv = MemoryKV()
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=kv, workdir=tmp_path)
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"worker:0: timed out after 0.5s waiting for the chief to start its "
                                          r"training loop \(control/steps_aligned\)"):
        _wait_for_aligned_steps(ctx)
    assert 0.5 <= time.monotonic() - t0 < 3
    threading.Timer(0.2, kv.put, (STEPS_ALIGNED_KEY, "1")).start()
    t0 = time.monotonic()
    _wait_for_aligned_steps(ctx)
    assert 0.15 <= time.monotonic() - t0 < 0.45
    done = MemoryKV()
    done.put(DONE_KEY, "1")                       # a finished job: nothing to wait for
    _wait_for_aligned_steps(TaskContext(spec=spec, role="worker", index=0, kv=done, workdir=tmp_path))
    aborted = MemoryKV()
    aborted.put(ABORT_KEY, "chief:0 exited with code 1")
    with pytest.raises(RuntimeError, match="job aborted while waiting for the chief to start: chief:0 exited"):
        _wait_for_aligned_steps(TaskContext(spec=spec, role="worker", index=0, kv=aborted, workdir=tmp_path))


def test_a_non_finite_loss_stops_the_reporting_task_unless_told_otherwise():
    from tfyarn.train.progress import NonFiniteLoss
    kv = MemoryKV()
    p = ProgressReporter(kv, "worker:1")
    p.report(step=1, epoch=0, loss=0.7, global_step=3)
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(NonFiniteLoss) as e:
            p.report(step=2, epoch=0, loss=bad, global_step=5)
        assert str(e.value).startswith(f"worker:1: loss is {bad} at step 2 (global step 5, epoch 0; last finite loss "
                                       f"0.7000): training diverged")
    assert p.last_loss == 0.7 and json.loads(kv.get(progress_key("worker:1")))["step"] == 2   # position published
    lenient = ProgressReporter(MemoryKV(), "worker:1", fail_on_nan_loss=False)
    lenient.report(step=1, epoch=0, loss=float("nan"))
    assert lenient.last_loss != lenient.last_loss                                             # NaN kept


def test_background_upload_commits_then_reports_a_failure_once(tmp_path, caplog):
    """One upload in flight; ``committed`` names it once the index does; a failure is raised by the next check."""
    import threading

    from tfyarn.train.checkpoint import BackgroundUpload
    local = tmp_path / "local"
    local.mkdir()
    for name in ("ckpt-5.index", "ckpt-5.data-00000-of-00001"):
        (local / name).write_bytes(b"x")
    store = CheckpointStore(str(tmp_path / "store"))
    gate = threading.Event()
    real_upload = store.upload

    def gated(*a, **kw):
        gate.wait(10)
        return real_upload(*a, **kw)
    store.upload = gated
    bg = BackgroundUpload(store)
    assert bg.commit(str(local / "ckpt-5"), 5, {"epoch": 0}, final=False) is None
    assert bg.busy() and not bg.ready() and store.latest() is None and bg.committed is None   # training goes on
    with pytest.raises(RuntimeError, match="already in flight"):
        bg.commit(str(local / "ckpt-5"), 5, {}, final=False)
    caplog.set_level("INFO", logger="tfyarn.train.checkpoint")
    threading.Timer(0.3, gate.set).start()
    bg.wait(log_every_s=0.05)                          # the final checkpoint's wait says what it waits for
    assert "still waiting for the upload of tfyarn-checkpoint-upload-5" in caplog.text
    assert not bg.busy() and store.latest()["name"] == "ckpt-5"
    assert (bg.committed[0]["name"], bg.committed[1]) == ("ckpt-5", str(local / "ckpt-5"))

    def broken(*a, **kw):
        raise OSError("store unreachable")
    store.upload = broken
    bg.commit(str(local / "ckpt-5"), 6, {}, final=False)
    bg._thread.join(10)
    with pytest.raises(OSError, match="store unreachable"):
        bg.ready()                                       # the step loop's next check fails the task
    bg.check()                                           # said once
    assert bg.committed[0]["global_step"] == 5           # the failed upload committed nothing
