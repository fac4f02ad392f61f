"""A node lost under a running job, on the real cluster: the NodeManager of a worker's node is
frozen (SIGSTOP: it answers nothing, heartbeats stop, as a dead or cut-off host) and so is the
worker's container. The in-app supervisor names the loss after ``timeouts.node_lost`` (8 s here),
well before YARN's own expiry (20 s on scripts/test-yarn's cluster, 10 minutes by default), and ends
the attempt at once: its record starts with the lost node, not with a peer's error. The attempt is
the cluster's doing, so ``retry.max_attempts: 1`` still allows attempt 1, which the supervisor starts
in the same application; it resumes from the checkpoint and reaches the planned global step. The
node is thawed right after the attempt ends.

Freezing rather than killing keeps the cluster whole for the tests after it and leaves the
application master and the in-app supervisor running wherever they are (they are other processes
than the frozen ones). Only on a cluster of one's own: TFYARN_BREAKABLE_CLUSTER=1."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil
import pytest
from clusterutil import (
    FAULT_JOBS,
    JOB_S,
    CliRun,
    CpuHog,
    assert_clean,
    attempt_record,
    job_doc,
    needs_yarn,
    planned_steps,
    task_process,
    unique,
    wait_for_step,
    wait_until,
)

from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

pytestmark = [
    *needs_yarn,
    pytest.mark.timeout(4 * JOB_S),
    pytest.mark.skipif(
        os.environ.get("TFYARN_BREAKABLE_CLUSTER") != "1",
        reason="freezes a NodeManager: set TFYARN_BREAKABLE_CLUSTER=1 on a cluster of your own "
               "(scripts/test-yarn)",
    ),
]


def _nodemanager(host: str) -> psutil.Process:
    """The NodeManager JVM serving ``host`` (127.0.0.2: scripts/hadoop-cluster's second one), by its
    pid file."""
    data = Path(os.environ["HADOOP_DATA_DIR"])
    pids = data / ("nm2" if host == "127.0.0.2" else "") / "pids"
    f = next(pids.glob("hadoop-*-nodemanager.pid"))
    p = psutil.Process(int(f.read_text().strip()))
    assert "-Dproc_nodemanager" in " ".join(p.cmdline()), p.cmdline()
    return p


def test_a_lost_node_ends_the_attempt_in_seconds_naming_it_and_uses_no_attempt(
    yarn, dataset, hdfs_root, tmp_path
):
    """Under a CPU hog (issue 40) from past the first checkpoint to the end: the node's loss is noticed in seconds
    under load too."""
    name = unique("node-lost")
    every = 10
    doc = job_doc(
        dataset,
        name,
        sync=False,
        workers=2,
        epochs=5,
        ckpt=hdfs.join(hdfs_root, name, "ckpt"),
        every_steps=every,
        model="fault_models:slow_recommender",
        code=str(FAULT_JOBS),
        memory="512 MiB",
        retry={"max_attempts": 1, "backoff": "1s"},
    )
    doc["timeouts"]["node_lost"] = 8
    doc["params"]["step_delay_s"] = 0.25
    spec = load_spec_dict(doc)
    total = sum(planned_steps(spec)) * spec.num_training_workers
    frozen: list[psutil.Process] = []
    with CliRun(doc, tmp_path) as run, contextlib.ExitStack() as loaded:
        try:
            first = run.submitted(
                lambda: [a.app_id for a in yarn.list() if name in a.tags], JOB_S, f"{name}'s app"
            )[0]
            wait_for_step(yarn, first, "chief:0", 2 * every)
            loaded.enter_context(CpuHog())
            st = yarn.status(first)
            victim = next(
                t for t in st.tasks if t.task.startswith("worker:") and t.state == "RUNNING"
            )
            proc = task_process(yarn, first, victim.task)
            nm = _nodemanager(victim.host or "")
            group = [
                p
                for p in psutil.process_iter()
                if p.pid > 1 and _pgid(p.pid) == os.getpgid(proc.pid)
            ]
            for p in [nm, *group]:
                p.suspend()
                frozen.append(p)
            t_frozen = time.time()
            ended = wait_until(
                lambda: attempt_record(yarn, first, 0),
                60,
                f"attempt 0 to end after {victim.task}'s node froze",
            )
        finally:
            for p in frozen:
                try:
                    p.resume()
                except psutil.Error:
                    pass
        final = run.status(3 * JOB_S)
    lost, _, rest = ended["diagnosis"].partition(f" lost with its node {victim.host} (")
    assert rest and victim.task in lost.split(", ") and "\n" not in lost, ended  # the root cause first
    assert "has not answered for" in rest.split("\n")[0], ended
    took = ended["ended"] - t_frozen  # noticed, its containers killed, the attempt's keys cleared
    assert took < 20, (
        f"the lost node was noticed {took:.1f}s after it froze: not before YARN's own expiry"
    )
    apps = [a.app_id for a in yarn.list(all_states=True) if name in a.tags]
    assert apps == [first], apps  # the next attempt ran inside the application
    # attempt 1 may itself have been placed on the frozen node before YARN knew: a lost node again,
    # free again
    assert (final["app_id"], final["state"]) == (first, "SUCCEEDED") and final["attempt"] >= 1, final
    last = yarn.status(first)
    assert last.state is AppState.SUCCEEDED and last.attempt == final["attempt"], last.attempt
    assert int(last.progress.get("global_step") or 0) == total
    assert any(c["kind"] == "attempt" and c["free"] and c["rule"] for c in last.causes), last.causes
    assert_clean(yarn, *apps, tag=name)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
