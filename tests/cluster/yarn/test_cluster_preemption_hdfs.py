"""HDFS faults on the real cluster: the only DataNode stopped for more than 30 s while a reader is
half-way through a TFRecord file and a checkpoint upload starts. Both go on once it is back (the
reader reopens at the same offset, the upload is retried with backoff); a read whose retry window is
shorter than the outage fails with one line naming the file, the offset and hdfs-native's cause.
Plain hdfs-native clients, no YARN app: the lean way to restart the DataNode under a read (a job's
tasks read the same code path: tfyarn/data/tfrecord.open_records).

It stops the cluster's DataNode: only on a cluster of one's own (scripts/test-yarn's, or
scripts/hadoop-cluster --port-offset), said by TFYARN_BREAKABLE_CLUSTER=1."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time

import pytest

from clusterutil import cpu_hog, needs_yarn  # noqa: F401 - cpu_hog: a fixture

pytestmark = [
    *needs_yarn,
    pytest.mark.skipif(
        os.environ.get("TFYARN_BREAKABLE_CLUSTER") != "1",
        reason="stops the cluster's DataNode: set TFYARN_BREAKABLE_CLUSTER=1 on a cluster of your "
               "own (scripts/test-yarn)",
    ),
]

OUTAGE_S = 32.0


def datanode(action: str) -> None:
    """``hdfs --daemon stop|start datanode`` of the cluster HADOOP_CONF_DIR names (its hadoop-env.sh
    has the pids)."""
    r = subprocess.run(
        ["hdfs", "--daemon", action, "datanode"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert r.returncode == 0, f"hdfs --daemon {action} datanode: {r.stderr[-1500:]}"


@pytest.mark.usefixtures("cpu_hog")
def test_a_datanode_restart_of_30s_is_survived_by_reads_and_checkpoint_uploads(
    hdfs_root, tmp_path, caplog, monkeypatch
):
    """Under a CPU hog (issue 40): the box's cores saturated for the whole outage."""
    import fsspec

    from tfyarn.cluster import hdfs
    from tfyarn.data.tfrecord import FrameOptions, TFRecordWriter, iter_chunks
    from tfyarn.common.fsretry import HdfsUnavailable, ReopeningReader
    from tfyarn.train.checkpoint import CheckpointStore

    caplog.set_level(logging.WARNING, logger="tfyarn.common.fsretry")
    url = hdfs.join(hdfs_root, "dn-restart", "big.tfrecord")
    n, payload = 60_000, 300  # ~18 MB: more than a reader buffers ahead
    with TFRecordWriter(url) as w:
        for i in range(n):
            w.write(i.to_bytes(4, "little") * (payload // 4))
    local = tmp_path / "ckpt"
    local.mkdir()
    for name, size in (("ckpt-7.index", 4096), ("ckpt-7.data-00000-of-00001", 3 << 20)):
        (local / name).write_bytes(os.urandom(size))
    store = CheckpointStore(hdfs.join(hdfs_root, "dn-restart", "ckpt"))

    chunks = iter_chunks(url, 0, n, opts=FrameOptions(block_bytes=256 << 10, max_records=500))
    seen = [int.from_bytes(p[:4], "little") for p in next(chunks).payloads]
    fs, path = fsspec.core.url_to_fs(url)
    datanode("stop")
    t_down = time.monotonic()
    restarted = threading.Timer(OUTAGE_S, datanode, args=("start",))
    restarted.start()
    try:
        # a short retry window fails cleanly, in one line: the file, the offset, the cause
        short = ReopeningReader(lambda: fs.open(path, "rb"), url, window_s=3)
        short.seek(1 << 20)
        with pytest.raises(HdfsUnavailable) as err:
            short.read(1 << 20)
        msg = str(err.value)
        assert (
            f"read {url} at byte 1,048,576 failed for" in msg and "\n" not in msg and len(msg) < 400
        ), msg
        assert "DatanodeInfoProto" not in msg and (
            "DataTransferError" in msg or "OperationFailed" in msg
        ), msg

        # a checkpoint upload started during the outage, and the reader going on through it
        uploaded: list = []
        up = threading.Thread(
            target=lambda: uploaded.append(store.upload(str(local / "ckpt-7"), 7))
        )
        up.start()
        for chunk in chunks:
            seen.extend(int.from_bytes(p[:4], "little") for p in chunk.payloads)
        read_done = time.monotonic() - t_down
        up.join(240)
        assert not up.is_alive(), (
            "the checkpoint upload did not end within 240 s of the DataNode's restart"
        )
    finally:
        restarted.join()
    assert seen == list(range(n)), "records lost or repeated across the DataNode restart"
    assert read_done >= OUTAGE_S - 1, (
        f"the read ended {read_done:.1f}s into a {OUTAGE_S}s outage: not exercised"
    )
    assert uploaded and uploaded[0]["global_step"] == 7 and store.latest()["name"] == "ckpt-7"
    warnings = [r.getMessage() for r in caplog.records]
    assert any("reopening" in m for m in warnings) and any(
        "checkpoint upload to" in m for m in warnings
    ), warnings
