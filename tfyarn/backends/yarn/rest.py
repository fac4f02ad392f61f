"""The ResourceManager's REST API: application reports, listing and kill without a JVM.

Why: a skein driver (a JVM) took 5-15 s to start on a loaded gateway, while the RM answers over HTTP in
milliseconds. Used when the RM's web endpoints take simple (pseudo) authentication, the Hadoop default; the skein
driver otherwise (SPNEGO, a refusal, an RM that does not answer). A running skein AM is then reached at its own
address (``amRPCAddress``) with skein's TLS credentials: no driver either. Inside a container of a secure cluster
(no Kerberos login) the app's RM delegation token authenticates instead (``token``: :mod:`tfyarn.cluster.tokens`);
every RM read made inside the app's containers goes through :func:`in_container`, which passes it when there is one.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterable

from tfyarn.cluster import hdfs, tokens, webauth
from tfyarn.errors import AppNotFound, WaitTimeout

log = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 5.0
TERMINAL = ("FINISHED", "FAILED", "KILLED")


class RestUnavailable(Exception):
    """The REST API cannot answer this (auth, network, an RM that refuses): use the skein driver instead."""


def _ms(v: Any) -> _dt.datetime | None:
    try:
        ms = int(v)
    except (TypeError, ValueError):
        return None
    return _dt.datetime.fromtimestamp(ms / 1000.0, tz=_dt.timezone.utc) if ms > 0 else None


def rm_webapp_urls(conf: dict[str, str]) -> list[str]:
    """ResourceManager web addresses from yarn-site.xml, HA-aware (``yarn.resourcemanager.ha.rm-ids``)."""
    https = conf.get("yarn.http.policy", "HTTP_ONLY") == "HTTPS_ONLY"
    key = "yarn.resourcemanager.webapp.https.address" if https else "yarn.resourcemanager.webapp.address"
    scheme = "https" if https else "http"
    ids = [i.strip() for i in conf.get("yarn.resourcemanager.ha.rm-ids", "").split(",") if i.strip()]
    addrs = [conf.get(f"{key}.{i}") or (conf.get(f"yarn.resourcemanager.hostname.{i}", "") + ":8088") for i in ids]
    if not ids:
        addrs = [conf.get(key) or (conf.get("yarn.resourcemanager.hostname", "") + (":8090" if https else ":8088"))]
    return [f"{scheme}://{a}" for a in addrs if a and not a.startswith(":")]


@dataclass
class AppReport:
    """The fields of skein's ``ApplicationReport`` that tfyarn reads, from the RM's JSON."""

    id: str
    name: str
    user: str
    state: str
    final_status: str
    diagnostics: str
    start_time: _dt.datetime | None
    finish_time: _dt.datetime | None
    tracking_url: str
    tags: set[str] = field(default_factory=set)
    am_address: str = ""  # host:port of the application master's RPC (skein's gRPC) server
    launch_time: _dt.datetime | None = None
    queue: str = ""
    preempted: int = 0  # containers the scheduler preempted (the RM keeps it after the app's end)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "AppReport":
        tags = {t for t in (d.get("applicationTags") or "").split(",") if t}
        am = d.get("amRPCAddress") or ""
        return cls(
            id=d["id"],
            name=d.get("name", ""),
            user=d.get("user", ""),
            state=d.get("state", ""),
            final_status=d.get("finalStatus", ""),
            diagnostics=d.get("diagnostics") or "",
            start_time=_ms(d.get("startedTime")),
            finish_time=_ms(d.get("finishedTime")),
            tracking_url=d.get("trackingUrl") or "",
            tags=tags,
            am_address="" if am.startswith("N/A") else am,
            launch_time=_ms(d.get("launchTime")),
            queue=d.get("queue") or "",
            preempted=int(d.get("numNonAMContainerPreempted") or 0),
        )


def rows(d: Any, outer: str, inner: str) -> list[dict[str, Any]]:
    """The list ``d[outer][inner]`` of the RM's JSON (also ``d[inner]``; one row alone, or none: ``null``)."""
    if isinstance(d, dict) and isinstance(d.get(outer), dict):
        d = d[outer]
    found = d.get(inner) if isinstance(d, dict) else None
    if isinstance(found, dict):
        return [found]
    return [r for r in found or [] if isinstance(r, dict)]


def attempt_of(container_id: str) -> str:
    """The application attempt a container id belongs to (``container_[e<epoch>_]<ts>_<app>_<attempt>_<n>``)."""
    parts = container_id.split("_")
    if len(parts) > 5 and parts[1].startswith("e"):
        del parts[1]
    if len(parts) != 5 or parts[0] != "container" or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"not a YARN container id: {container_id!r}")
    return f"appattempt_{parts[1]}_{parts[2]}_{int(parts[3]):06d}"


def host_port(address: str) -> str:
    """``http://host:port/`` or ``host:port`` as ``host:port``, lower-cased (a NodeManager's web address)."""
    return address.split("://", 1)[-1].strip("/").lower()


