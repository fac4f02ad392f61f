"""Helpers of the Kerberos suite (``pytest -m kerberos tests/cluster/kerberos``): the secure cluster of
``scripts/kerberos-cluster``, named by the env its ``env.sh`` sets (``TFYARN_KRB_DATA``, ``HADOOP_CONF_DIR``,
``KRB5_CONFIG``). ``scripts/test-kerberos`` starts one, runs this suite and stops it.

Every command runs as a keytab-only gateway runs (``KRB5CCNAME`` pointing at nothing) unless a test gives it a
ticket cache; skein's global-driver state is this session's own (``SKEIN_CONFIG``), so a driver another process
started for another cluster is never reused.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tfyarn.spec import Kerberos

ROOT = Path(__file__).resolve().parents[2]
FAULT_JOBS = ROOT / "tests" / "functional" / "faults" / "jobs"
REALM = os.environ.get("TFYARN_KRB_REALM", "TFYARN.TEST")
ALICE = f"alice@{REALM}"
NO_TICKET = "FILE:/nonexistent/tfyarn-no-ticket"
SESSION_TAG = f"tfyarn-krb-{uuid.uuid4().hex[:10]}"
JOB_S = float(os.environ.get("TFYARN_TEST_YARN_TIMEOUT", "300"))
FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}

needs_kerberos = [pytest.mark.kerberos, pytest.mark.skipif(
    not os.environ.get("TFYARN_KRB_DATA") or not os.environ.get("HADOOP_CONF_DIR"),
    reason="needs the Kerberized test cluster: scripts/test-kerberos, or `. $(scripts/kerberos-cluster start DIR)`")]


def unique(name: str) -> str:
    return f"{name}-{time.time_ns() % 10**12:012d}"


@pytest.fixture(scope="session")
def cluster() -> dict[str, str]:
    """The secure cluster's facts; the whole session runs without a ticket cache."""
    data = os.environ.get("TFYARN_KRB_DATA")
    if not data:
        pytest.skip("no Kerberized cluster: TFYARN_KRB_DATA is not set (source the env.sh of scripts/kerberos-cluster)")
    from tfyarn.cluster import hdfs
    conf = hdfs.load_hadoop_conf()
    assert conf.get("hadoop.security.authentication") == "kerberos", "HADOOP_CONF_DIR is not the Kerberized cluster"
    os.environ["KRB5CCNAME"] = NO_TICKET
    return {"data": data, "fs": hdfs.default_fs(conf), "keytabs": os.environ["TFYARN_KRB_KEYTABS"]}


@pytest.fixture(scope="session")
def skein_home(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("skein")
    os.environ["SKEIN_CONFIG"] = str(d)
    return str(d)


@pytest.fixture(scope="session")
def alice_keytab(cluster, tmp_path_factory) -> Path:
    """alice's keytab, private, at a path with a unique marker (the leak test greps for it)."""
    d = tmp_path_factory.mktemp(f"secret-{uuid.uuid4().hex[:12]}")
    kt = d / "alice.keytab"
    shutil.copyfile(Path(cluster["keytabs"]) / "alice.keytab", kt)
    kt.chmod(0o600)
    return kt


@pytest.fixture(scope="session")
def krb_env(cluster, skein_home) -> dict[str, str]:
    """The environment of a keytab-only gateway's commands."""
    return {**os.environ, "KRB5CCNAME": NO_TICKET, "SKEIN_CONFIG": skein_home,
            "TFYARN_HOME": os.environ.get("TFYARN_HOME") or str(Path(skein_home) / "tfyarn-home")}


@pytest.fixture(scope="session")
def session_root(cluster, alice_keytab):
    """This session's HDFS dir under alice's home (removed at the end), opened with alice's keytab."""
    from tfyarn.cluster import hdfs
    hdfs.set_login(Kerberos(principal=ALICE, keytab=str(alice_keytab)))
    url = f"{cluster['fs']}/user/alice/tfyarn-tests/{SESSION_TAG}"
    yield url
    fs, path = hdfs.get_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture(scope="session")
def session_data(session_root) -> str:
    """Small recommender data on HDFS, written once per session (through the keytab login)."""
    from tfyarn.data.synth import write_synthetic
    write_synthetic(f"{session_root}/data", kind="recommender", files=2, records=2000, skew=1, seed=1,
                    users=100, items=100)
    return f"{session_root}/data/*.tfrecord"


@pytest.fixture(scope="session")
def small_venv(tmp_path_factory):
    """A fresh, package-free virtualenv (real, small: venv-pack packs it in well under a second)."""
    d = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True)
    return d


