"""Batch scoring on the real cluster (issue 38): the recommender trained and exported on YARN scores a Parquet table
on HDFS with 3 workers; the output read back with pyarrow holds every input row once, with the SavedModel's own
predictions on a sample; then the same with one worker killed mid-way (restarted in place: rows out = rows in, no
duplicate, and the parts it had committed are not written again).

One training job and two scoring jobs for the module (CI budget). The containers run the gateway's tfyarn.
"""
import signal
import sys
import time

import numpy as np
import pytest

from clusterutil import SESSION_TAG, JOB_S, assert_clean, job, needs_yarn, task_process, unique
from predictutil import INPUTS, reference_predictions, table
from tfyarn import api, runner
from tfyarn.cluster import hdfs
from tfyarn.backends.base import AppState
from tfyarn.spec import load_spec_dict

pytestmark = [*needs_yarn, pytest.mark.timeout(3 * JOB_S)]
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def exported(yarn, dataset, hdfs_root):
    """The recommender trained on YARN (1 epoch, allreduce, chief + worker) and exported to HDFS."""
    name = unique("pred-train")
    spec = job(dataset, name, mode="allreduce", epochs=1, ckpt=hdfs.join(hdfs_root, name, "ckpt"),
               export={"dir": hdfs.join(hdfs_root, name, "models")})
    st = runner.run(yarn, spec, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    return spec.export.dir, st.summary["export"]["url"]


def _table_on_hdfs(root: str, sizes: list[int]) -> tuple[str, int]:
    import fsspec
    first = 0
    for k, n in enumerate(sizes):
        with fsspec.open(f"{root}/part-{k:05d}.parquet", "wb") as f:
            pq.write_table(table(first, n, k), f, row_group_size=4096)
        first += n
    return root, first


def _doc(name: str, model: str, data: str, out: str, **predict) -> dict:
    return {"name": name, "job": "predict", "tags": [SESSION_TAG, name],
            "predict": {"saved_model": model, "input": data, "output": out, "features": INPUTS,
                        "keep": ["row", "user_id", "item_id"], **predict},
            "roles": {"worker": {"instances": 3, "memory": "1 GiB"}},
            "environment": {"python": sys.executable},
            "timeouts": {"stall": 180, "shutdown": 30, "allocation": 180}}


def _output(url: str):
    import fsspec
    import pyarrow.dataset as ds
    fs, path = fsspec.core.url_to_fs(url)
    return ds.dataset(path, filesystem=fs, format="parquet").to_table()


def _local_model(url: str, dest) -> str:
    import fsspec
    fs, root = fsspec.core.url_to_fs(url)
    fs.get(root, str(dest), recursive=True)
    return str(dest)


def test_three_workers_score_a_parquet_table_every_row_once(yarn, exported, hdfs_root, tmp_path):
    export_dir, version_url = exported
    name = unique("pred")
    data, total = _table_on_hdfs(hdfs.join(hdfs_root, name, "in"), [7000, 5000, 301])
    out = hdfs.join(hdfs_root, name, "out")
    spec = load_spec_dict(_doc(name, f"{export_dir}/latest", data, out, batch_size=1000, part_rows=3000))
    st = api.predict(spec, "yarn", timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    s = st.summary
    assert (s["rows_in"], s["rows_out"], s["skipped"], s["parts"]) == (total, total, 0, 6)
    assert s["model"] == version_url                      # latest, fixed at submit
    got = _output(out)
    assert got["row"].to_pylist() == list(range(total))   # every input row once, in order
    pick = np.random.default_rng(0).choice(total, 500, replace=False)
    ref = reference_predictions(_local_model(version_url, tmp_path / "model"),
                                got["user_id"].to_numpy()[pick], got["item_id"].to_numpy()[pick])
    np.testing.assert_allclose(got["predictions"].to_numpy()[pick], ref, rtol=1e-5, atol=1e-6)
    assert_clean(yarn, st.app_id, tag=name)


def test_a_worker_killed_mid_way_is_restarted_and_rows_out_equal_rows_in(yarn, exported, hdfs_root):
    import fsspec
    export_dir, _ = exported
    name = unique("pred-kill")
    data, total = _table_on_hdfs(hdfs.join(hdfs_root, name, "in"), [40_000, 40_000, 10_000])
    out = hdfs.join(hdfs_root, name, "out")
    doc = _doc(name, f"{export_dir}/latest", data, out, batch_size=16, part_rows=3000)
    doc["roles"]["worker"]["max_restarts"] = 1
    spec = api.predict_job(load_spec_dict(doc))
    app_id = yarn.submit(spec)
    fs, root = fsspec.core.url_to_fs(out)
    victim = [i for i in range(10, 20)]                   # worker 1's parts: 30,000 rows of 90,000, 3,000 each
    proc = task_process(yarn, app_id, "worker:1", timeout=JOB_S)
    deadline = time.monotonic() + JOB_S
    while not fs.exists(f"{root}/_tfyarn/parts/{victim[0]:05d}.json"):
        assert time.monotonic() < deadline, "worker:1 committed no part in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    done = [i for i in victim if fs.exists(f"{root}/_tfyarn/parts/{i:05d}.json")]
    assert 1 <= len(done) < len(victim), done             # killed mid-way
    st = runner.wait(yarn, app_id, timeout=JOB_S)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert {t.task: t.restarts for t in st.tasks}["worker:1"] == 1
    s = st.summary
    assert (s["rows_in"], s["rows_out"], s["parts"]) == (total, total, 30)
    rows = _output(out)["row"].to_pylist()
    assert len(rows) == total and rows == list(range(total))   # no duplicate, none missing
    log = "\n".join(yarn.logs(app_id, task="worker:1"))
    assert f"{len(done)} already committed, {len(victim) - len(done)} to score" in log, log[-3000:]
    assert_clean(yarn, app_id, tag=name)
