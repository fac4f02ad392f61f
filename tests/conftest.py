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


@pytest.fixture(scope="session", autouse=True)
def shared_skein_driver(tmp_path_factory):
    """The session's commands share one skein driver (tfyarn's shared driver, in a session directory: the
    per-test TFYARN_HOME would start one per test), stopped at the end so no JVM outlives the tests; its idle
    time bounds what a killed session leaves."""
    from tfyarn.backends import yarn_driver
    d = tmp_path_factory.mktemp("skein-driver")
    saved = {k: os.environ.get(k) for k in (yarn_driver.DIR_ENV, yarn_driver.IDLE_ENV)}
    os.environ[yarn_driver.DIR_ENV] = str(d)
    os.environ.setdefault(yarn_driver.IDLE_ENV, "300")
    yield d
    yarn_driver.stop_all(d)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


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
