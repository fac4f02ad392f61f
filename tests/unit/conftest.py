# Fixtures live in yarnutil.py / clusterutil.py (unique module names: several test folders have a conftest.py, so
# tests import shared helpers from them, never from "conftest").
# The session fixtures the contract suite shares (`yarn`, `hdfs_root`, `dataset`) and the TFYARN_REQUIRE_YARN hook
# are in tests/conftest.py.
from yarnutil import small_venv, spec  # noqa: F401 - pytest finds fixtures by name here
