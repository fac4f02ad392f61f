"""The shared skein driver's rules that need no cluster: which driver may be reused, the idle setting, leases."""
import os
import subprocess
import sys

import pytest

from tfyarn.backends.yarn import driver
from tfyarn.errors import YarnUnavailable


def test_a_driver_is_reused_only_for_the_same_login_and_cluster(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    base = driver.identity("alice", "alice@R", str(conf), {})
    assert driver.key_of(base) == driver.key_of(driver.identity("alice", "alice@R", str(conf), {}))
    others = [driver.identity("alice", "bob@R", str(conf), {}),          # another principal
              driver.identity("bob", "alice@R", str(conf), {}),          # another YARN user
              driver.identity("alice", "alice@R", str(tmp_path), {}),    # another cluster
              driver.identity("alice", "alice@R", str(conf), {"java_options": ["-Dx=1"]})]
    assert len({driver.key_of(i) for i in [base, *others]}) == 5


@pytest.mark.parametrize("raw, secs", [("", 900.0), ("90", 90.0), ("2.5s", 2.5), ("15m", 900.0), ("1h", 3600.0),
                                       ("0", 0.0)])
def test_idle_setting(monkeypatch, raw, secs):
    monkeypatch.setenv(driver.IDLE_ENV, raw)
    assert driver.idle_seconds() == secs


def test_a_bad_idle_setting_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(driver.IDLE_ENV, "soon")
    with pytest.raises(YarnUnavailable, match="TFYARN_DRIVER_IDLE"):
        driver.idle_seconds()


def test_a_dead_commands_lease_no_longer_holds_the_driver(tmp_path):
    files = driver._Files(tmp_path, "k")
    files.leases.mkdir(parents=True)
    (files.leases / str(os.getpid())).write_text(driver._start_time(os.getpid()))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (files.leases / str(dead.pid)).write_text("1")
    reused = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:   # a live pid whose start time differs from the lease's: the pid was reused, the lease is stale
        (files.leases / str(reused.pid)).write_text("1")
        assert files.live_leases() == [os.getpid()]
        assert sorted(p.name for p in files.leases.iterdir()) == [str(os.getpid())]
        assert files.last_used() > 0            # the stale leases marked a use
    finally:
        reused.kill()
        reused.wait()


def test_a_stale_record_never_gets_an_unrelated_process_killed(tmp_path):
    """A record left by a driver that died long ago may name pids other processes have since: replacing or stopping
    it must not signal them."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rec = driver.Record(key="k", address="127.0.0.1:1", jvm_pid=other.pid, keeper_pid=other.pid,
                                 keeper_started="1", user="u", principal="", hadoop_conf_dir="", idle_s=1.0,
                                 started=0.0, log=str(tmp_path / "k.log"))
        assert not rec.alive
        driver._Files(tmp_path, "k").write(rec)
        assert [r.key for r in driver.stop_all(tmp_path)] == ["k"]
        assert other.poll() is None and driver.records(tmp_path) == []
    finally:
        other.kill()
        other.wait()


def test_a_driver_that_accepts_but_never_answers_is_not_reused():
    """A hung JVM still accepts connections (the kernel does): the ping is bounded, so it is replaced, not waited on."""
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        assert not driver.answers(f"127.0.0.1:{srv.getsockname()[1]}", timeout=1.0)
    finally:
        srv.close()
