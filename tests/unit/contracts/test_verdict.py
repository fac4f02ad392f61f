"""The job's verdict is tfyarn's, not YARN's (issue 41): SUCCEEDED only when the job's end record says so.

The table: an ended YARN app with or without an end record, whatever YARN's final status and its tasks' outcomes
(the YARN backend's status of such apps, end to end, is in tests/unit/backends/yarn/test_backend_state.py; the local
backend's launcher decides from its tasks' exits: tests/contract)."""
import subprocess
import sys

import pytest

from tfyarn.backends.yarn import outcome, start_causes
from tfyarn.backends.yarn.log_files import ContainerLog
from tfyarn.contracts import job_end, startup
from tfyarn.contracts.status import AppState

DONE = job_end.decide("task:chief:0", done=True, now=1.0)
FAILED = job_end.decide("failed-task:chief:0", failure="chief:0: exit code 1: ValueError: boom", now=1.0)
CAUSES = "ps:0, chief:0: cannot start: No module named 'pydantic' (python /usr/bin/python3 3.11.2)"


@pytest.mark.parametrize("state, diag, end, causes, expected", [
    # YARN's SUCCEEDED with no record: the tasks failed to start, or nobody said the job was done -> FAILED
    (AppState.SUCCEEDED, "Application completed successfully.", None, CAUSES, AppState.FAILED),
    (AppState.SUCCEEDED, "Application completed successfully.", None, "", AppState.FAILED),
    # a record that does not say SUCCEEDED (YARN's final status disagreed with it) is no success either
    (AppState.SUCCEEDED, "", FAILED, "", AppState.FAILED),
    # the record says SUCCEEDED: it is (from_record reads it first; verdict agrees)
    (AppState.SUCCEEDED, "", DONE, "", AppState.SUCCEEDED),
    # failures keep their state, the causes first
    (AppState.FAILED, "Failure in service tfyarn-supervisor, see logs for more information.", None, CAUSES,
     AppState.FAILED),
    (AppState.TIMED_OUT, "stalled", None, "", AppState.TIMED_OUT),
    (AppState.KILLED, "Application killed by user", None, CAUSES, AppState.KILLED),
])
def test_the_verdict_table_without_a_readable_record(state, diag, end, causes, expected):
    got, text = outcome.verdict(state, diag, end, causes)
    assert got is expected
    if expected is AppState.FAILED:
        assert got.exit_code == 1
        if causes:
            assert text.splitlines()[0] == causes  # the first line names what is missing and which Python
        if state is AppState.SUCCEEDED:
            assert outcome.NO_RECORD in text and (diag or "SUCCEEDED") in text


@pytest.mark.parametrize("yarn, final, snap, expected", [
    ("FINISHED", "SUCCEEDED", {"end": DONE.to_json()}, AppState.SUCCEEDED),
    ("FINISHED", "FAILED", {"end": FAILED.to_json()}, AppState.FAILED),
    ("FINISHED", "SUCCEEDED", {}, None),                      # no record: verdict() decides (FAILED)
    ("FINISHED", "SUCCEEDED", {"end": FAILED.to_json()}, None),  # YARN disagrees: verdict() (FAILED)
])
def test_the_record_decides_when_yarn_agrees(yarn, final, snap, expected):
    got = outcome.from_record(yarn, final, snap)
    assert (got[0] if got else None) is expected
    if got is None:
        assert outcome.verdict(AppState.SUCCEEDED, "", job_end.recorded(snap))[0] is AppState.FAILED


def test_a_python_without_tfyarns_dependencies_says_which_module_and_which_python(tmp_path):
    """The container script's check (contracts.startup as text, no tfyarn import) run by a Python that has none of
    tfyarn's dependencies (Debian's /usr/bin/python3 here): one line naming the first missing module."""
    python = "/usr/bin/python3"
    have = subprocess.run([python, "-c", "import pydantic"], capture_output=True)
    if have.returncode == 0:
        pytest.skip(f"{python} has pydantic")
    src = open(startup.__file__).read()
    p = subprocess.run([python, "-c", src, "1"], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)  # not even tfyarn
    version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True).stdout.strip()
    assert p.returncode == 0, p.stderr
    assert startup.parse_log(p.stderr) == (1, f"cannot start: No module named 'tfyarn' (python {python} {version})")
    import tfyarn
    p = subprocess.run([python, "-c", src, "7", "supervisor"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={"PYTHONPATH": str(__import__("pathlib").Path(tfyarn.__file__).parents[1])})
    assert startup.parse_log(p.stderr) == (7, f"cannot start: No module named 'pydantic' (python {python} {version})")


def test_the_check_is_silent_where_everything_imports():
    p = subprocess.run([sys.executable, "-c", open(startup.__file__).read(), "1"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and startup.MARK not in p.stderr, p.stderr


def test_start_causes_name_each_task_from_the_snapshot_the_supervisor_last():
    line = startup.log_line(1, "cannot start: No module named 'pydantic' (python /usr/bin/python3 3.11.2)")
    logs = [ContainerLog("container_1_0001_01_000003", {"ps.log": f"[tfyarn] container ps_0 yarn=x\n{line}\n"}),
            ContainerLog("container_1_0001_01_000002", {"tfyarn-supervisor.log": line}),
            ContainerLog("container_1_0001_01_000004", {"chief.log": "Traceback\nValueError: boom\n"}),
            ContainerLog("container_1_0001_01_000009", {"worker.log": f"{line}\n"}),
            ContainerLog("container_1_0001_01_000005", {"worker.log": startup.log_line(1, "cannot start: older")})]
    found = start_causes.in_logs(logs)
    assert set(found) == {"container_1_0001_01_000003", "container_1_0001_01_000002", "container_1_0001_01_000009",
                          "container_1_0001_01_000005"}
    snap = {"tasks": [{"task": "ps:0", "log": "h:8042/node/containerlogs/container_1_0001_01_000003/root"},
                      {"task": "worker:0", "log": "h:8042/node/containerlogs/container_1_0001_01_000009/root"}],
            "containers": {"tfyarn-supervisor_0": "container_1_0001_01_000002",
                           "worker_0": "container_1_0001_01_000005", "worker_4": "container_1_0001_01_000009"}}
    causes = start_causes.by_task(found, snap)
    assert causes == {"ps:0": (1, "cannot start: No module named 'pydantic' (python /usr/bin/python3 3.11.2)"),
                      "worker:0": (1, "cannot start: No module named 'pydantic' (python /usr/bin/python3 3.11.2)"),
                      "tfyarn-supervisor": (1, "cannot start: No module named 'pydantic' (python /usr/bin/python3 "
                                               "3.11.2)")}
    assert start_causes.diagnosis(causes, ["ps:0", "chief:0", "worker:0"]) == (
        "ps:0, worker:0, tfyarn-supervisor: cannot start: No module named 'pydantic' (python /usr/bin/python3 3.11.2)")
