"""SavedModel export (spec ``export:``, ``tfyarn export``): the version dir serves exactly the exported checkpoint's
model; versions are committed by rename (a model server never sees half a version) and pruned to ``keep``; every way
it cannot run says why. The end-of-training export of real jobs is checked in test_ps.py and test_allreduce.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import RECOMMENDER_FEATURES, check_export_matches_checkpoint
from tfyarn.cli import cli
from tfyarn.errors import ExportError, SpecError
from tfyarn.spec import load_spec_dict


def make_spec(tmp_path: Path, **extra):
    doc = {"name": "ex", "model": "tfyarn.models.recommender:model",
           "params": {"num_users": 50, "num_items": 40, "dim": 4, "seed": 3}, "mode": "allreduce",
           "data": {"train": ["unused"], "features": RECOMMENDER_FEATURES, "batch_size": 10},
           "roles": {"worker": {"instances": 1}},
           "checkpoint": {"dir": str(tmp_path / "ckpt")}, **extra}
    return load_spec_dict(doc)


def write_checkpoint(spec, workdir: Path, step: int, shift: float) -> tuple[dict, str]:
    """A committed allreduce-layout checkpoint whose variables differ per ``shift`` (as a trained one would): its
    index entry and its local prefix (as the chief that wrote it keeps them)."""
    import tensorflow as tf
    from tfyarn.train.allreduce import CHECKPOINT_FORMAT, model_variable_keys, train_state
    from tfyarn.train.checkpoint import CheckpointStore
    from tfyarn.train.model import build_model, load
    model = build_model(load(spec.model, spec.params))
    for i, v in enumerate(model.variables):
        v.assign_add(tf.fill(tf.shape(v), shift * (i + 1)))
    prefix = train_state(model, model.optimizer(), tf.Variable(step, dtype=tf.int64)).write(
        str(workdir / f"w{step}" / f"ckpt-{step}"))
    entry = CheckpointStore(spec.checkpoint.dir, keep=3).upload(prefix, step, {
        "format": CHECKPOINT_FORMAT, "model_variables": model_variable_keys(len(model.variables))})
    return entry, prefix


def test_export_needs_a_checkpoint_dir_to_export_from():
    with pytest.raises(SpecError, match="export.dir: the model is exported from the final checkpoint"):
        load_spec_dict({"name": "ex", "model": "a:b", "data": {"train": ["x"], "features": RECOMMENDER_FEATURES,
                                                               "batch_size": 4},
                        "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}}, "export": {"dir": "/tmp/e"}})


def test_relative_export_dir_resolves_against_the_spec_file(tmp_path):
    from tfyarn.spec import load_spec
    (tmp_path / "job.yaml").write_text(
        "name: ex\nmodel: a:b\ndata: {train: [d], features: {label: {dtype: float32}}, batch_size: 4}\n"
        "roles: {ps: {instances: 1}, chief: {instances: 1}}\ncheckpoint: {dir: ck}\nexport: {dir: models, keep: 2}\n")
    spec = load_spec(tmp_path / "job.yaml")
    assert spec.export.dir == str(tmp_path / "models") and spec.export.keep == 2


@pytest.mark.timeout(120)
def test_cli_exports_the_latest_or_a_named_checkpoint_serving_its_exact_model(tmp_path):
    spec = make_spec(tmp_path, export={"dir": str(tmp_path / "models"), "keep": 2})
    for step, shift in ((10, 0.1), (20, 0.2), (30, 0.3)):
        write_checkpoint(spec, tmp_path, step, shift)
    spec_file = tmp_path / "job.json"
    spec_file.write_text(spec.model_dump_json(by_alias=True))
    runner = CliRunner()
    r = runner.invoke(cli, ["export", str(spec_file), "--output", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["checkpoint"] == "ckpt-30" and out["version"] == 30 and out["url"] == str(tmp_path / "models" / "30")
    assert out["downloaded"] is True
    check_export_matches_checkpoint(spec, tmp_path / "models" / "30", "ckpt-30")
    r = runner.invoke(cli, ["export", str(spec_file), "--checkpoint", "ckpt-10"])
    assert r.exit_code == 0 and "exported ckpt-10 as SavedModel version 10" in r.output, r.output
    check_export_matches_checkpoint(spec, tmp_path / "models" / "10", "ckpt-10")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    with pytest.MonkeyPatch.context() as mp:             # --to is relative to the current directory
        mp.chdir(elsewhere)
        r = runner.invoke(cli, ["export", str(spec_file), "--checkpoint", "ckpt-20", "--to", "other"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (elsewhere / "other").iterdir()) == ["20"]
    assert f"{elsewhere / 'other' / '20'}" in r.output
    # keep: 2 — the two newest versions stay; no temporary directory is left behind
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["10", "30"]


def test_every_way_export_cannot_run_says_why_with_exit_2(tmp_path):
    spec = make_spec(tmp_path, export={"dir": str(tmp_path / "models")})
    spec_file = tmp_path / "job.json"
    spec_file.write_text(spec.model_dump_json(by_alias=True))
    r = CliRunner().invoke(cli, ["export", str(spec_file)])
    assert r.exit_code == 2 and f"no committed checkpoint in {tmp_path / 'ckpt'}" in r.output, r.output
    write_checkpoint(spec, tmp_path, 7, 0.1)
    r = CliRunner().invoke(cli, ["export", str(spec_file), "--checkpoint", "ckpt-9"])
    assert r.exit_code == 2 and "no checkpoint 'ckpt-9'" in r.output and "committed: ckpt-7" in r.output, r.output
    # the model changed since (params.dim) or the destination cannot be written: one line each, no traceback
    r = CliRunner().invoke(cli, ["export", str(spec_file), "--set", "params.dim=8"])
    assert r.exit_code == 2 and r.output.startswith("error: export: checkpoint ckpt-7 in ") and "Traceback" not in \
        r.output, r.output
    (tmp_path / "a-file").write_text("")
    r = CliRunner().invoke(cli, ["export", str(spec_file), "--to", str(tmp_path / "a-file" / "models")])
    assert r.exit_code == 2 and r.output.startswith("error: export: ") and "a-file" in r.output, r.output
    no_dest = make_spec(tmp_path)
    from tfyarn import api
    with pytest.raises(ExportError, match="no destination"):
        api.export(no_dest)
    assert not (tmp_path / "models").exists()


def test_versions_are_committed_by_rename_and_pruned(tmp_path):
    from tfyarn.train.export import ExportStore
    src = tmp_path / "sm"
    (src / "variables").mkdir(parents=True)
    (src / "saved_model.pb").write_bytes(b"pb")
    (src / "variables" / "variables.index").write_bytes(b"ix")
    store = ExportStore(str(tmp_path / "out"), keep=2)
    (tmp_path / "out" / ".tmp-dead-5").mkdir(parents=True)     # a crashed upload's debris is not a version
    for v in (5, 12, 9):
        store.upload(src, v)
    assert store.versions() == [9, 12]                          # numeric order, not upload order or names
    assert (tmp_path / "out" / "12" / "variables" / "variables.index").read_bytes() == b"ix"
    (src / "saved_model.pb").write_bytes(b"new")
    store.upload(src, 12)                                       # re-export of the same step replaces it
    assert (tmp_path / "out" / "12" / "saved_model.pb").read_bytes() == b"new"
    store.upload(src, 3)                                        # an older step exported on purpose stays
    assert store.versions() == [3, 9, 12]
    store.upload(src, 15)                                       # and is pruned with the rest by the next one
    assert store.versions() == [12, 15]
    # an upload failing half-way leaves neither a version nor a partial temporary dir
    real_put, calls = store.fs.put_file, []

    def put_file(lpath, rpath, **kw):
        calls.append(rpath)
        if len(calls) == 2:
            raise OSError("disk quota exceeded")
        return real_put(lpath, rpath, **kw)
    store.fs.put_file = put_file
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(OSError, match="quota"):
        store.upload(src, 20)
    assert store.versions() == [12, 15] and sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    assert len(calls) == 2


def test_a_failed_export_at_the_end_fails_the_task_naming_the_destination_and_the_retry(tmp_path):
    from tfyarn.tasklib.context import TaskContext
    from tfyarn.tasklib.kv import MemoryKV
    from tfyarn.train.export import export_at_end
    (tmp_path / "a-file").write_text("")
    spec = make_spec(tmp_path, export={"dir": str(tmp_path / "a-file" / "models")})
    write_checkpoint(spec, tmp_path, 4, 0.1)
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=MemoryKV(), workdir=tmp_path)
    with pytest.raises(RuntimeError) as err:
        export_at_end(ctx)
    msg = str(err.value)
    assert "final checkpoint is committed, but the export to" in msg and "a-file/models" in msg
    assert "tfyarn export SPEC" in msg
    ctx_none = TaskContext(spec=make_spec(tmp_path), role="worker", index=0, kv=MemoryKV(), workdir=tmp_path)
    assert export_at_end(ctx_none) is None


def test_the_end_of_run_export_reads_the_chiefs_local_copy_instead_of_downloading_it(tmp_path):
    """On HDFS, downloading the checkpoint the chief has just uploaded is most of an export's time. With the
    committed entry's local files the export reads those; when they are gone it downloads as the CLI does."""
    from tfyarn.tasklib.context import TaskContext
    from tfyarn.tasklib.kv import MemoryKV
    from tfyarn.train.checkpoint import remove_checkpoint_files
    from tfyarn.train.export import export_at_end
    spec = make_spec(tmp_path, export={"dir": str(tmp_path / "models")})
    entry, prefix = write_checkpoint(spec, tmp_path, 7, 0.2)
    check_store = tmp_path / "ckpt-copy"          # the committed files, for the check after they are removed
    import shutil
    shutil.copytree(tmp_path / "ckpt", check_store)
    for f in (tmp_path / "ckpt").glob("ckpt-7.*"):
        f.unlink()                                # had it downloaded, the export would fail on the missing files
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=MemoryKV(), workdir=tmp_path)
    out = export_at_end(ctx, (entry, prefix))
    assert out["downloaded"] is False and out["checkpoint"] == "ckpt-7" and out["version"] == 7
    spec_copy = make_spec(tmp_path, checkpoint={"dir": str(check_store)})
    check_export_matches_checkpoint(spec_copy, tmp_path / "models" / "7", "ckpt-7")
    # local files gone: downloaded from the store (here: missing there too, so the error names the checkpoint)
    remove_checkpoint_files(prefix)
    with pytest.raises(RuntimeError, match="ckpt-7 listed in .* but its files are missing"):
        export_at_end(ctx, (entry, prefix))
    shutil.rmtree(tmp_path / "ckpt")
    shutil.copytree(check_store, tmp_path / "ckpt")
    out = export_at_end(ctx, (entry, prefix))
    assert out["downloaded"] is True and out["version"] == 7