class RmRest:
    """A small client of ``/ws/v1/cluster``; every call is bounded by ``timeout`` and tries each HA RM in turn.
    ``token``: an RM delegation token (:meth:`tfyarn.cluster.tokens.Token.url_string`) sent with every request, the
    credential of a container on a secure cluster (never logged)."""

    def __init__(self, conf: dict[str, str], user: str, timeout: float = HTTP_TIMEOUT_S, token: str | None = None):
        self.bases = rm_webapp_urls(conf)
        self.user = user
        self.timeout = timeout
        self._token = token
        simple = conf.get("hadoop.http.authentication.type", "simple").strip().lower() == "simple"  # user.name
        if not self.bases:
            raise RestUnavailable("no ResourceManager web address in the client config")
        if not simple and not token and not webauth.available():  # else SPNEGO with this process's Kerberos login
            raise RestUnavailable(f"the ResourceManager's web API needs Kerberos (SPNEGO): {webauth.INSTALL_HINT}")

    @property
    def has_token(self) -> bool:
        """Whether every request carries an RM delegation token (a container's on a secure cluster)."""
        return bool(self._token)

    def _call(
        self, method: str, path: str, query: dict[str, Any] | None = None, body: dict[str, Any] | None = None
    ) -> Any:
        q = {"user.name": self.user, **(query or {})}
        data = json.dumps(body).encode() if body is not None else None
        errors = []
        for base in self.bases:
            url = f"{base}/ws/v1/cluster/{path}?{urllib.parse.urlencode(q)}"
            headers = {"Accept": "application/json", "Content-Type": "application/json"}
            if self._token:
                headers[tokens.HEADER] = self._token
            req = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with webauth.urlopen(req, timeout=self.timeout) as r:
                    return json.loads(r.read() or b"null")
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    raise AppNotFound(
                        f"no YARN application: {path.split('/')[1] if '/' in path else path} "
                        f"(ResourceManager at {base})"
                    ) from None
                errors.append(f"{base}: HTTP {exc.code} {exc.reason}")
            except (OSError, ValueError) as exc:  # URLError, timeouts, a standby RM's HTML page
                errors.append(f"{base}: {exc}")
        raise RestUnavailable("; ".join(errors))

    def get(self, path: str) -> Any:
        """GET ``/ws/v1/cluster/<path>`` (JSON), e.g. ``nodes`` or ``apps/<id>``."""
        return self._call("GET", path)

    def report(self, app_id: str) -> AppReport:
        d = self._call("GET", f"apps/{app_id}")
        if not d or "app" not in d:
            raise RestUnavailable(f"no report of {app_id} in the RM's answer")
        return AppReport.from_json(d["app"])

    def apps(self, states: Iterable[str], tags: Iterable[str] = ()) -> list[AppReport]:
        q: dict[str, Any] = {"states": ",".join(str(s) for s in states)}
        if tags:
            q["applicationTags"] = ",".join(tags)
        d = self._call("GET", "apps", q) or {}
        rows = (d.get("apps") or {}).get("app") or []
        return [AppReport.from_json(r) for r in rows]

    def live_containers(self, attempt_id: str) -> dict[str, str]:
        """The containers the RM holds live for an application attempt (id -> its node's id): not yet completed,
        and not released by the application master."""
        app_id = "application_" + attempt_id.split("_", 1)[1].rsplit("_", 1)[0]
        d = self._call("GET", f"apps/{app_id}/appattempts/{attempt_id}/containers")
        return {
            r["containerId"]: str(r.get("assignedNodeId") or r.get("nodeId") or "")
            for r in rows(d, "containers", "container")
            if r.get("containerId")
        }

    def node_containers(self) -> dict[str, tuple[str, int]]:
        """Per NodeManager web address (``host:port``): its node id and the containers the RM counts on it, of
        every application, until the NodeManager reports each completed (``numContainers``)."""
        d = self._call("GET", "nodes")
        return {
            host_port(str(r["nodeHTTPAddress"])): (str(r.get("id") or ""), int(r.get("numContainers") or 0))
            for r in rows(d, "nodes", "node")
            if r.get("nodeHTTPAddress")
        }

    def kill(self, app_id: str, timeout: float = 30.0, poll: float = 0.2) -> AppReport:
        """Ask the RM to kill ``app_id`` and return its report once it is KILLED (or ended otherwise first)."""
        self._call("PUT", f"apps/{app_id}/state", body={"state": "KILLED"})
        deadline = time.monotonic() + timeout
        while True:
            rep = self.report(app_id)
            if rep.state in TERMINAL:
                return rep
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"timed out after {timeout:g}s waiting for {app_id} to be KILLED "
                    f"(the ResourceManager still says {rep.state})"
                )
            time.sleep(poll)


def in_container(timeout: float = HTTP_TIMEOUT_S) -> RmRest:
    """The RM client of a process in the app's containers (the in-app supervisor's start time, page, re-request and
    relay reads): the container's Hadoop config and user, with the app's RM delegation token when the container has
    one (``$HADOOP_TOKEN_FILE_LOCATION``). Why: on a secure cluster that token is a container's only credential for
    the RM's web API (no Kerberos login there); on an insecure one there is none and ``user.name`` is read as before.
    :class:`RestUnavailable` when no RM can be asked (no address, an unreadable config, SPNEGO wanted and no token)."""
    token = tokens.container_token(tokens.RM_DELEGATION_TOKEN)
    try:
        conf = hdfs.load_hadoop_conf(None)
        user = getpass.getuser()  # $USER in a container ("" would be refused with HTTP 500)
    except (OSError, KeyError) as exc:  # an unreadable config dir; no user name at all (pwd: KeyError)
        raise RestUnavailable(f"no ResourceManager config or user in this container: {exc}") from None
    return RmRest(conf, user, timeout, token=token.url_string() if token else None)
