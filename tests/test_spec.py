"""Job spec: validation collects every problem with its YAML path; overrides; units; path resolution; schema."""
import json

import pytest
import yaml

from tfyarn.errors import SpecError
from tfyarn.spec import JobSpec, json_schema, load_spec, load_spec_dict, load_spec_json, parse_duration_s, parse_memory_mib

BASE = {
    "name": "t", "model": "tfyarn.models.recommender:model", "mode": "ps",
    "data": {"train": "file:///data/*.tfrecord", "batch_size": 32,
             "features": {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}}},
    "roles": {"ps": {"instances": 1}, "chief": {"instances": 1}, "worker": {"instances": 2, "memory": "2 GiB"}},
}


def doc(**changes):
    d = json.loads(json.dumps(BASE))
    for path, value in changes.items():
        cur = d
        keys = path.split("__")
        for k in keys[:-1]:
            cur = cur.setdefault(k, {})
        cur[keys[-1]] = value
    return d


def problems(d):
    with pytest.raises(SpecError) as info:
        load_spec_dict(d)
    return info.value.problems


def test_valid_spec_derives_tasks_and_global_batch():
    s = load_spec_dict(doc())
    assert s.tasks() == ["ps:0", "chief:0", "worker:0", "worker:1"]
    assert s.training_tasks == ["chief:0", "worker:0", "worker:1"]
    assert s.global_batch_size == 96
    assert s.roles["worker"].memory_mib == 2048
    assert s.data.label == "label"


def test_three_mistakes_are_all_reported_with_paths():
    d = doc(roles__worker__memory="8 gigs", data__epoch=3, timeouts={"stall": "soon"})
    assert problems(d) == [
        "data.epoch: unknown key (did you mean 'epochs'?)",
        "roles.worker.memory: '8 gigs' is not a size (examples: '2 GiB', '512 MiB', 2048)",
        "timeouts.stall: 'soon' is not a duration (examples: '30s', '5m', '1h', 90)",
    ]


def test_missing_required_and_wrong_type():
    d = doc()
    del d["model"]
    d["data"]["batch_size"] = "many"
    p = problems(d)
    assert "model: required" in p
    assert any(x.startswith("data.batch_size: 'many'") for x in p)


def test_topology_errors_are_listed_separately():
    p = problems(doc(roles={"chief": {"instances": 2}, "worker": {"instances": 0}}))
    assert p == ["roles.chief.instances: at most 1 chief", "roles.ps.instances: mode 'ps' needs at least one ps"]


def test_restart_rules_are_one_problem_each():
    p = problems(doc(sync=True, roles__worker__max_restarts=2, roles__ps__max_restarts=1))
    assert len(p) == 2
    assert p[0].startswith("roles.ps.max_restarts: a restarted ps cannot rejoin") and p[0].endswith(
        "use retry.max_attempts")
    assert p[1].startswith("roles.worker.max_restarts: sync ps mode cannot rejoin")


def test_allreduce_forbids_ps_and_evaluator_needs_eval_data():
    p = problems(doc(mode="allreduce", roles__evaluator={"instances": 1}))
    assert "roles.ps: mode 'allreduce' has no parameter servers (remove roles.ps)" in p
    assert "data.eval: an evaluator needs eval data" in p


def test_bad_model_reference_and_unknown_role():
    p = problems(doc(model="not a ref", roles__trainer={"instances": 1}))
    assert any(x.startswith("model: 'not a ref'") for x in p)
    assert any(x.startswith("roles.trainer") for x in p)


def test_label_must_be_a_feature():
    p = problems(doc(data__label="clicked"))
    assert p == ["data: label: 'clicked' is not one of the features (label, user_id)"]


@pytest.mark.parametrize("value,mib", [("2 GiB", 2048), ("2g", 2048), ("512 MiB", 512), (1024, 1024),
                                       ("1.5GiB", 1536), ("1 GB", 954)])
def test_memory_units(value, mib):
    assert parse_memory_mib(value) == mib


@pytest.mark.parametrize("value,secs", [("30s", 30), ("5m", 300), ("1h", 3600), (90, 90), ("250ms", 0.25)])
def test_durations(value, secs):
    assert parse_duration_s(value) == pytest.approx(secs)


def test_overrides_are_yaml_parsed_and_validated():
    s = load_spec_dict(doc(), ["roles.worker.instances=4", "data.epochs=3", "tags=[a, b]", "timeouts.stall=2m"])
    assert s.instances("worker") == 4 and s.data.epochs == 3 and s.tags == ["a", "b"]
    assert s.timeouts.stall == 120
    with pytest.raises(SpecError) as info:
        load_spec_dict(doc(), ["roles.worker.instances=-1", "nonsense"])
    assert info.value.problems == ["--set 'nonsense': expected key.path=value"]


def test_relative_paths_resolve_against_the_spec_file(tmp_path):
    d = doc(data__train="data/*.tfrecord", checkpoint={"dir": "../runs/ckpt"}, code="src")
    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / "job.yaml"
    path.write_text(yaml.safe_dump(d))
    s = load_spec(path)
    assert s.data.train == [str(tmp_path / "specs" / "data" / "*.tfrecord")]
    assert s.checkpoint.dir == str(tmp_path / "runs" / "ckpt")
    assert s.code == str(tmp_path / "specs" / "src")
    again = load_spec_json(s.to_json())  # what tasks read
    assert again == s


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)


def test_json_schema_describes_roles_and_forbids_extra_keys():
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert "roles" in schema["properties"] and "data" in schema["properties"]


def test_shipped_specs_are_valid():
    from pathlib import Path
    specs = sorted((Path(__file__).parent.parent / "specs").glob("*.yaml"))
    assert specs, "no example specs found"
    for p in specs:
        assert isinstance(load_spec(p), JobSpec), p


def test_the_readme_spec_example_is_valid():
    import re
    from pathlib import Path
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"## The job spec\n\n```yaml\n(.*?)```", readme, re.S).group(1)
    spec = load_spec_dict(yaml.safe_load(block))
    assert spec.retry.max_attempts == 3 and spec.sync


def test_unknown_keys_name_the_closest_known_key_or_list_the_known_ones():
    d = doc(roles__worker__memroy="1 GiB", timeouts={"zzz": 1})
    d["chekpoint"] = {}
    d["data"]["batch_szie"] = 8
    assert problems(d) == [
        "data.batch_szie: unknown key (did you mean 'batch_size'?)",
        "roles.worker.memroy: unknown key (did you mean 'memory'?)",
        "timeouts.zzz: unknown key (typo? known here: rendezvous, stall, shutdown, step, active_deadline, "
        "allocation)",
        "chekpoint: unknown key (did you mean 'checkpoint'?)",
    ]


def test_warm_start_source_must_be_another_dir_and_resolves_against_the_spec_file(tmp_path):
    assert problems(doc(checkpoint={"dir": "hdfs:///ck/a/", "init_from": "hdfs:///ck/a"})) == [
        "checkpoint.init_from: is checkpoint.dir itself (a job resumes from its own dir anyway); name another job's "
        "checkpoint dir"]
    assert load_spec_dict(doc(checkpoint={"init_from": "hdfs:///ck/a"})).checkpoint.init_from == "hdfs:///ck/a"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc(checkpoint={"dir": "new", "init_from": "../old"})))
    spec = load_spec(tmp_path / "job.yaml")
    assert spec.checkpoint.init_from == str((tmp_path.parent / "old").resolve())
