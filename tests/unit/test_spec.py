"""Job spec: validation collects every problem with its YAML path; overrides; units; path resolution; schema."""
import json

import pytest
import yaml

from tfyarn.errors import SpecError
from tfyarn.spec import (JobSpec, json_schema, load_spec, load_spec_dict, load_spec_json, parse_duration_s,
                         parse_memory_mib)

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
    p = problems(doc(model="not a ref", roles__trainer={"instances": 1}, roles__wrker={"instances": 3}))
    assert any(x.startswith("model: 'not a ref'") for x in p)
    # a role name is a key like any other: a typo gets the closest role, or the list of roles
    assert "roles.wrker: unknown key (did you mean 'worker'?)" in p
    assert "roles.trainer: unknown key (typo? known here: chief, worker, ps, evaluator, tensorboard)" in p


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
    with pytest.raises(SpecError) as info:      # a malformed override is listed beside the spec's other problems
        load_spec_dict(doc(), ["roles.worker.instances=-1", "nonsense"])
    assert info.value.problems == ["--set 'nonsense': expected key.path=value",
                                   "roles.worker.instances: -1 input should be greater than or equal to 0"]


def test_relative_paths_resolve_against_the_spec_file(tmp_path):
    d = doc(data__train="data/*.tfrecord", checkpoint={"dir": "../runs/ckpt"}, code="src")
    d["data"]["index_cache"] = "idx"
    d["kerberos"] = {"principal": "me@R", "keytab": "../me.keytab"}
    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / "job.yaml"
    path.write_text(yaml.safe_dump(d))
    s = load_spec(path)
    assert s.data.train == [str(tmp_path / "specs" / "data" / "*.tfrecord")]
    assert s.checkpoint.dir == str(tmp_path / "runs" / "ckpt")
    assert s.code == str(tmp_path / "specs" / "src")
    assert s.data.index_cache == str(tmp_path / "specs" / "idx")
    assert s.kerberos.keytab == str(tmp_path / "me.keytab")        # every path field absolute once, at load
    again = load_spec_json(s.to_json())  # what tasks read
    assert again == s


def test_a_spec_given_as_a_dict_has_its_relative_paths_made_absolute_against_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = load_spec_dict(doc(data__train="data/*.tfrecord", checkpoint={"dir": "ckpt"}))
    assert s.data.train == [str(tmp_path / "data" / "*.tfrecord")] and s.checkpoint.dir == str(tmp_path / "ckpt")
    assert load_spec_dict(doc(data__train="hdfs:///d/*.tfrecord")).data.train == ["hdfs:///d/*.tfrecord"]


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
    specs = sorted((Path(__file__).parents[2] / "specs").glob("*.yaml"))
    assert specs, "no example specs found"
    for p in specs:
        assert isinstance(load_spec(p), JobSpec), p


def test_the_readme_spec_example_is_valid():
    import re
    from pathlib import Path
    readme = (Path(__file__).parents[2] / "README.md").read_text()
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
        "allocation, node_lost, rerequest)",
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


# -- the JSON Schema accepts every form the loader accepts -------------------------------------------------------------

def _schema_errors(d):
    import jsonschema
    validator = jsonschema.Draft202012Validator(json_schema())
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(d))


def test_json_schema_is_valid_and_accepts_the_shipped_specs():
    import jsonschema
    from pathlib import Path
    jsonschema.Draft202012Validator.check_schema(json_schema())
    specs = sorted((Path(__file__).parents[2] / "specs").glob("*.yaml"))
    assert {p.name for p in specs} >= {"quickstart.yaml", "ctr-yarn.yaml"}
    for p in specs:
        assert _schema_errors(yaml.safe_load(p.read_text())) == [], p


@pytest.mark.parametrize("changes", [
    {"data__train": ["a/*.tfrecord", "hdfs:///b/*.tfrecord"], "data__eval": "c/*.tfrecord"},
    {"roles__worker__memory": 1536, "roles__ps__memory": "512 MiB", "roles__chief__memory": "1.5GiB"},
    {"roles__worker__memory": "2g", "roles__ps__memory": 1.5, "roles__chief__memory": "1 tb"},
    {"timeouts": {"stall": 90, "step": 2.5, "rendezvous": "250ms", "active_deadline": "1h", "allocation": "10 min"}},
    {"timeouts__active_deadline": None, "checkpoint": {"every_secs": None, "every_steps": 100}},
    {"checkpoint": {"every_secs": "10m", "dir": "ck"}, "retry": {"max_attempts": 2, "backoff": 30}},
    {"roles__worker__env": {"A": "x", "N": 4, "F": 0.5, "B": True}},
    {"data__features__emb": {"dtype": "float32", "shape": [4, 2]}, "environment": {"pack": "venv"}},
])
def test_json_schema_accepts_what_the_loader_accepts(changes):
    d = doc(**changes)
    load_spec_dict(json.loads(json.dumps(d)))
    assert _schema_errors(d) == []


