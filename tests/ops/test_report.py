"""The run report: written at the end of a real run (app dir and checkpoint dir), readable, fetchable by the CLI."""
import json
import struct
import subprocess

import pytest

from opsutil import job_spec, tfyarn_cmd
from tfyarn.backends.base import AppState
from tfyarn.backends.local import LocalBackend
from tfyarn.report import ProgressHistory
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(180)


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


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
        st = LocalBackend().run(spec)
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
        assert _png_size(d / "report.png") == (1000, 700)
    rep = json.loads((tmp / "ckpt" / "report.json").read_text())
    assert rep["schema"] == "tfyarn.report/1" and rep["state"] == "SUCCEEDED" and rep["plot"] == "report.png"
    assert set(rep["tasks"]) == {"chief:0", "worker:0"}
    for task, s in rep["tasks"].items():
        assert s["points"] >= 3, (task, s)           # ~4 s of training, published every second
        assert s["last_step"] == 80
        assert s["last_loss"] < s["first_loss"]
        assert 100 < s["mean_examples_per_sec"] < 5000  # 32 examples / 0.05 s ≈ 640, not a start-up spike
    assert rep["summary"]["global_step"] == 80
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
    assert _png_size(tmp_path / "got" / "report.png") == (1000, 700)

    missing = subprocess.run(tfyarn_cmd("report", "application_1_0001"), capture_output=True, text=True, env=env,
                             timeout=60)
    assert missing.returncode == 1 and "--from" in missing.stderr


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
    from tfyarn.report import report_for_launcher
    spec = load_spec_dict(job_spec(tmp_path, checkpoint={"dir": str(tmp_path / "ckpt")}))
    for d in ("ckpt", "app-f", "app-g"):
        (tmp_path / d).mkdir()
    (tmp_path / "ckpt" / "report.json").write_text('{"state": "SUCCEEDED"}')
    failed = AppStatus("local-f", "local", "j", AppState.FAILED, diagnostics="CheckpointMismatch")
    starting = ProgressHistory()
    starting.record({"progress/chief:0": json.dumps({"step": 0, "time": 1.0})})
    report_for_launcher(tmp_path / "app-f", failed, starting, spec)
    assert json.loads((tmp_path / "ckpt" / "report.json").read_text()) == {"state": "SUCCEEDED"}
    assert json.loads((tmp_path / "app-f" / "report.json").read_text())["state"] == "FAILED"
    trained = ProgressHistory()
    trained.record({"progress/chief:0": json.dumps({"step": 3, "time": 2.0, "loss": 0.5})})
    report_for_launcher(tmp_path / "app-g", failed, trained, spec)          # a run that trained, then failed: its
    assert json.loads((tmp_path / "ckpt" / "report.json").read_text())["state"] == "FAILED"   # report is the news
