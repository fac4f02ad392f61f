"""tfyarn.common.fsretry: hdfs-native's transient faults retried (reads reopen at the same offset),
permanent ones raised at once, and what is left said in one line. The errors are hdfs-native's own
texts (captured on the test cluster with its DataNode stopped); the files are fsspec's memory
filesystem behind a reader that fails a set number of reads. The real DataNode restart is
tests/yarn/test_cluster_preemption_hdfs.py."""

from __future__ import annotations

import io

import fsspec
import pytest

from tfyarn.data.tfrecord import TFRecordWriter, iter_chunks
from tfyarn.common.fsretry import (
    HdfsUnavailable,
    ReopeningReader,
    error_kind,
    is_transient,
    one_line,
    open_read,
    retry,
)

#: what hdfs-native raised when a read's DataNode was stopped (cut: the real one is ~1 KB)
ALL_FAILED = RuntimeError(
    'DataTransferError("All DataNodes failed: [DatanodeInfoProto { id: DatanodeIdProto { ip_addr: '
    '\\"127.0.0.1\\", '
    'host_name: \\"127.0.0.1\\", datanode_uuid: \\"3d2cec94\\", xfer_port: 39866, info_port: '
    '39864, ipc_port: '
    '39867, info_secure_port: Some(0) }, capacity: Some(270553174016), dfs_used: Some(21159943) '
    '}]")'
)
NOT_COMPLETE = RuntimeError('OperationFailed("Failed to complete file in time")')


class Clock:
    def __init__(self):
        self.t = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_hdfs_native_errors_are_classified_and_said_in_one_line():
    assert error_kind(ALL_FAILED) == "DataTransferError" and is_transient(ALL_FAILED)
    assert (
        is_transient(NOT_COMPLETE)
        and is_transient(ConnectionResetError())
        and is_transient(TimeoutError())
    )
    for permanent in (
        FileNotFoundError("x"),
        PermissionError("x"),
        RuntimeError('GSSAPIError("GSS_S_NO_CRED")'),
        RuntimeError('AlreadyExists("/a")'),
        ValueError("bad"),
        RuntimeError("plain bug"),
    ):
        assert not is_transient(permanent), permanent
    line = one_line(ALL_FAILED)
    assert line == "DataTransferError: All DataNodes failed (127.0.0.1:39866)"
    assert one_line(NOT_COMPLETE) == "OperationFailed: Failed to complete file in time"
    assert len(one_line(RuntimeError("x" * 5000))) <= 240


def test_retry_outlasts_a_fault_then_fails_cleanly_with_file_and_cause():
    clock = Clock()
    calls = []

    def flaky():
        calls.append(clock.t)
        if clock.t < 35:  # a DataNode down for 35 s
            raise NOT_COMPLETE
        return "uploaded"

    assert (
        retry(
            flaky,
            "checkpoint upload to",
            "hdfs://nn/ckpt",
            window_s=120,
            sleep=clock.sleep,
            clock=clock,
        )
        == "uploaded"
    )
    assert (
        clock.slept[:5] == [0.5, 1.0, 2.0, 4.0, 8.0]
        and max(clock.slept) == 8.0
        and 35 <= clock.t < 45
    )
    clock2 = Clock()
    with pytest.raises(HdfsUnavailable) as err:
        retry(
            lambda: (_ for _ in ()).throw(ALL_FAILED),
            "checkpoint upload to",
            "hdfs://nn/ckpt",
            window_s=30,
            sleep=clock2.sleep,
            clock=clock2,
        )
    msg = str(err.value)
    assert msg.startswith("HDFS unavailable: checkpoint upload to hdfs://nn/ckpt failed for ")
    assert (
        msg.endswith("DataTransferError: All DataNodes failed (127.0.0.1:39866)")
        and "\n" not in msg
    )
    assert clock2.t <= 30 and isinstance(err.value, OSError)
    n = []
    with pytest.raises(FileNotFoundError):  # permanent: raised at once, not retried
        retry(
            lambda: n.append(1) or (_ for _ in ()).throw(FileNotFoundError("/x")),
            "read",
            "/x",
            sleep=clock.sleep,
        )
    assert n == [1]


class FlakyFile(io.BytesIO):
    """A file whose reads fail while its "DataNode" is down (``down`` reads left to fail)."""

    def __init__(self, data: bytes, state: dict):
        super().__init__(data)
        self.state = state

    def read(self, size=-1):
        if self.state["down"] > 0:
            self.state["down"] -= 1
            raise ALL_FAILED
        return super().read(size)


def test_reader_reopens_at_the_same_offset_and_records_stay_whole():
    mem = fsspec.filesystem("memory")
    url = "memory://fsretry/data.tfrecord"
    with TFRecordWriter(url) as w:
        for i in range(500):
            w.write(f"record-{i:04d}".encode() * 20)
    data = mem.cat_file("/fsretry/data.tfrecord")
    state = {"down": 0, "opens": 0}

    def opener():
        state["opens"] += 1
        return FlakyFile(data, state)

    clock = Clock()
    r = ReopeningReader(
        opener, "hdfs://nn/data.tfrecord", window_s=60, sleep=clock.sleep, clock=clock
    )
    head = r.read(1000)
    state["down"] = 3  # 3 reads fail: reopened each time, read from byte 1000
    rest = r.read(-1)
    assert head + rest == data and state["opens"] == 4 and r.reopened == 3 and r.tell() == len(data)
    assert clock.slept == [0.5, 1.0, 2.0]
    r.seek(123)
    state["down"] = 10**6  # down for good: one line naming the file and the offset
    with pytest.raises(HdfsUnavailable) as err:
        r.read(10)
    assert str(err.value).startswith(
        "HDFS unavailable: read hdfs://nn/data.tfrecord at byte 123 failed for "
    )
    r.close()
    # the TFRecord reader over a local/memory URL is unchanged (no wrapper off HDFS)
    assert not isinstance(open_read(url), ReopeningReader)
    assert sum(len(c.payloads) for c in iter_chunks(url, 0, 500)) == 500