def test_removing_a_local_checkpoint_leaves_its_neighbours(tmp_path):
    from tfyarn.train.checkpoint import has_checkpoint_files, remove_checkpoint_files
    for name in ("ckpt-12", "ckpt-120"):
        (tmp_path / f"{name}.index").write_bytes(b"i")
        (tmp_path / f"{name}.data-00000-of-00001").write_bytes(b"d")
    assert has_checkpoint_files(tmp_path / "ckpt-12") and not has_checkpoint_files(tmp_path / "ckpt-1")
    remove_checkpoint_files(tmp_path / "ckpt-12")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-120.data-00000-of-00001", "ckpt-120.index"]
    assert not has_checkpoint_files(tmp_path / "ckpt-12")


def test_a_custom_train_function_with_export_is_refused_before_it_runs(tmp_path):
    from tfyarn.tasklib.context import TaskContext
    from tfyarn.tasklib.kv import MemoryKV
    from tfyarn.train import run_task
    jobs = Path(__file__).resolve().parents[2] / "helpers" / "jobs"
    spec = make_spec(tmp_path, model="custom_jobs:quick", code=str(jobs), export={"dir": str(tmp_path / "m")})
    ctx = TaskContext(spec=spec, role="worker", index=0, kv=MemoryKV(), workdir=tmp_path)
    with pytest.raises(ValueError, match="custom_jobs:quick is a custom train function; tfyarn cannot know"):
        run_task(ctx)
    spec_ok = make_spec(tmp_path, model="custom_jobs:quick", code=str(jobs))     # without export it runs
    assert run_task(TaskContext(spec=spec_ok, role="worker", index=0, kv=MemoryKV(), workdir=tmp_path))["pid"]


