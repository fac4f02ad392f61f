# Fixtures live in krbutil.py (a unique module name: several test folders have a conftest.py).
import os

import pytest

from krbutil import (alice_keytab, cluster, krb_env, session_data, session_root, skein_home,  # noqa: F401
                     small_venv)

#: TFYARN_REQUIRE_KERBEROS=1 (scripts/test-kerberos, CI): a `kerberos` test that skips — no Kerberized cluster in
#: the environment, a missing tool — fails instead, so a suite that silently tested nothing cannot pass.
REQUIRE_KERBEROS = os.environ.get("TFYARN_REQUIRE_KERBEROS") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if (REQUIRE_KERBEROS and rep.skipped and not hasattr(rep, "wasxfail")     # an expected failure is no skip
            and item.get_closest_marker("kerberos") is not None):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"TFYARN_REQUIRE_KERBEROS=1 but this kerberos test was skipped: {reason}"
