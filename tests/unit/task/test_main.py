"""The task entry point's own bookkeeping: on YARN a task learns its index only after claiming it through the KV,
and from then on its failure record, stack-dump answers and log lines must carry that name."""
from __future__ import annotations

import logging

from launch_helpers import small_spec
from tfyarn.backends.local.kvserver import KVServer
from tfyarn.errors import ExitCode
from tfyarn.spec import load_spec_dict


def test_a_yarn_task_reports_under_the_index_it_claimed(tmp_path, monkeypatch):
    import tfyarn.task.main as rt
    import tfyarn.task.rendezvous as rdv
    from tfyarn.tasklib import watchdog
    spec = load_spec_dict(small_spec(tmp_path))
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.to_json())
    claimed = []

    def identity(kv, instances_of):            # what claim_task_index does on YARN: claim slot 1 in the KV
        claimed.append(1)
        return "worker", 1

    def rendezvous(*a, **kw):
        raise RuntimeError("peer never came")
    monkeypatch.setattr(rt, "_identity", identity)
    monkeypatch.setattr(rdv, "rendezvous", rendezvous)
    monkeypatch.setattr(rt, "_die_with_parent", lambda: None)
    monkeypatch.setattr(logging, "shutdown", lambda: None)
    monkeypatch.setenv("TFYARN_ROLE", "worker")
    monkeypatch.delenv("TFYARN_INDEX", raising=False)
    monkeypatch.setenv("TFYARN_SPEC_FILE", str(spec_file))
    formatters = [(h, h.formatter) for h in logging.getLogger().handlers]   # pytest's: restored afterwards
    with KVServer() as server:
        monkeypatch.setenv("TFYARN_KV", server.url)
        try:
            assert rt.main() == ExitCode.FAILED
            store = server.store
            assert claimed == [1]
            assert store.get("failure/worker:1") == "RuntimeError: peer never came"
            assert store.get("failure/worker:?") is None          # where every YARN task's failure used to go
            assert "worker:1" in watchdog._installed                # answers stack-dump requests as worker:1
            fmt = logging.getLogger().handlers[0].formatter._fmt
            assert "[worker:1]" in fmt
        finally:
            watchdog.uninstall_stack_dumps()
            for h, f in formatters:
                h.setFormatter(f)


def test_the_kv_is_chosen_by_the_scheme_of_tfyarn_kv_and_anything_else_is_a_clear_error(monkeypatch):
    """One env contract names the task's KV: ``skein:`` (YARN) or ``http://…`` (the local launcher's)."""
    import pytest

    import tfyarn.task.main as rt
    from tfyarn.tasklib.kv import HttpKV
    monkeypatch.setenv("TFYARN_KV", "skein:")
    assert rt.kv_scheme() == "skein"
    monkeypatch.setenv("TFYARN_KV", "http://127.0.0.1:9")
    assert rt.kv_scheme() == "http" and isinstance(rt.make_kv(), HttpKV)
    for value in ("", "127.0.0.1:9", "redis://h:1"):
        monkeypatch.setenv("TFYARN_KV", value)
        with pytest.raises(RuntimeError, match="TFYARN_KV=.*expected skein: .* or http://HOST:PORT"):
            rt.make_kv()
    monkeypatch.delenv("TFYARN_KV")
    with pytest.raises(RuntimeError, match="TFYARN_KV=''"):
        rt.kv_scheme()
