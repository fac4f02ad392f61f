"""The run report: written at the end of a real run (app dir and checkpoint dir), readable, fetchable by the CLI."""
import json
import struct
import subprocess

import pytest

from opsutil import job_spec, tfyarn_cmd
from tfyarn import api
from tfyarn.backends.base import AppState
from tfyarn.report import ProgressHistory
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(180)


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def event_scalars(path, tag):
    """(step, value) of every ``tag`` scalar in a TF event file, read with TF's own reader."""
    import tensorflow as tf
    return [(e.step, float(tf.make_ndarray(v.tensor))) for e in tf.compat.v1.train.summary_iterator(str(path))
            for v in e.summary.value if v.tag == tag]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One real 2-task run with a checkpoint dir (module-scoped: several tests read its report)."""
    import os
    tmp = tmp_path_factory.mktemp("report")
    old = os.environ.get("TFYARN_HOME")
    os.environ["TFYARN_HOME"] = str(tmp / "home")
    try:
        spec = load_spec_dict(job_spec(tmp, params={"steps": 80, "dt": 0.05},
                                       checkpoint={"dir": str(tmp / "ckpt")}))
        st = api.run(spec, backend="local")
        yield st, tmp
    finally:
        if old is None:
            os.environ.pop("TFYARN_HOME", None)
        else:
            os.environ["TFYARN_HOME"] = old


def test_report_next_to_checkpoints_and_in_app_dir(finished_run):
    st, tmp = finished_run
    assert st.state is AppState.SUCCEEDED
    app_dir = tmp / "home" / "apps" / st.app_id
    for d in (app_dir, tmp / "ckpt"):
        assert (d / "report.json").exists() and (d / "report.png").exists() and (d / "progress.jsonl").exists(), d
        assert _png_size(d / "report.png") == (1000, 870)  # 700 + the memory panel: 100 + 35 per task (2)
    rep = json.loads((tmp / "ckpt" / "report.json").read_text())
    assert rep["schema"] == "tfyarn.report/1" and rep["state"] == "SUCCEEDED" and rep["plot"] == "report.png"
    assert set(rep["tasks"]) == {"chief:0", "worker:0"}
    for task, s in rep["tasks"].items():
        assert s["points"] >= 3, (task, s)           # ~4 s of training, published every second
        assert s["last_step"] == 80
        assert s["last_loss"] < s["first_loss"]
        assert 100 < s["mean_examples_per_sec"] < 5000  # 32 examples / 0.05 s ≈ 640, not a start-up spike
    assert rep["summary"]["global_step"] == 80
    assert rep["recorded_by_tasks"] == ["chief:0", "worker:0"]     # the tasks' own points, next to the checkpoints
    assert len(list((tmp / "ckpt" / "history" / st.app_id).glob("*.jsonl"))) == 2
    # the chief's training scalars for TensorBoard's "train" run (it showed only "eval" before)
    (events,) = (tmp / "ckpt" / "train").glob("events.out.tfevents.*")
    losses = event_scalars(events, "loss")
    assert len(losses) >= 3 and losses[-1][0] == 80 and losses[-1][1] < losses[0][1], losses
    history = ProgressHistory.load(app_dir / "progress.jsonl").points
    assert {p["task"] for p in history} == {"chief:0", "worker:0"}
    assert all(a["time"] <= b["time"] for a, b in zip(history, history[1:]) if a["task"] == b["task"])


def test_cli_report_prints_fetches_and_copies(finished_run, tmp_path):
    st, tmp = finished_run
    env_home = {"TFYARN_HOME": str(tmp / "home")}
    import os
    env = {**os.environ, **env_home}
    text = subprocess.run(tfyarn_cmd("report", st.app_id), capture_output=True, text=True, env=env, timeout=60)
    assert text.returncode == 0, text.stderr
    assert f"run report of ops-test ({st.app_id}): SUCCEEDED" in text.stdout
    assert f"plot: {tmp / 'home' / 'apps' / st.app_id / 'report.png'}" in text.stdout
    assert "chief:0" in text.stdout and "worker:0" in text.stdout and "step 80" in text.stdout

    fetched = subprocess.run(tfyarn_cmd("report", "--from", f"file://{tmp / 'ckpt'}", "--to", str(tmp_path / "got"),
                                        "--output", "json"), capture_output=True, text=True, env=env, timeout=60)
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads(fetched.stdout)["app_id"] == st.app_id
    assert _png_size(tmp_path / "got" / "report.png") == (1000, 870)

    missing = subprocess.run(tfyarn_cmd("report", "application_1_0001"), capture_output=True, text=True, env=env,
                             timeout=60)
    # a YARN app id on a machine that has neither its report nor a cluster: the missing configuration is named
    assert missing.returncode == 2 and "HADOOP_CONF_DIR" in missing.stderr, missing.stderr


def test_report_is_rebuilt_for_an_app_without_one(finished_run):
    st, tmp = finished_run
    app_dir = tmp / "home" / "apps" / st.app_id
    (app_dir / "report.json").unlink()
    (app_dir / "report.png").unlink()
    import os
    env = {**os.environ, "TFYARN_HOME": str(tmp / "home")}
    out = subprocess.run(tfyarn_cmd("report", st.app_id, "--output", "json"), capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["tasks"]["worker:0"]["last_step"] == 80 and (app_dir / "report.png").exists()


def test_history_deduplicates_unchanged_records(tmp_path):
    h = ProgressHistory(tmp_path / "p.jsonl")
    rec = {"progress/worker:0": json.dumps({"step": 1, "time": 10.0, "loss": 1.0})}
    assert h.record(rec) == 1 and h.record(rec) == 0
    assert h.record({"progress/worker:0": json.dumps({"step": 2, "time": 11.0, "loss": 0.5}),
                     "progress/bad": "not json"}) == 1
    assert [p["step"] for p in ProgressHistory.load(tmp_path / "p.jsonl").points] == [1, 2]


def test_a_run_that_failed_before_training_leaves_the_checkpoint_dirs_report_alone(tmp_path):
    """The report beside the checkpoints describes the run that wrote them, as summary.json does: a rerun that fails
    before its first step (the model no longer fits them) keeps its own report in its app dir only."""
    from tfyarn.backends.base import AppStatus
    from tfyarn.report import checkpoint_url, write_report
    spec = load_spec_dict(job_spec(tmp_path, checkpoint={"dir": str(tmp_path / "ckpt")}))
    for d in ("ckpt", "app-f", "app-g"):
        (tmp_path / d).mkdir()
    (tmp_path / "ckpt" / "report.json").write_text('{"state": "SUCCEEDED"}')
    failed = AppStatus("local-f", "local", "j", AppState.FAILED, diagnostics="CheckpointMismatch")
    starting = ProgressHistory()
    starting.record({"progress/chief:0": json.dumps({"step": 0, "time": 1.0})})
    write_report(tmp_path / "app-f", failed, starting.points, checkpoint_url(spec))
    assert json.loads((tmp_path / "ckpt" / "report.json").read_text()) == {"state": "SUCCEEDED"}
    assert json.loads((tmp_path / "app-f" / "report.json").read_text())["state"] == "FAILED"
    trained = ProgressHistory()
    trained.record({"progress/chief:0": json.dumps({"step": 3, "time": 2.0, "loss": 0.5})})
    # a run that trained, then failed: its report is the news
    write_report(tmp_path / "app-g", failed, trained.points, checkpoint_url(spec))
    assert json.loads((tmp_path / "ckpt" / "report.json").read_text())["state"] == "FAILED"


def _record_segment(url, task, attempt=0, restart=0, seconds=1.2, start_step=0):
    """One task process's own history, recorded as a training task records it (ProgressReporter + TaskHistory)."""
    import time
    from tfyarn.tasklib.kv import MemoryKV
    from tfyarn.train.history import TaskHistory
    from tfyarn.train.progress import ProgressReporter
    h = TaskHistory(url, "app-h", task, attempt, __import__("pathlib").Path(url) / ".." / f"scratch-{task}-{restart}")
    rep = ProgressReporter(MemoryKV(), task, history=h, attempt=attempt, restart=restart)
    rep.begin()
    step, end = start_step, time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
        step += 1
        rep.report(step=step, epoch=0, loss=1.0 / step, examples=32, global_step=step)
    rep.final()
    return step


