import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: The suites' shared helper modules (tests/helpers: launch_helpers, clusterutil, yarnutil, krbutil, harness...: unique
#: names, imported as top-level modules by every suite; the session fixtures below use them too).
sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))

#: TFYARN_REQUIRE_YARN=1 (scripts/test-yarn, CI): a `yarn` test that skips — no HADOOP_CONF_DIR, a missing
#: package — fails instead, so a cluster suite that silently tested nothing cannot pass.
REQUIRE_YARN = os.environ.get("TFYARN_REQUIRE_YARN") == "1"


def pytest_addoption(parser):
    parser.addoption("--part", metavar="K/N", help="run only part K of N of the selected tests, whole modules "
                     "each, parts of about equal time by --part-durations (tests/helpers/halves.py)")
    parser.addoption("--part-durations", metavar="JSON", help="test node id -> seconds, for --part")


@pytest.hookimpl(trylast=True)  # after -m / -k deselected theirs: every part splits the same list
def pytest_collection_modifyitems(config, items):
    if not config.getoption("--part"):
        return
    import halves  # tests/helpers

    try:
        k, n = halves.parse_part(config.getoption("--part"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    path = config.getoption("--part-durations")
    parts = halves.split(items, halves.load_durations(path) if path else {}, n)
    keep = {id(i) for i in parts[k - 1]}
    config.hook.pytest_deselected(items=[i for i in items if id(i) not in keep])
    items[:] = parts[k - 1]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if (REQUIRE_YARN and rep.skipped and not hasattr(rep, "wasxfail")  # an xfail reports as skipped
            and item.get_closest_marker("yarn") is not None):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"TFYARN_REQUIRE_YARN=1 but this yarn test was skipped: {reason}"


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
    from tfyarn.backends.yarn import driver
    d = tmp_path_factory.mktemp("skein-driver")
    saved = {k: os.environ.get(k) for k in (driver.DIR_ENV, driver.IDLE_ENV)}
    os.environ[driver.DIR_ENV] = str(d)
    os.environ.setdefault(driver.IDLE_ENV, "300")
    yield d
    driver.stop_all(d)
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


# ---------------------------------------------------------------------- YARN (tests/cluster/yarn, tests/contract)
@pytest.fixture(scope="session")
def yarn():
    """One YarnBackend for the whole session (on the session's shared skein driver, above)."""
    from tfyarn.backends.yarn.backend import YarnBackend
    from clusterutil import SESSION_TAG
    b = YarnBackend(staging_dir=os.environ.get("TFYARN_STAGING_DIR"))
    yield b
    try:   # a test that failed half-way must not leave its apps running on a shared cluster
        for app in b.list():
            if SESSION_TAG in app.tags:
                b.kill(app.app_id)
    finally:
        b.close()


@pytest.fixture(scope="session")
def hdfs_root(yarn):
    """This session's own HDFS directory (removed at the end): data, checkpoints, exports."""
    import fsspec
    from tfyarn.cluster import hdfs
    url = hdfs.join(yarn.staging_dir, "tests", f"s-{time.time_ns()}")
    yield url
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture(scope="session")
def dataset(hdfs_root):
    """Skewed recommender data on HDFS, written once per session: 4 files, the largest 3x the smallest."""
    from clusterutil import write_dataset
    from tfyarn.cluster import hdfs
    return write_dataset(hdfs.join(hdfs_root, "data"))
