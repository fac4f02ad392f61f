# Fixtures of the contract suite; helpers live in contractutil.py (a unique module name, like clusterutil.py).
import pytest

from clusterutil import needs_yarn, write_dataset
from contractutil import Harness

#: Where a backend still disagrees with the contract: (test name, backend) -> the disagreement. Such a parameter is a
#: strict xfail, so the day the backends agree the suite says so (an XPASS fails) and the entry must go.
DISAGREEMENTS: dict[tuple[str, str], str] = {}


def pytest_collection_modifyitems(items):
    for item in items:
        spec = getattr(item, "callspec", None)
        reason = DISAGREEMENTS.get((item.originalname, spec.params.get("backend") if spec else None))
        if reason:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


@pytest.fixture(scope="session")
def local_dataset(tmp_path_factory) -> str:
    """The YARN suite's dataset (same generator, same records), as local files."""
    return write_dataset(f"file://{tmp_path_factory.mktemp('contract-data')}")


@pytest.fixture(params=["local", pytest.param("yarn", marks=needs_yarn)])
def backend(request, tmp_path) -> Harness:
    """Each scenario once per backend: local (this test's own TFYARN_HOME, tests/conftest.py) and the real YARN
    cluster named by HADOOP_CONF_DIR (marked ``yarn``: scripts/test-yarn runs it, a plain ``pytest`` skips it)."""
    if request.param == "local":
        return Harness("local", request.getfixturevalue("local_dataset"), f"file://{tmp_path}")
    return Harness("yarn", request.getfixturevalue("dataset"), request.getfixturevalue("hdfs_root"),
                   yarn=request.getfixturevalue("yarn"))
