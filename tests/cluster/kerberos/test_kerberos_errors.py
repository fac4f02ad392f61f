"""Every way a Kerberos login can fail is one line and exit 2 before anything is submitted (issue 23): no ticket
and no keytab on a Kerberized cluster, a principal the keytab does not hold, a keytab others can read, an
unreachable KDC, a missing keytab file. Real CLI processes against the secure cluster, no ticket cache."""
import time

import pytest

from krbutil import ALICE, REALM, job_doc, needs_kerberos, rm_json, tfyarn, unique, write_spec

pytestmark = [*needs_kerberos, pytest.mark.timeout(300)]


def apps_tagged(tag: str) -> list:
    """Apps the ResourceManager knows with this tag (any state): proof that nothing was submitted."""
    return (rm_json(f"apps?applicationTags={tag.lower()}").get("apps") or {}).get("app") or []


def refused(env, spec_path, *, command=("submit",), expect: str) -> str:
    t0 = time.monotonic()
    r = tfyarn(env, *command, str(spec_path), "--yarn")
    took = time.monotonic() - t0
    assert r.returncode == 2, f"exit {r.returncode}, stderr:\n{r.stderr}"
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), f"not one error line:\n{r.stderr}"
    assert expect in errors[0], errors[0]
    assert "Traceback" not in r.stderr
    assert took < 60, f"the refusal took {took:.0f}s"
    return errors[0]


@pytest.fixture
def data_url(cluster):
    return f"{cluster['fs']}/user/alice/no-such-dir/*.tfrecord"   # never read: the login is refused first


def test_no_ticket_and_no_kerberos_section(krb_env, data_url, tmp_path):
    name = unique("krb-noticket")
    spec = write_spec(tmp_path, job_doc(data_url, name))
    line = refused(krb_env, spec, expect="Kerberized")
    assert "kinit" in line and "kerberos: {principal, keytab}" in line
    refused(krb_env, spec, command=("validate", "--check-files"), expect="no Kerberos ticket")
    assert apps_tagged(name) == []


def test_principal_not_in_the_keytab(krb_env, alice_keytab, data_url, tmp_path):
    name = unique("krb-wrongprinc")
    doc = job_doc(data_url, name, keytab=alice_keytab)
    doc["kerberos"]["principal"] = f"bob@{REALM}"
    line = refused(krb_env, write_spec(tmp_path, doc), expect=f"bob@{REALM} is not in the keytab")
    assert ALICE in line and str(alice_keytab) not in line
    assert apps_tagged(name) == []


def test_keytab_readable_by_others(krb_env, alice_keytab, data_url, tmp_path):
    kt = tmp_path / "open.keytab"
    kt.write_bytes(alice_keytab.read_bytes())
    kt.chmod(0o644)
    name = unique("krb-openkt")
    line = refused(krb_env, write_spec(tmp_path, job_doc(data_url, name, keytab=kt)), expect="world-readable")
    assert "chmod 600" in line
    assert apps_tagged(name) == []


def test_missing_keytab(krb_env, data_url, tmp_path):
    name = unique("krb-nokt")
    refused(krb_env, write_spec(tmp_path, job_doc(data_url, name, keytab=tmp_path / "gone.keytab")),
            expect="cannot read the keytab file")


def test_kdc_unreachable(krb_env, alice_keytab, data_url, tmp_path):
    """A krb5.conf whose KDC port nobody listens on (as when the KDC is down)."""
    import os
    import socket
    conf = open(os.environ["KRB5_CONFIG"]).read()
    with socket.socket() as s:   # a free port: bound, then released
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bad = tmp_path / "krb5.conf"
    import re
    bad.write_text(re.sub(r"kdc = 127\.0\.0\.1:\d+", f"kdc = 127.0.0.1:{port}", conf))
    name = unique("krb-nokdc")
    refused({**krb_env, "KRB5_CONFIG": str(bad)}, write_spec(tmp_path, job_doc(data_url, name, keytab=alice_keytab)),
            expect="cannot reach the KDC")
    assert apps_tagged(name) == []
