"""Tables split by rows over the ps (tfyarn.train.sharding): placement, lookups on the ps, sparse updates by every
supported v1 optimizer, and checkpoints read back by another number of ps."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tfyarn.tasklib.context import TaskContext  # noqa: E402
from tfyarn.tasklib.kv import MemoryKV  # noqa: E402
from tfyarn.spec import load_spec_dict  # noqa: E402
from tfyarn.train import load, sharding  # noqa: E402
from tfyarn.models.recommender import Recommender  # noqa: E402
from tfyarn.train.ps.graph import BIG_INIT_BYTES, build_graph, init_stages  # noqa: E402
from tfyarn.train.ps.placement import plan_placement  # noqa: E402

FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}
OPTIMIZERS = {  # v1 optimizer → its sparse update op on a resource variable
    "GradientDescentOptimizer": "ResourceScatterAdd",
    "MomentumOptimizer": "ResourceSparseApplyMomentum",
    "AdagradOptimizer": "ResourceSparseApplyAdagrad",
    "AdamOptimizer": "ResourceScatterSub",  # lazy on shards (sharding.touched_rows_only)
    "RMSPropOptimizer": "ResourceSparseApplyRMSProp",
    "FtrlOptimizer": "ResourceSparseApplyFtrl",
}


def spec_doc(ps: int, *, sync: bool = False, min_shard: str = "16 KiB", max_shards: int | None = None, **params):
    return {
        "name": "shardtest",
        "model": "tfyarn.models.recommender:model",
        "params": {"num_users": 5000, "num_items": 3001, "dim": 8, **params},
        "mode": "ps",
        "sync": sync,
        "ps": {"min_shard_size": min_shard, "max_shards": max_shards},
        "data": {"train": ["unused"], "features": FEATURES, "batch_size": 10},
        "roles": {"ps": {"instances": ps}, "chief": {"instances": 1}, "worker": {"instances": 1}},
    }


def graph_of(doc, model=None):
    spec = load_spec_dict(doc)
    n = spec.instances("ps")
    cluster = {"ps": [f"127.0.0.1:{i + 1}" for i in range(n)], "chief": ["127.0.0.1:90"], "worker": ["127.0.0.1:91"]}
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=MemoryKV(), cluster=cluster)
    return build_graph(ctx, model or load(spec.model, spec.params, spec.code or None))


def test_spec_keys_parse_sizes_and_default_to_64_mib_and_the_number_of_ps():
    spec = load_spec_dict(spec_doc(3, min_shard="1 KiB", max_shards=2))
    assert (spec.ps.min_shard_size, spec.ps.max_shards) == (1024, 2)
    spec = load_spec_dict({**spec_doc(3), "ps": {}})
    assert spec.ps.min_shard_size == 64 * 2**20
    assert sharding.policy_for(spec, 3) == sharding.Policy(64 * 2**20, 3)
    from tfyarn.spec import load_spec_json

    for size in ("1 KiB", "0.5 KiB", 100, "1.5 GiB"):  # what the tasks read back from the gateway's JSON
        spec = load_spec_dict({**spec_doc(3), "ps": {"min_shard_size": size}})
        assert load_spec_json(spec.to_json()).ps == spec.ps


def test_policy_splits_only_big_variables_with_rows_and_div_layout():
    pol = sharding.Policy(min_bytes=1000, max_shards=3)
    assert pol.shards([250, 1], tf.float32) == 3  # 1000 bytes
    assert pol.shards([249, 1], tf.float32) == 1
    assert pol.shards([2, 1000], tf.float32) == 2  # no more shards than rows
    assert pol.shards([], tf.float32) == 1
    assert sharding.row_splits(10, 3) == [4, 3, 3]  # tf.nn.embedding_lookup's "div": the first ones one more
    capped = sharding.Policy(min_bytes=1000, max_shards=1, max_shard_bytes=400)
    assert capped.shards([250, 1], tf.float32) == 3  # 1000 bytes in pieces of <= 400, whatever max_shards says
    assert capped.shards([2, 1000], tf.float32) == 2  # still no more shards than rows
    # a 2.4 GB table on 1 ps: pieces under gRPC's 2 GiB limit (the chief's Saver reads each in one tensor)
    assert sharding.Policy(64 * 2**20, 1).shards([600_000_000, 1], tf.float32) == 3


def test_a_variable_over_the_shard_cap_is_cut_into_pieces_on_one_ps(monkeypatch):
    """1 ps, the cap lowered to 50 KB: the 160 KB user table is 4 pieces on ps:0 (its Adagrad slots beside them)."""
    monkeypatch.setattr(sharding, "MAX_SHARD_BYTES", 50_000)
    tg = graph_of(spec_doc(1, min_shard="64 MiB"))
    ops = tg.graph.get_operations()
    pieces = {op.name: op.device for op in ops if op.type == "VarHandleOp" and op.name.startswith("user_embedding/")
              and "Adagrad" not in op.name}
    assert sorted(pieces) == [f"user_embedding/part_{i}" for i in range(4)], pieces
    assert all("/job:ps/task:0" in d for d in pieces.values()), pieces
    assert tg.model_var_keys[0] == "user_embedding"  # one table in checkpoints, as unsplit


def test_plan_puts_each_shard_of_a_table_on_its_own_ps_balanced_with_the_rest():
    sizes = {"big/part_0": 100, "big/part_1": 100, "big/part_2": 100, "other": 150, "small": 10}
    plan = plan_placement(sizes, 3)
    assert len({plan[f"big/part_{i}"] for i in range(3)}) == 3
    # 'other' (largest) first on ps0, then the shards on ps1, ps2 and — the only one left free — ps0
    loads = [sum(s for n, s in sizes.items() if plan[n] == j) for j in range(3)]
    assert max(loads) - min(loads) <= 150
    two = plan_placement({"t/part_0": 5, "t/part_1": 5, "t/part_2": 5}, 2)  # more shards than ps: spread anyway
    assert sorted(two.values()) == [0, 0, 1]


def test_tables_split_over_three_ps_lookups_gather_on_each_shards_ps():
    tg = graph_of(spec_doc(3))
    ops = tg.graph.get_operations()
    var_dev = {op.name: op.device for op in ops if op.type == "VarHandleOp"}
    for table in ("user_embedding", "item_embedding"):
        shards = [n for n in var_dev if re.fullmatch(f"{table}/part_\\d", n)]
        assert len(shards) == 3, var_dev
        assert len({var_dev[s] for s in shards}) == 3, "two shards of one table on one ps"
        assert all(var_dev[f"{s}/Adagrad"] == var_dev[s] for s in shards)
    assert "user_embedding" not in var_dev  # no whole table anywhere
    # 5000 x 8 floats = 160 KB: split, in rows 1667 / 1667 / 1666
    parts = [tg.graph.get_operation_by_name(f"user_embedding/part_{i}") for i in range(3)]
    rows = [tf.TensorShape(part.get_attr("shape"))[0] for part in parts]
    assert rows == [1667, 1667, 1666]
    gathers = [op for op in ops if op.type == "ResourceGather" and "/part_" in op.inputs[0].op.name]
    assert len(gathers) == 3 * 3  # users, items, user_bias; item_bias (12 KB) stays whole; 3 shards each
    for op in gathers:  # every lookup reads a shard where it lives (colocated with it, on its ps)
        handle = op.inputs[0].op
        assert op.colocation_groups() == handle.colocation_groups()
        assert op.device == handle.device and "/job:ps" in op.device
    # no read of a whole shard travels to the worker for the forward pass
    reads = [op for op in ops if op.type == "ReadVariableOp" and "embedding" in op.name and "/job:worker" in op.device]
    assert reads == []
    assert tg.model_var_keys[:2] == ["user_embedding", "item_embedding"]


def test_one_ps_or_max_shards_1_keeps_tables_whole_and_small_ones_stay_whole():
    for doc in (spec_doc(1), spec_doc(3, max_shards=1), spec_doc(3, min_shard="64 MiB")):
        names = {op.name for op in graph_of(doc).graph.get_operations() if op.type == "VarHandleOp"}
        assert "user_embedding" in names and not any("/part_" in n for n in names)


class _WithOptimizer:
    """The recommender with another v1 optimizer."""

    def __init__(self, name: str, sync: bool):
        from tfyarn.models.recommender import Recommender

        self.inner, self.name, self.sync = Recommender(5000, 3001, 8), name, sync

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def __call__(self, features, training):
        return self.inner(features, training)

    def build(self):
        self.inner.build()

    def optimizer(self):
        cls = getattr(tf.compat.v1.train, self.name)
        return cls(0.1, 0.9) if self.name in ("MomentumOptimizer",) else cls(0.1)


@pytest.mark.parametrize("sync", [False, True])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_every_v1_optimizer_updates_only_touched_rows_on_the_shards_ps_without_densifying(opt, sync):
    model = _WithOptimizer(opt, sync)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tg = graph_of(spec_doc(3, sync=sync), model)
    dense = [str(w.message) for w in caught if "IndexedSlices" in str(w.message)]
    assert dense == [], dense
    ops = tg.graph.get_operations()
    shard_handles = {
        op.name for op in ops if op.type == "VarHandleOp" and re.fullmatch(r".*_embedding/part_\d", op.name)
    }
    updates = [op for op in ops if op.type == OPTIMIZERS[opt]]
    hit = set()
    for op in updates:
        for t in op.inputs:
            if t.op.name in shard_handles:
                hit.add(t.op.name)
                assert op.device == t.op.device and "/job:ps" in op.device, (op.name, op.device)
    assert hit == shard_handles, f"{opt}: shards without a sparse update: {shard_handles - hit}"
    # no dense update of a shard (a densified gradient) by the apply ops
    dense_applies = [
        op.name
        for op in ops
        if (op.type.startswith("ResourceApply") or op.type == "AssignSubVariableOp")
        and any(t.op.name in shard_handles for t in op.inputs)
    ]
    assert dense_applies == []


# ----------------------------------------------------------------------------- checkpoints across numbers of ps
@pytest.fixture(scope="module")
def servers():
    """In-process TF servers: 3 ps and a worker (a graph built for 2 ps uses the first two)."""
    from harness import free_port

    cluster = {"ps": [f"127.0.0.1:{free_port()}" for _ in range(3)], "worker": [f"127.0.0.1:{free_port()}"]}
    spec = tf.train.ClusterSpec(cluster)
    out = {
        (job, i): tf.distribute.Server(spec, job_name=job, task_index=i, start=True)
        for job in cluster
        for i in range(len(cluster[job]))
    }
    return cluster, out


def _train_graph(cluster, num_ps: int, doc: dict):
    spec = load_spec_dict(doc)
    sub_cluster = {"ps": cluster["ps"][:num_ps], "worker": cluster["worker"]}
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=MemoryKV(), cluster=sub_cluster)
    return spec, build_graph(ctx, load(spec.model, spec.params))


def _feed(tg, rng, n=64):
    batch = {
        "user_id": rng.integers(0, 5000, n),
        "item_id": rng.integers(0, 3001, n),
        "label": rng.integers(0, 2, n).astype("float32"),
    }
    return {tg.feeds[k][0]: v for k, v in batch.items()}


def _values(sess, tg) -> list:
    """The model's variables, a split table's shards joined."""
    return [np.concatenate(sess.run(list(v))) if sharding.is_sharded(v) else sess.run(v) for v in tg.model_vars]


def keras_doc(ps: int, flavour: str, optimizer: str = "Adagrad", **kw):
    doc = spec_doc(ps, **kw)
    params = {"num_users": 5000, "num_items": 3001, "dim": 8, "keras": flavour, "optimizer": optimizer}
    doc.update(model="tfyarn.models.keras_recommender:model", params=params)
    return doc


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_keras_embeddings_split_over_the_ps_and_looked_up_there(flavour):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tg = graph_of(keras_doc(3, flavour))
    assert [str(w.message) for w in caught if "IndexedSlices" in str(w.message)] == []
    ops = tg.graph.get_operations()
    var_dev = {op.name: op.device for op in ops if op.type == "VarHandleOp"}
    for layer in ("user_embedding", "item_embedding"):
        shards = [f"{layer}/embeddings_part_{i}" for i in range(3)]
        assert len({var_dev[s] for s in shards}) == 3 and f"{layer}/embeddings" not in var_dev, var_dev
    assert tg.model_var_keys[:2] == ["user_embedding/embeddings", "item_embedding/embeddings"]  # as unsplit
    gathers = [op for op in ops if op.type == "ResourceGather" and "_part_" in op.inputs[0].op.name]
    assert gathers and len(gathers) % 6 == 0  # (tf_keras also traces the layers once when it builds the model)
    assert all(op.device == op.inputs[0].op.device for op in gathers)
    reads = [op for op in ops if op.type == "ReadVariableOp" and "embeddings_part" in op.inputs[0].op.name]
    assert all("/job:ps" in op.device for op in reads), [(op.name, op.device) for op in reads]
    sparse = {op.inputs[0].op.name for op in ops if op.type == "ResourceSparseApplyAdagrad"}
    layers = ("user_embedding", "item_embedding")
    assert {f"{layer}/embeddings_part_{i}" for layer in layers for i in range(3)} <= sparse
    # a Dense layer stays one variable, updated densely
    assert "hidden/kernel" in var_dev


@pytest.mark.parametrize(
    "make_doc",
    [spec_doc, lambda ps: keras_doc(ps, "keras"), lambda ps: keras_doc(ps, "tf_keras")],
    ids=["plain", "keras", "tf_keras"],
)
def test_a_checkpoint_of_3_shards_restores_into_2_and_1_and_the_export_serves_the_trained_graph(
    servers, tmp_path, make_doc
):
    from tfyarn.train.export import write_saved_model

    cluster, srv = servers
    target = srv[("worker", 0)].target
    doc = make_doc(3)
    spec3, tg3 = _train_graph(cluster, 3, doc)
    rng = np.random.default_rng(0)
    probe = _feed(tg3, np.random.default_rng(9))
    with tf.compat.v1.Session(target, graph=tg3.graph) as s:
        s.run([tg3.init_op, tg3.local_init_op])
        for _ in range(5):
            s.run(tg3.train_op, _feed(tg3, rng))
        prefix = tg3.saver.save(s, str(tmp_path / "ck" / "ckpt"))
        want = _values(s, tg3)
        served_graph = s.run(tg3.predictions, probe)
    table = want[0]
    third = len(table) // 3  # shards of one table start as different rows (seed + i), not copies of each other
    assert not np.allclose(table[:third], table[third : 2 * third])
    keys = dict(tf.train.list_variables(prefix))
    table = tg3.model_var_keys[0]
    assert keys[table] == [5000, 8] and keys[f"{table}/Adagrad"] == [5000, 8]
    assert not any("/part_" in k for k in keys)  # one full tensor per table, whatever the number of ps
    for num_ps in (2, 1):
        _, tg = _train_graph(cluster, num_ps, make_doc(num_ps))
        with tf.compat.v1.Session(target, graph=tg.graph) as s:
            tg.saver.restore(s, prefix)
            got = _values(s, tg)
            assert len(got) == len(want)
            for a, b in zip(want, got):
                np.testing.assert_array_equal(a, b)
            feed = {tg.feeds[k][0]: probe[tg3.feeds[k][0]] for k in tg3.feeds}
            np.testing.assert_allclose(s.run(tg.predictions, feed), served_graph, rtol=1e-6)
    out = write_saved_model(spec3, prefix, tg3.model_var_keys, tmp_path / "export", "test")
    serve = tf.saved_model.load(str(out)).signatures["serving_default"]
    feats = {k: tf.constant(probe[tg3.feeds[k][0]]) for k in ("user_id", "item_id")}
    served = serve(**feats)["predictions"].numpy()
    np.testing.assert_allclose(served.reshape(served_graph.shape), served_graph, rtol=1e-5, atol=1e-6)
    assert np.std(served) > 0


# ------------------------------------------------------------------------- initial values computed on their ps
class _PlainVariables:
    """The recommender plus a variable made from a callable by plain ``tf.Variable`` (split or not by the
    policy's interception, as any model's)."""

    def __init__(self):
        self.inner = Recommender(5000, 3001, 8)

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def build(self):
        self.inner.build()
        self.w = tf.Variable(lambda: tf.random_uniform_initializer(-0.1, 0.1)([300, 8]), name="plain_w")

    def __call__(self, features, training):
        return self.inner(features, training) + tf.reduce_sum(tf.gather(self.w, features["item_id"] % 300), 1)


def _initial_value_ops(v):
    """The ops computing ``v``'s initial value (its initializer's value input, back to the graph's sources)."""
    seen, todo = {}, [v.initializer.inputs[1].op]
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen[op.name] = op
            todo.extend(t.op for t in op.inputs)
    return list(seen.values())


