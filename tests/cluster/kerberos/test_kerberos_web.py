"""The secure cluster's web endpoints (issue 31): SPNEGO on the NameNode, DataNode, ResourceManager and NodeManager;
tfyarn.cluster.webauth authenticates with a keytab and no ticket cache (no JVM), says what is missing in one line
otherwise; preflight's scheduler read goes through it. A packed venv the containers' account cannot run is refused by
preflight in one line (scripts/kerberos-cluster runs containers as alice/bob: LinuxContainerExecutor)."""
import json
import sys
import urllib.error
import urllib.request

import pytest
from krbutil import ALICE, job_doc, needs_kerberos, tfyarn, unique, write_spec

from tfyarn.spec import Kerberos

pytestmark = needs_kerberos

ENDPOINTS = {"namenode": "dfs.namenode.http-address", "datanode": "dfs.datanode.http.address",
             "resourcemanager": "yarn.resourcemanager.webapp.address",
             "nodemanager": "yarn.nodemanager.webapp.address"}


@pytest.fixture
def webauth_login(cluster, alice_keytab):
    from tfyarn.cluster import webauth
    webauth.set_login(Kerberos(principal=ALICE, keytab=str(alice_keytab)))
    yield webauth
    webauth.set_login(None)


def test_every_web_endpoint_needs_spnego_and_takes_the_keytab_login(webauth_login):
    from tfyarn.cluster import hdfs
    conf = hdfs.load_hadoop_conf()
    for daemon, key in ENDPOINTS.items():
        url = f"http://{conf[key]}/jmx?qry=java.lang:type=Runtime"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=10)
        assert e.value.code == 401 and "Negotiate" in e.value.headers.get("WWW-Authenticate", ""), daemon
        with webauth_login.urlopen(url, timeout=10) as r:     # the keytab login, no ticket cache
            beans = json.loads(r.read())["beans"]
        assert r.status == 200 and beans[0]["name"] == "java.lang:type=Runtime", daemon


def test_no_ticket_no_keytab_is_one_clear_error(cluster):
    from tfyarn.cluster import hdfs, webauth
    webauth.set_login(None)
    url = f"http://{hdfs.load_hadoop_conf()['yarn.resourcemanager.webapp.address']}/ws/v1/cluster/info"
    with pytest.raises(webauth.SpnegoUnavailable) as e:
        webauth.urlopen(url, timeout=10)
    assert "no Kerberos ticket" in str(e.value) and "kinit" in str(e.value) and "\n" not in str(e.value)


def test_preflight_reads_the_scheduler_with_spnego(webauth_login):
    """The queue's state and maxima from the RM's REST answer alone: no skein client (None) is ever asked."""
    from tfyarn.cluster import hdfs
    from tfyarn.backends.yarn.cluster_info import SkeinClusterInfo
    info = SkeinClusterInfo(client=None, conf=hdfs.load_hadoop_conf())
    q = info.queue("default")
    assert q is not None and q.state == "RUNNING" and q.max_memory_mib == 16384, q
    assert info.max_allocation() == (16384, 16)


def test_a_packed_venv_the_containers_cannot_run_is_refused(krb_env, alice_keytab, session_data, tmp_path):
    """This venv's bin/python links into a pyenv under a 0700 /root: alice's containers could not start it."""
    from tfyarn.gateway import task_python
    if task_python.blocker(sys.executable, "alice") is None:
        pytest.skip(f"{sys.executable} is runnable by other users here: nothing to refuse")
    doc = job_doc(session_data, unique("krb-pack-lce"), keytab=alice_keytab, environment={"pack": "venv"})
    r = tfyarn(krb_env, "submit", str(write_spec(tmp_path, doc)), "--yarn", timeout=180)
    assert r.returncode == 2, f"{r.stdout}\n{r.stderr}"
    line = next(ln for ln in r.stderr.splitlines() if "packed venv" in ln)
    assert "which the account 'alice' cannot read" in line and "relocatable env" in line, r.stderr
    assert "environment.python" in line and "readable by others" in line
    assert "nothing was uploaded or submitted" in r.stderr and "Traceback" not in r.stderr
