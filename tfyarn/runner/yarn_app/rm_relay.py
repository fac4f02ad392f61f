"""Has a killed container stopped? The ResourceManager's relay of its NodeManager's answer, for a container that
may not ask the NodeManager itself (a secure web UI, no Kerberos login: a container has delegation tokens only).

Why: the NodeManager's web API takes SPNEGO only (Hadoop's NodeManager installs the plain AuthenticationFilter),
while the RM's takes the app's RM delegation token, which skein gives every container (:mod:`tfyarn.cluster.tokens`).
skein's ``kill_container`` *releases* a running container to the RM: the RM drops it from the attempt's live
containers at once and tells its NodeManager to stop it, but keeps counting it on the node (``numContainers``)
until the NodeManager reports it completed, after its process exited. So, per killed container:

- ``LIVE``: the RM still holds it live (the release not processed yet): not stopped;
- ``STOPPED``: released, and its node counts no container beyond the app's live ones there (those read the same
  before and after the node's count): the NodeManager reported it completed — the answer, relayed;
- ``RELEASED``: released, but the node counts other containers too (another app's, or this one still stopping):
  the RM cannot tell them apart, so the caller keeps its grace, counted from the release.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tfyarn.backends.yarn.rest import RestUnavailable, RmRest, attempt_of, host_port, in_container
from tfyarn.errors import AppNotFound

log = logging.getLogger(__name__)

LIVE, STOPPED, RELEASED = "live", "stopped", "released"


@dataclass(frozen=True)
class NodeCount:
    """A node as the RM counts it: its id and the containers launched there that its NodeManager has not reported
    completed (every application's)."""

    node_id: str
    containers: int


def verdict(container_id: str, before: dict[str, str], node: NodeCount | None, after: dict[str, str]) -> str:
    """LIVE, STOPPED or RELEASED (module doc) from the attempt's live containers read ``before`` and ``after`` the
    count of the container's ``node`` (None: the RM knows no node at its address)."""
    if container_id in before or container_id in after:
        return LIVE
    if node is None:
        return RELEASED
    ours = {c for c, n in before.items() if n == node.node_id}
    if ours != {c for c, n in after.items() if n == node.node_id}:
        return RELEASED  # one started or ended meanwhile: the count is not comparable
    # every container in ``ours`` was live through the count, so counted: anything beyond is released, not stopped
    return STOPPED if node.containers == len(ours) else RELEASED


class RmRelay:
    """Asks the RM (with the app's delegation token) about killed containers (:func:`verdict`)."""

    def __init__(self, rest: RmRest):
        self.rest = rest

    def state(self, container_id: str, nm_http_address: str) -> str:
        """LIVE, STOPPED or RELEASED; :class:`RestUnavailable` when the RM does not answer."""
        attempt = attempt_of(container_id)
        try:
            before = self.rest.live_containers(attempt)
            nodes = self.rest.node_containers()
            after = self.rest.live_containers(attempt)
        except AppNotFound as exc:
            raise RestUnavailable(str(exc)) from None
        found = nodes.get(host_port(nm_http_address))
        return verdict(container_id, before, NodeCount(*found) if found else None, after)


def from_container() -> RmRelay | None:
    """The relay, asking with this container's RM delegation token (:func:`~tfyarn.backends.yarn.rest.in_container`);
    None without one (a cluster without security, or outside YARN) or without an RM address in the Hadoop config."""
    try:
        rest = in_container()
    except RestUnavailable as exc:
        log.info("no ResourceManager to ask about killed containers: %s", exc)
        return None
    return RmRelay(rest) if rest.has_token else None
