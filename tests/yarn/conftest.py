# Fixtures live in yarnutil.py / clusterutil.py (unique module names: several test folders have a conftest.py, so
# tests import shared helpers from them, never from "conftest").
import os
import subprocess
import sys
import time

import pytest

from yarnutil import small_venv, spec  # noqa: F401 - pytest finds fixtures by name here

#: TFYARN_REQUIRE_YARN=1 (scripts/test-yarn, CI): a `yarn` test that skips — no HADOOP_CONF_DIR, a missing
#: package — fails instead, so a cluster suite that silently tested nothing cannot pass.
REQUIRE_YARN = os.environ.get("TFYARN_REQUIRE_YARN") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if (REQUIRE_YARN and rep.skipped and not hasattr(rep, "wasxfail")  # an xfail reports as skipped
            and item.get_closest_marker("yarn") is not None):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"TFYARN_REQUIRE_YARN=1 but this yarn test was skipped: {reason}"


@pytest.fixture(scope="session")
def yarn():
    """One YarnBackend for the whole session (on the session's shared skein driver: tests/conftest.py)."""
    from tfyarn.backends.yarn import YarnBackend
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
    from tfyarn import hdfs
    url = hdfs.join(yarn.staging_dir, "tests", f"s-{time.time_ns()}")
    yield url
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture(scope="session")
def dataset(hdfs_root):
    """Skewed recommender data on HDFS, written once per session: 4 files, the largest 3x the smallest."""
    from tfyarn.data.synth import write_synthetic
    from tfyarn import hdfs
    url = hdfs.join(hdfs_root, "data")
    write_synthetic(url, kind="recommender", files=4, records=4000, skew=3, seed=1, users=100, items=100)
    return url + "/*.tfrecord"