def node_python() -> str:
    """The nodes' Python: containers run as alice or bob (LinuxContainerExecutor), who cannot run this venv's
    interpreter (it links into a pyenv under a 0700 /root). A venv of the system's python3.X (same minor: the
    compiled packages fit) in the cluster's dir (0755), seeing this venv's packages through a .pth; made once."""
    import sysconfig
    d = Path(os.environ["TFYARN_KRB_DATA"]) / "node-python"
    py = d / "bin" / "python"
    if not py.exists():
        base = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
        if not os.access(base, os.X_OK):
            pytest.skip(f"no {base} for the containers' accounts to run (the LinuxContainerExecutor's nodes)")
        subprocess.run([base, "-m", "venv", "--without-pip", str(d)], check=True, timeout=60)
        site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              check=True, capture_output=True, text=True).stdout.strip()
        ours = sysconfig.get_path("purelib")
        Path(site, "tfyarn-gateway-venv.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return str(py)


def rm_json(path: str, keytab: str | Path | None = None) -> Any:
    """GET ``/ws/v1/cluster/<path>`` from the ResourceManager (SPNEGO with alice's keytab: the cluster's web
    endpoints refuse plain requests)."""
    import json

    from tfyarn.cluster import hdfs, webauth
    kt = keytab or Path(os.environ["TFYARN_KRB_KEYTABS"]) / "alice.keytab"
    webauth.set_login(Kerberos(principal=ALICE, keytab=str(kt)))
    rm = hdfs.load_hadoop_conf()["yarn.resourcemanager.webapp.address"]
    with webauth.urlopen(f"http://{rm}/ws/v1/cluster/{path}", timeout=10) as r:
        return json.loads(r.read())


def nm_log_dir(cluster) -> Path:
    return Path(cluster["data"]) / "nm-logs"


def job_doc(data: str, name: str, *, keytab: Path | None = None, epochs: int = 1, **over: Any) -> dict:
    """A small ps-mode recommender job run by the nodes' Python (:func:`node_python`: this venv's packages)."""
    doc: dict[str, Any] = {
        "name": name, "model": "tfyarn.models.recommender:model", "mode": "ps", "sync": True,
        "params": {"num_users": 100, "num_items": 100, "dim": 8, "learning_rate": 0.2},
        "data": {"train": [data], "features": FEATURES, "batch_size": 100, "epochs": epochs},
        "roles": {"ps": {"instances": 1, "memory": "1 GiB"}, "chief": {"instances": 1, "memory": "1 GiB"},
                  "worker": {"instances": 1, "memory": "1 GiB"}},
        "environment": {"python": node_python()},
        "timeouts": {"rendezvous": 180, "stall": 180, "step": 120, "shutdown": 30, "allocation": 180},
        "tags": [SESSION_TAG, name],
    }
    if keytab is not None:
        doc["kerberos"] = {"principal": ALICE, "keytab": str(keytab)}
    doc.update(over)
    return doc


def write_spec(tmp_path: Path, doc: dict) -> Path:
    import yaml
    p = tmp_path / f"{doc['name']}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def tfyarn(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI as a user runs it (a new process with its own skein driver)."""
    return subprocess.run([sys.executable, "-m", "tfyarn.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def kinit(keytab: Path, cache: Path, principal: str = ALICE) -> str:
    """A ticket cache of ``principal`` (the ``kinit`` a user runs); returns its KRB5CCNAME."""
    cc = f"FILE:{cache}"
    subprocess.run(["kinit", "-kt", str(keytab), principal], check=True, timeout=30,
                   env={**os.environ, "KRB5CCNAME": cc})
    return cc


def yarn_backend(spec=None):
    """A YarnBackend logged in as the spec's principal (keytab-only, like the CLI)."""
    from tfyarn.backends.yarn.backend import YarnBackend
    b = YarnBackend(driver="private")
    b.login(spec)
    return b


def kill_session_apps(keytab: Path) -> None:
    """Kill whatever this session left running on the shared secure cluster (its tag only)."""
    from tfyarn.backends.yarn.backend import YarnBackend
    os.environ.setdefault("TFYARN_KERBEROS_PRINCIPAL", ALICE)
    os.environ.setdefault("TFYARN_KERBEROS_KEYTAB", str(keytab))
    with YarnBackend(driver="private") as b:
        for app in b.list():
            if SESSION_TAG in app.tags:
                b.kill(app.app_id)
