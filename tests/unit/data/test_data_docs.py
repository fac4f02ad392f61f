"""The examples of docs/data.md work as written: its YAML data section is a valid spec section, and its Python
example runs (a real Parquet file through the feeder into TF's sparse embedding lookup)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tfyarn.spec import load_spec_dict

DOC = Path(__file__).resolve().parents[3] / "docs" / "data.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def test_the_yaml_example_is_a_valid_data_section():
    (block,) = _blocks("yaml")
    data = yaml.safe_load(block)["data"]
    spec = load_spec_dict({"name": "doc", "model": "tfyarn.models.recommender:model", "data": data,
                           "roles": {"chief": {"instances": 1}}, "mode": "allreduce"})
    f = spec.data.features
    assert f["hist"].varlen and f["recent"].pad_to == 5 and f["country"].default == "??"
    assert spec.data.format == "auto"


def test_the_python_example_runs(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    pytest.importorskip("tensorflow")
    (block,) = _blocks("python")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(DOC), "exec"), {})