def test_tasks_record_their_own_history_and_a_restart_is_marked(tmp_path):
    """Issue 19: on YARN the follower samples progress every ~2 s, so a short job's report was one point per task
    (its examples/s panel empty); and a restarted worker's line just dropped to 0. Tasks now record their own
    points next to the checkpoints; each process is a segment, a new one is marked as a restart."""
    from tfyarn.report import load_task_history, write_run_report
    ckpt = tmp_path / "ckpt"
    _record_segment(str(ckpt), "chief:0")
    last = _record_segment(str(ckpt), "worker:0", seconds=0.6)
    _record_segment(str(ckpt), "worker:0", restart=1, seconds=0.6, start_step=last - 5)   # resumes a bit back
    files = sorted(p.name for p in (ckpt / "history" / "app-h").iterdir())
    assert len(files) == 3 and all(f.endswith(".jsonl") for f in files), files
    recorded = load_task_history(str(ckpt), "app-h")
    # the follower saw one sample per task, as on YARN; the tasks' own points replace them
    followed = [{"task": "chief:0", "time": recorded[0]["time"] + 0.5, "step": 40, "loss": 0.1},
                {"task": "worker:0", "time": recorded[0]["time"] + 0.5, "step": 40, "loss": 0.1}]
    status = {"app_id": "app-h", "name": "h", "state": "SUCCEEDED", "started": recorded[0]["time"] - 14.0,
              "finished": recorded[-1]["time"] + 1}
    (tmp_path / "app").mkdir()
    rep = write_run_report(tmp_path / "app", status, followed, None, history_from=str(ckpt))
    chief = rep["tasks"]["chief:0"]
    assert chief["points"] >= 4 and chief["last_step"] > 40, chief            # 1.2 s at >= 1 point per 0.25 s
    assert chief["mean_examples_per_sec"] is not None and 300 < chief["mean_examples_per_sec"] < 3200, chief
    assert chief["last_loss"] < chief["first_loss"]
    assert rep["recorded_by_tasks"] == ["chief:0", "worker:0"]
    assert [(r["task"], r["kind"]) for r in rep["restarts"]] == [("worker:0", "restart")]
    assert rep["plot"] == "report.png" and _png_size(tmp_path / "app" / "report.png") == (1000, 700)


