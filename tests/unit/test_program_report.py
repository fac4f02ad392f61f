"""A user's program (``entrypoint:``) that reports nothing still gets a true run report (issue 39, item 1): what
it took from ``train_dataset()`` is counted and labelled; what nobody reported is None ("not reported"), never 0;
``global batch`` only where a batch size exists. The summary, the status's progress, the history and the report's
per-task figures, each on records as the tasks publish them (the end-to-end job: tests/unit/train/test_entrypoint.py's
MWMS tutorial test; on YARN: tests/cluster/yarn/test_cluster_keras.py)."""
import json
import time
from types import SimpleNamespace

from tfyarn.contracts.status import AppState, AppStatus, TaskStatus
from tfyarn.display import progress_line, progress_text, summary_text
from tfyarn.contracts.progress import aggregate_progress
from tfyarn.report import ProgressHistory, build_report
from tfyarn.task.entrypoint import _Taken, program_summary
from tfyarn.tasklib.kv import MemoryKV
from tfyarn.tasklib.watchdog import _progress
from tfyarn.spec import load_spec_dict
from tfyarn.train.progress import ProgressReporter, loop_summary

TASKS = ["chief:0", "worker:0", "worker:1"]


def _ctx(data: bool, mode: str = "ps"):
    doc = {"name": "pss", "entrypoint": "pss.py", "mode": mode, "code": "/tmp",
           "roles": {"chief": {"instances": 1}, "worker": {"instances": 2}}}
    if mode == "ps":
        doc["roles"]["ps"] = {"instances": 1}
    if data:
        doc["data"] = {"train": ["/d/x.tfrecord"], "features": {"label": {"dtype": "float32"}}, "batch_size": 64,
                       "epochs": 3}
    spec = load_spec_dict(doc)
    return SimpleNamespace(spec=spec, task_id="chief:0", app_id="app_1", attempt=0, num_data_workers=3,
                           training_tasks=TASKS)


def _silent_final() -> dict:
    """A silent chief's ProgressReporter.final() (what loop_summary gets)."""
    return {"steps": 0, "examples": 0, "examples_per_sec": 0.0, "first_loss": None, "last_loss": None,
            "metrics": {}, "elapsed_s": 12.5}


def _status(summary, progress=None, state=AppState.SUCCEEDED):
    return AppStatus(app_id="app_1", name="pss", state=state, backend="yarn", started=1.0, finished=50.0,
                     summary=summary, progress=progress or {},
                     tasks=[TaskStatus(task=t, state="SUCCEEDED" if state.is_terminal else "RUNNING") for t in TASKS])


def test_a_silent_program_without_data_has_no_step_batch_epochs_rate_or_loss_only_not_reported():
    """The PSS tutorial as issue 39 ran it (5 epochs x 20 steps, no data:): it ended "global step 0 · 1 epochs ·
    global batch 3 · examples/s: 0"."""
    ctx = _ctx(data=False)
    per_task = {"chief:0": {"reported": False, "program_s": 40.2, "done": True},
                "worker:0": {"reported": False, "beat": 7}, "worker:1": {"reported": False, "beat": 9}}
    s = program_summary(loop_summary(ctx, 0, _silent_final(), time.monotonic(), entrypoint="pss.py"), ctx, per_task,
                        chief_reported=False, planned=None)
    assert s["global_step"] is None and s["examples_per_sec"] is None and s["train_s"] is None, s
    assert s["epochs"] is None and s["batch_size"] is None and s["global_batch_size"] is None, s
    assert s["reported"] is False and s["taken"] == {} and s["steps_per_worker"] is None, s
    assert s["program_s"] == {"chief:0": 40.2}, s
    text = summary_text(_status(s))
    assert "global step not reported" in text and "examples/s: not reported" in text, text
    assert "loss: not reported" in text and "program ran: chief:0=40.2s" in text, text
    for wrong in ("global step 0", "examples/s: 0", "global batch", "epochs", "batches taken"):
        assert wrong not in text, (wrong, text)


