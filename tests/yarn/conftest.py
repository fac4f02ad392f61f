# Fixtures live in yarnutil.py (a unique module name: several test folders have a conftest.py, so tests import
# shared helpers from yarnutil, never from "conftest").
from yarnutil import small_venv, spec  # noqa: F401 - pytest finds fixtures by name here
