"""The Backend interface: every backend takes the same arguments per verb; backends by name, where unknown names and
missing dependencies are one-line usage errors (exit 2) saying what to do; a dry run is the request a submit starts."""
import inspect
import sys

import pytest

from tfyarn import api
from tfyarn.backends import registry
from tfyarn.backends.base import Backend
from tfyarn.backends.local.backend import LocalBackend
from tfyarn.errors import AppNotFound, ExitCode


def test_known_names_and_app_ids_find_their_backend():
    assert isinstance(api.get_backend("local"), LocalBackend)
    assert registry.backend_class("yarn").name == "yarn"
    assert registry.backend_name_for_app("local-20260101-000000-abcdef") == "local"
    assert registry.backend_name_for_app("application_1_0001") == "yarn"


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(registry.BackendUnavailable, match=r"unknown backend 'k8s' \(known: local, yarn\)") as e:
        api.get_backend("k8s")
    assert e.value.exit_code == ExitCode.INVALID
    with pytest.raises(AppNotFound, match=r"app ids are local-… \(local\) or application_… \(yarn\)"):
        registry.backend_name_for_app("k8s-1")


def test_a_backend_whose_dependency_is_missing_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(registry.KNOWN, "yarn", registry.Known("tfyarn_test_no_such_module.backend.X", "application_",
                                                                 "pip install tfyarn-test-extra"))
    with pytest.raises(registry.BackendUnavailable, match="needs the module 'tfyarn_test_no_such_module', which is not "
                                                          "installed here: pip install tfyarn-test-extra"):
        api.status("application_1_0001")


@pytest.mark.parametrize("name", list(registry.KNOWN))
def test_every_backend_takes_the_interface_arguments_of_each_verb(name):
    """A caller (api, the CLI, the Airflow operator) can use any backend the same way: each verb of the ABC exists
    and accepts the ABC's arguments; a backend may only add optional keywords (test knobs such as YARN's poll)."""
    cls = registry.backend_class(name)
    assert not inspect.isabstract(cls), f"{cls.__name__} leaves {sorted(cls.__abstractmethods__)} abstract"
    for verb in ("dryrun", "schedule", "submit", "status", "logs", "kill", "list", "end",
                 "kv", "queue_note", "keep_report", "report_location", "saved_report"):
        base = inspect.signature(getattr(Backend, verb)).parameters
        own = inspect.signature(getattr(cls, verb)).parameters
        assert list(own)[:len(base)] == list(base), (cls.__name__, verb, list(own), list(base))
        extra = [p for p in list(own.values())[len(base):] if p.kind not in (p.VAR_KEYWORD,)]
        assert all(p.default is not p.empty for p in extra), (cls.__name__, verb, extra)


def test_a_local_dry_run_is_the_process_plan(tmp_path, monkeypatch):
    from tfyarn.spec import load_spec_dict
    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    spec = load_spec_dict({"name": "plan", "model": "tfyarn.models.logreg:model", "mode": "allreduce",
                           "data": {"train": [str(tmp_path / "d")], "batch_size": 4,
                                    "features": {"label": {"dtype": "float32"}}},
                           "roles": {"chief": {"instances": 1}, "worker": {"instances": 2, "env": {"A": "1"}}}})
    plan = api.dryrun(spec, "local")
    assert list(plan.tasks) == ["chief:0", "worker:0", "worker:1"] and plan.tasks["worker:1"] == {"A": "1"}
    text = str(plan)
    assert f"3 processes on 127.0.0.1 (app dir under {tmp_path / 'home' / 'apps'})" in text
    assert f"worker:1       {sys.executable} -m tfyarn.task A=1" in text
    assert not (tmp_path / "home").exists()