def test_a_silent_program_over_train_dataset_shows_the_batches_each_task_took_and_their_rate_labelled():
    ctx = _ctx(data=True, mode="allreduce")
    taken = {"batches": 78, "examples": 4992, "epochs": 3, "seconds": 20.0, "examples_per_sec": 249.6}
    per_task = {t: {"reported": False, "taken": dict(taken), "program_s": 21.0, "done": True} for t in TASKS}
    s = program_summary(loop_summary(ctx, 0, _silent_final(), time.monotonic(), entrypoint="mwms.py"), ctx,
                        per_task, chief_reported=False, planned=78)
    assert s["global_step"] is None and s["first_loss"] is None and s["last_loss"] is None, s
    assert s["examples_per_sec"] == round(3 * 249.6, 1) and s["examples_from"] == "train_dataset()", s
    assert s["epochs"] == 3 and s["global_batch_size"] == 192 and s["planned_batches"] == 78, s
    assert {t: v["batches"] for t, v in s["taken"].items()} == dict.fromkeys(TASKS, 78), s
    text = summary_text(_status(s))
    assert ("batches taken from train_dataset(): chief:0=78 worker:0=78 worker:1=78 (of 78 planned, 3 epochs, "
            "4,992 examples each)") in text, text
    assert "examples/s (taken from train_dataset()): 749" in text and "global batch 192" in text, text
    assert "global step not reported" in text and "loss: not reported" in text, text


def test_a_program_reporting_through_the_callback_keeps_its_steps_loss_and_metrics():
    ctx = _ctx(data=True, mode="allreduce")
    mine = {"steps": 78, "examples": 0, "examples_per_sec": 0.0, "first_loss": 2.3, "last_loss": 0.4,
            "metrics": {"accuracy": 0.9}, "elapsed_s": 20.0}
    taken = {"batches": 78, "examples": 4992, "epochs": 3, "seconds": 20.0, "examples_per_sec": 249.6}
    per_task = {t: {"step": 78, "global_step": 78, "taken": dict(taken), "program_s": 21.0} for t in TASKS}
    summary = loop_summary(ctx, 78, mine, time.monotonic(), entrypoint="mwms.py", metrics=mine["metrics"])
    s = program_summary(summary, ctx, per_task, chief_reported=True, planned=78)
    assert s["global_step"] == 78 and s["last_loss"] == 0.4 and s["metrics"] == {"accuracy": 0.9}, s
    assert s["steps_per_worker"] == dict.fromkeys(TASKS, 78) and s["reported"] is True, s
    assert s["examples_from"] == "train_dataset()" and s["examples_per_sec"] == 748.8, s  # no examples reported
    text = summary_text(_status(s))
    assert "global step 78 · 3 epochs" in text and "loss: first 2.3000 -> last 0.4000" in text, text


def test_status_while_a_silent_program_runs_shows_batches_taken_and_no_step():
    """Issue 39: the status line showed "step 1 … step 19 … step 3" (the log heartbeat's beats) for a program
    that reports nothing."""
    items = {
        "progress/chief:0": json.dumps({"reported": False, "beat": 19, "taken": {"batches": 26,
                                        "examples_per_sec": 100.0}, "time": 1.0}),
        "progress/worker:0": json.dumps({"reported": False, "beat": 3, "taken": {"batches": 25,
                                         "examples_per_sec": 90.0}, "time": 1.0}),
        "progress/worker:1": json.dumps({"step": 4, "heartbeat": "log", "time": 1.0}),  # an older task's beat
    }
    p = aggregate_progress(items, None, TASKS)
    assert p["global_step"] is None and p["epoch"] is None, p
    assert p["per_task"] == dict.fromkeys(TASKS), p
    assert p["taken"] == {"chief:0": 26, "worker:0": 25}, p
    assert p["examples_per_sec"] == 190.0 and p["examples_from"] == "train_dataset()", p
    st = _status(None, p, state=AppState.RUNNING)
    line = progress_text(st)
    assert "batches taken from train_dataset() chief:0=26 worker:0=25" in line and "190 ex/s taken" in line, line
    assert "step " not in line.replace("batches taken", ""), line
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(progress_line(st))
    assert "batches taken chief:0=26" in console.export_text(), console.export_text()
    # nothing reported, nothing taken: no figure at all (not 0)
    quiet = aggregate_progress({"progress/chief:0": json.dumps({"reported": False, "beat": 2})}, None, TASKS)
    assert quiet["global_step"] is None and quiet["examples_per_sec"] is None and "taken" not in quiet, quiet


