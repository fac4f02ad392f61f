"""A scoring worker killed with SIGKILL mid-way is restarted in place and rewrites only its unfinished parts: the
parts it had committed stay as they were (same file), every input row is in the output exactly once, and the run's
rows out = rows in. Real processes on the local backend (3 workers, the recommender's SavedModel)."""
import signal
import time

import pytest

from faultutil import task_process
from launch_helpers import wait_no_processes
from predictutil import predict_doc, read_output, write_model, write_parquet
from tfyarn import api, runner
from tfyarn.backends.base import AppState
from tfyarn.backends.local.backend import LocalBackend
from tfyarn.data import build_manifest
from tfyarn.data.planner import scoring_plan
from tfyarn.predict.output import OutputDir
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(300)
pytest.importorskip("pyarrow")
pytest.importorskip("tensorflow")


def test_a_worker_killed_mid_way_rewrites_only_its_unfinished_parts(tmp_path):
    model = write_model(tmp_path / "models")
    total = write_parquet(tmp_path / "in", [60_000, 60_000, 30_000], row_group=5000)
    doc = predict_doc(str(model), str(tmp_path / "in"), str(tmp_path / "out"), workers=3, batch_size=16,
                      part_rows=5000)
    doc["roles"]["worker"]["max_restarts"] = 1
    spec = api.predict_job(load_spec_dict(doc))
    plan = scoring_plan(build_manifest(spec.predict.input), 3, 5000)
    victim = [p.index for p in plan if p.worker == 1]
    assert len(victim) == 10
    out = OutputDir(str(tmp_path / "out"))
    backend = LocalBackend()
    app_id = backend.submit(spec)
    proc = task_process(app_id, "worker:1", timeout=120)
    deadline = time.monotonic() + 180
    while not out.fs.exists(out.record_path(victim[0])):   # its first part committed: kill it now
        assert time.monotonic() < deadline, "worker:1 committed no part within 180 s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    done = sorted(i for i in out.committed() if i in victim)
    kept = {i: (tmp_path / "out" / f"part-{i:05d}.parquet").stat() for i in done}
    assert 1 <= len(done) < len(victim), done   # mid-way
    st = runner.wait(backend, app_id, timeout=240, poll=0.2)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert {t.task: t.restarts for t in st.tasks}["worker:1"] == 1
    s = st.summary
    assert (s["rows_in"], s["rows_out"], s["parts"]) == (total, total, 30)
    rows = read_output(str(tmp_path / "out"))["row"].to_pylist()
    assert rows == list(range(total))   # each row once: no duplicate, none missing
    for i, before in kept.items():   # committed before the kill: not written again
        after = (tmp_path / "out" / f"part-{i:05d}.parquet").stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), i
    log = "\n".join(backend.logs(app_id, task="worker:1"))
    assert "==== tfyarn: restart 1/1 after exit code -9 ====" in log
    assert f"{len(done)} already committed, {len(victim) - len(done)} to score" in log, log[-3000:]
    assert wait_no_processes(app_id, 10) == []
