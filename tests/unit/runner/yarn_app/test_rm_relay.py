"""The RM's relay of a NodeManager's answer (runner/yarn_app/rm_relay.verdict) and the RM JSON it reads
(backends/yarn/rest: rows, attempt_of, host_port): a killed container is STOPPED only when the RM no longer holds
it live and its node counts no container beyond the app's live ones, read the same before and after the count."""

import pytest

from tfyarn.backends.yarn.rest import attempt_of, host_port, rows
from tfyarn.runner.yarn_app.rm_relay import LIVE, RELEASED, STOPPED, NodeCount, verdict

N1, N2 = "node1:45454", "node2:45454"
AM, SUP, KILLED, OTHER = "c_am", "c_sup", "c_killed", "c_other"


def test_live_at_the_rm_is_never_stopped():
    assert verdict(KILLED, {AM: N1, KILLED: N1}, NodeCount(N1, 1), {AM: N1}) == LIVE
    assert verdict(KILLED, {AM: N1}, NodeCount(N1, 1), {AM: N1, KILLED: N1}) == LIVE


def test_released_and_uncounted_is_stopped():
    assert verdict(KILLED, {AM: N1, SUP: N2}, NodeCount(N1, 1), {AM: N1, SUP: N2}) == STOPPED
    assert verdict(KILLED, {AM: N2}, NodeCount(N1, 0), {AM: N2}) == STOPPED       # nothing of ours left there


def test_a_count_beyond_the_apps_live_containers_cannot_be_told_apart():
    assert verdict(KILLED, {AM: N1}, NodeCount(N1, 2), {AM: N1}) == RELEASED      # it, or another app's
    assert verdict(KILLED, {AM: N1}, None, {AM: N1}) == RELEASED                  # no node at that address
    # the app's containers on the node changed during the count (one ended): the count is not comparable
    assert verdict(KILLED, {AM: N1, OTHER: N1}, NodeCount(N1, 1), {AM: N1}) == RELEASED


def test_the_rms_json_rows_ids_and_addresses():
    row = {"containerId": AM, "assignedNodeId": N1}
    assert rows({"container": [row]}, "containers", "container") == [row]              # Hadoop 3.3's RM
    assert rows({"containers": {"container": row}}, "containers", "container") == [row]  # one row, wrapped
    assert rows({"nodes": None}, "nodes", "node") == [] and rows(None, "nodes", "node") == []
    assert attempt_of("container_e05_1795503544962_0007_01_000002") == "appattempt_1795503544962_0007_000001"
    assert attempt_of("container_1795503544962_10007_12_000002") == "appattempt_1795503544962_10007_000012"
    with pytest.raises(ValueError, match="not a YARN container id"):
        attempt_of("worker_0")
    assert host_port("http://Node1:8042/") == host_port("node1:8042") == "node1:8042"


def test_a_token_stands_in_for_spnego(monkeypatch):
    """With the app's RM token a secure RM's web API is used without requests-gssapi (a container's Python need
    not have it); without one the caller is told to install it (tests/unit/backends/yarn/test_latency.py)."""
    from tfyarn.backends.yarn.rest import RestUnavailable, RmRest
    from tfyarn.cluster import webauth

    conf = {"hadoop.http.authentication.type": "kerberos", "yarn.resourcemanager.webapp.address": "rm:8088"}
    monkeypatch.setattr(webauth, "available", lambda: False)
    assert RmRest(conf, "alice", token="tok").bases == ["http://rm:8088"]
    with pytest.raises(RestUnavailable, match="SPNEGO"):
        RmRest(conf, "alice")