@pytest.mark.parametrize("ps", [1, 3])
def test_every_initial_value_is_computed_on_its_variables_ps(ps):
    """Whole tables (1 ps), shards (3 ps), a plain tf.Variable(callable) and the optimizer's slots: every op of
    an initial value is placed on its variable's ps or colocated with it, none on the worker (a whole 10^7 x 64
    table's value computed there and sent hit gRPC's 2 GB limit)."""
    tg = graph_of(spec_doc(ps), _PlainVariables())
    variables = tg.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    names = {v.op.name for v in variables}
    assert {"user_embedding" if ps == 1 else "user_embedding/part_0", "plain_w", "plain_w/Adagrad"} <= names, names
    for v in variables:
        assert "/job:ps" in v.device, (v.op.name, v.device)
        for op in _initial_value_ops(v):
            where = op.device or next(
                (tg.graph.get_operation_by_name(g.decode()[5:]).device for g in op.colocation_groups()), ""
            )
            assert where == v.device, f"{op.name} ({op.type}) of {v.op.name}: on {where!r}, not {v.device}"
    stages = tg.init_stages  # every variable initialised once, the big ones (none here) in turns
    assert sorted(op.name for ops in stages for op in ops) == sorted(v.initializer.name for v in variables)


@pytest.mark.parametrize("ps", [1, 3])
@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_keras_tables_and_slots_are_initialised_on_their_ps(ps, flavour):
    """A Keras Embedding's table (whole or split), its Dense layers and their optimizer slots: initial values on
    the ps. (Keras 3's optimizer makes its scalar iteration and learning rate from a value computed on the worker:
    4 bytes each, left as they are.)"""
    tg = graph_of(keras_doc(ps, flavour))
    checked = 0
    for v in tg.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        if v.shape.rank == 0:
            continue
        for op in _initial_value_ops(v):
            where = op.device or next(
                (tg.graph.get_operation_by_name(g.decode()[5:]).device for g in op.colocation_groups()), ""
            )
            assert where == v.device, f"{op.name} ({op.type}) of {v.op.name}: on {where!r}, not {v.device}"
        checked += 1
    assert checked >= 8, checked  # tables (or their shards), Dense kernels and biases, and their slots


