"""Against a live YARN cluster: ``pytest -m yarn`` with HADOOP_CONF_DIR naming its client config.

Start one with ``scripts/hadoop-cluster start`` (or ``scripts/minicluster/start.sh``, docker). These jobs pack the
gateway's environment (``environment.pack: auto``); the other cluster tests run the node's Python. A task raising in
its container and preflight's refusals: test_cluster_faults.py. Without HADOOP_CONF_DIR every test here is skipped. These
run the real path end to end: preflight, packing + HDFS staging, skein driver, containers, KV, logs, kill.
"""
import os
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.yarn, pytest.mark.skipif(
    not os.environ.get("HADOOP_CONF_DIR"),
    reason="needs a live YARN cluster: set HADOOP_CONF_DIR (e.g. scripts/minicluster/start.sh prints it)")]

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = float(os.environ.get("TFYARN_TEST_YARN_TIMEOUT", "900"))


@pytest.fixture(scope="module")
def backend():
    from tfyarn.backends.yarn import YarnBackend
    staging = os.environ.get("TFYARN_STAGING_DIR")
    b = YarnBackend(staging_dir=staging)
    yield b
    b.close()


@pytest.fixture(scope="module")
def data_url(backend):
    """Synthetic recommender data written to HDFS (through hdfs-native)."""
    from tfyarn.data.synth import write_synthetic
    from tfyarn import hdfs
    url = hdfs.join(backend.staging_dir, "test-data", f"run-{int(time.time())}")
    write_synthetic(url, kind="recommender", files=4, records=2000, skew=0.5, seed=1)
    return url


def quickstart(data_url, **over):
    from tfyarn.spec import load_spec
    sets = [f"data.train=[{data_url}/*]", f"checkpoint.dir={data_url}-ckpt/{time.time_ns()}"]
    sets += [f"{k}={v}" for k, v in over.items()]
    return load_spec(ROOT / "specs" / "quickstart.yaml", sets)


def test_quickstart_succeeds_and_loss_goes_down(backend, data_url):
    spec = quickstart(data_url)
    app_id = backend.submit(spec)
    seen_loss = []
    st = backend.wait(app_id, timeout=WAIT_S,
                      on_update=lambda s: s.progress.get("loss") is not None and seen_loss.append(s.progress["loss"]))
    assert st.state.value == "SUCCEEDED", st.diagnostics
    assert st.summary, "the chief writes a summary before the app ends"
    losses = [x for x in seen_loss if x is not None]
    assert len(losses) >= 2 and losses[-1] < losses[0]


def test_resubmit_hits_the_env_cache(backend, data_url):
    spec = quickstart(data_url)
    backend.kill(backend.submit(spec))      # only the staging is tested here: nothing left running
    first = backend.last_env
    app_id = backend.submit(spec)
    assert backend.last_env.cached and backend.last_env.uploaded_bytes == 0
    assert backend.last_env.archive_url == first.archive_url
    backend.kill(app_id)


def test_logs_during_and_after_and_kill(backend, data_url):
    spec = quickstart(data_url, **{"data.epochs": 50})
    app_id = backend.submit(spec)
    deadline = time.monotonic() + WAIT_S
    lines = []
    while time.monotonic() < deadline and not lines:
        if backend.status(app_id).state.value == "RUNNING":
            lines = list(backend.logs(app_id, task="worker:0"))
        time.sleep(2)
    assert any(line.startswith("worker:0 | ") for line in lines), "live logs via the NodeManager"
    backend.kill(app_id)
    st = backend.wait(app_id, timeout=120)
    assert st.state.value == "KILLED" and st.state.exit_code == 3
    after = list(backend.logs(app_id, task="worker:0"))
    assert any("[tfyarn] container worker_0" in line for line in after), "aggregated logs after the end"
