"""The local KV service and its HTTP client: values, prefixes, long-poll waits with named timeouts."""
import json
import threading
import time

import pytest

from tfyarn.backends.local.kvserver import KVServer
from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.kv import HttpKV, KVUnavailable, MemoryKV, put_json


@pytest.fixture
def server():
    with KVServer() as s:
        yield s


def test_put_get_delete_items(server):
    kv = HttpKV(server.url)
    assert kv.get("addr/worker:0") is None
    kv.put("addr/worker:0", "127.0.0.1:1234")
    kv.put("addr/ps:0", "127.0.0.1:999")
    kv.put("other", "x y/z")
    assert kv.get("addr/worker:0") == "127.0.0.1:1234"
    assert kv.items("addr/") == {"addr/worker:0": "127.0.0.1:1234", "addr/ps:0": "127.0.0.1:999"}
    kv.delete("other")
    assert kv.get("other") is None
    put_json(kv, "progress/chief:0", {"step": 3})
    assert json.loads(kv.get("progress/chief:0")) == {"step": 3}


def test_wait_all_returns_when_keys_appear(server):
    kv = HttpKV(server.url)
    threading.Timer(0.3, lambda: kv.put("b", "2")).start()
    kv.put("a", "1")
    t0 = time.monotonic()
    assert kv.wait_all(["a", "b"], timeout=10) == {"a": "1", "b": "2"}
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("make", ["http", "memory"])
def test_wait_timeout_names_missing_keys(server, make):
    kv = HttpKV(server.url) if make == "http" else MemoryKV()
    kv.put("addr/ps:0", "h:1")
    with pytest.raises(WaitTimeout) as info:
        kv.wait_all(["addr/ps:0", "addr/worker:1", "addr/worker:2"], timeout=0.5, what="peers")
    assert str(info.value) == "timed out after 0.5s waiting for peers: missing addr/worker:1, addr/worker:2"


def test_unreachable_service_is_a_clear_error():
    with KVServer() as s:
        url = s.url
    with pytest.raises(KVUnavailable, match="unreachable"):
        HttpKV(url, request_timeout=1).get("x")


def test_progress_eta_follows_the_global_step_rate():
    from tfyarn.contracts.progress import GlobalStepRate, aggregate_progress
    rate = GlobalStepRate()

    def items(g):
        return {"progress/chief:0": json.dumps({"step": g, "global_step": g, "examples_per_sec": 100.0, "loss": 0.5}),
                "progress/worker:0": json.dumps({"step": g, "global_step": g, "examples_per_sec": 50.0, "loss": 0.3})}

    assert rate.add(0, now=0.0) is None
    assert rate.add(10, now=1.0) == 10.0
    p = aggregate_progress(items(20), 120, ["chief:0", "worker:0"])
    assert p["global_step"] == 20 and p["examples_per_sec"] == 150.0 and p["loss"] == 0.4 and p["eta_s"] is None
    r2 = GlobalStepRate()
    r2.add(0, now=time.monotonic() - 2.0)
    p = aggregate_progress(items(20), 120, ["chief:0", "worker:0"], r2)
    assert p["eta_s"] == pytest.approx(10.0, rel=0.05)  # 100 steps left at 10 steps/s