class TwoHeads:
    """A model whose predictions are a dict (logit and probability): exported with its own output keys."""

    def build(self):
        import tensorflow as tf
        self.w = tf.Variable([[0.5], [-0.25]], name="w")

    def __call__(self, features, training):
        import tensorflow as tf
        x = tf.stack([tf.cast(features["user_id"], tf.float32), tf.cast(features["item_id"], tf.float32)], axis=1)
        logit = tf.squeeze(tf.matmul(x, self.w), axis=1)
        return {"logit": logit, "prob": tf.sigmoid(logit)}

    def loss(self, labels, predictions):
        import tensorflow as tf
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=predictions["logit"])

    def optimizer(self):
        import tensorflow as tf
        return tf.compat.v1.train.GradientDescentOptimizer(0.1)


def two_heads():
    return TwoHeads()


def test_a_model_returning_a_dict_is_served_with_its_own_keys(tmp_path):
    import numpy as np
    import tensorflow as tf
    spec = make_spec(tmp_path, model="test_export:two_heads", params={}, export={"dir": str(tmp_path / "m")})
    write_checkpoint(spec, tmp_path, 5, 1.0)                  # w = [[1.5], [0.75]]
    from tfyarn import api
    out = api.export(spec)
    serve = tf.saved_model.load(out["url"]).signatures["serving_default"]
    got = serve(user_id=tf.constant([1, 0], tf.int64), item_id=tf.constant([0, 4], tf.int64))
    assert sorted(got) == ["logit", "prob"]
    np.testing.assert_allclose(got["logit"].numpy(), [1.5, 3.0], rtol=1e-6)
    np.testing.assert_allclose(got["prob"].numpy(), 1 / (1 + np.exp(-np.array([1.5, 3.0]))), rtol=1e-6)
