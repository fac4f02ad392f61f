"""The failure record of a real TF error raised in a real two-server cluster (one process, gRPC on loopback): TF
prefixes a partition's error with the task it came ``From`` — this task's own too — and triage tells a peer's
error (the cluster's) from the same error on the task's own partition (the user's) by that and the op's device."""

from __future__ import annotations

import socket

import pytest

from tfyarn.contracts.triage import INFRA, USER, classify

tf = pytest.importorskip("tensorflow")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_peers_cancelled_error_is_the_clusters_and_the_same_on_its_own_partition_the_users():
    from tfyarn.task.main import _failure_text

    cs = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{_port()}"], "worker": [f"127.0.0.1:{_port()}"]})
    tf.distribute.Server(cs, job_name="ps", task_index=0)
    worker = tf.distribute.Server(cs, job_name="worker", task_index=0)
    decided = {}
    for device in ("/job:ps/task:0", "/job:worker/task:0"):
        g = tf.Graph()
        with g.as_default():
            with tf.compat.v1.device(device):
                q = tf.queue.FIFOQueue(2, tf.float32, shared_name=f"q_{device[5:7]}")
                close, enqueue = q.close(), q.enqueue(1.0)
            with tf.compat.v1.Session(worker.target, graph=g) as sess:
                sess.run(close)
                with pytest.raises(tf.errors.CancelledError) as err:  # a closed queue: TF's Cancelled
                    sess.run(enqueue)
        text = _failure_text(err.value)
        assert "\n" not in text and len(text) <= 2000 and "Recent warning" not in text
        assert text.endswith(f"(TF op fifo_queue_enqueue on {device})"), text
        decided[device] = classify(exit_code=1, failure=text, task="worker:0")
    peer, own = decided["/job:ps/task:0"], decided["/job:worker/task:0"]
    assert (peer.cls, peer.cause, peer.free) == (INFRA, "peer_lost", True), peer
    assert 'came "From /job:ps/replica:0/task:0"' in peer.rule
    assert (own.cls, own.cause, own.free) == (USER, "exception", False), own
