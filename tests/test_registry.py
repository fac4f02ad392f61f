"""Backends by name: unknown names and missing dependencies are one-line usage errors (exit 2) saying what to do."""
import pytest

from tfyarn import api
from tfyarn.backends import registry
from tfyarn.backends.local import LocalBackend
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