def test_initial_values_run_on_the_ps(servers):
    """Run for real (in-process servers): the init runs' partition graphs put every random op of an initial
    value on the ps, none on the worker."""
    cluster, srv = servers
    _, tg = _train_graph(cluster, 1, spec_doc(1))
    opts = tf.compat.v1.RunOptions(output_partition_graphs=True)
    cfg = tf.compat.v1.ConfigProto()  # (else Grappler folds these small seeded values into constants)
    cfg.graph_options.rewrite_options.constant_folding = cfg.graph_options.rewrite_options.OFF
    random_on = {}
    with tf.compat.v1.Session(srv[("worker", 0)].target, graph=tg.graph, config=cfg) as s:
        for ops in tg.init_stages:
            meta = tf.compat.v1.RunMetadata()
            s.run(ops, options=opts, run_metadata=meta)
            for part in meta.partition_graphs:
                for node in part.node:
                    if "Random" in node.op:
                        random_on[node.name] = node.device
        assert len(s.run(tg.ready_op)) == 0
    assert any(n.startswith("user_embedding/Initializer/") for n in random_on), random_on
    assert random_on and all("/job:ps/replica:0/task:0" in d for d in random_on.values()), random_on


def test_the_saver_reads_each_variable_on_its_ps_after_disabling_copy_on_read():
    """The chief's Saver (train/ps/saver.py) writes TF's keys (a split table as one full tensor) and reads each
    variable where it lives, after a DisableCopyOnRead (else a sparse-updated variable is copied whole per read)."""
    tg = graph_of(spec_doc(3))
    save = next(op for op in tg.graph.get_operations() if op.type == "SaveV2")
    names = tf.make_ndarray(save.inputs[1].op.get_attr("value"))
    keys = {sharding.checkpoint_key(v) for v in tg.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
    assert {n.decode() for n in names} == keys and "user_embedding" in keys and "user_embedding/Adagrad" in keys
    reads = [t.op for t in save.inputs[3:]]
    assert len(reads) == len(names) > 8
    for read in reads:
        assert read.type == "ReadVariableOp" and "/job:ps" in read.device, (read.name, read.type, read.device)
        (off,) = read.control_inputs
        assert off.type == "DisableCopyOnRead" and off.inputs[0] is read.inputs[0] and off.device == read.device


def test_init_stages_initialise_big_variables_of_each_ps_one_at_a_time():
    rows = BIG_INIT_BYTES // 4 // 8 + 1
    g = tf.Graph()
    with g.as_default():
        made = {}
        for name, ps, n in (("a", 0, rows), ("b", 0, 2 * rows), ("c", 1, rows), ("small", 1, 10)):
            with tf.compat.v1.device(f"/job:ps/task:{ps}"):
                made[name] = tf.Variable(tf.zeros([n, 8]), name=name)
    stages = init_stages(list(made.values()))
    assert [sorted(op.name for op in ops) for ops in stages] == [
        ["b/Assign", "c/Assign", "small/Assign"],  # the biggest of each ps and every small one
        ["a/Assign"],
    ]


# --------------------------------------------------------------------------------------------------- real processes
def _job(tmp_path, urls, name, *, ps, epochs, lr=0.2, sync=False, init_from=None, model=None, params=None):
    doc = spec_doc(ps, sync=sync, learning_rate=lr)
    doc.update(name=name, data={"train": urls, "features": FEATURES, "batch_size": 100, "epochs": epochs})
    if model:
        doc.update(model=model, params=params)
    doc["checkpoint"] = {"dir": f"file://{tmp_path / ('ckpt-' + name.split('-')[0])}", "every_secs": None}
    if init_from:
        doc["checkpoint"]["init_from"] = f"file://{tmp_path / ('ckpt-' + init_from)}"
    doc["timeouts"] = {"step": 60, "rendezvous": 120}
    return load_spec_dict(doc)


def _run(spec, tmp_path, tag):
    from harness import LocalCluster
    from test_ps import run_ok

    with LocalCluster(spec, tmp_path / f"run-{tag}", target="tfyarn.train:run_task") as c:
        c.start()
        # five TF processes: at load 21-27 their imports alone took 2.5-4.5 min (200 s failed twice, trained)
        return run_ok(c, timeout=600), c.log("chief:0")


def _model_values(ckpt) -> list:
    import json

    index = json.loads((ckpt / "tfyarn-checkpoint.json").read_text())
    entry = index["checkpoints"][-1]
    reader = tf.train.load_checkpoint(str(ckpt / entry["name"]))
    return [reader.get_tensor(k) for k in entry["model_variables"]]


def test_tfyarn_run_local_fails_a_ps_job_with_a_plain_weight_over_1_gib_in_its_chief_before_the_session(tmp_path):
    """A local run skips preflight's ps sizing (a TF child for every ps job): the chief refuses the 1-row variable of
    1 GiB + 4 bytes when it builds its graph, before its session, nothing allocated; the job FAILED (exit 1) with the
    line, not retried (the model's own doing). The rule and its preflight side: the test above."""
    import os
    import subprocess
    import sys

    import yaml
    from test_ps import write_sized

    doc = {**spec_doc(1), "name": "wide", "model": "big_weights:model", "code": JOBS, "params": {}}
    doc["data"] = {"train": write_sized(tmp_path / "data", [200]), "features": FEATURES, "batch_size": 100}
    doc["roles"] = {"ps": {"instances": 1}, "chief": {"instances": 1}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "tfyarn.cli", "run", str(tmp_path / "spec.yaml"), "--local"],
                          check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "TFYARN_HOME": str(tmp_path / "home")})
    assert proc.returncode == 1, (proc.stdout, proc.stderr[-3000:])
    assert "diagnosis: chief:0 exited with code 1: TooBigForPs: model: weight wide is 1,073,741,828 bytes (1 x " \
           "268435457 float32) and ps mode, which splits by rows (1 here)" in proc.stdout, proc.stdout
    assert "not retried: the job's own code failed (raised TooBigForPs)" in proc.stdout, proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)  # three runs of _run's 600 s