def test_report_axes_show_plain_seconds_and_mark_restarts():
    """A short job's x axis said "+1.467e1" (matplotlib's offset for values close together far from 0)."""
    from tfyarn.report import history_figure
    t0 = 1_795_300_000.0
    pts = [{"task": "chief:0", "time": t0 + 14.60 + i * 0.02, "step": i + 1, "loss": 0.69310 + i * 1e-5,
            "examples_per_sec": 51234.0 + i} for i in range(5)]
    pts += [{"task": "worker:1", "time": t0 + 14.61, "step": 3, "loss": 0.7},
            {"task": "worker:1", "time": t0 + 14.65, "step": 1, "loss": 0.69}]                 # restarted
    fig = history_figure(pts, "t", t0=t0)
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.xaxis.get_major_formatter().get_offset() == ""
        assert ax.yaxis.get_major_formatter().get_offset() == ""
    assert any("worker:1 restart" in t.get_text() for t in fig.axes[0].texts)
    one_each = [{"task": t, "time": t0 + 14.6651 + i * 1e-4, "step": 18, "loss": 0.6931}
                for i, t in enumerate(("chief:0", "worker:0", "worker:1"))]
    fig = history_figure(one_each, "t", t0=t0)     # the case: one sample per task, all at ~14.67 s
    fig.canvas.draw()
    assert [ax.xaxis.get_major_formatter().get_offset() for ax in fig.axes] == ["", ""]