@pytest.mark.parametrize("changes,where", [
    ({"roles__worker__instances": "many"}, "roles.worker.instances"),
    ({"roles__worker__memory": "8 gigs"}, "roles.worker.memory"),
    ({"roles__worker__memory": 0}, "roles.worker.memory"),
    ({"timeouts__stall": "soon"}, "timeouts.stall"),
    ({"timeouts__stall": None}, "timeouts.stall"),
    ({"data__epochs": True}, "data.epochs"),
    ({"data__train": 3}, "data.train"),
    ({"roles__trainer": {"instances": 1}}, "roles"),
    ({"data__epoch": 3}, "data"),
])
def test_json_schema_rejects_what_the_loader_rejects(changes, where):
    d = doc(**changes)
    with pytest.raises(SpecError):
        load_spec_dict(json.loads(json.dumps(d)))
    errors = _schema_errors(d)
    assert errors and all(e.startswith(where) for e in errors), errors


def test_schema_patterns_agree_with_the_unit_parsers():
    import re
    schema = json.dumps(json_schema())
    patterns = set(re.findall(r'"pattern": "((?:[^"\\]|\\.)*)"', schema))
    size = next(json.loads(f'"{p}"') for p in patterns if "Ii" in p)
    duration = next(json.loads(f'"{p}"') for p in patterns if "ms|" in p)
    for text in ["2 GiB", "2g", "512 MiB", "1.5GiB", "1 GB", "3kb", "7 Ti", "2048", "8 gigs", "2 XB", "GiB", "-1 GiB"]:
        try:
            ok = parse_memory_mib(text) > 0
        except ValueError:
            ok = False
        assert bool(re.search(size, text)) == ok, text
    for text in ["30s", "5m", "1h", "250ms", "2 hrs", "1.5d", "90", "soon", "5 minutes", "-3s", "3S"]:
        try:
            ok = parse_duration_s(text) > 0
        except ValueError:
            ok = False
        assert bool(re.search(duration, text)) == ok, text


# -- duplicate keys are mistakes ---------------------------------------------------------------------------------------

def test_duplicate_keys_are_errors_naming_the_path_and_lines(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc(), sort_keys=False).replace("  batch_size: 32\n",
                                                                    "  epochs: 3\n  batch_size: 32\n  epochs: 5\n")
                    + "name: again\n" + "tags: [{a: 1, b: 2, a: 3}]\n")
    lines = path.read_text().splitlines()
    e3, e5 = lines.index("  epochs: 3") + 1, lines.index("  epochs: 5") + 1
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.problems == ["name: duplicate key (lines 1 and %d)" % (len(lines) - 1),
                                   f"data.epochs: duplicate key (lines {e3} and {e5})",
                                   f"tags.0.a: duplicate key (line:column {len(lines)}:9 and {len(lines)}:21)"]
    assert info.value.exit_code == 2


def test_duplicate_keys_in_overrides_and_merge_keys(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec_dict(doc(), ["params={a: 1, a: 2}"])
    assert info.value.problems == ["--set params.a: duplicate key (line:column 1:2 and 1:8)"]
    with pytest.raises(SpecError, match="--set tags: not valid YAML"):
        load_spec_dict(doc(), ["tags=[unclosed"])
    path = tmp_path / "job.yaml"   # a merge key (<<) overriding an anchored mapping's key is not a duplicate
    text = "params: &res {instances: 1, memory: 1 GiB}\n" + yaml.safe_dump(doc())
    path.write_text(text.replace("  ps:\n    instances: 1\n", "  ps:\n    <<: *res\n    memory: 2 GiB\n"))
    assert load_spec(path).roles["ps"].memory_mib == 2048


def test_the_cli_exits_2_on_duplicate_keys(tmp_path):
    from click.testing import CliRunner
    from tfyarn.cli import cli
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc()) + "queue: a\nqueue: b\n")
    r = CliRunner().invoke(cli, ["validate", str(path)])
    assert r.exit_code == 2 and "queue: duplicate key (lines" in r.output


# -- integers and booleans are not coerced -----------------------------------------------------------------------------

@pytest.mark.parametrize("changes,path", [
    ({"data__epochs": True}, "data.epochs"),
    ({"data__batch_size": 2.5}, "data.batch_size"),
    ({"data__batch_size": 32.0}, "data.batch_size"),
    ({"data__shuffle_seed": "7"}, "data.shuffle_seed"),
    ({"roles__worker__instances": False}, "roles.worker.instances"),
    ({"roles__worker__vcores": True}, "roles.worker.vcores"),
    ({"checkpoint": {"every_steps": True}}, "checkpoint.every_steps"),
    ({"retry": {"max_attempts": True}}, "retry.max_attempts"),
    ({"export": {"dir": "x", "keep": True}}, "export.keep"),
    ({"data__features__label": {"dtype": "float32", "shape": [True]}}, "data.features.label.shape.0"),
    ({"sync": 1}, "sync"),
    ({"fail_on_nan_loss": "no"}, "fail_on_nan_loss"),
    ({"acls": {"enable": "yes"}}, "acls.enable"),
])
def test_integers_and_booleans_are_strict(changes, path):
    p = problems(doc(**changes))
    assert len(p) == 1 and p[0].startswith(f"{path}: "), p


def test_strict_integers_still_come_from_yaml_and_overrides(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc()) + "sync: yes\n")
    spec = load_spec(path, ["data.epochs=3", "roles.worker.vcores=2", "checkpoint.every_steps=50",
                            "fail_on_nan_loss=false"])
    assert (spec.data.epochs, spec.roles["worker"].vcores, spec.checkpoint.every_steps) == (3, 2, 50)
    assert spec.sync is True and spec.fail_on_nan_loss is False
    assert load_spec_json(spec.to_json()) == spec
