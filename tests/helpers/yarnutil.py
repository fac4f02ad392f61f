import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tfyarn.gateway.preflight import QueueInfo
from tfyarn.spec import load_spec_dict


def make_spec(**over):
    doc = {
        "name": "yarn-test", "model": "tfyarn.models.recommender:model", "queue": "ml", "user": "alice",
        "tags": ["Team-A", "nightly"],
        "data": {"train": ["hdfs:///data/train-*.tfrecord"], "features": {"label": {"dtype": "float32"}},
                 "batch_size": 8},
        "roles": {"ps": {"instances": 1, "memory": "1 GiB"},
                  "chief": {"instances": 1, "memory": "3 GiB", "vcores": 2},
                  "worker": {"instances": 3, "memory": 4096, "vcores": 4, "gpus": 1, "node_label": "gpu",
                             "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}, "max_restarts": 2}},
        "acls": {"enable": True, "view_users": ["bob"], "modify_groups": ["ml-ops"], "ui_users": ["*"]},
    }
    for k, v in over.items():
        doc[k] = v
    return load_spec_dict(doc)


@dataclass
class StaticClusterInfo:
    """A preflight.ClusterInfo with fixed answers: resource rules tested without a ResourceManager."""
    queues: dict[str, QueueInfo]
    max_memory_mib: int | None = None
    max_vcores: int | None = None

    def queue(self, name: str) -> QueueInfo | None:
        return self.queues.get(name)

    def max_allocation(self) -> tuple[int | None, int | None]:
        return self.max_memory_mib, self.max_vcores


@pytest.fixture
def spec():
    return make_spec()


@pytest.fixture(scope="session")
def small_venv(tmp_path_factory):
    """A fresh, package-free virtualenv (real, small: venv-pack packs it in well under a second)."""
    d = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True)
    return d


def site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def add_dist(venv: Path, name: str, version: str, editable: str | None = None) -> None:
    """Install a minimal distribution record (what pip writes: METADATA, and direct_url.json for -e)."""
    sp = site_packages(venv)
    for old in sp.glob(f"{name}-*.dist-info"):
        shutil.rmtree(old)
    di = sp / f"{name}-{version}.dist-info"
    di.mkdir()
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if editable:
        (di / "direct_url.json").write_text(
            '{"dir_info": {"editable": true}, "url": "file://%s"}' % os.path.abspath(editable))
