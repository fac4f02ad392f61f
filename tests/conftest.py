import os
import subprocess
import sys

import pytest


@pytest.fixture(autouse=True)
def tfyarn_home(tmp_path, monkeypatch):
    """Every test gets its own TFYARN_HOME, so local apps never mix between tests or with the user's."""
    home = tmp_path / "tfyarn-home"
    monkeypatch.setenv("TFYARN_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tensorboard_dir(tmp_path_factory):
    """A directory with the ``tensorboard`` package (not a TF dependency, not in the test venv) for the tensorboard
    role's PYTHONPATH: installed once per session from pip's index/cache, or TFYARN_TEST_TENSORBOARD_PATH."""
    if os.environ.get("TFYARN_TEST_TENSORBOARD_PATH"):
        return os.environ["TFYARN_TEST_TENSORBOARD_PATH"]
    d = tmp_path_factory.mktemp("tensorboard-pkg")
    # --no-deps keeps TF's own numpy/protobuf/grpcio; these are the packages TensorBoard needs beyond TF's
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(d),
                           "tensorboard", "tensorboard-data-server", "markdown", "werkzeug", "markupsafe"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"could not install tensorboard for the tensorboard role:\n{proc.stderr[-2000:]}"
    return str(d)
