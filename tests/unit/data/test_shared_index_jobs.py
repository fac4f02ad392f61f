"""Shared indexing in real local jobs (issue 22): a training task SIGKILLed while the tasks index the data together is
covered — by its in-place restart, which reuses what it had cached, or, for the chief, by the job's next attempt —
and every task of the run that completes plans from the same manifest as a single reader would build."""
import json
from pathlib import Path

import pytest

from launch_helpers import JOBS
from tfyarn import api
from tfyarn.backends.base import AppState
from tfyarn.data import build_manifest
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(300)
FILES = 40


@pytest.fixture
def data_dir(tmp_path):
    from tfyarn.data.synth import write_synthetic
    d = tmp_path / "data"
    write_synthetic(f"file://{d}", kind="logreg", files=FILES, records=120_000, skew=2, seed=5)
    return d


def job(tmp_path, data_dir, victim, **over):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    doc = {"name": "index-death", "model": "index_jobs:die_while_indexing", "code": str(JOBS), "mode": "ps",
           "params": {"victim": victim, "data_dir": str(data_dir), "out": str(out)},
           "data": {"train": [f"{data_dir}/*.tfrecord"], "batch_size": 8,
                    "features": {"label": {"dtype": "float32"}, "x": {"dtype": "float32", "shape": [16]}},
                    "index_cache": str(tmp_path / "cache")},
           "roles": {"ps": {"instances": 1}, "chief": {"instances": 1},
                     "worker": {"instances": 1, "max_restarts": 1, "restart": "exit_code"}},
           "timeouts": {"rendezvous": 120, "shutdown": 10, "stall": 120}, **over}
    return load_spec_dict(doc), out


def records(out: Path, attempt: int) -> dict:
    return {r["task"]: r for r in (json.loads(p.read_text()) for p in out.glob(f"*-{attempt}.json"))}


def test_a_worker_killed_while_indexing_is_restarted_and_reuses_what_it_cached(tmp_path, data_dir):
    spec, out = job(tmp_path, data_dir, "worker:0")
    st = api.run(spec, backend="local", timeout=240)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert {t.task: t.restarts for t in st.tasks}["worker:0"] == 1
    got = records(out, 0)
    want = [f.records for f in build_manifest(f"{data_dir}/*.tfrecord", use_cache=False).files]
    assert got["chief:0"]["records"] == got["worker:0"]["records"] == want
    # nothing indexed twice by the survivors: the chief its share, the restarted worker what its first life left
    assert got["chief:0"]["files_indexed"] + got["worker:0"]["files_indexed"] <= FILES - 3, got
    assert got["worker:0"]["restart"] == 1
    assert got["worker:0"]["files_indexed"] >= 1, "the worker died after its share was done: nothing was tested"


def test_a_chief_killed_while_indexing_ends_the_attempt_and_the_next_reuses_the_indexes(tmp_path, data_dir):
    spec, out = job(tmp_path, data_dir, "chief:0", retry={"max_attempts": 2, "backoff": 1})
    st = api.run(spec, backend="local", timeout=240)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    assert st.attempt == 1
    got = records(out, 1)
    want = [f.records for f in build_manifest(f"{data_dir}/*.tfrecord", use_cache=False).files]
    assert got["chief:0"]["records"] == got["worker:0"]["records"] == want
    assert got["chief:0"]["files_indexed"] + got["worker:0"]["files_indexed"] <= FILES - 3, got