def test_the_reporter_of_a_program_publishes_no_step_until_one_is_reported_and_no_rate_without_examples():
    kv = MemoryKV()
    r = ProgressReporter(kv, "worker:0", program=True)
    taken = _Taken()
    r.extra["taken"] = taken.record
    taken.add(0, 64)
    r.publish()
    rec = json.loads(kv.get("progress/worker:0"))
    assert rec["reported"] is False and "step" not in rec and "examples_per_sec" not in rec, rec
    assert rec["taken"]["batches"] == 1 and rec["taken"]["examples"] == 64 and rec["taken"]["epochs"] == 1, rec
    r.report(step=1, epoch=0, loss=0.5, force=True)  # fit's callback: steps and loss, no examples
    rec = json.loads(kv.get("progress/worker:0"))
    assert rec["step"] == 1 and rec["loss"] == 0.5 and rec["examples_per_sec"] is None, rec
    assert "reported" not in rec and rec["taken"]["batches"] == 1, rec
    # tfyarn's own loops are unchanged: a rate of 0 is a measured 0 there
    own = ProgressReporter(kv, "chief:0")
    own.report(step=1, epoch=0, force=True)
    assert json.loads(kv.get("progress/chief:0"))["examples_per_sec"] == 0.0


def test_the_watchdog_takes_a_silent_programs_beat_as_its_progress():
    assert _progress(json.dumps({"reported": False, "beat": 5})) == (5, False)
    assert _progress(json.dumps({"step": 7, "beat": 5, "done": True})) == (7, True)
    assert _progress(json.dumps({"reported": False})) == (None, False)


def test_history_and_the_report_keep_batches_taken_and_no_step_for_a_silent_program():
    h = ProgressHistory()
    for i, t in enumerate((10.0, 11.0)):
        h.record({"progress/worker:0": json.dumps({"reported": False, "beat": i, "time": t,
                                                   "taken": {"batches": 10 * (i + 1)}}),
                  "progress/chief:0": json.dumps({"step": i + 1, "loss": 0.5, "time": t})})
    silent = [p for p in h.points if p["task"] == "worker:0"]
    assert [p.get("batches_taken") for p in silent] == [10, 20] and all("step" not in p for p in silent), silent
    rep = build_report({"app_id": "a", "state": "SUCCEEDED"}, h.points)
    assert rep["tasks"]["worker:0"]["last_step"] is None and rep["tasks"]["worker:0"]["batches_taken"] == 20, rep
    assert rep["tasks"]["chief:0"]["last_step"] == 2 and "batches_taken" not in rep["tasks"]["chief:0"], rep
    from tfyarn.display import report_text

    text = report_text(rep, None)
    assert "worker:0     step not reported · 20 batches taken from train_dataset()" in text, text


def test_the_keras_callback_reports_steps_epoch_loss_and_metrics(monkeypatch):
    import tfyarn
    from tfyarn.keras import _scalars, callback

    seen = []
    monkeypatch.setattr(tfyarn, "progress", lambda **kw: seen.append(kw))
    cb = callback()
    import tensorflow as tf

    assert isinstance(cb, tf.keras.callbacks.Callback)
    cb.on_epoch_begin(0)
    cb.on_train_batch_end(0, {"loss": 0.7, "accuracy": 0.5})
    cb.on_epoch_begin(1)
    cb.on_train_batch_end(0, {"loss": 0.6})
    assert seen == [{"step": 1, "loss": 0.7, "epoch": 0, "metrics": {"accuracy": 0.5}},
                    {"step": 2, "loss": 0.6, "epoch": 1, "metrics": None}], seen
    assert _scalars({"loss": float("nan"), "auc": float("inf"), "name": "x", "acc": 1}) == {"loss": _nan(), "acc": 1.0}


class _nan(float):
    """Equal to any NaN (a dict of NaN losses compares by identity otherwise)."""

    def __new__(cls):
        return super().__new__(cls, "nan")

    def __eq__(self, other):
        return other != other

    __hash__ = float.__hash__
