"""The runtime's YARN KV adapter over skein's real KeyValueStore (fake only at the AM's gRPC boundary)."""
import json
import sys
import threading
import time

import pytest

from fake_am import FakeAM
from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.kv import KVUnavailable, put_json
from tfyarn.task.yarn.kv_yarn import SkeinKV, claim_task_index, parse_container_id, slot_key


@pytest.fixture
def am():
    return FakeAM()


def test_get_put_items_delete_as_str(am):
    kv = SkeinKV(am.kv)
    assert kv.get("addr/worker:0") is None
    kv.put("addr/worker:0", "h:1")
    kv.put("addr/worker:1", "h:2")
    kv.put("progress/worker:0", "{}")
    assert kv.get("addr/worker:0") == "h:1"
    assert am.kv.get("addr/worker:0") == b"h:1"          # stored as bytes, as skein requires
    assert kv.items("addr/") == {"addr/worker:0": "h:1", "addr/worker:1": "h:2"}
    assert set(kv.items()) == {"addr/worker:0", "addr/worker:1", "progress/worker:0"}
    kv.delete("addr/worker:0")
    kv.delete("never-there")
    assert kv.get("addr/worker:0") is None
    put_json(kv, "summary", {"loss": 0.5})
    assert json.loads(kv.get("summary")) == {"loss": 0.5}


def test_wait_all_wakes_on_put_events(am):
    kv = SkeinKV(am.kv)
    kv.put("addr/ps:0", "a:1")

    def later():
        time.sleep(0.3)
        SkeinKV(am.kv).put("addr/worker:0", "b:2")

    threading.Thread(target=later).start()
    t0 = time.monotonic()
    got = kv.wait_all(["addr/ps:0", "addr/worker:0"], timeout=10, what="peers")
    assert got == {"addr/ps:0": "a:1", "addr/worker:0": "b:2"}
    assert time.monotonic() - t0 < 5


def test_wait_times_out_naming_missing_keys(am):
    kv = SkeinKV(am.kv)
    kv.put("addr/ps:0", "a:1")
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as ei:
        kv.wait_all(["addr/ps:0", "addr/worker:1", "addr/chief:0"], timeout=0.5, what="rendezvous")
    assert 0.4 < time.monotonic() - t0 < 5
    msg = str(ei.value)
    assert "rendezvous" in msg and "addr/worker:1" in msg and "addr/chief:0" in msg and "addr/ps:0" not in msg
    with pytest.raises(WaitTimeout):
        kv.wait("x", timeout=0.2)


def test_am_gone_is_kv_unavailable(am):
    kv = SkeinKV(am.kv)
    am.down = True
    with pytest.raises(KVUnavailable):
        kv.get("x")
    with pytest.raises(KVUnavailable):
        kv.put("x", "1")


def test_claim_is_atomic_and_owned(am):
    kv = SkeinKV(am.kv)
    assert kv.claim("slot/worker:0", "worker_0", owner="worker_0")
    assert not kv.claim("slot/worker:0", "worker_5", owner="worker_5")
    am.container_exited("worker_0")                      # the AM drops keys owned by an exited container
    assert kv.get("slot/worker:0") is None
    assert kv.claim("slot/worker:0", "worker_5", owner="worker_5")


def test_task_index_survives_restarts(am):
    kv = SkeinKV(am.kv)
    assert claim_task_index(kv, "worker", 3, "worker_0") == 0
    assert claim_task_index(kv, "worker", 3, "worker_1") == 1
    assert claim_task_index(kv, "worker", 3, "worker_2") == 2
    am.container_exited("worker_1")                      # worker:1 dies; skein starts worker_3 in its place
    assert claim_task_index(kv, "worker", 3, "worker_3") == 1
    assert kv.get("taskmap/worker_3") == "worker:1" and kv.get("taskmap/worker_1") == "worker:1"
    with pytest.raises(WaitTimeout, match="free worker slot for container worker_4"):
        claim_task_index(kv, "worker", 3, "worker_4", timeout=0.3)


