"""tfyarn's shared skein driver on the real cluster (issue 21): one JVM reused by later processes, replaced when its
keeper dies (which takes its JVM with it: nothing orphaned), stopped by ``tfyarn driver stop`` and by its idle timer.

Each test has its own driver directory, so the session's shared driver (tests/conftest.py) is never touched.
"""
import json
import os
import signal
import subprocess
import sys

import pytest

from clusterutil import needs_yarn, tfyarn, wait_until
from tfyarn.backends.yarn import driver

pytestmark = [*needs_yarn, pytest.mark.timeout(600)]

#: A new process that needs a driver: it lists the cluster's apps through skein and prints the driver it used.
USE_DRIVER = """
import json
from tfyarn.backends.yarn.backend import YarnBackend
b = YarnBackend()
b.client().get_applications()
print(json.dumps({"jvm_pid": b.conn._lease.record.jvm_pid, "keeper_pid": b.conn._lease.record.keeper_pid}))
b.close()
"""


@pytest.fixture
def driver_env(tmp_path, monkeypatch):
    d = tmp_path / "drivers"
    monkeypatch.setenv(driver.DIR_ENV, str(d))
    yield {driver.DIR_ENV: str(d)}
    driver.stop_all(d)      # whatever the test left: no JVM outlives it


def _use(env: dict, idle: str = "600") -> dict:
    p = subprocess.run([sys.executable, "-c", USE_DRIVER], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env, driver.IDLE_ENV: idle})
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_second_process_reuses_the_driver_and_a_dead_keeper_takes_its_jvm_along(driver_env):
    first = _use(driver_env)
    assert not _gone(first["jvm_pid"]), "the shared driver stopped with the command that started it"
    second = _use(driver_env)
    assert second == first                             # no new JVM: the same driver answered
    st = json.loads(tfyarn("driver", "status", "--output", "json", env=driver_env).stdout)
    assert [d["jvm_pid"] for d in st["drivers"]] == [first["jvm_pid"]] and st["drivers"][0]["used_by"] == []

    os.kill(first["keeper_pid"], signal.SIGKILL)       # the keeper dies hard: its JVM sees stdin close and exits
    wait_until(lambda: _gone(first["jvm_pid"]), 60, f"the driver JVM {first['jvm_pid']} to exit after its keeper")
    third = _use(driver_env)                           # the stale record is replaced by a new driver
    assert third["jvm_pid"] != first["jvm_pid"] and not _gone(third["jvm_pid"])

    out = tfyarn("driver", "stop", env=driver_env)
    assert out.returncode == 0 and f"jvm pid {third['jvm_pid']}" in out.stdout, out.stdout + out.stderr
    assert _gone(third["jvm_pid"]) and _gone(third["keeper_pid"])
    assert "no tfyarn shared driver running" in tfyarn("driver", "status", env=driver_env).stdout


def test_an_unused_driver_stops_after_its_idle_time(driver_env):
    used = _use(driver_env, idle="3")
    wait_until(lambda: _gone(used["jvm_pid"]) and _gone(used["keeper_pid"]), 60,
               f"the idle driver (JVM {used['jvm_pid']}) to stop after TFYARN_DRIVER_IDLE=3")
    assert driver.records() == []