def test_plain_job_on_3_ps_resumes_on_1_and_warm_starts_split_over_2_values_equal(tmp_path):
    """A plain recommender trained with its tables split over 3 ps (async, Adagrad); resumed with 1 ps (tables whole)
    for one epoch more and a learning rate of ~0, its model variables are the first run's; a job warm-started from
    it on 2 ps (tables split in 2) starts from the same values."""
    from test_ps import write_sized

    urls = write_sized(tmp_path / "data", [1200, 800])
    s1, log1 = _run(_job(tmp_path, urls, "a", ps=3, epochs=1), tmp_path, "a1")
    assert s1["global_step"] == s1["total_steps"] == 20
    assert "user_embedding/part_2" in log1  # the placement log names the shards
    first = _model_values(tmp_path / "ckpt-a")
    s2, log2 = _run(_job(tmp_path, urls, "a-resume", ps=1, epochs=2, lr=1e-12), tmp_path, "a2")
    assert s2["resumed_from"] == s1["last_checkpoint"] and s2["global_step"] == s2["total_steps"] == 40, s2
    for x, y in zip(first, _model_values(tmp_path / "ckpt-a")):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    s3, log3 = _run(_job(tmp_path, urls, "c", ps=2, epochs=1, lr=1e-12, init_from="a"), tmp_path, "c")
    assert s3["warm_started_from"] and s3["resumed_from"] is None
    assert "user_embedding/part_1" in log3 and "user_embedding/part_2" not in log3
    for x, y in zip(first, _model_values(tmp_path / "ckpt-c")):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_preflight_sizing_refuses_tables_one_ps_cannot_hold_in_one_line_and_passes_them_split():
    """Two 3,200,000 x 64 tables + Adagrad slots (3.3 GB, 1.5x one ps's 2 GiB) over 3 ps: split, ~1,060 MiB a ps +
    its biggest shard's initial value + TF's own: accepted; whole (ps.max_shards: 1), 1,563 MiB on one ps: refused,
    naming the bytes and the ps memory; split but checkpointed (the Saver's reads copy every variable): refused."""
    from tfyarn.train.ps import memory_check

    doc = spec_doc(3, min_shard="64 MiB", num_users=3_200_000, num_items=3_200_000, dim=64)
    doc["roles"]["ps"]["memory"] = "2 GiB"
    assert memory_check.problems(load_spec_dict(doc).to_json()) == []
    total, tables, biggest = memory_check.ps_loads(load_spec_dict(doc).to_json())
    assert max(total) < 1100 * 2**20 and sum(tables) >= 2 * 3_200_000 * 64 * 4
    assert max(biggest) == (3_200_000 // 3 + 1) * 64 * 4  # a shard of a table (its slot is as big)
    (line,) = memory_check.problems(load_spec_dict({**doc, "checkpoint": {"dir": "/tmp/unused"}}).to_json())
    assert "at its peak (a copy of them while a checkpoint is read)" in line and "over its 2,048 MiB" in line, line
    doc["ps"]["max_shards"] = 1
    (line,) = memory_check.problems(load_spec_dict(doc).to_json())
    assert "would hold 1,562 MiB of variables (781 MiB of model variables" in line, line
    assert "over its 2,048 MiB" in line, line
    assert "+ 781 MiB at its peak (its biggest variable's initial value)" in line, line


def test_preflight_sizing_leaves_a_small_models_ps_in_a_small_container_alone():
    """A recommender of a few MiB on a 512 MiB ps (the YARN tests' jobs; TensorFlow alone is ~600 MiB resident, which
    a cluster that does not enforce physical memory allows): its variables are not what decides, so no refusal."""
    from tfyarn.train.ps import memory_check

    doc = spec_doc(1, min_shard="64 MiB", num_users=1000, num_items=1000, dim=16)
    doc["roles"]["ps"]["memory"] = "512 MiB"
    total, _, _ = memory_check.ps_loads(load_spec_dict(doc).to_json())
    assert 0 < max(total) < memory_check.MATERIAL_MIB * 2**20
    assert memory_check.problems(load_spec_dict(doc).to_json()) == []


JOBS = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "helpers" / "jobs")  # (big_weights.py)