def test_a_replacement_never_takes_the_slot_of_a_task_that_finished(am):
    """skein deletes a container's owned keys on any exit, success included: worker:0 finishing its steps (async
    ps) must not let the replacement of a failed worker:1 become worker:0 (worker:1's share would never train)."""
    from tfyarn.task.yarn.kv_yarn import mark_slot_done
    kv = SkeinKV(am.kv)
    assert claim_task_index(kv, "worker", 2, "worker_0") == 0
    assert claim_task_index(kv, "worker", 2, "worker_1") == 1
    mark_slot_done(kv, "worker:0")
    am.container_exited("worker_0")                      # finished: its slot key is gone, its done marker stays
    am.container_exited("worker_1")                      # failed: skein starts worker_2 in its place
    assert claim_task_index(kv, "worker", 2, "worker_2") == 1


def test_the_replacement_of_a_task_killed_after_it_finished_has_nothing_to_do_at_once(am):
    """Async ps: worker:1 finished its share (slot-done), then was killed before its process ended; skein starts
    worker_2 in its place. It waited 60 s for a free slot and exited 4, and the job ended TIMED_OUT although training
    was done; now it learns at once that no task is left (the runtime exits 0)."""
    from tfyarn.task.yarn.kv_yarn import NoTaskLeft, mark_slot_done
    kv = SkeinKV(am.kv)
    assert claim_task_index(kv, "worker", 2, "worker_0") == 0
    assert claim_task_index(kv, "worker", 2, "worker_1") == 1
    mark_slot_done(kv, "worker:1")
    am.container_exited("worker_1")                      # killed: skein drops its slot before it starts worker_2
    t0 = time.monotonic()
    with pytest.raises(NoTaskLeft, match="worker:1"):
        claim_task_index(kv, "worker", 2, "worker_2", timeout=30)
    assert time.monotonic() - t0 < 5
    assert kv.get("taskmap/worker_2") is None and kv.get(slot_key("worker", 1)) is None
    # worker:0, still running, dies too (not finished): its replacement takes its slot as before
    am.container_exited("worker_0")
    assert claim_task_index(kv, "worker", 2, "worker_3") == 0


def test_a_container_beyond_the_instances_claims_a_free_slot(am):
    kv = SkeinKV(am.kv)
    assert claim_task_index(kv, "worker", 2, "worker_7") == 0
    assert kv.get(slot_key("worker", 0)) == "worker_7"
    assert parse_container_id("param_server_12") == ("param_server", 12)
    with pytest.raises(ValueError):
        parse_container_id("worker")


