"""Issue 39's ParameterServerStrategy data share on the real cluster: docs/models.md's "Parameter server training"
tutorial program (``pss_tutorial.py``, its custom loop, ``train_dataset(worker=...)``) trains from data on HDFS that
TF itself cannot read — a Parquet table, then GZIP TFRecords — on 2 workers, and every worker's dataset holds
exactly its share: after training, the chief reads ``train_dataset(worker=...)`` on each worker's server (TF ops
placed on that worker, reading what tfyarn staged there) and the rows, batch by batch, are the feeder's batches of
that worker's planned share (counted: the same number on every worker, epochs x steps_per_epoch()).

One job per format (CI budget); the containers run the gateway's tfyarn (shipped first on PYTHONPATH).
"""
import json

import numpy as np
import pytest
from clusterutil import JOB_S, assert_clean, job_doc, needs_yarn, unique
from keras_helpers import doc_examples, require_tf_keras

from tfyarn import runner
from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_yarn, pytest.mark.timeout(2 * JOB_S)]
pa = pytest.importorskip("pyarrow")

SIZES = [500, 260, 140]           # skewed files: 900 rows
WORKERS, BATCH, EPOCHS = 2, 40, 2
FEATURES = {"features": {"dtype": "string", "shape": [3]}, "label": {"dtype": "string"}, "rid": {"dtype": "int64"}}
VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]

#: appended to the tutorial program: each worker's dataset read on that worker's server, its row ids to a file
COUNT = '''

import json as _json
import sys as _sys

import fsspec as _fsspec

_shares = {}
for _w in range(NUM_WORKERS):
    @tf.function
    def _read_share():
        ids = tfyarn.data.train_dataset(worker=0).map(lambda x, y: x["rid"])   # (the id TF passes every worker)
        return ids.batch(1 << 20).get_single_element()

    with tf.device(f"/job:worker/replica:0/task:{_w}"):
        _shares[_w] = _read_share().numpy().tolist()
with _fsspec.open(_sys.argv[1], "w") as _f:
    _json.dump(_shares, _f)
'''


def _rows(first: int, n: int) -> dict:
    rng = np.random.default_rng(first)
    feats = rng.integers(0, len(VOCAB), (n, 3))
    return {"features": [[VOCAB[i] for i in row] for row in feats.tolist()],
            "label": ["yes" if row.sum() % 2 else "no" for row in feats],
            "rid": list(range(first, first + n))}


def _write_parquet(root: str) -> str:
    import fsspec
    import pyarrow.parquet as pq
    first = 0
    for k, n in enumerate(SIZES):
        with fsspec.open(f"{root}/part-{k:05d}.parquet", "wb") as f:
            pq.write_table(pa.table(_rows(first, n)), f, row_group_size=64)
        first += n
    return f"{root}/*.parquet"


def _write_gzip_tfrecords(root: str) -> str:
    from tfyarn.data import TFRecordWriter
    from tfyarn.data.example import encode_example
    first = 0
    for k, n in enumerate(SIZES):
        r = _rows(first, n)
        with TFRecordWriter(f"{root}/part-{k:05d}.tfrecord.gz", compression="gzip") as w:
            for feats, label, rid in zip(r["features"], r["label"], r["rid"]):
                w.write(encode_example({"features": [s.encode() for s in feats], "label": [label.encode()],
                                        "rid": [rid]}, {"features": "bytes", "label": "bytes", "rid": "int64"}))
        first += n
    return f"{root}/*.tfrecord.gz"


def _feeder_shares(spec) -> tuple[int, dict[int, list[int]]]:
    """steps_per_epoch(), and each worker's row ids as the feeder gives them: epochs x that many batches (read from
    HDFS here, by the gateway's feeder)."""
    from tfyarn.data import Feeder, build_manifest, plan
    d = spec.data
    m = build_manifest(list(d.train), d.compression, format=d.format)
    steps = min(plan(m, WORKERS, e, d.shuffle_seed, d.batch_size).steps for e in range(d.epochs))
    out = {}
    for w in range(WORKERS):
        with Feeder(m, dict(d.features), d.batch_size, w, WORKERS, seed=d.shuffle_seed) as f:
            out[w] = [int(r) for e in range(d.epochs) for i, b in enumerate(f.epoch(e)) if i < steps
                      for r in b["rid"]]
    return steps, out


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord.gz"])
def test_pss_tutorial_trains_from_hdfs_each_worker_exactly_its_share(yarn, hdfs_root, tmp_path, fmt):
    require_tf_keras()
    root = hdfs.join(hdfs_root, unique(f"pss-{fmt.replace('.', '-')}"))
    data = _write_parquet(root) if fmt == "parquet" else _write_gzip_tfrecords(root)
    code = tmp_path / "code"
    code.mkdir()
    (code / "pss_tutorial.py").write_text(doc_examples()["pss_tutorial.py"] + COUNT)
    out = f"{root}/shares.json"
    name = unique(f"pss-{fmt.split('.')[0]}")
    doc = job_doc(data, name, mode="ps", sync=False, workers=WORKERS, epochs=EPOCHS, batch=BATCH, code=str(code),
                  entrypoint=f"pss_tutorial.py {out}")
    del doc["model"], doc["params"]
    doc["data"]["features"] = FEATURES
    spec = load_spec_dict(doc)
    st = runner.run(yarn, spec, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    steps, want = _feeder_shares(spec)
    assert steps >= 10 and len(want[0]) == len(want[1]) == EPOCHS * steps * BATCH, (steps, len(want[0]))
    import fsspec
    with fsspec.open(out, "r") as f:
        got = {int(w): ids for w, ids in json.load(f).items()}
    for w in range(WORKERS):             # counted on each worker's server: its batches, exactly, in order
        assert np.asarray(got[w]).shape == (EPOCHS * steps, BATCH), (w, np.asarray(got[w]).shape)
        assert np.asarray(got[w]).ravel().tolist() == want[w], w
    per_epoch = steps * BATCH          # each epoch's shares are disjoint (the plan reshuffles between epochs)
    for e in range(EPOCHS):
        assert not set(want[0][e * per_epoch:][:per_epoch]) & set(want[1][e * per_epoch:][:per_epoch]), e
    s = st.summary
    assert s["entrypoint"] == f"pss_tutorial.py {out}" and s["last_loss"] is not None, s
    assert np.isfinite(s["last_loss"]), s
    assert_clean(yarn, st.app_id, tag=name)
