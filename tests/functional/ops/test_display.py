"""The live view (rich, to a string console) and the plain line view (timestamps, bounded rate) — and both on a real
run through the local backend."""
import io
import json
import re

import pytest
from rich.console import Console

from opsutil import job_spec
from tfyarn import api
from tfyarn.backends.base import AppState, AppStatus, TaskStatus
from tfyarn.display import LineView, LiveView, progress_text, progress_view, render_status, summary_text
from tfyarn.spec import load_spec_dict

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} ")


def _status(state=AppState.RUNNING, step=120, worker1="RUNNING", restarts=0):
    tasks = [TaskStatus("ps:0", "RUNNING", "10.0.0.5"), TaskStatus("chief:0", "RUNNING", "10.0.0.6"),
             TaskStatus("worker:0", "RUNNING", "10.0.0.7"),
             TaskStatus("worker:1", worker1, "10.0.0.8", restarts=restarts,
                        exit_code=1 if worker1 == "FAILED" else None)]
    progress = {"global_step": step, "total_steps": 300, "examples_per_sec": 51234.0, "loss": 0.41, "epoch": 1,
                "eta_s": 12.3, "per_task": {"chief:0": 40, "worker:0": 41, "worker:1": 39}}
    return AppStatus("local-x", "local", "ctr", state, tasks=tasks, progress=progress)