def test_a_weight_over_1_gib_ps_mode_cannot_cut_is_refused_by_name_size_and_way_out_from_its_shape():
    """TF's gRPC moves no tensor over 2 GiB, so no ps variable may hold more than 1 GiB (sharding.MAX_SHARD_BYTES): a
    Keras Dense kernel (only Embeddings are split) and a plain variable of one row over it are refused in one line
    when the graph is built (every ps-mode task, before its session), by preflight's ps sizing and by its Keras
    check, from shapes: the process grows by no GiB (building the Keras one's graph used to peak at 4547 MiB: its
    optimizer's eager twin). 1 GiB exactly passes; a plain variable of many rows over it is split, not refused."""
    import resource

    from tfyarn.gateway.preflight import check_ps_memory
    from tfyarn.train import keras_check
    from tfyarn.train.model import build_model, load_unbuilt
    from tfyarn.train.ps import memory_check

    peak_mib = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # noqa: E731
    before = peak_mib()
    dense = keras_doc(2, "keras", min_shard="64 MiB")
    dense["params"].update(num_users=60, num_items=60, dim=8192, hidden=20_000)  # hidden/kernel: 16384 x 20000
    with pytest.raises(sharding.TooBigForPs) as refused:  # (loaded as the tasks load it: in a scratch graph)
        graph_of(dense, load_unbuilt(dense["model"], dense["params"], data=load_spec_dict(dense).data))
    (line,) = refused.value.lines
    assert line.startswith("model: weight hidden/kernel is 1.22 GiB (16384 x 20000 float32) and ps mode would keep "
                           "it whole on one ps, over the 1 GiB it allows a variable (TF's gRPC moves no tensor over "
                           "2 GiB"), line
    assert "make it a keras.layers.Embedding if it is a lookup table, make the layer smaller, or train with mode: " \
           "allreduce (no ps)" in line, line
    spec_json = load_spec_dict(dense).to_json()
    assert memory_check.problems(spec_json) == keras_check.problems(spec_json) == [line]

    plain = {**spec_doc(1), "model": "big_weights:model", "code": JOBS, "params": {}}  # 1 x (2^28 + 1) float32
    with pytest.raises(sharding.TooBigForPs) as refused:
        graph_of(plain)
    (line,) = refused.value.lines
    assert line.startswith("model: weight wide is 1,073,741,828 bytes (1 x 268435457 float32) and ps mode, which "
                           "splits by rows (1 here), would keep 1,073,741,828 bytes of it in one piece on a ps, over "
                           "the 1 GiB"), line
    assert "tfyarn.train.table with a row per id), make it smaller, or train with mode: allreduce" in line, line
    assert check_ps_memory(load_spec_dict(plain)) == [line]  # (the gateway's side: a child process, exit 2)

    graph_of({**plain, "params": {"cols": 2**28}})  # 1 GiB exactly: whole, allowed
    tg = graph_of({**plain, "params": {"rows": 300_000, "cols": 1024}})  # 1.14 GiB of rows: split, under 1 GiB each
    pieces = {op.name for op in tg.graph.get_operations() if re.fullmatch(r"wide(/part_\d+)?", op.name)}
    assert pieces == {"wide/part_0", "wide/part_1"}, pieces
    exact = {**dense, "params": {**dense["params"], "hidden": 16_384}}  # a 1 GiB kernel (the rule only: the eager
    with tf.Graph().as_default():  # twin of its optimizer would allocate it)
        spec = load_spec_dict(exact)
        with sharding.sharding(sharding.policy_for(spec, 2), intercept=False):
            build_model(load(spec.model, spec.params, data=spec.data))
        sharding.refuse_too_big(tf.compat.v1.global_variables(), keras=True)
        assert "hidden/kernel" in {v.op.name for v in tf.compat.v1.global_variables()}
    assert peak_mib() - before < 512, (before, peak_mib())


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_a_ps_mode_keras_model_is_never_made_with_real_tables_on_the_worker(flavour):
    """A ps-mode worker (and preflight) loads the Keras factory in a scratch graph and reads its optimizer from an
    eager twin whose Embeddings have one row: a 2.56 GB table allocates nothing there (measured before: the chief
    of a 1 GB-table job peaked at 3166 MiB, its ps' 312 MiB)."""
    import subprocess
    import sys

    code = f"""
import resource, json
from tfyarn.train.model import load_unbuilt
from tfyarn.train.keras_model import KerasModel
import tensorflow as tf
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
params = {{"num_users": 10_000_000, "num_items": 10_000, "dim": 64, "keras": "{flavour}", "optimizer": "Adagrad",
          "learning_rate": 0.05}}
load_unbuilt("tfyarn.models.keras_recommender:model", params)  # (Keras's own imports, counted before)
before = peak()
m = load_unbuilt("tfyarn.models.keras_recommender:model", params)
config = m.ps_optimizer_config()
print(json.dumps({{"grew_mib": peak() - before, "keras": isinstance(m, KerasModel), "eager": tf.executing_eagerly(),
                  "config": [config[0], float(config[1]["learning_rate"])]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert got["keras"] and got["eager"], got  # (the scratch graph does not leak into the caller)
    assert got["config"][0] == "Adagrad" and abs(got["config"][1] - 0.05) < 1e-6, got
    assert got["grew_mib"] < 600, got  # a 10^7 x 64 float table is 2441 MiB


def test_big_keras_tables_start_from_tfs_fused_random_ops():
    """Keras's stateless random initializers hold a second copy of the value while it is made (a 976 MiB table took
    2022 MiB to initialise on its ps): a big Embedding table starts from TF's own op of the same distribution and
    seed; other initializers, and small tables, are left as Keras makes them."""
    import keras

    twin = sharding.tf_twin(keras.initializers.RandomUniform(-0.2, 0.3, seed=7))
    assert isinstance(twin, tf.random_uniform_initializer)
    assert twin.get_config() == {"minval": -0.2, "maxval": 0.3, "seed": 7}
    normal = sharding.tf_twin(keras.initializers.RandomNormal(0.1, 0.02))
    assert isinstance(normal, tf.random_normal_initializer) and normal.get_config()["stddev"] == 0.02
    ortho = keras.initializers.Orthogonal()
    assert sharding.tf_twin(ortho) is ortho
    for ps, min_shard in ((3, "16 KiB"), (1, "16 KiB"), (3, "64 MiB")):  # split, whole (big), small
        tg = graph_of(keras_doc(ps, "keras", min_shard=min_shard))
        ops = {
            v.op.name: {op.type for op in _initial_value_ops(v)}
            for v in tg.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            if re.fullmatch(r"user_embedding/embeddings(_part_\d+)?", v.op.name)  # (not its optimizer slots)
        }
        assert ops, (ps, min_shard)
        big = min_shard == "16 KiB"
        for name, types in ops.items():
            assert ("RandomUniform" in types) is big, (ps, min_shard, name, types)
            assert ("StatelessRandomUniformV2" in types) is not big, (ps, min_shard, name, types)
