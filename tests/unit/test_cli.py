"""The CLI through click's runner and as a real subprocess: exit codes, all problems at once, schema, overrides."""
import json
import subprocess
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner

from launch_helpers import ROOT, small_spec
from tfyarn import api
from tfyarn.cli import cli


def write(tmp_path, spec, name="job.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(spec))
    return str(p)


def test_spec_with_three_mistakes_prints_all_three_and_exits_2(tmp_path):
    spec = small_spec(tmp_path)
    spec["roles"]["worker"]["memory"] = "8 gigs"
    spec["data"]["epoch"] = 2
    spec["timeouts"]["stall"] = "soon"
    path = write(tmp_path, spec)
    # a real process, as a scheduler would run it: nothing started, exit 2, every problem listed
    proc = subprocess.run([sys.executable, "-m", "tfyarn.cli", "run", path], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "3 problems in the job spec" in proc.stderr
    for line in ["data.epoch: unknown key (did you mean 'epochs'?)",
                 "roles.worker.memory: '8 gigs' is not a size",
                 "timeouts.stall: 'soon' is not a duration"]:
        assert line in proc.stderr
    assert not (Path(tmp_path) / "tfyarn-home" / "apps").exists()  # nothing was started


def test_missing_data_and_unwritable_checkpoint_dir_exit_2_before_any_task_starts(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    spec = small_spec(tmp_path, checkpoint={"dir": str(blocker / "ckpt")})
    spec["data"]["train"] = [spec["data"]["train"], str(tmp_path / "nowhere" / "*.tfrecord")]
    path = write(tmp_path, spec)
    for cmd in ("run", "submit"):
        proc = subprocess.run([sys.executable, "-m", "tfyarn.cli", cmd, path], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "2 problems found before starting the job (nothing was started)" in proc.stderr
        assert f"data.train[1]: {tmp_path}/nowhere/*.tfrecord matches no files" in proc.stderr
        assert f"checkpoint.dir: {blocker}/ckpt is not writable" in proc.stderr
        assert not (Path(tmp_path) / "tfyarn-home" / "apps").exists()  # no app, no process


def test_a_malformed_set_and_a_mistyped_role_are_listed_with_every_other_problem(tmp_path):
    """`--set nokey` (no '=') used to be the only error shown, hiding the spec's others; a mistyped role got
    pydantic's "Input should be 'chief', ..." where other keys get "did you mean"."""
    spec = small_spec(tmp_path)
    spec["data"]["epoch"] = 2
    path = write(tmp_path, spec)
    proc = subprocess.run([sys.executable, "-m", "tfyarn.cli", "validate", path, "--set", "nokey",
                           "--set", "roles.wrker.instances=3", "--set", "roles.worker.memory=8 gigs"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "4 problems in the job spec" in proc.stderr
    for line in ["--set 'nokey': expected key.path=value",
                 "data.epoch: unknown key (did you mean 'epochs'?)",
                 "roles.worker.memory: '8 gigs' is not a size",
                 "roles.wrker: unknown key (did you mean 'worker'?)"]:
        assert f"  - {line}" in proc.stderr, proc.stderr
    assert "Input should be" not in proc.stderr and "Traceback" not in proc.stderr


RECO_FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}


def _reco_spec(tmp_path, data_dir, batch_size):
    """A ps spec (chief + 2 workers: 3 training tasks) on a synthetic recommender data dir."""
    return write(tmp_path, {"name": "reco", "model": "tfyarn.models.recommender:model", "mode": "ps",
                            "data": {"train": str(data_dir), "features": RECO_FEATURES, "batch_size": batch_size},
                            "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 2}},
                            "timeouts": {"rendezvous": 60}})


def test_fewer_records_than_one_global_batch_is_one_line_and_exit_2_before_anything_starts(tmp_path):
    """300 records, batch 500 x 3 training tasks: `validate --check-files` said ok and run's preflight passed; every
    task then died with its own NoDataError traceback (exit 1)."""
    from tfyarn.data import write_synthetic
    write_synthetic(str(tmp_path / "data"), "recommender", files=3, records=300)
    path = _reco_spec(tmp_path, tmp_path / "data", 500)
    line = ("  - data.train: 300 records are fewer than one global batch (3 training tasks x data.batch_size 500 = "
            "1500): no step can be planned; lower data.batch_size to at most 100 or give more data")
    for args in (["validate", path, "--check-files"], ["run", path, "--local"],      # indexes the files, then
                 ["run", path, "--local"]):                                          # from the cached indexes
        proc = subprocess.run([sys.executable, "-m", "tfyarn.cli", *args], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "1 problem found before starting the job" in proc.stderr and line in proc.stderr.splitlines(), \
            (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert not (Path(tmp_path) / "tfyarn-home" / "apps").exists()              # no task was started
    ok = CliRunner().invoke(cli, ["validate", path, "--check-files", "--set", "data.batch_size=100"])
    assert ok.exit_code == 0, ok.output


def test_side_files_in_a_data_dir_are_left_out_and_a_stray_one_is_named_with_the_way_out(tmp_path):
    """A non-hidden checksum (part-00000.tfrecord.crc) in a data dir was read as data and failed preflight."""
    from tfyarn.data import write_synthetic
    d = tmp_path / "data"
    write_synthetic(str(d), "recommender", files=2, records=400)
    for side in ("part-00000.tfrecord.crc", ".part-00001.tfrecord.crc", "_SUCCESS", "_temporary/0/part-9.tfrecord"):
        (d / side).parent.mkdir(parents=True, exist_ok=True)
        (d / side).write_bytes(b"crc\x00\x01 not a record")
    path = _reco_spec(tmp_path, d, 50)
    cmd = [sys.executable, "-m", "tfyarn.cli"]
    proc = subprocess.run(cmd + ["validate", path, "--check-files"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    index = subprocess.run(cmd + ["data", "index", str(d)], capture_output=True, text=True, timeout=60)
    assert index.returncode == 0 and index.stdout.startswith("2 files, 400 records"), (index.stdout, index.stderr)
    (d / "README.txt").write_text("how this data set was made\n")
    hint = ("'README.txt' was listed as data: directories and globs leave out names starting with '_' or '.' and "
            "*.crc (as Hadoop does); name only the data files (a glob such as DIR/part-*), or move or rename it")
    proc = subprocess.run(cmd + ["validate", path, "--check-files"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "README.txt: not a TFRecord file" in proc.stderr and hint in proc.stderr, \
        proc.stderr
    index = subprocess.run(cmd + ["data", "index", str(d)], capture_output=True, text=True, timeout=60)
    assert index.returncode != 0 and hint in index.stderr and "Traceback" not in index.stderr, index.stderr
    named = subprocess.run(cmd + ["data", "index", str(d / "README.txt")], capture_output=True, text=True,
                           timeout=60)                                 # named explicitly: read as data, no hint
    assert named.returncode != 0 and "not a TFRecord file" in named.stderr and hint not in named.stderr


def test_validate_ok_states_the_global_batch(tmp_path):
    path = write(tmp_path, small_spec(tmp_path))
    r = CliRunner().invoke(cli, ["validate", path, "--set", "roles.worker.instances=3", "--set", "data.batch_size=8"])
    assert r.exit_code == 0, r.output
    assert "global batch 32 (8 per worker x 4)" in r.output
    assert "SavedModel" not in r.output
    r = CliRunner().invoke(cli, ["validate", path, "--set", f"checkpoint.dir={tmp_path}/ck",
                                 "--set", f"export.dir={tmp_path}/models"])
    assert r.exit_code == 0 and f"exports a SavedModel to {tmp_path}/models" in r.output, r.output


def test_validate_check_files_reads_the_data_as_run_would(tmp_path):
    """Without the flag validate reads no file; with it, the data and checkpoint-dir checks of run/submit (exit 2)."""
    path = write(tmp_path, small_spec(tmp_path, checkpoint={"dir": str(tmp_path / "ck")}))
    r = CliRunner().invoke(cli, ["validate", path, "--check-files"])
    assert r.exit_code == 0, r.output
    other = ["--set", "data.features={user_id: {dtype: int64}}"]        # the tiny data has only 'label'
    assert CliRunner().invoke(cli, ["validate", path] + other).exit_code == 0
    r = CliRunner().invoke(cli, ["validate", path, "--check-files"] + other)
    assert r.exit_code == 2
    assert "validate --check-files: nothing was started" in r.output
    assert "record 0 does not fit data.features: feature 'user_id' is missing (the record has: 'label')" in r.output
    # what run refuses before starting, validate --check-files refuses too (it passed them)
    r = CliRunner().invoke(cli, ["validate", path, "--check-files", "--local", "--set", "model=nomodule:thing",
                                 "--set", f"checkpoint.init_from={tmp_path / 'nowhere'}"])
    assert r.exit_code == 2, r.output
    assert "model: module 'nomodule' not found" in r.output
    assert f"checkpoint.init_from: no committed checkpoint in {tmp_path / 'nowhere'}" in r.output


def test_validate_bad_override_exits_2(tmp_path):
    path = write(tmp_path, small_spec(tmp_path))
    r = CliRunner().invoke(cli, ["validate", path, "--set", "roles.worker.instances=-2"])
    assert r.exit_code == 2
    assert "roles.worker.instances: -2" in r.output


def test_schema_is_json_schema():
    r = CliRunner().invoke(cli, ["schema"])
    assert r.exit_code == 0
    schema = json.loads(r.output)
    assert schema["title"] == "JobSpec" and "roles" in schema["properties"]


def test_quickstart_spec_validates():
    r = CliRunner().invoke(cli, ["validate", str(ROOT / "specs" / "quickstart.yaml")])
    assert r.exit_code == 0, r.output
    assert "global batch 768" in r.output


def test_status_of_unknown_app_exits_2():
    r = CliRunner().invoke(cli, ["status", "local-does-not-exist"])
    assert r.exit_code == 2
    assert "no local app 'local-does-not-exist'" in r.output


def test_an_id_of_no_backend_or_yarn_without_hadoop_is_a_usage_error_not_a_crash(tmp_path, monkeypatch):
    """A typo in an app id, or a YARN id on a machine without Hadoop, used to start a skein driver and end in a
    traceback with exit 1 — which a scheduler reads as "the job failed"."""
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))                 # no `yarn` command
    runner = CliRunner()
    for args in (["status", "nope"], ["kill", "nope"], ["logs", "nope"], ["wait", "nope"]):
        r = runner.invoke(cli, args)
        assert r.exit_code == 2 and "no app 'nope': app ids are local-… (local) or application_… (yarn)" \
            in r.output, (args, r.output)
    for args in (["status", "application_1_2"], ["list", "--yarn"],
                 ["run", "--yarn", write(tmp_path, small_spec(tmp_path))]):
        r = runner.invoke(cli, args)
        assert r.exit_code == 2 and "YARN is not configured on this machine: set HADOOP_CONF_DIR" in r.output, \
            (args, r.output)
        assert "Traceback" not in r.output


def test_submit_and_wait_with_json_output_print_exactly_one_json_document(tmp_path):
    """A scheduler does json.loads(stdout): the bare app id before the JSON, or nothing on a wait's timeout, broke
    that."""
    runner = CliRunner()
    long_job = write(tmp_path, small_spec(tmp_path, model="custom_jobs:run_long"), "long.yaml")
    r = runner.invoke(cli, ["-q", "submit", long_job, "--local", "--output", "json"])
    assert r.exit_code == 0, r.output
    app_id = json.loads(r.stdout)["app_id"]
    try:
        r = runner.invoke(cli, ["-q", "wait", app_id, "--timeout", "1", "--output", "json"])
        assert r.exit_code == 4 and "timed out" in r.stderr
        st = json.loads(r.stdout)
        assert st["app_id"] == app_id and st["state"] in ("PENDING", "RUNNING")
    finally:
        assert runner.invoke(cli, ["kill", app_id]).exit_code == 0
    quick = write(tmp_path, small_spec(tmp_path, model="custom_jobs:quick"), "quick.yaml")
    r = runner.invoke(cli, ["-q", "submit", quick, "--local", "--wait", "--output", "json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["state"] == "SUCCEEDED" and "submitted local-" in r.stderr
    r = runner.invoke(cli, ["submit", quick, "--local", "--dry-run", "--output", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["dry_run"]


def test_a_path_that_cannot_be_used_is_one_error_line_and_exit_2(tmp_path):
    spec = write(tmp_path, small_spec(tmp_path, model="custom_jobs:quick"))
    (tmp_path / "a-file").write_text("")
    r = CliRunner().invoke(cli, ["submit", spec, "--local"], env={"TFYARN_HOME": str(tmp_path / "a-file" / "home")})
    assert r.exit_code == 2 and r.output.startswith("error: ") and "a-file" in r.output, r.output
    assert "Traceback" not in r.output


def test_data_synth_refuses_to_mix_data_sets_unless_told_to_overwrite(tmp_path):
    out = str(tmp_path / "syn")
    runner = CliRunner()
    assert runner.invoke(cli, ["data", "synth", out, "--files", "4", "--records", "400"]).exit_code == 0
    r = runner.invoke(cli, ["data", "synth", out, "--files", "2", "--records", "100"])
    assert r.exit_code == 2 and "already holds data" in r.output and "--overwrite" in r.output, r.output
    r = runner.invoke(cli, ["data", "synth", out, "--files", "2", "--records", "100", "--overwrite"])
    assert r.exit_code == 0 and sorted(p.name for p in (tmp_path / "syn").iterdir()) == \
        ["part-00000.tfrecord", "part-00001.tfrecord"]
    r = runner.invoke(cli, ["data", "synth", str(tmp_path / "other"), "--files", "0"])
    assert r.exit_code == 2 and "files must be a positive integer, not 0" in r.output


def test_run_json_output_and_exit_code_of_a_finished_job(tmp_path):
    path = write(tmp_path, small_spec(tmp_path, model="custom_jobs:quick"))
    r = CliRunner().invoke(cli, ["-q", "run", path, "--local", "--output", "json"])
    assert r.exit_code == 0, r.output
    st = json.loads(r.output[r.output.index("{"):])
    assert st["schema"] == "tfyarn.status/1" and st["state"] == "SUCCEEDED" and st["exit_code"] == 0
    r2 = CliRunner().invoke(cli, ["status", st["app_id"], "--output", "json"])
    assert r2.exit_code == 0 and json.loads(r2.output)["state"] == "SUCCEEDED"
    # a role selects its tasks, as on YARN (locally it used to be AppNotFound); an unknown one names the tasks
    r3 = CliRunner().invoke(cli, ["logs", st["app_id"], "--task", "worker"])
    lines = r3.output.splitlines()
    assert r3.exit_code == 0 and lines and all(ln.startswith("worker:0 | ") for ln in lines), r3.output[-2000:]
    r4 = CliRunner().invoke(cli, ["logs", st["app_id"], "--task", "evaluator"])
    assert r4.exit_code == 2 and "no task 'evaluator' (tasks: chief:0, worker:0)" in r4.output, r4.output


def test_gateway_commands_import_no_tensorflow():
    """Validating and building the YARN submission run on gateway nodes without TensorFlow (or Keras, matplotlib)."""
    code = ("import sys\n"
            "from click.testing import CliRunner\n"
            "from tfyarn.cli import cli\n"
            f"spec = {str(ROOT / 'specs' / 'ctr-yarn.yaml')!r}\n"
            "assert CliRunner().invoke(cli, ['validate', spec]).exit_code == 0\n"
            "r = CliRunner().invoke(cli, ['submit', spec, '--yarn', '--dry-run'])\n"
            "assert r.exit_code == 0 and 'tfyarn.task' in r.output, r.output\n"
            "print(sorted(m for m in ('tensorflow', 'keras', 'matplotlib') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_stop_signal_ends_the_wait_not_the_submitted_job(tmp_path):
    """`submit --wait` / `wait` follow a job submitted to run on its own: Ctrl-C (or a scheduler's SIGTERM) ends the
    wait with 128 + the signal and says how to follow or kill the job, which keeps running (`run` is the command
    that ties a job to the process: its launcher stops every task on those signals)."""
    import signal
    import time

    from launch_helpers import wait_for_step, wait_no_processes
    from tfyarn.backends.base import AppState
    from tfyarn.backends.local.backend import LocalBackend
    path = write(tmp_path, small_spec(tmp_path, model="custom_jobs:run_long"))
    cmd = [sys.executable, "-m", "tfyarn.cli", "-q"]
    sub = subprocess.Popen(cmd + ["submit", path, "--local", "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    app_id = sub.stdout.readline().strip()
    backend = LocalBackend()
    try:
        wait_for_step(backend, app_id, "chief:0", 2, timeout=90)
        sub.send_signal(signal.SIGINT)
        out, err = sub.communicate(timeout=30)
        assert sub.returncode == 130, (out, err)
        assert (f"stopped waiting (SIGINT); {app_id} is still running: `tfyarn wait {app_id}` follows it, "
                f"`tfyarn kill {app_id}` stops it") in err
        for delay in (2.0, 6.0, 15.0):               # in its wait loop (imports done): later on a loaded box
            waiter = subprocess.Popen(cmd + ["wait", app_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
            time.sleep(delay)
            waiter.send_signal(signal.SIGTERM)
            out, err = waiter.communicate(timeout=30)
            if waiter.returncode != -signal.SIGTERM:   # -15: still importing, before any handler: try later
                break
        assert waiter.returncode == 128 + signal.SIGTERM and "stopped waiting (SIGTERM)" in err, (out, err)
        follower = subprocess.Popen(cmd + ["logs", app_id, "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        first = follower.stdout.readline()             # following: its handlers are in place
        follower.send_signal(signal.SIGINT)            # how `logs -f` is stopped: exit 130, no "Aborted!"
        out, err = follower.communicate(timeout=30)
        out = first + out
        assert follower.returncode == 130 and "Aborted" not in err and "chief:0" in out, (out[-500:], err)
        assert backend.status(app_id).state is AppState.RUNNING
    finally:
        sub.kill()
        backend.kill(app_id)
    assert api.wait(app_id, timeout=60).state is AppState.KILLED
    assert wait_no_processes(app_id, 15) == []
