"""Helpers of the operations tests: a small real job (custom train functions from tests/functional/ops/jobs, no
TensorFlow)."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from launch_helpers import tiny_data  # (tests/helpers is on sys.path: tests/conftest.py)

OPS = Path(__file__).resolve().parents[1] / "functional" / "ops"
JOBS = OPS / "jobs"
DAGS = OPS / "dags"
ROOT = OPS.parents[2]


def job_spec(tmp_path: Path, model: str = "ops_jobs:short", **overrides) -> dict:
    """A valid spec dict: allreduce chief + one worker running a custom train function from
    tests/functional/ops/jobs."""
    spec = {
        "name": "ops-test", "model": model, "code": str(JOBS), "mode": "allreduce",
        "params": {"steps": 40, "dt": 0.05},
        "data": {"train": tiny_data(tmp_path), "batch_size": 4,
                 "features": {"label": {"dtype": "float32"}}},
        "roles": {"chief": {"instances": 1}, "worker": {"instances": 1}},
        "timeouts": {"rendezvous": 30, "shutdown": 10},
    }
    spec.update(overrides)
    return spec


def write_spec(tmp_path: Path, spec: dict, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def tfyarn_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tfyarn.cli", *args]
