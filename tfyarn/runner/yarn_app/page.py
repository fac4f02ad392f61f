"""The job's page on YARN (:mod:`tfyarn.web`), served from the in-app supervisor's container.

Why there: the supervisor already reads the app (containers, KV) every second, so the page answers
from its last snapshot and costs nothing while nobody looks. How people reach it: skein's
ApplicationMaster owns the app's tracking URL (its web UI, which the ResourceManager proxies at
``http://RM:8088/proxy/<app>/``); the page is added to that UI as a proxied page (``ui.add_page``),
so the RM's link leads to skein's overview, whose "Service Pages" menu links it ("tfyarn job";
``<tracking URL>pages/tfyarn/``), through the RM's proxy. Its URL goes to the KV (``page/url``):
status shows it as ``progress.page_url``."""

from __future__ import annotations

import logging
import os
import socket
import urllib.error
import urllib.request
from typing import Any

from tfyarn.backends.yarn.states import app_state, app_status
from tfyarn.contracts.kv_keys import PAGE_URL_KEY
from tfyarn.contracts.status import AppState, AppStatus, TaskStatus
from tfyarn.contracts.progress import memory_warnings
from tfyarn.web import StatusPage, page_enabled
from tfyarn.backends.yarn import rest

log = logging.getLogger(__name__)

#: The page's route under skein's web UI (``<tracking URL>pages/tfyarn/``) and its link text there.
ROUTE, LINK = "tfyarn", "tfyarn job"


def rm_report(app_id: str) -> Any:
    """The ResourceManager's report of the app (tracking URL, tags, start), read once; None when it
    cannot say."""
    try:
        return rest.in_container().report(app_id)
    except Exception as exc:  # noqa: BLE001 - (no Hadoop conf in the container, an RM down)
        log.info("no report of %s from the ResourceManager for its page: %s", app_id, exc)
        return None


def live_status(sup: Any, rep: Any) -> AppStatus:
    """What ``tfyarn status APP`` says of the running app, from the supervisor's last snapshot (no
    read of its own): the page's ``status.json``. ``rep``: the RM's report (tracking URL, tags), or
    None."""
    snap = sup.snap or {}
    tasks = [TaskStatus(**t) for t in snap.get("tasks", [])]
    state = app_state("RUNNING", "UNDEFINED", "", [t.state for t in tasks])
    if sup.outcome is not None:  # it is ending the app: the page says how
        state = AppState.SUCCEEDED if sup.outcome[0] == "SUCCEEDED" else AppState.TIMED_OUT
    more = {"tasks": tasks, "progress": snap.get("progress") or {}, "summary": snap.get("summary") or sup.sup.summary}
    if rep is not None:
        st = app_status(rep, state, "", **more)
        st.finished = None
        return st
    return AppStatus(
        app_id=sup.app_id,
        backend="yarn",
        name=sup.spec.name,
        state=state,
        started=sup.started,
        attempt=sup.attempt,
        tags=sorted(sup.spec.tags),
        **more,
    )


def serve(sup: Any) -> StatusPage | None:
    """Start the page of ``sup`` (an :class:`~tfyarn.runner.yarn_app.supervise.InAppSupervisor`) on
    every interface of this container's node, add it to skein's web UI, publish its URL; None when
    off or it cannot start (a warning: the job goes on)."""
    if not page_enabled():
        return None
    rep = rm_report(sup.app_id)
    host = os.environ.get("NM_HOST") or socket.getfqdn()
    try:
        page = StatusPage(
            lambda: live_status(sup, rep).to_dict(), lambda: sup.sup.history.points, host="", advertise=host
        ).start()
    except OSError as exc:
        log.warning("no page for %s: %s", sup.app_id, exc)
        return None
    url = page.url
    try:
        url = add_page(sup.app.ui, page.url.rstrip("/"))
    except Exception as exc:  # noqa: BLE001 - skein's UI refused it: the direct URL still works
        log.warning("the page of %s is not in skein's web UI (%s): it is at %s", sup.app_id, exc, url)
    sup.kv.put(PAGE_URL_KEY, url)
    log.info("page of %s: %s (served at %s)", sup.app_id, url, page.url)
    return page


def add_page(ui: Any, target: str) -> str:
    """Proxy ``target`` under skein's web UI with a link on its overview (the page the RM's link
    opens); returns the page's address there. skein 0.8.2's overview cannot render that link on Java
    17+ (its template reads the pages' map entries by reflection: HTTP 500 for the whole overview,
    seen on the test cluster) unless the master opens java.util (``appspec.MASTER_ENV``): when the
    overview still fails with the link, the page stays proxied without it."""
    address = ui.add_page(ROUTE, target, link_name=LINK).address
    try:
        with urllib.request.urlopen(ui.address.rstrip("/") + "/overview", timeout=10):
            return address
    except urllib.error.HTTPError as exc:
        if exc.code < 500:
            return address
        log.info("skein's overview fails with a link to the page (HTTP %s): proxied without it", exc.code)
    except OSError as exc:  # the RM's proxy cannot be reached from here: keep the link
        log.info("could not check skein's overview (%s)", exc)
        return address
    ui.remove_page(ROUTE)
    return ui.add_page(ROUTE, target).address


class MemoryWatch:
    """Warns once per task (in the supervisor's log, which the user reads with ``tfyarn logs``) when
    its resident memory reaches 90 % of its container's: YARN kills it above 100 %."""

    def __init__(self) -> None:
        self.warned: set[str] = set()

    def __call__(self, tasks: list[dict[str, Any]]) -> None:
        for line in memory_warnings(TaskStatus(**t) for t in tasks):
            task = line.split(" ", 1)[0]
            if task not in self.warned:
                self.warned.add(task)
                log.warning("memory: %s: YARN kills its container above 100%%", line)
