"""Corrupt records mid-epoch (on_corrupt fail and skip) and a slow reader (an fsspec file system adding latency to
every read), each in a real local ps job (1 ps + chief + 1 worker). A frozen worker (SIGSTOP → the stall watchdog)
is a scenario of the contract suite (tests/contract), on both backends.

Each asserts the job's outcome, its final global step, the diagnosis text, and that no process is left behind."""
import re
import sys

import pytest

from faultutil import JOBS, corrupt_record, fault_spec, planned_steps, write_data
from launch_helpers import wait_no_processes
from tfyarn import api
from tfyarn.backends.base import AppState
from tfyarn.backends.local.backend import LocalBackend

pytestmark = pytest.mark.timeout(180)


def _corrupt_spec(tmp_path, on_corrupt):
    urls = write_data(tmp_path / "data")
    n = sum(1 for _ in open(urls[0], "rb").read().split(b"user_id")) - 1  # records in file 0 (one user_id each)
    offset = corrupt_record(urls[0], n // 2)
    spec = fault_spec(tmp_path, train=urls, data={"on_corrupt": on_corrupt, "shuffle_buffer": 0})
    return spec, urls[0], n // 2, offset


def assert_clean_success_at_planned_step(st, steps: list[int]) -> None:
    """SUCCEEDED with nothing to diagnose, at the planned global step of the 2 training workers."""
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.diagnostics == ""
    assert st.summary["global_step"] == st.summary["total_steps"] == 2 * sum(steps)


def test_corrupt_record_mid_epoch_fails_the_job_naming_file_record_and_offset(tmp_path):
    spec, path, index, offset = _corrupt_spec(tmp_path, "fail")
    total = 2 * sum(planned_steps(spec))
    st = api.run(spec, backend="local")
    assert st.state is AppState.FAILED, st.diagnostics
    expected = (rf"^(chief|worker):0 exited with code 1: DataError: \S*{re.escape(path)}: record {index} at byte "
                rf"offset {offset}: corrupted data \(data CRC mismatch\)")
    assert re.search(expected, st.diagnostics), st.diagnostics
    assert st.summary is None
    assert int(st.progress.get("global_step") or 0) < total
    assert wait_no_processes(st.app_id, 10) == []


def test_corrupt_record_mid_epoch_is_skipped_and_the_job_reaches_the_planned_step(tmp_path):
    spec, path, index, offset = _corrupt_spec(tmp_path, "skip")
    steps = planned_steps(spec)
    backend = LocalBackend()
    st = api.run(spec, backend="local")
    assert_clean_success_at_planned_step(st, steps)
    assert st.summary["steps_per_worker"] == {"chief:0": sum(steps), "worker:0": sum(steps)}
    logs = "\n".join(backend.logs(st.app_id))
    warn = "skipped corrupt record: "
    hits = [ln for ln in logs.splitlines() if warn in ln and f"record {index} at byte offset {offset}" in ln]
    assert hits, logs[-3000:]
    assert len(hits) == spec.data.epochs   # once per epoch: the record is met (and skipped) in every epoch
    # the summary counts them: once per epoch, by the task whose share holds the record in that epoch's plan
    assert st.summary["skipped_records"] == spec.data.epochs, st.summary
    by_task = st.summary["skipped_by_task"]
    assert sum(by_task.values()) == spec.data.epochs and set(by_task) <= {"chief:0", "worker:0"}, st.summary
    assert wait_no_processes(st.app_id, 10) == []


@pytest.mark.slow
def test_slow_reader_is_slow_but_correct(tmp_path):
    """Every read of the training files takes 0.5 s longer (``slowfile://``, tests/functional/faults/jobs): the job gets
    slower, the watchdog does not mistake it for a stall, and it ends at the planned global step."""
    sys.path.insert(0, str(JOBS))
    import fault_models  # noqa: F401  registers slowfile:// in this process too (planned_steps reads the files)
    urls = [f"slowfile://{u}" for u in write_data(tmp_path / "data")]
    env = {"SLOWFILE_DELAY_S": "0.5"}
    spec = fault_spec(tmp_path, train=urls, delay=0.0, timeouts={"stall": 30},
                      worker={"env": env})
    spec = spec.model_copy(update={"roles": {**spec.roles, "chief": spec.roles["chief"].model_copy(
        update={"env": env})}})
    steps = planned_steps(spec)
    st = api.run(spec, backend="local")
    assert_clean_success_at_planned_step(st, steps)
    assert wait_no_processes(st.app_id, 10) == []


@pytest.mark.slow
def test_checkpoint_uploads_slower_than_the_step_timeout_do_not_stop_sync_training(tmp_path):
    """Every checkpoint upload takes 2 x 4 s (``slowfile://`` store, 2 files), longer than ``timeouts.step`` = 6 s.
    Uploading inside the chief's step loop, the sync worker waited for the chief's gradients past its step timeout
    and the job failed; uploads now run beside training and the job ends at the planned step, checkpoints
    committed."""
    sys.path.insert(0, str(JOBS))
    import fault_models  # noqa: F401  registers slowfile:// in this process too (preflight, the index read below)
    env = {"SLOWFILE_PUT_DELAY_S": "4"}
    spec = fault_spec(tmp_path, sync=True, delay=0.05, checkpoint_every=4, timeouts={"step": 6, "stall": 60})
    ck = spec.checkpoint.model_copy(update={"dir": f"slowfile://{tmp_path / 'ckpt'}"})
    spec = spec.model_copy(update={"checkpoint": ck, "roles": {
        r: spec.roles[r].model_copy(update={"env": env}) for r in spec.roles}})
    steps = planned_steps(spec)
    backend = LocalBackend()
    st = api.run(spec, backend="local")
    assert st.state is AppState.SUCCEEDED and st.diagnostics == "", st.diagnostics
    total = sum(steps)                                  # sync: one global step per aggregated step of both workers
    assert st.summary["global_step"] == st.summary["total_steps"] == total, st.summary
    assert st.summary["steps_per_worker"] == {"chief:0": total, "worker:0": total}, st.summary
    from tfyarn.train.checkpoint import CheckpointStore
    index = CheckpointStore(str(tmp_path / "ckpt")).index()
    assert index["latest"] == f"ckpt-{total}" and len(index["checkpoints"]) >= 2, index
    uploads = [float(s) for s in re.findall(r"uploaded to \S+ in ([\d.]+)s", "\n".join(backend.logs(st.app_id)))]
    assert len(uploads) >= 2 and min(uploads) > spec.timeouts.step, uploads      # each slower than a step may take
    assert wait_no_processes(st.app_id, 10) == []


def test_a_truncated_last_record_is_skipped_counted_and_named_also_from_the_cached_index(tmp_path):
    """``on_corrupt: skip`` of a truncated last record: the summary used to say ``skipped_records: 0`` and the end of
    the run nothing; a second run, reading the damaged range from the cached index, said nothing anywhere. An empty
    file's warning was printed by every training task. Through the CLI, as a user runs it, twice."""
    import json
    import os
    import subprocess

    import yaml
    urls = write_data(tmp_path / "data", records=1200)
    last = urls[-1]
    data = open(last, "rb").read()
    open(last, "wb").write(data[:-3])                     # the last record loses its data CRC's last 3 bytes
    (tmp_path / "data" / "part-00099.tfrecord").write_bytes(b"")
    spec = fault_spec(tmp_path, train=[str(tmp_path / "data")], epochs=1, delay=0.0, data={"on_corrupt": "skip"})
    doc = json.loads(spec.to_json())
    doc.pop("base_dir")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "TFYARN_HOME": str(tmp_path / "home")}
    for run in ("indexes the files", "reads the cached index"):
        proc = subprocess.run([sys.executable, "-m", "tfyarn.cli", "run", str(path), "--local"], capture_output=True,
                              text=True, timeout=150, env=env)
        assert proc.returncode == 0, (run, proc.stdout, proc.stderr[-3000:])
        index = json.loads((tmp_path / "data" / f".{os.path.basename(last)}.tfyidx.json").read_text())
        ((a, b),) = index["holes"]
        assert b == len(data) - 3, index["holes"]
        where = f"file://{last}: bytes {a}..{b} skipped (to the end of the file: a truncated or damaged last record)"
        assert "data: 1 corrupt record skipped (on_corrupt: skip); each is named in its task's log" in proc.stdout, \
            (run, proc.stdout)
        assert f"    {where}" in proc.stdout, (run, proc.stdout)
        app_id = re.search(r"\((local-[\w-]+)\)", proc.stdout).group(1)
        st = json.loads(subprocess.run([sys.executable, "-m", "tfyarn.cli", "status", app_id, "--output", "json"],
                                       capture_output=True, text=True, timeout=60, env=env).stdout)
        assert st["summary"]["skipped_records"] == 1 and st["summary"]["skipped_at"] == [where], (run, st["summary"])
        # said once per run (by one training task), not by each of chief:0 and worker:0
        assert proc.stderr.count("part-00099.tfrecord: empty file (0 bytes), skipped") == 1, (run, proc.stderr)
        assert proc.stderr.count(where) == 1, (run, proc.stderr)
        assert wait_no_processes(app_id, 10) == []
