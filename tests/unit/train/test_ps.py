"""ps mode with real processes (ps, chief, workers over loopback gRPC, the real KV service) and graph inspection.

Figures from issue 4's done-when: files of 3000/2500/2000/1500/1000 records, batch 1000, 2 training workers,
3 epochs, sync: it finishes, every worker ran the same number of steps, the final global step is the planned one;
a slow worker holds a fast one back (no extra steps); killed mid-run and started again it resumes at the right
epoch and step.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from harness import LocalCluster, check_export_matches_checkpoint
from tfyarn.spec import load_spec_dict

FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}
ISSUE_SIZES = [3000, 2500, 2000, 1500, 1000]


def write_sized(root: Path, sizes: list[int], seed: int = 0) -> list[str]:
    """Recommender TFRecords with exactly ``sizes`` records per file; labels follow one hidden dot product."""
    from tfyarn.data import TFRecordWriter
    from tfyarn.data.example import encode_example

    rng = np.random.default_rng(seed)
    U, V = rng.normal(size=(100, 4)), rng.normal(size=(100, 4))
    root.mkdir(parents=True, exist_ok=True)
    urls = []
    for i, n in enumerate(sizes):
        url = str(root / f"part-{i:05d}.tfrecord")
        u, it = rng.integers(0, 100, n), rng.integers(0, 100, n)
        lab = ((U[u] * V[it]).sum(axis=1) > 0).astype("float32")
        with TFRecordWriter(url, compression="none") as w:
            for a, b, c in zip(u.tolist(), it.tolist(), lab.tolist()):
                w.write(encode_example({"user_id": np.array([a], np.int64), "item_id": np.array([b], np.int64),
                                        "label": np.array([c], np.float32)}))
        urls.append(url)
    return urls


def make_spec(train: list[str], *, sync: bool, batch: int, epochs: int, ps: int = 1, workers: int = 1,
              ckpt: Path | None = None, every_steps: int | None = None, params: dict | None = None,
              export: Path | None = None):
    doc = {"name": "pstest", "model": "tfyarn.models.recommender:model",
           "params": params or {"num_users": 100, "num_items": 100, "dim": 8, "learning_rate": 0.2},
           "mode": "ps", "sync": sync,
           "data": {"train": train, "features": FEATURES, "batch_size": batch, "epochs": epochs},
           "roles": {"ps": {"instances": ps}, "chief": {"instances": 1}, "worker": {"instances": workers}},
           "timeouts": {"step": 60, "rendezvous": 120}}
    if ckpt:
        doc["checkpoint"] = {"dir": f"file://{ckpt}", "every_steps": every_steps, "every_secs": None, "keep": 2}
    if export:
        doc["export"] = {"dir": str(export)}
    return load_spec_dict(doc)


def planned_steps(spec) -> list[int]:
    from tfyarn.data import build_manifest, plan
    m = build_manifest(spec.data.train)
    return [plan(m, spec.num_training_workers, e, spec.data.shuffle_seed, spec.data.batch_size).steps
            for e in range(spec.data.epochs)]


def run_ok(cluster: LocalCluster, timeout: float) -> dict:
    codes = cluster.wait(timeout=timeout)
    bad = {t: c for t, c in codes.items() if c != 0}
    assert not bad, "tasks failed: " + "\n".join(f"--- {t} ({c})\n{cluster.log(t)[-3000:]}" for t, c in bad.items())
    return json.loads(cluster.kv.get("summary"))


# ---------------------------------------------------------------------------------------------- graph inspection
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [False, True])
def test_no_dataset_or_iterator_op_on_a_ps_and_variables_balanced(tmp_path, sync):
    from tfyarn.tasklib.context import TaskContext
    from tfyarn.tasklib.kv import MemoryKV
    from tfyarn.train import load
    from tfyarn.train.ps.graph import build_graph

    spec = make_spec(["unused"], sync=sync, batch=10, epochs=1, ps=2,
                     params={"num_users": 5000, "num_items": 3000, "dim": 8})
    cluster = {"ps": ["127.0.0.1:1", "127.0.0.1:2"], "chief": ["127.0.0.1:3"], "worker": ["127.0.0.1:4"]}
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=MemoryKV(), cluster=cluster)
    tg = build_graph(ctx, load(spec.model, spec.params))
    ops = tg.graph.get_operations()
    on_ps = [op for op in ops if "/job:ps" in op.device]
    assert on_ps, "no op on a ps at all: placement did not happen"
    bad = [(op.name, op.type, op.device) for op in on_ps if re.search("Dataset|Iterator", op.type)]
    assert bad == []
    assert not [op for op in ops if re.search("Dataset|Iterator", op.type)], "the fed graph has no input pipeline"
    assert all(op.device.startswith("/job:worker/task:0") for op in ops if op.type == "Placeholder")
    var_dev = {op.name: op.device for op in ops if op.type == "VarHandleOp"}
    assert all("/job:ps" in d for n, d in var_dev.items() if n != "tfyarn_local_step")
    # the two embedding tables (5000x8 and 3000x8 floats) must not share a ps
    assert var_dev["user_embedding"] != var_dev["item_embedding"]
    # by size, not round-robin: creation order users, items, user_bias... would put user_bias with users
    assert var_dev["user_bias"] != var_dev["user_embedding"]
    # optimizer slots live with their variable, and the logged placement says so
    assert var_dev["user_embedding/Adagrad"] == var_dev["user_embedding"]
    assert tg.placement["item_bias/Adagrad"] == tg.placement["item_bias"]


# --------------------------------------------------------------------------------------------------- real processes
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sync_issue_figures_equal_steps_and_slow_worker_holds_fast_one_back(tmp_path):
    """Done-when: 3000/2500/2000/1500/1000 records, batch 1000, 2 workers, 3 epochs, sync. worker:0 is slow
    (0.3 s per step): the chief must wait for it every round, so it cannot run extra steps."""
    urls = write_sized(tmp_path / "data", ISSUE_SIZES)
    spec = make_spec(urls, sync=True, batch=1000, epochs=3, ckpt=tmp_path / "ckpt", every_steps=2)
    steps = planned_steps(spec)
    total = sum(steps)
    assert total >= 6
    slow_s = 0.3
    with LocalCluster(spec, tmp_path / "run", target="tfyarn.train:run_task",
                      targets={"worker:0": "tests.unit.train.ps_targets:slow"},
                      env={"TFYARN_TEST_SLOW_S": str(slow_s)}) as c:
        c.start()
        summary = run_ok(c, timeout=200)
        chief_log = c.log("chief:0")
    assert summary["global_step"] == summary["total_steps"] == total
    assert summary["steps_per_worker"] == {"chief:0": total, "worker:0": total}
    assert summary["sync"] is True and summary["global_batch_size"] == 2000
    assert summary["checkpoint_dir"] == spec.checkpoint.dir and summary["last_checkpoint"] == f"ckpt-{total}"
    assert summary["resumed_from"] is None and summary["num_workers"] == 2 and summary["last_loss"] is not None
    # lockstep: the fast chief took at least as long as the slow worker's delays (it could not run ahead)
    assert summary["train_s"] >= 0.8 * slow_s * total, summary
    assert "sync lockstep broken" not in chief_log
    on_disk = json.loads((tmp_path / "ckpt" / "summary.json").read_text())
    assert on_disk["global_step"] == total
    from tfyarn.train.checkpoint import CheckpointStore
    latest = CheckpointStore(str(tmp_path / "ckpt")).latest()
    assert latest["global_step"] == total and latest["worker_steps"] == [total, total]
    assert latest["epoch"] == 3 and latest["format"] == "v1-saver"
    kept = [p.name for p in tmp_path.rglob("ckpt-save/ckpt-*.index")]      # a checkpoint every 2 steps, and the
    assert kept == [f"ckpt-{total}.index"], kept                             # chief's disk holds only the last one


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_async_two_ps_trains_to_the_planned_global_step_and_loss_goes_down(tmp_path):
    from tfyarn.data import write_synthetic
    urls = write_synthetic(str(tmp_path / "data"), "recommender", files=4, records=8000, skew=4, seed=3,
                           users=200, items=200, dim=4)
    spec = make_spec(urls, sync=False, batch=100, epochs=3, ps=2, ckpt=tmp_path / "ckpt", export=tmp_path / "models",
                     params={"num_users": 200, "num_items": 200, "dim": 8, "learning_rate": 0.3})
    steps = planned_steps(spec)
    per_worker = sum(steps)
    t0 = time.monotonic()
    with LocalCluster(spec, tmp_path / "run", target="tfyarn.train:run_task") as c:
        c.start()
        summary = run_ok(c, timeout=200)
        assert c.kv.get("plan/total_steps") == str(2 * per_worker)
        progress = {t: json.loads(c.kv.get(f"progress/{t}")) for t in ("chief:0", "worker:0")}
        chief_log = c.log("chief:0")
    assert summary["global_step"] == summary["total_steps"] == 2 * per_worker
    assert summary["steps_per_worker"] == {"chief:0": per_worker, "worker:0": per_worker}
    assert summary["last_loss"] < summary["first_loss"] * 0.9, summary
    assert summary["examples_per_sec"] > 0 and summary["num_ps"] == 2 and summary["mode"] == "ps"
    assert all(p["step"] == per_worker and p["done"] for p in progress.values())
    assert "training done: global step" in chief_log and "first step" in chief_log
    assert time.monotonic() - t0 < 200
    # export: the final checkpoint (variables on 2 ps, name-based) as a SavedModel serving exactly its model
    final = f"ckpt-{2 * per_worker}"
    assert summary["last_checkpoint"] == final
    assert summary["export"]["url"] == str(tmp_path / "models" / str(2 * per_worker))
    assert summary["export"]["checkpoint"] == final and summary["export"]["version"] == 2 * per_worker
    assert summary["export"]["downloaded"] is False          # from the chief's local copy of what it uploaded
    kept = [p.name for p in tmp_path.rglob("ckpt-save/ckpt-*.index")]
    assert kept == [f"{final}.index"], kept                   # local copies do not pile up: only the last one stays
    check_export_matches_checkpoint(spec, summary["export"]["url"], final)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_mid_run_resumes_at_the_right_epoch_and_step(tmp_path):
    from tfyarn.train.checkpoint import CheckpointStore
    from tfyarn.train.helpers import position

    urls = write_sized(tmp_path / "data", ISSUE_SIZES)
    ckpt = tmp_path / "ckpt"
    spec = make_spec(urls, sync=True, batch=500, epochs=3, ckpt=ckpt, every_steps=3)
    steps = planned_steps(spec)
    total = sum(steps)
    store = CheckpointStore(str(ckpt))
    slow = {"chief:0": "tests.unit.train.ps_targets:slow", "worker:0": "tests.unit.train.ps_targets:slow"}
    with LocalCluster(spec, tmp_path / "run1", target="tfyarn.train:run_task", targets=slow,
                      env={"TFYARN_TEST_SLOW_S": "0.4"}) as c:
        c.start()
        deadline = time.monotonic() + 150
        while (store.latest() or {}).get("global_step", 0) < steps[0] + 1:
            assert time.monotonic() < deadline, "no checkpoint past the first epoch within 150s:\n" + c.log("chief:0")
            assert c.procs["chief:0"].poll() is None, c.log("chief:0")
            time.sleep(0.2)
        c.kill()
        codes = {t: p.returncode for t, p in c.procs.items()}
    assert codes["chief:0"] != 0, "the job finished before it was killed: the test proves nothing"
    at_kill = store.latest()
    g = at_kill["global_step"]
    assert steps[0] < g < total
    epoch, in_epoch = position(g, steps)
    with LocalCluster(spec, tmp_path / "run2", target="tfyarn.train:run_task") as c:
        c.start()
        summary = run_ok(c, timeout=450)
        chief_log, worker_log = c.log("chief:0"), c.log("worker:0")
    expected = f"resuming at epoch {epoch} step {in_epoch} (global step {g})"
    assert expected in chief_log and expected in worker_log, chief_log[-3000:]
    assert f"resuming from {at_kill['name']}" in chief_log
    assert summary["global_step"] == summary["total_steps"] == total
    assert summary["steps_per_worker"] == {"chief:0": total, "worker:0": total}
    # Run it again (a scheduler's retry after the job had finished): the chief restores the final checkpoint and is
    # done at once, the ps leave; a worker still starting must end cleanly, not fail on the vanished ps.
    with LocalCluster(spec, tmp_path / "run3", target="tfyarn.train:run_task") as c:
        c.start()
        again = run_ok(c, timeout=450)
    assert again["global_step"] == total and again["resumed_from"] == f"ckpt-{total}", again


@pytest.mark.timeout(900)
def test_warm_start_loads_another_jobs_model_in_both_modes_and_starts_the_run_afresh(tmp_path):
    """checkpoint.init_from: a ps job's model warm-starts an allreduce job, whose model warm-starts a ps job. With a
    learning rate of ~0 the warm-started job's final model variables equal its source's exactly (loaded, by creation
    order, across checkpoint formats), while its global step starts at 0 and ends at its own planned target."""
    import tensorflow as tf
    urls = write_sized(tmp_path / "data", [1200, 800])
    params = {"num_users": 100, "num_items": 100, "dim": 8, "learning_rate": 0.3}
    frozen = {**params, "learning_rate": 1e-12}
    a = make_spec(urls, sync=False, batch=100, epochs=2, ckpt=tmp_path / "A", params=params)
    with LocalCluster(a, tmp_path / "run-a", target="tfyarn.train:run_task") as c:
        c.start()
        sa = run_ok(c, timeout=450)

    def second(name, mode, source, ckpt):
        doc = json.loads(a.model_dump_json(by_alias=True))
        doc.update(name=name, mode=mode, params=frozen)
        doc["checkpoint"].update(dir=f"file://{ckpt}", init_from=f"file://{source}")
        if mode == "allreduce":
            doc["roles"] = {"chief": {"instances": 1}, "worker": {"instances": 1}}
        spec = load_spec_dict(doc)
        with LocalCluster(spec, tmp_path / f"run-{name}", target="tfyarn.train:run_task") as c:
            c.start()
            return spec, run_ok(c, timeout=450)

    def model_values(ckpt: Path) -> list:
        index = json.loads((ckpt / "tfyarn-checkpoint.json").read_text())
        entry = index["checkpoints"][-1]
        reader = tf.train.load_checkpoint(str(ckpt / entry["name"]))
        return [reader.get_tensor(k) for k in entry["model_variables"]]

    b_spec, sb = second("b", "allreduce", tmp_path / "A", tmp_path / "B")
    assert sb["warm_started_from"] == f"file://{tmp_path / 'A'}/{sa['last_checkpoint']}"
    assert sb["resumed_from"] is None and sb["global_step"] == sb["total_steps"] == sum(planned_steps(b_spec))
    from tfyarn.train.model import build_model, load
    fresh = [v.numpy() for v in build_model(load(a.model, frozen)).variables]      # where a cold start begins
    trained = model_values(tmp_path / "A")
    assert not np.allclose(fresh[0], trained[0], atol=1e-3)                        # so equality below means loaded
    for x, y in zip(trained, model_values(tmp_path / "B")):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    c_spec, sc = second("c", "ps", tmp_path / "B", tmp_path / "C")
    assert sc["warm_started_from"].endswith(f"B/{sb['last_checkpoint']}") and sc["resumed_from"] is None
    assert sc["global_step"] == sc["total_steps"]
    for x, y in zip(model_values(tmp_path / "A"), model_values(tmp_path / "C")):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
