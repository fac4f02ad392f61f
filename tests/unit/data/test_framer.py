"""The framing process (tfyarn.data.framer): chosen by protocol, killed mid-epoch, parent gone, cancelled early.

Real child processes over real files; the feeder tests run every case on both framing paths (the ``src`` fixture).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfyarn.data import Feeder, build_manifest, native
from tfyarn.data.framer import FramerDied
from tfyarn.data.parse import python_parser

from _datahelpers import ID_SCHEMA, framer_children, write_ids


def dataset(root, sizes=(400, 300, 500)):
    start = 0
    for i, n in enumerate(sizes):
        write_ids(f"{root}/part-{i}.tfrecord", start, n)
        start += n
    return build_manifest([f"{root}/part-*"], stride=16, use_cache=False)


def feeder(m, **kw):
    kw.setdefault("parser", python_parser)
    kw.setdefault("timeout", 30)
    return Feeder(m, ID_SCHEMA, 10, 0, 1, **kw)


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"framing process {pid} still running {timeout:g}s after its parent went away")


def test_with_the_c_loops_file_data_is_framed_in_the_reader_thread(local, no_thread_leak):
    if native.records is None:
        pytest.skip("tfyarn.data._records is not built")
    with feeder(dataset(local)) as f:
        assert f.framing == "thread" and f.framer is None
        assert sorted(int(r) for b in f.epoch(0) for r in b["rid"]) == list(range(1200))
        assert f.stats()["records_from_framing_process"] == 0 and not framer_children()


def test_without_the_c_loops_file_data_is_framed_in_a_child_process_memory_data_in_the_thread(
        local, mem, no_thread_leak, monkeypatch):
    monkeypatch.setattr(native, "records", None)
    monkeypatch.setenv("TFYARN_NATIVE", "0")
    with feeder(dataset(local)) as f:
        assert f.framing == "process"
        it = f.epoch(0)
        time.sleep(0.5)                                          # the reader is busy framing, the parser parsing:
        assert f.framer.pid is None and not framer_children()   # no process before the first batch is taken
        got = [int(r) for b in it for r in b["rid"]]             # framed here until the process is up: no wait
        assert sorted(got) == list(range(1200))
        deadline = time.monotonic() + 20
        while not f.framer.ready():
            assert time.monotonic() < deadline, "the framing process did not start within 20s"
            time.sleep(0.05)
        assert f.framer.pid in framer_children()
        got = [int(r) for b in f.epoch(1) for r in b["rid"]]
        assert sorted(got) == list(range(1200)) and f.stats()["records_from_framing_process"] == 1200
        assert f.framer.cpu_s() > 0                                # its interpreter start-up at least
    with feeder(dataset(local), framing="thread") as f:
        assert f.framer is None
    with feeder(dataset(mem)) as f:
        assert f.framing == "thread" and f.framer is None
    with pytest.raises(ValueError, match="framing='process' cannot read memory:// files"):
        feeder(dataset(mem), framing="process")
    with pytest.raises(ValueError, match="framing must be 'auto', 'process' or 'thread', not 'fork'"):
        feeder(dataset(local), framing="fork")
    with feeder(dataset(local), framing="thread") as f:
        assert f.framer is None and len(list(f.epoch(1))) == 120


def test_framing_process_killed_mid_epoch_fails_the_epoch_then_restarts(local, no_thread_leak):
    m = dataset(local, sizes=(5000, 5000))
    with feeder(m, prefetch=1, frame_records=64, parse_group=10, framing="process") as f:   # reader ~3 groups ahead
        it = f.epoch(0)
        next(it)
        pid = f.framer.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(FramerDied, match=r"record framing process .* ended unexpectedly, exit code -9"):
            for _ in it:
                pass
        assert len(list(f.epoch(1))) == f.steps(1)          # the next epoch starts a new framing process
        assert f.framer.pid != pid


def test_closing_mid_epoch_cancels_and_the_next_epoch_is_exact(local, no_thread_leak):
    m = dataset(local, sizes=(5000, 5000))
    with feeder(m, prefetch=1, frame_records=64, parse_group=10, framing="process") as f:
        first = next(iter(f.epoch(0)))
        again = next(iter(f.epoch(0)))                       # same framing process, cancelled job drained
        assert (first["rid"] == again["rid"]).all()
        pid = f.framer.pid
        assert len(list(f.epoch(0, start_step=990))) == 10 and f.framer.pid == pid


def test_framing_process_exits_when_its_parent_dies(local, tmp_path):
    dataset(local, sizes=(20000, 20000))
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path[:0] = {[os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "helpers")]!r}
        from tfyarn.data import Feeder, build_manifest
        from tfyarn.data.parse import python_parser
        from _datahelpers import ID_SCHEMA
        m = build_manifest(["{local}/part-*"], stride=16, use_cache=False)
        f = Feeder(m, ID_SCHEMA, 10, 0, 1, parser=python_parser, prefetch=1, frame_records=64, framing="process")
        next(iter(f.epoch(0)))
        print(f.framer.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"the feeder process printed {line!r} instead of its framer's pid"
        framer = int(line)
        os.kill(framer, 0)                                   # alive while the feeder process is
    finally:
        proc.kill()
        proc.wait(timeout=10)
    wait_gone(framer)


def test_which_protocols_a_child_process_can_open():
    import fsspec
    from fsspec.implementations.local import LocalFileSystem
    from tfyarn.data.framer import protocol_shared

    class Here(LocalFileSystem):
        protocol = "tfyarn-test-here"

    fsspec.register_implementation("tfyarn-test-here", Here, clobber=True)
    assert protocol_shared("/data/x.tfrecord") and protocol_shared("file:///data/x.tfrecord")
    assert protocol_shared("hdfs://nn:8020/data/x.tfrecord")        # hdfs-native's entry point: any process knows it
    assert not protocol_shared("memory://data/x.tfrecord")          # exists only in this process
    assert not protocol_shared("tfyarn-test-here:///data/x")        # registered at run time in this process only


def test_a_framing_process_whose_parent_closed_before_it_was_up_exits_quietly():
    """A feeder that finished (or closed) before its framing process started: the child's first message meets a
    closed socket. It used to print a BrokenPipeError traceback into the task's log; it exits 0, silently."""
    import socket

    from tfyarn.data.framer import _CHILD
    parent, child = socket.socketpair()
    parent.close()                                           # gone before the child sends "ready"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(child.fileno()), str(os.getpid()), root],
                              pass_fds=(child.fileno(),), capture_output=True, text=True, timeout=60)
    finally:
        child.close()
    assert (proc.returncode, proc.stderr) == (0, "")