def _text(renderable) -> str:
    console = Console(file=io.StringIO(), width=140, force_terminal=False, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def test_live_rendering_shows_tasks_and_progress():
    out = _text(render_status(_status(restarts=2)))
    lines = out.splitlines()
    assert lines[0].strip() == "ctr (local-x)"
    header = lines[1].split()
    assert header == ["role", "#", "state", "host", "restarts", "step", "exit"]
    rows = {tuple(ln.split()[:2]): ln.split() for ln in lines[2:6]}
    assert rows[("worker", "1")][2:6] == ["RUNNING", "10.0.0.8", "2", "39"]
    assert rows[("ps", "0")][2:6] == ["RUNNING", "10.0.0.5", "0", "-"]
    bar_line = lines[6]
    for part in ("RUNNING", "step 120/300 (40%)", "51,234 ex/s", "ETA 0m12s", "loss 0.4100", "epoch 1"):
        assert part in bar_line, (part, bar_line)


def test_live_view_writes_frames_to_a_terminal_and_keeps_the_last():
    buf = io.StringIO()
    view = LiveView(console=Console(file=buf, width=140, force_terminal=True, color_system=None))
    view(_status(step=10))
    view.echo("worker:1", "hello from a task")
    view(_status(AppState.FAILED, step=150, worker1="FAILED"))
    view.close()
    out = buf.getvalue()
    assert "hello from a task" in out
    assert "step 150/300 (50%)" in out and "FAILED" in out
    # the task line was printed above the live table, not inside a frame
    assert out.index("hello from a task") < out.rindex("step 150/300")


def test_line_view_timestamps_and_bounded_rate():
    buf, now = io.StringIO(), [0.0]
    view = LineView(buf, every=10.0, clock=lambda: now[0])
    for i in range(200):  # 100 s of 0.5 s polls, progress moving every poll
        now[0] = i * 0.5
        view(_status(step=i))
    lines = buf.getvalue().splitlines()
    assert all(STAMP.match(ln) for ln in lines), lines[:3]
    assert 10 <= len(lines) <= 11, len(lines)   # one line per 10 s, not 200
    assert "running · tasks 4/4 running · step 0/300" in lines[0]


def test_line_view_reports_state_changes_at_once():
    buf, now = io.StringIO(), [0.0]
    view = LineView(buf, every=60.0, clock=lambda: now[0])
    view(_status(step=1))
    now[0] = 1.0
    view(_status(step=2))                    # same states, too soon: no line
    now[0] = 2.0
    view(_status(AppState.FAILED, step=3, worker1="FAILED"))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[1].endswith("[worker:1 FAILED]") and " failed · " in lines[1]


def test_progress_view_chooses_by_tty():
    assert isinstance(progress_view(out=io.StringIO()), LineView)
    assert isinstance(progress_view(out=io.StringIO(), live=True), LiveView)


@pytest.mark.timeout(120)
def test_plain_lines_on_a_real_run(tmp_path):
    buf = io.StringIO()
    view = progress_view(out=buf, every=1.0)
    spec = load_spec_dict(job_spec(tmp_path, params={"steps": 60, "dt": 0.05}))
    st = api.run(spec, backend="local", echo=view.echo, on_update=view)
    view.close()
    assert st.state is AppState.SUCCEEDED
    lines = buf.getvalue().splitlines()
    progress = [ln for ln in lines if STAMP.match(ln)]
    task_lines = [ln for ln in lines if re.match(r"^\s+(chief|worker):0 \| ", ln)]
    assert task_lines, "task output was not echoed"
    assert any("step " in ln and "/60" in ln and "loss" in ln for ln in progress), progress
    assert progress[-1].split(" ", 2)[2].startswith("succeeded · tasks 0/2 running · step 60/60")
    # bounded: a ~4 s run at one line per second plus state changes
    assert len(progress) <= 16, progress


def test_an_ended_app_shows_no_eta():
    """A killed job's last progress poll had an ETA; the final line and the status JSON must not carry it on."""
    for state in (AppState.KILLED, AppState.FAILED, AppState.SUCCEEDED, AppState.TIMED_OUT):
        st = _status(state=state)
        assert "eta_s" not in st.to_dict()["progress"] and "ETA" not in progress_text(st), state
    assert "ETA 0m12s" in progress_text(_status())


def test_summary_text_states_totals_when_known_and_never_prints_none():
    ps = {"mode": "ps", "sync": True, "epochs": 3, "global_step": 279, "total_steps": 279, "global_batch_size": 768,
          "steps_per_worker": {"chief:0": 93, "worker:0": 93}, "examples_per_sec": 34322.0, "first_loss": 0.69,
          "last_loss": 0.47, "checkpoint_dir": "hdfs:///ckpt",
          "export": {"url": "hdfs:///models/279", "version": 279, "checkpoint": "ckpt-279", "seconds": 1.2},
          "warm_started_from": "hdfs:///old/ckpt-500", "skipped_records": 3, "skipped_by_task": {"worker:0": 3}}
    text = summary_text(AppStatus("local-x", "local", "q", AppState.SUCCEEDED, summary=ps))
    assert "data: 3 corrupt records skipped (on_corrupt: skip): worker:0=3; each is named in its task's log" in text
    assert "model (SavedModel): hdfs:///models/279  (from ckpt-279)" in text
    assert "warm start: model variables from hdfs:///old/ckpt-500" in text
    assert "global step 279/279 · 3 epochs · mode ps sync · global batch 768" in text
    assert "steps per worker: chief:0=93 worker:0=93" in text and "checkpoints: hdfs:///ckpt" in text
    assert "loss: first 0.6900 -> last 0.4700 (down 31.9%)" in text
    custom = {"mode": "allreduce", "custom": True, "epochs": 2, "global_step": 12, "total_steps": None,
              "global_batch_size": 512, "steps_per_worker": None, "first_loss": None, "last_loss": None}
    text = summary_text(AppStatus("local-y", "local", "c", AppState.SUCCEEDED, summary=custom))
    assert "global step 12 · 2 epochs · mode allreduce (custom train) · global batch 512" in text
    assert "None" not in text


EVAL = {"checkpoint": "ckpt-120", "global_step": 120, "epoch": 3, "batches": 20, "examples": 1000, "time": 1.0,
        "eval_seconds": 0.42, "loss": 0.722108, "accuracy": 0.525}


def test_the_evaluators_newest_result_is_in_the_progress_line_and_the_final_summary(tmp_path):
    """The evaluator publishes each evaluation to the KV (eval/latest); status shows it live, and the final summary
    (which the chief wrote before the final evaluation) gets it joined by the launcher / the YARN backend."""
    from tfyarn.runner.local_app import Launcher
    from tfyarn.contracts.progress import side_roles
    kv = {"eval/latest": json.dumps(EVAL), "tensorboard/url": "http://node7:6006",
          "summary": json.dumps({"mode": "ps", "epochs": 3, "global_step": 120, "total_steps": 120})}
    assert side_roles(kv.get) == {"tensorboard_url": "http://node7:6006", "eval": EVAL}
    assert side_roles({}.get) == {}
    st = _status()
    st.progress.update(side_roles(kv.get))
    assert "loss 0.4100 · eval loss 0.7221 · accuracy 0.5250 @ step 120 · ETA" in progress_text(st)
    launcher = Launcher(load_spec_dict(job_spec(tmp_path)), tmp_path / "app", "local-e")
    launcher.supervisor.progress(kv)
    summary = launcher.status().summary
    assert summary["eval"] == EVAL and summary["global_step"] == 120
    text = summary_text(AppStatus("local-e", "local", "q", AppState.SUCCEEDED, summary=summary))
    assert "  eval: loss 0.7221 · accuracy 0.5250 (ckpt-120, global step 120, 1,000 examples)" in text
    assert "eval" not in summary_text(AppStatus("local-f", "local", "q", AppState.SUCCEEDED,
                                                summary={"mode": "ps", "epochs": 1, "global_step": 3}))


def test_a_resumed_run_says_so_and_a_rerun_of_a_finished_job_says_nothing_ran():
    done = {"mode": "ps", "epochs": 1, "global_step": 80, "total_steps": 80, "resumed_from": "ckpt-80",
            "first_loss": None, "last_loss": None, "examples_per_sec": 0.0}
    text = summary_text(AppStatus("local-r", "local", "q", AppState.SUCCEEDED, summary=done))
    assert "  resumed from ckpt-80 — training had already finished: no step ran" in text
    mid = done | {"resumed_from": "ckpt-40", "first_loss": 0.5, "last_loss": 0.3, "examples_per_sec": 900.0}
    text = summary_text(AppStatus("local-s", "local", "q", AppState.SUCCEEDED, summary=mid))
    assert "  resumed from ckpt-40\n" in text + "\n" and "no step ran" not in text


def test_app_status_round_trips_through_its_json_dict():
    st = AppStatus("local-z", "local", "q", AppState.FAILED, diagnostics="boom",
                   tasks=[TaskStatus(task="worker:0", state="FAILED", exit_code=1, peak_rss_mib=300)],
                   progress={"global_step": 4, "eta_s": 3.0}, started=1.0, finished=2.0, summary={"mode": "ps"},
                   attempt=1, tags=["t"])
    d = st.to_dict()
    assert d["schema"] == "tfyarn.status/1" and d["exit_code"] == 1
    back = AppStatus.from_dict(json.loads(json.dumps(d)))
    assert back == st and back.to_dict() == d
    assert AppStatus.from_dict({"app_id": "a", "state": "RUNNING"}, backend="yarn").backend == "yarn"


def test_text_status_shows_the_tensorboard_url_while_running():
    """Issue 19: `tfyarn status` (text) never showed the TensorBoard URL; only --output json did."""
    from tfyarn.display import status_text
    st = _status()
    st.progress["tensorboard_url"] = "http://node7:40123/"
    text = status_text(st)
    assert "  tensorboard: http://node7:40123/" in text.splitlines()
    assert text.splitlines()[0].startswith("local-x ctr: running") and "worker:1" in text.splitlines()[-1]
    assert "TensorBoard: http://node7:40123/" in _text(render_status(st))
    ended = _status(state=AppState.SUCCEEDED)
    ended.progress["tensorboard_url"] = "http://node7:40123/"     # served no more once training ended
    assert "tensorboard" not in status_text(ended)


def test_eta_from_the_tasks_own_global_step_rate_on_a_single_status_read():
    """Issue 19: JSON `eta_s` was null while running on YARN: each `tfyarn status` is a fresh process with one
    sample of the global step. The training tasks publish the global step's rate they measured; its median gives
    the ETA."""
    from tfyarn.contracts.progress import GlobalStepRate, aggregate_progress

    def rec(gs, r):
        return json.dumps({"step": gs, "global_step": gs, "examples_per_sec": 10.0, "loss": 0.5,
                           "global_steps_per_sec": r})

    items = {"progress/chief:0": rec(100, 4.0), "progress/worker:0": rec(100, 5.0), "progress/worker:1": rec(99, 50.0)}
    p = aggregate_progress(items, 300, ["chief:0", "worker:0", "worker:1"], GlobalStepRate())
    assert p["eta_s"] == pytest.approx(200 / 5.0)
    stale = {k: v for k, v in items.items() if k != "progress/worker:1"} | {"progress/ps:0": rec(0, 99.0)}
    assert aggregate_progress(stale, 300, ["chief:0", "worker:0"])["eta_s"] == pytest.approx(200 / 4.5, abs=0.05)


def test_a_task_publishes_the_global_step_rate_it_sees():
    import time
    from tfyarn.tasklib.kv import MemoryKV
    from tfyarn.train.progress import ProgressReporter
    kv = MemoryKV()
    rep = ProgressReporter(kv, "worker:0", interval=0.3)
    rep.begin()
    for i in range(1, 31):
        time.sleep(0.02)
        rep.report(step=i, epoch=0, loss=0.5, examples=8, global_step=3 * i)   # async: 3 global steps per own step
    published = json.loads(kv.get("progress/worker:0"))
    assert published["global_steps_per_sec"] == pytest.approx(3 * published["steps_per_sec"], rel=0.05)


def test_a_predict_job_shows_rows_scored_of_total_rows_per_second_and_its_totals():
    from tfyarn.contracts.progress import aggregate_progress
    recs = {"progress/worker:0": json.dumps({"step": 3, "rows": 3000, "rows_total": 5000, "examples_per_sec": 1500.0}),
            "progress/worker:1": json.dumps({"step": 5, "rows": 5000, "rows_total": 5000, "examples_per_sec": 500.0})}
    p = aggregate_progress(recs, None, ["worker:0", "worker:1"])
    assert (p["rows"], p["rows_total"], p["rows_per_sec"], p["eta_s"]) == (8000, 10000, 2000.0, 1.0)
    st = AppStatus("local-1", "local", "score", AppState.RUNNING, progress=p,
                   tasks=[TaskStatus("worker:0", "RUNNING"), TaskStatus("worker:1", "SUCCEEDED")])
    assert progress_text(st) == "running · tasks 1/2 running · rows 8,000/10,000 · 2,000 rows/s · ETA 0m01s"
    summary = {"job": "predict", "rows_in": 10000, "rows_out": 9998, "skipped": 2, "parts": 4, "bytes": 123456,
               "output": "hdfs:///scores/x", "format": "parquet", "model": "hdfs:///models/ctr/7", "workers": 2,
               "batch_size": 1024, "skipped_at": ["f.parquet: row 7: column 'user_id' is null"]}
    done = AppStatus("local-1", "local", "score", AppState.SUCCEEDED, summary=summary, started=100.0, finished=112.0)
    assert summary_text(done).splitlines() == [
        "job score SUCCEEDED in 12.0s (local-1)",
        "  rows: 10,000 in, 9,998 out, 2 skipped as corrupt (on_corrupt: skip)",
        "  output: hdfs:///scores/x (4 parquet parts, 123,456 bytes)",
        "  model: hdfs:///models/ctr/7 · 2 workers · batch 1024",
        "    f.parquet: row 7: column 'user_id' is null",
    ]