def test_report_location_of_a_yarn_app_is_next_to_its_checkpoints(tmp_path, monkeypatch):
    """Issue 19: the Airflow operator's XCom `report` was None on YARN although report.json existed (only the local
    backend was looked up)."""
    from tfyarn import api
    from tfyarn.backends.base import AppStatus
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    st = AppStatus("application_1_0007", "yarn", "j", AppState.SUCCEEDED,
                   summary={"checkpoint_dir": f"file://{ckpt}"})
    assert api.report_location(st, build=False) is None
    (ckpt / "report.json").write_text(json.dumps({"app_id": "application_1_0006"}))   # an earlier run's
    assert api.report_location(st, build=False) is None
    mine = tmp_path / "home" / "yarn" / st.app_id
    mine.mkdir(parents=True)
    (mine / "report.json").write_text(json.dumps({"app_id": st.app_id}))
    assert api.report_location(st, build=False) == str(mine / "report.json")
    (ckpt / "report.json").write_text(json.dumps({"app_id": st.app_id}))
    assert api.report_location(st, build=False) == f"file://{ckpt}/report.json"


def test_a_process_killed_before_its_first_upload_keeps_its_samples_and_its_restart_mark():
    """A worker SIGKILLed before it uploaded any point: the follower's samples of that process (restart 0) stay in
    the report before the restarted process's recorded points (restart 1), so the restart is still marked; samples
    of the process that did record are replaced by its own points."""
    from tfyarn.report import merge_points, restarts
    followed = [{"task": "worker:0", "time": 1.0, "step": 5, "attempt": 0, "restart": 0},
                {"task": "worker:0", "time": 3.0, "step": 20, "attempt": 0, "restart": 0},
                {"task": "worker:0", "time": 12.0, "step": 30, "attempt": 0, "restart": 1},
                {"task": "chief:0", "time": 0.9, "step": 1, "attempt": 0, "restart": 0}]
    recorded = [{"task": "worker:0", "time": 10.0 + i, "step": 21 + i, "attempt": 0, "restart": 1,
                 "segment": "worker-0.a0.10000"} for i in range(4)]
    recorded += [{"task": "chief:0", "time": 1.0 + i, "step": 1 + i, "attempt": 0, "restart": 0,
                  "segment": "chief-0.a0.900"} for i in range(4)]
    merged = merge_points(followed, recorded)
    assert [p["time"] for p in merged if p["task"] == "worker:0"] == [1.0, 3.0, 10.0, 11.0, 12.0, 13.0]
    assert [p["time"] for p in merged if p["task"] == "chief:0"] == [1.0, 2.0, 3.0, 4.0]   # its sample dropped
    assert [(r["task"], r["time"], r["kind"]) for r in restarts(merged)] == [("worker:0", 10.0, "restart")]


def test_report_has_a_memory_panel_per_task_when_the_status_has_their_memory():
    """Issue 32: the run report shows each task's peak RSS against its container's memory and its CPU; one at 90 %
    or more is drawn in red (YARN would kill it past its limit)."""
    from tfyarn.report import history_figure

    pts = [{"task": "chief:0", "time": 10.0 + i, "step": i, "loss": 1.0 / (i + 1)} for i in range(5)]
    tasks = [{"task": "chief:0", "peak_rss_mib": 1900, "memory_mib": 2048, "cpu_percent": 95.0},
             {"task": "worker:0", "peak_rss_mib": 600, "memory_mib": 2048, "cpu_percent": 40.0},
             {"task": "ps:0", "peak_rss_mib": None, "memory_mib": 1024}]          # never reported: no bar
    fig = history_figure(pts, "t", t0=10.0, tasks=tasks)
    fig.canvas.draw()
    panel = fig.axes[2]
    assert [t.get_text() for t in panel.get_yticklabels()] == ["chief:0", "worker:0"]
    bars = panel.patches
    assert [b.get_width() for b in bars] == [1900.0, 600.0]
    assert bars[0].get_facecolor() != bars[1].get_facecolor()      # chief at 93 %: the warning colour
    texts = [t.get_text() for t in panel.texts]
    assert texts == ["1,900 / 2,048 MiB · CPU 95 %", "600 / 2,048 MiB · CPU 40 %"], texts
    assert len(history_figure(pts, "t", t0=10.0).axes) == 2                       # no tasks: no panel
