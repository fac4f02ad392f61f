"""Preemption on the real cluster: the CapacityScheduler's ProportionalCapacityPreemptionPolicy
takes containers of a job in queue ``a`` (over its 40 % share) when an app in queue ``b`` asks for
its share. Queues a/b are switched on for this module with ``scripts/hadoop-cluster queues DATA on``
(``yarn rmadmin -refreshQueues``) and off after it; the ResourceManager must run the preemption
monitor (``scripts/hadoop-cluster start --preemption``, as scripts/test-yarn does). Only on a
cluster of one's own: TFYARN_BREAKABLE_CLUSTER=1."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.request

import pytest
import yaml
from clusterutil import (
    FAULT_JOBS,
    JOB_S,
    ROOT,
    CliRun,
    CpuHog,
    assert_causes_named,
    assert_clean,
    attempt_record,
    job_doc,
    needs_yarn,
    planned_steps,
    unique,
    wait_for_step,
    wait_until,
)

from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

pytestmark = [
    *needs_yarn,
    pytest.mark.skipif(
        os.environ.get("TFYARN_BREAKABLE_CLUSTER") != "1",
        reason="reconfigures the cluster's queues: set TFYARN_BREAKABLE_CLUSTER=1 on a cluster of "
               "your own",
    ),
]

# : memory of one worker / one hog container: three workers on the two 16 GB nodes put queue a over
# its 40 % share,
# : two hog containers of 10 GB fit on no node without taking some away (the newest containers of a:
# workers)
WORKER_MIB, HOG_MIB = 6144, 10240


def _rm_web() -> str:
    from tfyarn.cluster.hdfs import load_hadoop_conf

    return "http://" + load_hadoop_conf().get(
        "yarn.resourcemanager.webapp.address", "127.0.0.1:8088"
    )


@pytest.fixture(scope="module")
def queues():
    """Queues default/a/b with preemption for this module (the RM's monitor must already run)."""
    data = os.environ.get("HADOOP_DATA_DIR")
    assert data, "HADOOP_DATA_DIR (set by the bundle's env.sh) names the cluster's data dir"
    with urllib.request.urlopen(_rm_web() + "/conf", timeout=30) as r:
        conf = r.read().decode()
    assert "ProportionalCapacityPreemptionPolicy" in conf, (
        "the ResourceManager runs no preemption monitor: start the cluster with "
        "scripts/hadoop-cluster --preemption"
    )

    def run(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(ROOT / "scripts" / "hadoop-cluster"), "queues", data, mode],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = run("on")
    assert r.returncode == 0 and '"queueName":"b"' in r.stdout + r.stderr, r.stdout + r.stderr
    yield
    r = run("off")
    assert r.returncode == 0, r.stderr


def _hog(yarn, tag: str) -> str:
    """An app in queue b asking for its share: two containers that sleep."""
    from tfyarn.cluster._skein import skein

    sk = skein()
    spec = sk.ApplicationSpec(
        name="hog",
        queue="b",
        tags={tag},
        services={
            "hog": sk.Service(
                script="sleep 900", instances=2, resources=sk.Resources(memory=HOG_MIB, vcores=1)
            )
        },
        master=sk.Master(resources=sk.Resources(memory=256, vcores=1)),
    )
    return yarn.client().submit(spec)


@pytest.fixture(params=["quiet", "cpu-hog"])
def load(request):
    """The async preemption test twice: as it is, and with the box's cores saturated from its first steps to its
    end (issue 40: at load 30-47 a returning worker's next step got TF's "RunGraph request received twice" from
    the ps, and the job FAILED). The hog starts once the job trains: a start under it took minutes, testing
    nothing more."""
    return None if request.param == "quiet" else CpuHog()


@pytest.mark.timeout(5 * JOB_S)
def test_async_workers_preempted_come_back_in_place_without_using_the_restart_budget(
    yarn, dataset, hdfs_root, tmp_path, queues, load
):
    """Async ps job in queue a with ``max_restarts: 0``: the scheduler preempts workers for an app
    in queue b; each comes back in place (a new container, same task) once resources return, the
    budget of 0 restarts untouched; the job reaches its planned global step in one attempt and says
    what happened, the cause of every restart with the triage rule; nothing is left running. Also
    under a CPU hog (``load``), where TF's transient errors between worker and ps show."""
    name = unique("preempt-async")
    doc = job_doc(
        dataset,
        name,
        sync=False,
        workers=3,
        # under the hog the queue-b app's AM and the preemption take a minute or two: a longer job, still mid-run
        epochs=30 if load is None else 60,
        ckpt=hdfs.join(hdfs_root, name, "ckpt"),
        every_steps=50,
        model="fault_models:slow_recommender",
        code=str(FAULT_JOBS),
        queue="a",
        memory="512 MiB",
    )
    doc["roles"]["worker"]["memory"] = f"{WORKER_MIB} MiB"
    # under the hog the job's start takes minutes and training only seconds: slower steps keep it mid-run while
    # the queue-b app's AM starts and the scheduler preempts (measured: hog launched 66 s before a 0.15 s-step end)
    doc["params"]["step_delay_s"] = 0.15 if load is None else 0.4
    spec = load_spec_dict(doc)
    total = (
        sum(planned_steps(spec)) * spec.num_training_workers
    )  # async: every training task's steps
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    run = subprocess.Popen(
        [sys.executable, "-m", "tfyarn.cli", "run", str(path), "--yarn", "--output", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    hog = None
    with contextlib.ExitStack() as loaded:  # the hog (load) from the job's first steps to its end
        try:
            app_id = wait_until(
                lambda: [a.app_id for a in yarn.list() if name in a.tags], JOB_S, f"{name}'s app"
            )[0]
            # under the hog the queue-b app's AM starts slowly: asked for sooner, so that it preempts mid-run
            wait_for_step(yarn, app_id, "worker:0", 20 if load is None else 3)
            if load is not None:
                loaded.enter_context(load)
            hog = _hog(yarn, name)
            app = yarn.client().connect(app_id)

            def preempted():
                try:
                    got = app.get_containers(services=["worker"], states=["FAILED"])
                except Exception as exc:  # skein's ConnectionError: the app has ended
                    raise AssertionError(f"{app_id} ended before the scheduler preempted a worker ({exc})") from exc
                return [c for c in got if "preempted" in (c.exit_message or "")]

            gone = wait_until(preempted, 120 if load is None else 300, "the scheduler to preempt a worker of queue a")
            st = yarn.status(app_id)
            assert st.state in (AppState.RUNNING, AppState.PENDING), (st.state, st.diagnostics)
            yarn.kill(hog)
            hog = None
            _, err = run.communicate(timeout=2 * JOB_S)
        finally:
            if hog:
                yarn.kill(hog)
            if run.poll() is None:
                run.kill()
    assert run.returncode == 0, err[-3000:]
    final = yarn.status(app_id)
    assert final.state is AppState.SUCCEEDED and final.attempt == 0, (
        final.state,
        final.diagnostics,
    )
    assert int(final.progress.get("global_step") or 0) == total
    workers = {t.task: t for t in final.tasks if t.task.startswith("worker:")}
    assert set(workers) == {"worker:0", "worker:1", "worker:2"}  # no phantom worker:3
    assert "preempted by the scheduler" in final.diagnostics, final.diagnostics  # in words
    # replaced in place despite max_restarts: 0
    assert sum(t.restarts for t in workers.values()) >= len(gone)
    assert_causes_named(final.causes, sum(t.restarts for t in workers.values()))
    assert any("preempt" in c["words"] for c in final.causes), final.causes
    assert_clean(yarn, app_id, tag=name)


@pytest.mark.timeout(6 * JOB_S)
def test_a_sync_job_preempted_resumes_from_its_checkpoint_without_using_an_attempt(
    yarn, dataset, hdfs_root, tmp_path, queues
):
    """Sync ps job with ``retry.max_attempts: 1``: a preempted worker cannot rejoin a lockstep
    round, so the attempt ends; the preemption is said in its record and uses none of the one
    attempt: the in-app supervisor starts attempt 1 in the same application, which resumes from the
    latest checkpoint and reaches the planned global step (followed by ``tfyarn run``, which
    submits nothing more). Under a CPU hog (issue 40) from past its first checkpoint to its end, one run: the quiet
    case is the async test's."""
    name = unique("preempt-sync")
    every = 20
    doc = job_doc(
        dataset,
        name,
        sync=True,
        workers=3,
        epochs=40,
        ckpt=hdfs.join(hdfs_root, name, "ckpt"),
        every_steps=every,
        model="fault_models:slow_recommender",
        code=str(FAULT_JOBS),
        queue="a",
        memory="512 MiB",
        retry={"max_attempts": 1, "backoff": "1s"},
    )
    doc["roles"]["worker"]["memory"] = f"{WORKER_MIB} MiB"
    # under the hog training is seconds after minutes of start-up: slower steps keep it running until the preemption
    doc["params"]["step_delay_s"] = 0.5
    spec = load_spec_dict(doc)
    total = sum(planned_steps(spec))
    hog = None
    with CliRun(doc, tmp_path) as run, contextlib.ExitStack() as loaded:
        try:
            first = run.submitted(
                lambda: [a.app_id for a in yarn.list() if name in a.tags], JOB_S, f"{name}'s app"
            )[0]
            wait_for_step(yarn, first, "chief:0", 2 * every)  # past a checkpoint
            loaded.enter_context(CpuHog())
            hog = _hog(yarn, name)
            ended = wait_until(
                lambda: attempt_record(yarn, first, 0), 180, "the preemption to end attempt 0"
            )
            yarn.kill(hog)
            hog = None
        finally:
            if hog:
                yarn.kill(hog)
        final = run.status(3 * JOB_S)
    assert "preempted by the scheduler" in ended["diagnosis"], ended
    assert ended["cause"] and "preempt" in ended["cause"], ended
    assert 0 < ended["resumes_at"] <= ended["reached"], ended  # resumed from a checkpoint
    apps = [a.app_id for a in yarn.list(all_states=True) if name in a.tags]
    assert apps == [first], apps  # the attempt ran inside the application: nothing resubmitted
    assert (final["app_id"], final["state"], final["attempt"]) == (first, "SUCCEEDED", 1), final
    last = yarn.status(first)
    assert last.state is AppState.SUCCEEDED and last.attempt == 1, (last.state, last.attempt)
    assert int(last.progress.get("global_step") or 0) == total
    totals = final["summary"]["attempts"]  # both attempts counted, the steps redone said
    assert totals["attempts"] == 2 and len(totals["by_attempt"]) == 1, totals
    assert_causes_named(last.causes, 1)
    assert any(c["kind"] == "attempt" and c["free"] for c in last.causes), last.causes
    assert_clean(yarn, *apps, tag=name)
