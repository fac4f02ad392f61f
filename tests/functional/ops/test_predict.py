"""tfyarn predict on the local backend, real processes end to end: every input row scored once with the
SavedModel's own predictions; a re-run refused unless --overwrite; a model that does not take the spec's features
refused before any task starts (one line naming both sides); corrupt records following on_corrupt."""
import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from faultutil import corrupt_record
from predictutil import predict_doc, read_output, reference_predictions, write_model, write_parquet
from tfyarn import api
from tfyarn.backends.base import AppState
from tfyarn.cli import cli
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(300)
pa = pytest.importorskip("pyarrow")
pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    write_model(root, version=3)
    return write_model(root, version=12)   # latest


def _spec_file(tmp_path, doc) -> str:
    path = tmp_path / "score.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_three_workers_score_every_row_once_with_the_models_own_predictions(tmp_path, model):
    total = write_parquet(tmp_path / "in", [2500, 4000, 37])
    doc = predict_doc(f"{model.parent}/latest", str(tmp_path / "in"), str(tmp_path / "out"), workers=3)
    st = api.predict(load_spec_dict(doc), "local", timeout=240)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    s = st.summary
    assert (s["rows_in"], s["rows_out"], s["skipped"]) == (total, total, 0)
    assert s["parts"] == 6 and s["model"] == str(model) and s["bytes"] > 0   # 2179 rows each: 2 parts per worker
    out = read_output(str(tmp_path / "out"))
    assert out.column_names == ["row", "user_id", "item_id", "predictions"]
    assert out["row"].to_pylist() == list(range(total))   # every row once, in input order
    ref = reference_predictions(model, out["user_id"].to_numpy(), out["item_id"].to_numpy())
    np.testing.assert_allclose(out["predictions"].to_numpy(), ref, rtol=1e-6, atol=1e-6)
    success = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert success["rows_out"] == total and success["parts"] == 6
    assert not (tmp_path / "out" / "_tfyarn" / "tmp").exists()
    p = st.progress or {}
    assert p.get("rows_total") == total and p.get("rows") == total, p


def test_a_rerun_is_refused_unless_overwrite(tmp_path, model):
    total = write_parquet(tmp_path / "in", [3000])
    path = _spec_file(tmp_path, predict_doc(str(model), str(tmp_path / "in"), str(tmp_path / "out"), workers=1))
    first = CliRunner().invoke(cli, ["-q", "predict", path, "--local", "--output", "json"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(cli, ["-q", "predict", path, "--local"])
    assert again.exit_code == 2
    assert f"predict.output: {tmp_path / 'out'} already holds a complete run (_SUCCESS); pass --overwrite" in (
        again.output
    )
    assert len(api.list_apps()) == 1   # nothing started the second time
    over = CliRunner().invoke(
        cli, ["-q", "predict", path, "--local", "--overwrite", "--set", "predict.output_format=tfrecord",
              "--set", "predict.keep=[row]", "--output", "json"]
    )
    assert over.exit_code == 0, over.output
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["_SUCCESS", "_tfyarn", "part-00000.tfrecord", "part-00001.tfrecord"]   # the Parquet is gone
    from tfyarn.data import build_manifest
    from tfyarn.data.parse import decode_example
    from tfyarn.data.tfrecord import iter_chunks

    m = build_manifest(str(tmp_path / "out"), use_cache=False)
    assert m.total_records == total
    rows = [decode_example(p)["row"][1][0] for fi in m.files for c in iter_chunks(fi.path, 0, fi.records)
            for p in c.payloads]
    assert rows == list(range(total))


@pytest.mark.parametrize("features,line", [
    ({"user_id": {"dtype": "int64"}},
     "predict.saved_model: the model's input 'item_id' (int64) is not among predict.features (user_id)"),
    ({"user_id": {"dtype": "int64"}, "item_id": {"dtype": "float32"}},
     "predict.saved_model: the model's input 'item_id' is int64, predict.features.item_id is float32"),
])
def test_a_model_that_does_not_take_the_features_fails_before_any_task_starts(tmp_path, model, features, line):
    write_parquet(tmp_path / "in", [100])
    doc = predict_doc(str(model), str(tmp_path / "in"), str(tmp_path / "out"), features=features, keep=[])
    r = CliRunner().invoke(cli, ["predict", _spec_file(tmp_path, doc), "--local"])
    assert r.exit_code == 2, r.output
    assert f"  - {line} ({model})" in r.output
    assert api.list_apps() == [] and not (tmp_path / "out").exists()


def test_corrupt_records_fail_the_job_or_are_skipped_counted_and_listed(tmp_path, model):
    from tfyarn.data import write_synthetic
    files = write_synthetic(str(tmp_path / "in"), "recommender", files=2, records=3000, skew=1.5, seed=3,
                            users=100, items=100)
    offset = corrupt_record(files[1], 17)
    doc = predict_doc(str(model), str(tmp_path / "in"), str(tmp_path / "out"), keep=["user_id", "item_id"])
    failed = api.predict(load_spec_dict(doc), "local", timeout=240)
    assert failed.state is AppState.FAILED
    assert f"{files[1]}: record 17 at byte offset {offset}" in failed.diagnostics
    doc["predict"]["on_corrupt"] = "skip"
    st = api.predict(load_spec_dict(doc), "local", overwrite=True, timeout=240)
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    s = st.summary
    assert (s["rows_in"], s["rows_out"], s["skipped"]) == (3000, 2999, 1)
    assert s["skipped_at"] and f"{files[1]}: record 17" in s["skipped_at"][0]
    assert read_output(str(tmp_path / "out")).num_rows == 2999
