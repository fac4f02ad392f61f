"""``entrypoint:`` (issue 27, item 2): a user's own program as a real local job. The three example scripts of
docs/models.md (tf_keras MWMS fit, tf_keras ParameterServerStrategy fit on tfyarn's share, Keras 3 MWMS custom loop),
a program that raises, one that stalls; and, in one process, the equal-steps share as a tf.data.Dataset."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from harness import RECOMMENDER_FEATURES, write_recommender_files
from keras_helpers import DIGIT_FEATURES, doc_examples, require_tf_keras, write_digits

from tfyarn.errors import SpecError
from tfyarn.spec import load_spec_dict

ROOT = Path(__file__).resolve().parents[3]
JOBS = ROOT / "tests" / "helpers" / "jobs"


def _spec(tmp: Path, entrypoint: str, code: Path, data: bool = True, **over):
    doc = {"name": "script", "code": str(code), "entrypoint": entrypoint, "mode": "allreduce",
           "roles": {"chief": {"instances": 1}, "worker": {"instances": 1}},
           "timeouts": {"rendezvous": 120, "stall": 60, "shutdown": 20}}
    if data:
        doc["data"] = {"train": write_recommender_files(tmp / "data", [1200, 800]), "features": RECOMMENDER_FEATURES,
                       "batch_size": 200, "epochs": 2}
    doc.update(over)
    return load_spec_dict(doc)


def _run(spec):
    from tfyarn import api
    return api.run(spec, backend="local", timeout=300)


def test_entrypoint_spec_rules():
    base = {"name": "x", "roles": {"worker": {"instances": 1}}, "mode": "allreduce"}
    s = load_spec_dict({**base, "entrypoint": "train.py --lr 0.1 'a b'"})
    assert s.entrypoint_parts() == ("train.py", ["--lr", "0.1", "a b"]) and not s.has_data
    assert json.loads(s.to_json())["entrypoint"] == s.entrypoint and "data" not in json.loads(s.to_json())
    cases = [({**base}, "model: required"),
             ({**base, "model": "a:b"}, "data: required"),
             ({**base, "model": "a:b", "entrypoint": "t.py"}, "entrypoint: give either model or entrypoint, not both"),
             ({**base, "entrypoint": "train"}, "entrypoint: 'train' is neither a script"),
             ({**base, "entrypoint": "t.py", "checkpoint": {"dir": "/c"}, "export": {"dir": "/e"}},
              "export: an entrypoint job saves its own model")]
    for doc, want in cases:
        with pytest.raises(SpecError) as err:
            load_spec_dict(doc)
        assert any(p.startswith(want) for p in err.value.problems), (doc, err.value.problems)


def test_progress_outside_a_task_is_a_no_op():
    import tfyarn
    tfyarn.progress(step=1, loss=0.5)          # a script runs unchanged outside tfyarn


def test_train_dataset_is_the_planned_share_by_feeder_and_by_tf_ops_alike(tmp_path, monkeypatch):
    """Both readers give this worker exactly epochs x steps_per_epoch() full batches, the same records: the TF ops
    read the share the worker's process staged in its working directory (worker 0's elsewhere is another share)."""
    import tfyarn.data
    from tfyarn.data import build_manifest, plan
    from tfyarn.data.tf_dataset import bind, stage
    spec = _spec(tmp_path, "t.py", tmp_path)
    bind(spec.data, 1, 2)
    steps = tfyarn.data.steps_per_epoch()
    want = min(plan(build_manifest(spec.data.train), 2, e, 0, 200).steps for e in range(2))
    assert steps == want == 5
    for w in (0, 1):
        (tmp_path / f"w{w}").mkdir()
        monkeypatch.chdir(tmp_path / f"w{w}")
        stage(w).join(60)
    monkeypatch.chdir(tmp_path / "w1")
    fed = list(tfyarn.data.train_dataset().as_numpy_iterator())
    by_tf = list(tfyarn.data.train_dataset(worker=1).as_numpy_iterator())
    assert len(fed) == len(by_tf) == 2 * steps
    assert int(tfyarn.data.train_dataset().cardinality()) == 2 * steps
    for (f1, y1), (f2, y2) in zip(fed, by_tf):
        assert sorted(f1) == ["item_id", "user_id"] and y1.shape == (200,)
        np.testing.assert_array_equal(f1["user_id"], f2["user_id"])
        np.testing.assert_array_equal(y1, y2)
    monkeypatch.chdir(tmp_path / "w0")
    other = list(tfyarn.data.train_dataset(epoch=0, worker=0).as_numpy_iterator())
    assert len(other) == steps and not np.array_equal(other[0][0]["user_id"], fed[0][0]["user_id"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_docs_scripts_train_as_entrypoint_jobs(tmp_path):
    require_tf_keras()
    code = tmp_path / "code"
    code.mkdir()
    for name, text in doc_examples().items():
        if name not in ("mwms_tutorial.py", "pss_tutorial.py"):  # their own data (pss_tutorial: on YARN,
            (code / name).write_text(text)                          # tests/cluster/yarn/test_cluster_pss_share.py)
    assert sorted(doc_examples()) == ["custom_loop.py", "mwms_fit.py", "mwms_tutorial.py", "pss_fit.py",
                                      "pss_tutorial.py"]
    jobs = {"mwms_fit.py --epochs 2": {}, "custom_loop.py": {},
            "pss_fit.py": {"mode": "ps", "roles": {"chief": {"instances": 1}, "worker": {"instances": 2},
                                                   "ps": {"instances": 1}}}}
    for i, (entry, over) in enumerate(jobs.items()):
        spec = _spec(tmp_path / f"j{i}", entry, code, **over)
        st = _run(spec)
        assert st.state.value == "SUCCEEDED", (entry, st.diagnostics)
        s = st.summary
        assert s["entrypoint"] == entry and s["custom"] is True and s["last_loss"] is not None, s
        if over:     # PSS: the chief coordinates 2 epochs x (5 steps x 2 workers), reported at the end
            assert s["global_step"] == 20, s
        else:        # MWMS: 2 epochs x 5 equal steps on each worker, reported per step
            assert s["global_step"] == 10 and s["first_loss"] is not None, s
            steps = {t: st.progress.get("per_task", {}).get(t) for t in ("chief:0", "worker:0")}
            assert steps == {"chief:0": 10, "worker:0": 10}, (entry, st.progress)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_raising_program_fails_the_job_with_its_last_traceback_line_without_data(tmp_path):
    spec = _spec(tmp_path, "entrypoint_jobs:bad_flag --colour", JOBS, data=False)
    st = _run(spec)
    assert st.state.value == "FAILED"
    assert "ValueError: unknown flag ['--colour']" in st.diagnostics, st.diagnostics


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_program_that_stops_making_progress_is_ended_by_the_watchdog_naming_the_task(tmp_path):
    spec = _spec(tmp_path, "entrypoint_jobs:stalls", JOBS, data=False,
                 roles={"chief": {"instances": 1}}, timeouts={"rendezvous": 120, "stall": 8, "shutdown": 10})
    st = _run(spec)
    assert st.state.value in ("FAILED", "TIMED_OUT"), st.state
    assert "stall" in st.diagnostics.lower() and "chief:0" in st.diagnostics, st.diagnostics


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_progress_calls_log_output_is_the_heartbeat_the_watchdog_judges(tmp_path):
    """30 s of printing without tfyarn.progress, while the watchdog allows rendezvous + stall = 14 s for a first step:
    not a stall (before the prints counted, this job was TIMED_OUT "training did not start ... chief:0")."""
    spec = _spec(tmp_path, "entrypoint_jobs:chatty", JOBS, data=False, roles={"chief": {"instances": 1}},
                 timeouts={"rendezvous": 10, "stall": 4, "shutdown": 10})
    st = _run(spec)
    assert st.state.value == "SUCCEEDED", st.diagnostics


def _without_callback(script: str) -> str:
    """The tutorial as the user first runs it: no tfyarn.keras.callback() in fit."""
    silent = script.replace("callbacks=[tfyarn.keras.callback()]", "callbacks=[]")
    assert silent != script and "callback()" not in silent
    return silent


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_mwms_tutorial_has_a_true_run_report_with_and_without_the_keras_callback(tmp_path):
    """docs/models.md's "Multi-worker training with Keras" tutorial (2 workers, no chief, 3 epochs of
    steps_per_epoch()): every worker takes exactly its planned batches from train_dataset(), and the summary, status,
    the report and its text say so; with tfyarn.keras.callback() also steps, loss and accuracy; without it the
    global step and the loss are not reported (None), never 0 (issue 39: it ended "global step 0 · examples/s: 0")."""
    require_tf_keras()
    from tfyarn import api
    from tfyarn.data import build_manifest, plan
    from tfyarn.display import progress_text, summary_text

    code = tmp_path / "code"
    code.mkdir()
    script = doc_examples()["mwms_tutorial.py"]
    (code / "mwms_tutorial.py").write_text(script)
    (code / "silent_tutorial.py").write_text(_without_callback(script))
    data = write_digits(str(tmp_path / "data"), records=720)
    for entry, reported in (("silent_tutorial.py", False), ("mwms_tutorial.py", True)):
        spec = load_spec_dict({
            "name": entry.split(".")[0].replace("_", "-"), "code": str(code), "entrypoint": entry,
            "mode": "allreduce", "roles": {"worker": {"instances": 2}},
            "data": {"train": data, "features": DIGIT_FEATURES, "batch_size": 64, "epochs": 3},
            "timeouts": {"rendezvous": 120, "stall": 120, "shutdown": 20}})
        m = build_manifest(spec.data.train)
        planned = 3 * min(plan(m, 2, e, spec.data.shuffle_seed, 64).steps for e in range(3))
        assert planned >= 9, planned
        st = _run(spec)
        assert st.state.value == "SUCCEEDED", (entry, st.diagnostics)
        s = st.summary
        each = {"batches": planned, "examples": planned * 64, "epochs": 3}
        assert {t: {k: v[k] for k in each} for t, v in s["taken"].items()} == {"worker:0": each, "worker:1": each}, s
        assert s["planned_batches"] == planned and s["reported"] is reported, s
        assert set(s["program_s"]) == {"worker:0", "worker:1"} and min(s["program_s"].values()) > 0, s
        assert s["examples_per_sec"] is not None and s["examples_per_sec"] > 0, s
        assert st.progress["taken"] == {"worker:0": planned, "worker:1": planned}, st.progress
        text = summary_text(st)
        line = f"batches taken from train_dataset(): worker:0={planned} worker:1={planned} (of {planned} planned"
        assert line in text and "global batch 128" in text, text
        rep, _ = api.report(st.app_id)
        assert {t: rep["tasks"][t].get("batches_taken") for t in ("worker:0", "worker:1")} == dict.fromkeys(
            ("worker:0", "worker:1"), planned), rep["tasks"]
        if reported:
            assert s["global_step"] == planned and s["steps_per_worker"] == {"worker:0": planned, "worker:1": planned}
            assert s["last_loss"] is not None and "accuracy" in s["metrics"], s
            assert st.progress["per_task"] == {"worker:0": planned, "worker:1": planned}, st.progress
        else:
            assert s["global_step"] is None and s["first_loss"] is None and s["last_loss"] is None, s
            assert s["steps_per_worker"] is None and s["examples_from"] == "train_dataset()", s
            assert st.progress["global_step"] is None and set(st.progress["per_task"].values()) == {None}
            assert "global step not reported" in text and "loss: not reported" in text, text
            assert "examples/s (taken from train_dataset())" in text and "global step 0" not in text, text
            assert f"batches taken from train_dataset() worker:0={planned}" in progress_text(st)
            assert all(rep["tasks"][t]["last_step"] is None for t in ("worker:0", "worker:1")), rep["tasks"]