def test_from_current_outside_a_container_is_clear(monkeypatch):
    for k in ("SKEIN_APPLICATION_ID", "SKEIN_APPMASTER_ADDRESS", "SKEIN_CONTAINER_ID"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(KVUnavailable, match="not inside a skein container"):
        SkeinKV.from_current()


def test_the_runtime_of_such_a_replacement_exits_0_without_a_task(am, monkeypatch, tmp_path):
    """tfyarn.task's main() in the replacement container: exit 0 at once, no task claimed, no failure written."""
    from yarnutil import make_spec
    from tfyarn.task import main as runtime
    from tfyarn.task.yarn.kv_yarn import mark_slot_done
    kv = SkeinKV(am.kv)
    spec = make_spec(environment={"python": sys.executable})
    workers = spec.instances("worker")
    for i in range(workers):
        assert claim_task_index(kv, "worker", workers, f"worker_{i}") == i
    mark_slot_done(kv, "worker:1")
    am.container_exited("worker_1")
    (tmp_path / "spec.json").write_text(spec.to_json())
    for k in ("TFYARN_INDEX", "TFYARN_KV", "TFYARN_PARENT_PID", "TFYARN_CODE_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TFYARN_KV", "skein:")
    monkeypatch.setenv("TFYARN_ROLE", "worker")
    monkeypatch.setenv("SKEIN_CONTAINER_ID", f"worker_{workers}")
    monkeypatch.setenv("TFYARN_SPEC_FILE", str(tmp_path / "spec.json"))
    monkeypatch.setattr(runtime, "make_kv", lambda: kv)
    # what main() does to the process that pytest's own logging and signal handling must not get
    for name in ("_configure_logging", "install_stack_dumps"):
        monkeypatch.setattr(runtime, name, lambda *a, **k: None)
    monkeypatch.setattr(runtime.logging, "shutdown", lambda: None)
    monkeypatch.setattr(runtime.faulthandler, "enable", lambda: None)
    t0 = time.monotonic()
    assert runtime.main() == 0
    assert time.monotonic() - t0 < 5
    assert kv.get(f"taskmap/worker_{workers}") is None and kv.items("failure/") == {}


def test_a_put_the_application_master_failed_is_put_again_and_the_waiter_wakes(am):
    """skein 0.8.2's AM stored ps:0's address, lost the waiting peers' event and failed the put (a watch being
    created raced the notification): the ps failed the job. The put is tried again and notifies the waiters."""
    kv = SkeinKV(am.kv)
    am.fail_puts.add("addr/ps:0")
    got = {}
    waiter = threading.Thread(target=lambda: got.update(SkeinKV(am.kv).wait_all(["addr/ps:0"], timeout=20)))
    waiter.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    kv.put("addr/ps:0", "h:1")
    waiter.join(20)
    assert got == {"addr/ps:0": "h:1"} and time.monotonic() - t0 < 3       # woken by the second put's event


def test_a_put_that_keeps_failing_raises_after_a_bounded_retry(am):
    import skein

    class Always(set):
        def discard(self, key):
            pass
    am.fail_puts = Always({"addr/ps:0"})
    t0 = time.monotonic()
    with pytest.raises(skein.exceptions.ApplicationError):
        SkeinKV(am.kv).put("addr/ps:0", "h:1")
    assert time.monotonic() - t0 < 5


def test_a_wait_rereads_keys_whose_event_never_came(am, monkeypatch):
    from tfyarn.task.yarn import kv_yarn
    monkeypatch.setattr(kv_yarn, "WAIT_REREAD_S", 0.2)
    kv = SkeinKV(am.kv)
    got = {}
    waiter = threading.Thread(target=lambda: got.update(kv.wait_all(["addr/ps:0"], timeout=20)))
    waiter.start()
    time.sleep(0.3)
    with am.lock:
        am.data["addr/ps:0"] = (b"h:1", None)         # stored, no event sent (what the AM's race leaves)
    waiter.join(5)
    assert got == {"addr/ps:0": "h:1"}


def test_a_wait_whose_watch_stream_died_goes_on_by_re_reading(am, monkeypatch):
    """skein 0.8.2 waits for a subscription's answer without a bound: a watch stream that died on the AM's GOAWAY
    ("sent too many headers", once under load) held a worker's rendezvous until the chief's step timed out."""
    from tfyarn.task.yarn import kv_yarn
    monkeypatch.setattr(kv_yarn, "WAIT_REREAD_S", 0.2)
    monkeypatch.setattr(kv_yarn, "SUBSCRIBE_S", 0.5)
    am.break_watch = True
    kv = SkeinKV(am.kv)
    got = {}
    waiter = threading.Thread(target=lambda: got.update(kv.wait_all(["addr/ps:0", "addr/chief:0"], timeout=30)))
    waiter.start()
    kv.put("addr/ps:0", "h:1")
    time.sleep(1.0)              # past the subscription's bound
    kv.put("addr/chief:0", "h:2")
    waiter.join(10)
    assert got == {"addr/ps:0": "h:1", "addr/chief:0": "h:2"}
    # a later wait on the dead stream is bounded too, and a missing key is still named
    with pytest.raises(WaitTimeout, match="addr/worker:0"):
        kv.wait_all(["addr/worker:0"], timeout=1.5, what="peers")
