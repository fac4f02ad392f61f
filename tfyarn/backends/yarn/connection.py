"""How a YARN backend reaches the cluster: the Kerberos login, the staging dir, the skein driver and client, the
ResourceManager's REST API and a running app's application master.

**Driver.** skein talks to YARN through a Java driver that takes seconds to start: a running ``skein driver start``
one is reused, else tfyarn's shared one (:mod:`~tfyarn.backends.yarn.driver`). ``driver="private"`` (or
``TFYARN_DRIVER_IDLE=0``) starts one of this backend's own, stopped by :meth:`YarnConnection.close`. Whatever the RM's
REST API (:mod:`~tfyarn.backends.yarn.rest`) can answer needs no JVM at all.

One part of :class:`~tfyarn.backends.yarn.backend.YarnBackend`, which every other part (submit, status, logs,
reports, the app's end) is given: they share this connection and own their own state (skein's own split of
``Client`` from ``ApplicationClient``).
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import logging
import os
import shutil
import threading
from typing import Any, Callable

from tfyarn.cluster import hdfs, kerberos
from tfyarn.cluster._skein import skein
from tfyarn.backends.yarn import driver as skein_driver
from tfyarn.backends.yarn import records, rest
from tfyarn.errors import AppNotFound, YarnUnavailable
from tfyarn.spec import JobSpec

log = logging.getLogger(__name__)


class YarnConnection:
    """The cluster connection every part of the YARN backend shares (options: see ``YarnBackend``; ``one_shot``:
    a one-shot command's, whose private driver is let go once a run's app is submitted)."""

    def __init__(
        self,
        staging_dir: str | None = None,
        hadoop_conf_dir: str | None = None,
        driver: str = "auto",
        client: Any = None,
        one_shot: bool = False,
    ):
        if driver not in ("auto", "global", "private"):
            raise ValueError(f"driver must be auto, global or private, not {driver!r}")
        self._staging_opt = staging_dir
        self.hadoop_conf_dir = hadoop_conf_dir
        self.driver = driver
        self.one_shot = one_shot
        self._client = client
        self._owns_client = False
        self._rest: Any = None  # rest.RmRest, False when the REST API cannot be used
        self.injected = client is not None  # a test's fake client answers everything itself
        self._driver_thread: threading.Thread | None = None  # start_driver(): the JVM starting in the background
        self._driver_error: BaseException | None = None
        self._lease: Any = None  # skein_driver.Lease on tfyarn's shared driver, released by close()
        self._apps: dict[str, Any] = {}  # running apps' skein ApplicationClients
        self._krb: Any = None  # the Kerberos login (tfyarn.cluster.kerberos) once self.login() has run
        self._logged_in = False

    @functools.cached_property
    def conf(self) -> dict[str, str]:
        return hdfs.load_hadoop_conf(self.hadoop_conf_dir)

    @property
    def user(self) -> str:
        # with a keytab, the cluster knows us by its principal, not by this machine's account
        return (
            os.environ.get("HADOOP_USER_NAME")
            or (self._krb and kerberos.short_name(self._krb.principal))
            or getpass.getuser()
        )

    def login(self, spec: JobSpec | None = None, app_id: str | None = None) -> Any:
        """Check and install this command's Kerberos login once (:func:`tfyarn.cluster.kerberos.login`, one-line
        exit 2): the spec's, else the spec this machine submitted ``app_id`` with, else ``TFYARN_KERBEROS_*``; None =
        the ticket cache, or no Kerberos."""
        if not self._logged_in:
            krb = (
                kerberos.resolved(spec)
                or (kerberos.resolved(records.saved_spec(app_id)) if app_id else None)
                or kerberos.from_env()
            )
            self._krb = kerberos.login(krb, self.conf)
            self._logged_in = True
        return self._krb

    @property
    def staging_dir(self) -> str:
        # qualified against fs.defaultFS: a host-less hdfs:/// is refused on a viewfs cluster (hdfs-native, skein)
        d = self._staging_opt or os.environ.get("TFYARN_STAGING_DIR")
        if not d:
            on_dfs = hdfs.default_fs(self.conf).split(":", 1)[0] in ("hdfs", "viewfs")
            d = f"/user/{self.user}/.tfyarn" if on_dfs else f"hdfs:///user/{self.user}/.tfyarn"
        return hdfs.qualify(d, self.conf)

    def start_driver(self, spec: JobSpec | None = None) -> None:
        """Start the skein driver in the background: ``submit`` overlaps its JVM start with preflight and the
        environment's staging, and the first :meth:`client` call waits for it (bounded)."""
        if self._client is not None or self._driver_thread is not None:
            return

        def start() -> None:
            try:
                self.client(spec)
            except BaseException as exc:  # noqa: BLE001 - raised again by the caller of client()
                self._driver_error = exc

        self._driver_thread = threading.Thread(target=start, name="tfyarn-skein-driver", daemon=True)
        self._driver_thread.start()

    def _join_driver(self) -> None:
        t = self._driver_thread
        if t is None or t is threading.current_thread():
            return
        t.join(skein_driver.START_TIMEOUT_S)
        if t.is_alive():
            raise YarnUnavailable(
                f"timed out after {skein_driver.START_TIMEOUT_S:g}s waiting for the skein driver "
                f"(JVM) to start; check `yarn classpath` and java on this machine"
            )
        self._driver_thread = None
        err, self._driver_error = self._driver_error, None
        if err is not None:
            raise err

    def client(self, spec: JobSpec | None = None) -> Any:
        """The skein Client: the global driver's if one runs, else a driver of our own (see module docstring)."""
        self._join_driver()
        if self._lease is not None and not self._lease.record.alive:
            # a long-lived backend (a scheduler, a test session) outlives a shared driver that died (its JVM
            # OOM-killed, its keeper killed): join or start another instead of failing every later call
            log.warning(
                "tfyarn's shared skein driver (JVM pid %s) has gone: joining or starting another",
                self._lease.record.jvm_pid,
            )
            self._lease.release()
            self._lease = self._client = None
        if self._client is not None:
            return self._client
        self.require_hadoop()
        sk = skein()
        kw = kerberos.driver_options(self.login(spec))
        if self.driver in ("auto", "global"):
            try:
                self._client = sk.Client.from_global_driver()
                log.debug("using the running global skein driver")
                return self._client
            except (sk.exceptions.DriverNotRunningError, sk.exceptions.ConnectionError) as exc:
                if not isinstance(exc, sk.exceptions.DriverNotRunningError):  # (a subclass of ConnectionError)
                    # ~/.skein/driver names a driver that is gone (a reboot, an OOM): forget it, as `skein driver
                    # stop --force` would, instead of failing every command
                    log.warning("the global skein driver recorded in ~/.skein does not answer (%s); not using it", exc)
                    sk.Client.stop_global_driver(force=True)
                if self.driver == "global":
                    sk.Client.start_global_driver(log=False, **kw)
                    self._client = sk.Client.from_global_driver()
                    return self._client
        if self.driver == "auto" and skein_driver.idle_seconds() > 0:
            env = {**os.environ, "HADOOP_CONF_DIR": self.hadoop_conf_dir} if self.hadoop_conf_dir else None
            self._lease = skein_driver.acquire(self._driver_identity(kw), kw, env)
            self._client = self._lease.client
            return self._client
        log.info("starting a skein driver (JVM) for this command; `skein driver start` keeps one running")
        try:
            self._client = sk.Client(log=False, **kw)
        except (OSError, sk.exceptions.DriverError) as exc:
            raise YarnUnavailable(
                f"cannot reach YARN: the skein driver did not start ({type(exc).__name__}: "
                f"{exc}); check HADOOP_CONF_DIR, `yarn` and java on PATH, or use --local"
            ) from None
        self._owns_client = True
        return self._client

    def _driver_identity(self, kw: dict[str, Any]) -> dict[str, Any]:
        """Who the shared driver must be logged in as: the keytab's principal, else the ticket cache's."""
        principal = (
            self._krb.principal if self._krb else skein_driver.cache_principal() if kerberos.secure(self.conf) else None
        )
        return skein_driver.identity(self.user, principal, self.hadoop_conf_dir, kw)

    def release_driver(self) -> None:
        """A one-shot command's (``detached_report``: the CLI) private driver is stopped now, in the background, when
        following needs no JVM (the RM's REST API and the AM's own address): its JVM's exit overlaps the job instead
        of delaying the CLI's exit. A long-lived backend (tests, a scheduler) keeps it for its next submit."""
        if self.one_shot and (self._owns_client or self._lease) and self.rm():
            self._drop_driver(background=True)

    def _drop_driver(self, background: bool = False) -> None:
        """Release the shared driver's lease, or stop this backend's private driver (``background``: in a thread)."""
        if self._lease is not None:
            lease, self._lease, self._client = self._lease, None, None
            lease.release()
        elif self._client is not None and self._owns_client:
            client, self._client, self._owns_client = self._client, None, False
            if background:
                threading.Thread(target=client.close, name="tfyarn-skein-driver-stop", daemon=True).start()
            else:
                client.close()

    def require_hadoop(self) -> None:
        """Fail with a usage error, before skein tries to start a JVM, on a machine with no Hadoop at all."""
        if self.hadoop_conf_dir or os.environ.get("HADOOP_CONF_DIR") or shutil.which("yarn"):
            return
        raise YarnUnavailable(
            "YARN is not configured on this machine: set HADOOP_CONF_DIR to the cluster's "
            "configuration directory (with `yarn` on PATH), or run with --local"
        )

    def close(self) -> None:
        """Close application connections; stop the skein driver if this backend started a private one (waiting for
        one still starting in the background, so no JVM is left behind)."""
        try:
            self._join_driver()
        except BaseException as exc:  # noqa: BLE001 - closing: what failed was said where the client was needed
            log.debug("skein driver start: %s", exc)
        for app in self._apps.values():
            with contextlib.suppress(Exception):
                app.close()
        self._apps.clear()
        self._drop_driver()

    def rm(self) -> rest.RmRest | None:
        """The RM's REST API when it takes simple auth and no driver is injected (tests): status, list, logs and
        kill then need no JVM (:mod:`tfyarn.backends.yarn.rest`); None = use the skein driver."""
        if self._rest is None:
            self._rest = False
            if not self.injected and os.environ.get("TFYARN_YARN_REST", "1") != "0":
                try:
                    self._rest = rest.RmRest(self.conf, self.user)
                except rest.RestUnavailable as exc:
                    log.debug("not using the RM REST API: %s", exc)
        return self._rest or None

    def app_report(self, app_id: str) -> Any:
        self.login(app_id=app_id)
        rm = self.rm()
        if rm is not None:
            try:
                return rm.report(app_id)
            except rest.RestUnavailable as exc:
                log.debug("RM REST report of %s: %s; asking the skein driver", app_id, exc)
        sk = skein()  # only here: importing skein (grpc, its protobufs) is ~0.3 CPU s of a REST-only command
        try:
            return self.client().application_report(app_id)
        except (sk.exceptions.ApplicationError, ValueError) as exc:
            raise AppNotFound(f"no YARN application {app_id}: {exc}") from None

    def app_client(self, app_id: str) -> Any | None:
        app = self._apps.get(app_id)
        if app is None:
            sk = skein()
            rep = self.app_report(app_id) if self.rm() else None
            try:
                if isinstance(rep, rest.AppReport):  # straight to the AM's address: no driver needed
                    if rep.state != "RUNNING" or not rep.am_address:
                        return None
                    app = sk.ApplicationClient(rep.am_address, app_id, security=sk.Security.from_default())
                else:
                    app = self.client().connect(app_id, wait=False)
            except (sk.exceptions.ApplicationNotRunningError, sk.exceptions.ConnectionError) as exc:
                log.debug("cannot connect to %s: %s", app_id, exc)
                return None
            self._apps[app_id] = app
        return app

    def on_am(self, app_id: str, what: str, call: Callable[[Any], Any]) -> Any:
        """``call(app)`` on the running app's application master; None when it has none or the call fails (the AM may
        exit between the report and this call: the next status read says so), dropping the connection."""
        app = self.app_client(app_id)
        if app is None:
            return None
        try:
            return call(app)
        except Exception as exc:  # noqa: BLE001 - see above
            log.debug("%s of %s: %s", what, app_id, exc)
            self._apps.pop(app_id, None)
            return None

    def forget(self, app_id: str) -> None:
        """Close and drop the connection to ``app_id``'s application master (it was killed or shut down)."""
        app = self._apps.pop(app_id, None)
        if app is not None:
            with contextlib.suppress(Exception):
                app.close()

    def index_cache_dir(self) -> str:
        return hdfs.join(self.staging_dir, "index")
