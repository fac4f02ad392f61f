"""YarnBackend: a tfyarn job as a skein application on YARN (:class:`~tfyarn.backends.base.Backend`), built by
:mod:`~tfyarn.backends.yarn.yarn_spec`, with its logs from :mod:`~tfyarn.backends.yarn.yarn_logs`.

**Driver.** skein talks to YARN through a Java driver that takes seconds to start: a running ``skein driver start``
one is reused, else tfyarn's shared one (:mod:`~tfyarn.backends.yarn.yarn_driver`). ``driver="private"`` (or
``TFYARN_DRIVER_IDLE=0``) starts one of this backend's own, stopped by :meth:`YarnBackend.close`.

**Status after the end.** The application master, and its KV with the tasks' progress, is gone once the app ends:
every status read of a running app is saved in ``$TFYARN_HOME/yarn/<app_id>.json`` (with the spec at submit), so
``status`` of a finished app still shows its tasks, last progress, summary and failure diagnoses.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import getpass
import json
import logging
import os
import shutil
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any, Callable, Iterator

from tfyarn import hdfs, kerberos, packaging, paths
from tfyarn._skein import skein
from tfyarn.backends.base import AppState, AppStatus, Backend, Request, TaskStatus
from tfyarn.backends.yarn import phases, yarn_driver, yarn_logs, yarn_rest, yarn_spec
from tfyarn.backends.yarn.yarn_status import (ACTIVE_APP_STATES, ALL_APP_STATES, ALL_CONTAINER_STATES, app_state,
                                              app_status, attempt_of, failure_diagnosis, snapshot, timestamp)
from tfyarn.errors import AppNotFound, TfyarnError, WaitTimeout, YarnUnavailable, without_timeout_mark
from tfyarn.interrupts import Interrupted, deferring_stop_signals, ignoring_stop_signals, interruptible
from tfyarn.report import (HISTORY_FILE, REPORT_JSON, REPORT_PNG, ProgressHistory, copy_report, preload_plotting,
                           report_at)
from tfyarn.runtime import app_end
from tfyarn.runtime.kv_yarn import SkeinKV
from tfyarn.spec import JobSpec, load_spec_json
from tfyarn.supervisor import (Supervisor, Verdict, checkpoint_url, select_tasks, settle, task_matches,
                               training_end_note, write_report)

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------------ backend

@dataclasses.dataclass
class YarnRequest(Request):
    """A YARN submit: the skein ApplicationSpec and the files it ships (:meth:`YarnBackend.dryrun`)."""
    app: Any = None                         # skein.ApplicationSpec
    shipped: yarn_spec.Shipped | None = None

    def __str__(self) -> str:
        """The skein YAML (``skein.ApplicationSpec.from_yaml`` loads it), then what submit ships and stages."""
        assert self.shipped is not None
        env = self.shipped.env
        staged = {"pack": f"this Python's {env.kind} packed to {env.archive_url} (packed and uploaded at submit "
                          f"unless already there)", "archive": f"the archive {env.archive_url}",
                  "python": f"the nodes' {env.python}", "none": "the nodes' python3"}[env.source]
        files = [self.shipped.spec_file, self.shipped.tfyarn_src, self.shipped.code]
        return "\n".join([yarn_spec.to_yaml(self.app).rstrip(), f"# environment: {staged}",
                          *(f"# ships: {f}" for f in files if f)])


class YarnBackend(Backend):
    """tfyarn on YARN through skein. Options: ``staging_dir`` (env archives, index cache, app records; default
    ``$TFYARN_STAGING_DIR`` or ``/user/<user>/.tfyarn``); ``driver``: "auto" (a global skein driver, else tfyarn's
    shared one) | "global" (start skein's global one, leave it running) | "private" (stopped by close());
    ``master_memory_mib``/``master_vcores`` (the AM's container); ``preflight`` (checks in submit); ``progress``
    (``callback(stage, done, total)`` while packing/uploading the env); ``client``/``cluster`` (an injected skein
    Client / preflight ClusterInfo); ``detached_report``: the run report of a followed job is written by a detached
    process (its plot and HDFS uploads took ~3 s on the CLI's exit path)."""
    name = "yarn"

    def __init__(self, staging_dir: str | None = None, hadoop_conf_dir: str | None = None, driver: str = "auto",
                 master_memory_mib: int = 512, master_vcores: int = 1, preflight: bool = True,
                 progress: packaging.Progress | None = None, client: Any = None, cluster: Any = None,
                 log_poll_s: float = 1.0, aggregation_wait_s: float = 30.0, detached_report: bool = False):
        if driver not in ("auto", "global", "private"):
            raise ValueError(f"driver must be auto, global or private, not {driver!r}")
        self._staging_opt = staging_dir
        self.hadoop_conf_dir = hadoop_conf_dir
        self.driver = driver
        self.master_memory_mib = master_memory_mib
        self.master_vcores = master_vcores
        self.preflight = preflight
        self.progress = progress
        self.log_poll_s = log_poll_s
        self.aggregation_wait_s = aggregation_wait_s
        self.detached_report = detached_report
        self._client = client
        self._owns_client = False
        self._rest: Any = None             # yarn_rest.RmRest, False when the REST API cannot be used
        self._injected = client is not None   # a test's fake client answers everything itself
        self._run_started: float | None = None  # wall time run() began (the first phase of the job's timeline)
        self._driver_thread: threading.Thread | None = None   # start_driver(): the JVM starting in the background
        self._driver_error: BaseException | None = None
        self._lease: Any = None            # yarn_driver.Lease on tfyarn's shared driver, released by close()
        self._cluster = cluster
        self._apps: dict[str, Any] = {}
        # per app: the job's rules while this process follows it (attempts, deadline, stall, progress, ETA)
        self._sups: dict[str, Supervisor] = {}
        self._no_record: set[str] = set()  # apps whose in-app supervisor record was looked for (_recover)
        self._krb: Any = None              # the Kerberos login (tfyarn.kerberos) once self.login() has run
        self._logged_in = False

    # -- plumbing ----------------------------------------------------------------------------------------------------
    @functools.cached_property
    def conf(self) -> dict[str, str]:
        return hdfs.load_hadoop_conf(self.hadoop_conf_dir)

    @property
    def user(self) -> str:
        # with a keytab, the cluster knows us by its principal, not by this machine's account
        return (os.environ.get("HADOOP_USER_NAME") or (self._krb and kerberos.short_name(self._krb.principal))
                or getpass.getuser())

    def login(self, spec: JobSpec | None = None, app_id: str | None = None) -> Any:
        """Check and install this command's Kerberos login once (:func:`tfyarn.kerberos.login`, one-line exit 2):
        the spec's, else the spec this machine submitted ``app_id`` with, else ``TFYARN_KERBEROS_*``; None = the
        ticket cache, or no Kerberos."""
        if not self._logged_in:
            krb = (kerberos.resolved(spec) or (kerberos.resolved(self._saved_spec(app_id)) if app_id else None)
                   or kerberos.from_env())
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
        t.join(yarn_driver.START_TIMEOUT_S)
        if t.is_alive():
            raise YarnUnavailable(f"timed out after {yarn_driver.START_TIMEOUT_S:g}s waiting for the skein driver "
                                  f"(JVM) to start; check `yarn classpath` and java on this machine")
        self._driver_thread = None
        err, self._driver_error = self._driver_error, None
        if err is not None:
            raise err

    def client(self, spec: JobSpec | None = None) -> Any:
        """The skein Client: the global driver's if one runs, else a driver of our own (see module docstring)."""
        self._join_driver()
        if self._client is not None:
            return self._client
        self._require_hadoop()
        sk = skein()
        kw = kerberos.driver_options(self.login(spec))
        if self.driver in ("auto", "global"):
            try:
                self._client = sk.Client.from_global_driver()
                log.debug("using the running global skein driver")
                return self._client
            except (sk.exceptions.DriverNotRunningError, sk.exceptions.ConnectionError) as exc:
                if not isinstance(exc, sk.exceptions.DriverNotRunningError):   # (a subclass of ConnectionError)
                    # ~/.skein/driver names a driver that is gone (a reboot, an OOM): forget it, as `skein driver
                    # stop --force` would, instead of failing every command
                    log.warning("the global skein driver recorded in ~/.skein does not answer (%s); not using it", exc)
                    sk.Client.stop_global_driver(force=True)
                if self.driver == "global":
                    sk.Client.start_global_driver(log=False, **kw)
                    self._client = sk.Client.from_global_driver()
                    return self._client
        if self.driver == "auto" and yarn_driver.idle_seconds() > 0:
            env = {**os.environ, "HADOOP_CONF_DIR": self.hadoop_conf_dir} if self.hadoop_conf_dir else None
            self._lease = yarn_driver.acquire(self._driver_identity(kw), kw, env)
            self._client = self._lease.client
            return self._client
        log.info("starting a skein driver (JVM) for this command; `skein driver start` keeps one running")
        try:
            self._client = sk.Client(log=False, **kw)
        except (OSError, sk.exceptions.DriverError) as exc:
            raise YarnUnavailable(f"cannot reach YARN: the skein driver did not start ({type(exc).__name__}: "
                                  f"{exc}); check HADOOP_CONF_DIR, `yarn` and java on PATH, or use --local") from None
        self._owns_client = True
        return self._client

    def _driver_identity(self, kw: dict[str, Any]) -> dict[str, Any]:
        """Who the shared driver must be logged in as: the keytab's principal, else the ticket cache's."""
        principal = (self._krb.principal if self._krb else
                     yarn_driver.cache_principal() if kerberos.secure(self.conf) else None)
        return yarn_driver.identity(self.user, principal, self.hadoop_conf_dir, kw)

    def _release_driver(self) -> None:
        """A one-shot command's (``detached_report``: the CLI) private driver is stopped now, in the background, when
        following needs no JVM (the RM's REST API and the AM's own address): its JVM's exit overlaps the job instead
        of delaying the CLI's exit. A long-lived backend (tests, a scheduler) keeps it for its next submit."""
        if self.detached_report and (self._owns_client or self._lease) and self._rm():
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

    def _require_hadoop(self) -> None:
        """Fail with a usage error, before skein tries to start a JVM, on a machine with no Hadoop at all."""
        if self.hadoop_conf_dir or os.environ.get("HADOOP_CONF_DIR") or shutil.which("yarn"):
            return
        raise YarnUnavailable("YARN is not configured on this machine: set HADOOP_CONF_DIR to the cluster's "
                              "configuration directory (with `yarn` on PATH), or run with --local")

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

    def _saved_spec(self, app_id: str, saved: dict[str, Any] | None = None) -> JobSpec | None:
        """The spec this machine submitted ``app_id`` with (None for an app submitted elsewhere)."""
        saved = self._load_state(app_id) if saved is None else saved
        return load_spec_json(saved["spec"]) if saved.get("spec") else None

    def _recover(self, app_id: str, running: bool, tags: Any = ()) -> dict[str, Any]:
        """This machine's state of ``app_id``, with the spec (and the last snapshot) of an app submitted elsewhere
        recovered from the app itself: KV ``spec`` while it runs, else the record its in-app supervisor left in the
        staging dir (:mod:`tfyarn.backends.yarn.yarn_supervise`; only an app ``tags`` say has one). Saved here."""
        from tfyarn.backends.yarn import yarn_supervise
        saved = self._load_state(app_id)
        if saved.get("spec"):
            return saved
        text = running and self._on_am(app_id, "spec in the KV", lambda app: app.kv.get(yarn_supervise.SPEC_KEY))
        found: dict[str, Any] = {"spec": text.decode()} if text else {}
        if not found and not running and yarn_spec.SUPERVISED_TAG in (tags or ()) and app_id not in self._no_record:
            self._no_record.add(app_id)               # read once: an app with no supervisor has none
            rec = yarn_supervise.read_record(self.staging_dir, app_id)
            found = {k: rec[k] for k in ("spec", "snapshot") if rec.get(k) and not saved.get(k)}
        if found:
            log.debug("%s: spec recovered from the application", app_id)
            self._save_state(app_id, **found)
            saved.update(found)
        return saved

    def _load_state(self, app_id: str) -> dict[str, Any]:
        try:
            return json.loads(paths.yarn_state_file(app_id).read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self, app_id: str, **updates: Any) -> None:
        p = paths.yarn_state_file(app_id)
        p.parent.mkdir(parents=True, exist_ok=True)
        d = {**self._load_state(app_id), "app_id": app_id, **updates}
        tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(d, indent=1, default=str))
        os.replace(tmp, p)

    # -- spec → skein ---------------------------------------------------------------------------------------------
    def dryrun(self, spec: JobSpec, attempt: int = 0) -> YarnRequest:
        """The skein ApplicationSpec for ``spec`` and the files it ships. Nothing is packed, uploaded or written: the
        env archive's URL and the shipped files' paths are content hashes, made to exist by :meth:`schedule`."""
        self.login(spec)
        submitted, spec = spec, self.with_index_cache(spec)   # the spec saved and shown is the one given
        env = packaging.ensure_env(spec, self.staging_dir, self.progress, dry_run=True, conf=self.conf)
        shipped = self._ship(submitted, env, write=False)
        # every filesystem a task reads or writes: each needs a delegation token on a secure cluster
        urls = [*spec.data.train, *spec.data.eval, spec.checkpoint.dir, spec.checkpoint.init_from,
                spec.export.dir if spec.export else None, self.staging_dir]
        fss = hdfs.filesystems_for_tokens([spec.resolve_path(u) for u in urls if u], self.conf)
        app = yarn_spec.build_application_spec(spec, shipped, master_memory_mib=self.master_memory_mib,
                                               master_vcores=self.master_vcores, file_systems=fss, attempt=attempt,
                                               staging_dir=self.staging_dir)
        return YarnRequest(submitted, attempt, app, shipped)

    def _ship(self, spec: JobSpec, env: packaging.EnvRef, write: bool) -> yarn_spec.Shipped:
        spec, local = self.with_index_cache(spec), paths.cache_dir() / "ship"
        code = yarn_spec.build_code_zip(spec.resolve_path(spec.code), local, write=write) if spec.code else None
        return yarn_spec.Shipped(env=env, spec_file=yarn_spec.write_spec_file(spec, local, write=write),
                                 tfyarn_src=yarn_spec.build_tfyarn_zip(local, write=write), code=code)

    def with_index_cache(self, spec: JobSpec) -> JobSpec:
        """``spec`` with ``data.index_cache`` set, when unset, to ``<staging dir>/index``: the tasks' cluster-wide
        cache of data indexes (read-only data is indexed once per cluster, not once per node or run)."""
        if spec.data.index_cache:
            return spec
        data = spec.data.model_copy(update={"index_cache": self.index_cache_dir()})
        return spec.model_copy(update={"data": data})

    def run_preflight(self, spec: JobSpec) -> list[str]:
        from tfyarn import preflight

        self.login(spec)
        spec = self.with_index_cache(spec)     # staging dir: the user may be the keytab's
        cluster = self._cluster
        if cluster is None:   # the client only when the RM's REST API cannot say: the driver may still be starting
            cluster = preflight.SkeinClusterInfo(_LazyClient(lambda: self.client(spec)), self.conf)
        return preflight.run_preflight(spec, cluster, master_memory_mib=self.master_memory_mib,
                                       master_vcores=self.master_vcores)

    def schedule(self, request: Request) -> str:
        """Preflight, stage the environment (0 bytes when cached) and the shipped files the request names, submit its
        ApplicationSpec; return the YARN application id. The skein driver starts meanwhile (:meth:`start_driver`):
        its JVM is the only one a job needs."""
        assert isinstance(request, YarnRequest), f"not a YARN request: {request!r}"
        spec, attempt, app = request.spec, request.attempt, request.app
        if not self._injected:
            self._require_hadoop()          # a usage error before anything starts, not a driver thread's
        self.start_driver(spec)
        if self.preflight and attempt == 0:
            self.run_preflight(spec)
        env = packaging.stage_env(request.shipped.env, self.progress, conf=self.conf)
        if self._ship(spec, env, write=True) != dataclasses.replace(request.shipped, env=env):
            raise TfyarnError("the job's code, spec or tfyarn changed since its dry run: dry-run it again")
        env_ready = time.time()
        client = self.client(spec)          # the driver started in the background: waited for here
        t0 = time.monotonic()
        submit_call = time.time()
        with deferring_stop_signals() as stopped:   # a stop until app_id is known must not leave an app nobody knows of
            try:
                app_id = client.submit(app)
            except skein().exceptions.DriverError as exc:
                refused = kerberos.proxy_refusal(exc, spec.user)
                if refused is None:
                    raise
                raise refused from None
            log.info("submitted %s as %s (%.1fs; env %s, %d bytes uploaded)", spec.name, app_id,
                     time.monotonic() - t0, "cached" if env.cached else env.source, env.uploaded_bytes)
            self._save_state(app_id, name=spec.name, spec=spec.to_json(), submitted=time.time(),
                             env=env.to_dict(), submit_call=submit_call, run_started=self._run_started,
                             env_ready=env_ready)
        if stopped:
            raise SubmittedThenInterrupted(stopped[0], app_id)
        return app_id

    def run(self, spec: JobSpec, echo: Callable[[str, str], None] | None = None,
            on_update: Callable[[AppStatus], None] | None = None, timeout: float | None = None,
            poll: float = 2.0) -> AppStatus:
        """Submit and follow to the end, with the spec's job attempts (:class:`tfyarn.supervisor.Supervisor`, as a
        local run): a FAILED or TIMED_OUT application is submitted again (``TFYARN_ATTEMPT=n``, resuming from the
        latest checkpoint) after ``retry.backoff``, up to ``retry.max_attempts`` applications in all, within
        ``timeouts.active_deadline`` and ``timeout`` (the earlier; the application running then is killed, TIMED_OUT).
        """
        self._run_started = time.time()
        sup = Supervisor(spec, started=self._run_started, timeout=timeout)
        app_id = None
        try:
            with interruptible():
                while True:
                    app_id = self.schedule(self.dryrun(spec, attempt=sup.attempt))
                    self._release_driver()
                    st = self._followed(app_id, sup, None, poll, on_update)
                    st.attempt = sup.attempt
                    if not sup.next_attempt(st.state, st.diagnostics, label=app_id):
                        break
                    sup.backoff()
        except Interrupted as exc:
            if isinstance(exc, SubmittedThenInterrupted):
                app_id = exc.app_id   # stopped while this attempt was submitted: it is the one to kill
            if app_id is None:      # stopped before the first submit: nothing to kill
                raise
            st = self._kill_interrupted(app_id, exc)
        st.diagnostics = sup.final_diagnosis(st.diagnostics)
        return st

    def _kill_interrupted(self, app_id: str, exc: Interrupted) -> AppStatus:
        """``run`` was stopped (Ctrl-C, a scheduler's SIGTERM): the application it started must not outlive it. Further
        stop signals are ignored while the kill is asked for (a second Ctrl-C must not leave it half done)."""
        with ignoring_stop_signals():
            st = self.status(app_id)
            if st.state.is_terminal:
                return st                   # it had ended on its own just before: its outcome stands
            log.warning("%s: killing %s", exc, app_id)
            self.kill(app_id)
            last, st = st, self.status(app_id)
        st.state = AppState.KILLED          # YARN reports the kill asynchronously; it was asked for, and accepted
        st.diagnostics = f"{exc}: killed {app_id}" + training_end_note(
            st.progress or last.progress or {}, st.summary or last.summary, checkpoint_url(self._saved_spec(app_id)))
        return st

    # -- status --------------------------------------------------------------------------------------------------
    def _rm(self) -> yarn_rest.RmRest | None:
        """The RM's REST API when it takes simple auth and no driver is injected (tests): status, list, logs and
        kill then need no JVM (:mod:`tfyarn.backends.yarn.yarn_rest`); None = use the skein driver."""
        if self._rest is None:
            self._rest = False
            if not self._injected and os.environ.get("TFYARN_YARN_REST", "1") != "0":
                try:
                    self._rest = yarn_rest.RmRest(self.conf, self.user)
                except yarn_rest.RestUnavailable as exc:
                    log.debug("not using the RM REST API: %s", exc)
        return self._rest or None

    def _report(self, app_id: str) -> Any:
        self.login(app_id=app_id)
        rm = self._rm()
        if rm is not None:
            try:
                return rm.report(app_id)
            except yarn_rest.RestUnavailable as exc:
                log.debug("RM REST report of %s: %s; asking the skein driver", app_id, exc)
        sk = skein()     # only here: importing skein (grpc, its protobufs) is ~0.3 CPU s of a REST-only command
        try:
            return self.client().application_report(app_id)
        except (sk.exceptions.ApplicationError, ValueError) as exc:
            raise AppNotFound(f"no YARN application {app_id}: {exc}") from None

    def _app_client(self, app_id: str) -> Any | None:
        app = self._apps.get(app_id)
        if app is None:
            sk = skein()
            rep = self._report(app_id) if self._rm() else None
            try:
                if isinstance(rep, yarn_rest.AppReport):   # straight to the AM's address: no driver needed
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

    def _on_am(self, app_id: str, what: str, call: Callable[[Any], Any]) -> Any:
        """``call(app)`` on the running app's application master; None when it has none or the call fails (the AM may
        exit between the report and this call: the next status read says so), dropping the connection."""
        app = self._app_client(app_id)
        if app is None:
            return None
        try:
            return call(app)
        except Exception as exc:  # noqa: BLE001 - see above
            log.debug("%s of %s: %s", what, app_id, exc)
            self._apps.pop(app_id, None)
            return None

    def _live(self, app_id: str, spec: JobSpec | None) -> dict[str, Any] | None:
        """Tasks, progress, summary and failures from the running application master; None if unreachable."""
        got = self._on_am(app_id, "containers and KV",
                          lambda app: (app.get_containers(states=ALL_CONTAINER_STATES), app.kv.get_range()))
        if got is None:
            return None
        kv = {k: v.decode("utf-8", "replace") for k, v in got[1].items()}
        return snapshot(got[0], kv, spec, progress=self._supervisor(app_id, spec).progress(kv))

    def _supervisor(self, app_id: str, spec: JobSpec | None) -> Supervisor:
        """This process's supervisor of ``app_id``: its progress rate (the ETA) and progress points (the run report)
        across status reads. ``run`` and ``wait`` install theirs; a bare ``status`` gets one here."""
        sup = self._sups.get(app_id)
        if sup is None:
            d = paths.yarn_report_dir(app_id)
            d.mkdir(parents=True, exist_ok=True)
            sup = self._sups[app_id] = Supervisor(spec, history_path=d / HISTORY_FILE)
        return sup

    def status(self, app_id: str) -> AppStatus:
        rep = self._report(app_id)
        saved = self._recover(app_id, running=str(rep.state) == "RUNNING", tags=rep.tags)
        spec = self._saved_spec(app_id, saved)
        live = self._live(app_id, spec) if str(rep.state) == "RUNNING" else None
        snap = live or saved.get("snapshot") or {}
        task_states = [t["state"] for t in snap.get("tasks", [])] if live else None
        diag = failure_diagnosis(rep.diagnostics, snap.get("failures") or {}, snap.get("exits") or {})
        state = app_state(rep.state, rep.final_status, diag, task_states)
        if state is AppState.TIMED_OUT:
            diag = without_timeout_mark(diag)      # the in-app supervisor's marker: the state says it now
        if state is AppState.SUCCEEDED and diag.strip() == app_end.DONE_DIAGNOSTICS:
            diag = ""                      # ended early by tfyarn (runtime.app_end): nothing to diagnose
        final = saved.get("final") or {}
        if state is AppState.KILLED and final.get("state") == AppState.TIMED_OUT.value:
            state, diag = AppState.TIMED_OUT, final.get("diagnostics", diag)  # tfyarn killed it for a deadline
        if state in (AppState.FAILED, AppState.TIMED_OUT) and spec is not None and not saved.get("run_started"):
            from tfyarn.backends.yarn.yarn_supervise import no_more_attempts_note
            note = no_more_attempts_note(spec, attempt_of(rep.tags))      # a bare submit: nobody resubmits
            diag = f"{diag}\n{note}".strip() if note else diag
        summary = snap.get("summary") or final.get("summary")
        if summary is None and state.is_terminal:
            summary = self._summary_from_checkpoints(app_id, spec)
        st = settle(app_status(rep, state, diag, tasks=[TaskStatus(**t) for t in snap.get("tasks", [])],
                               progress=snap.get("progress") or {}, summary=summary))
        launched = timestamp(getattr(rep, "launch_time", None))   # the RM's REST report has it, skein's not
        if live is not None:
            self._save_state(app_id, name=rep.name, snapshot=live,
                             **({"am_launched": launched} if launched else {}))
        if state.is_terminal and not saved.get("final"):
            self._save_state(app_id, name=rep.name, final=st.to_dict())
        return st

    def _summary_from_checkpoints(self, app_id: str, spec: JobSpec | None) -> dict[str, Any] | None:
        """The chief's ``summary.json`` beside the checkpoints, when it is this app's: an app that ended before anyone
        read its KV (``submit``, then ``wait`` or ``status`` later) has no snapshot holding the summary."""
        if spec is None or not spec.checkpoint.dir:
            return None
        import fsspec
        url = hdfs.join(spec.resolve_path(spec.checkpoint.dir), "summary.json")
        try:
            with fsspec.open(url, "rt") as f:
                summary = json.load(f)
        except (OSError, ValueError) as exc:
            log.debug("no summary of %s at %s: %s", app_id, url, exc)
            return None
        return summary if isinstance(summary, dict) and summary.get("app_id") == app_id else None

    def list(self, all_states: bool = False) -> list[AppStatus]:
        """tfyarn applications (YARN tag ``tfyarn``): active ones, or every one the RM still knows."""
        self.login()
        states = ALL_APP_STATES if all_states else ACTIVE_APP_STATES
        reps = None
        rm = self._rm()
        if rm is not None:
            try:
                reps = rm.apps(states, tags=[yarn_spec.TFYARN_TAG])
            except yarn_rest.RestUnavailable as exc:
                log.debug("RM REST list: %s; asking the skein driver", exc)
        if reps is None:
            reps = self.client().get_applications(states=states)
        out = [app_status(r, app_state(r.state, r.final_status, r.diagnostics), r.diagnostics or "")
               for r in reps if yarn_spec.TFYARN_TAG in {t.lower() for t in r.tags}]
        return sorted(out, key=lambda s: s.started or 0)

    def kill(self, app_id: str) -> None:
        """Kill ``app_id``; through the RM's REST API (no JVM) this returns once the RM says KILLED (or ended)."""
        rep = self._report(app_id)     # AppNotFound for an unknown id, before asking YARN to kill
        rm = self._rm() if isinstance(rep, yarn_rest.AppReport) else None
        try:
            if rm is None:
                raise yarn_rest.RestUnavailable("no REST API")
            rm.kill(app_id)
        except yarn_rest.RestUnavailable as exc:
            log.debug("RM REST kill of %s: %s; asking the skein driver", app_id, exc)
            spec = self._saved_spec(app_id)
            # a job submitted for a proxy user (spec.user) is that user's: killing it as the submitter may be refused
            self.client().kill_application(app_id, user=(spec.user or "") if spec else "")
        app = self._apps.pop(app_id, None)
        if app is not None:
            app.close()

    # -- logs ----------------------------------------------------------------------------------------------------
    def _live_containers(self, app_id: str, task: str | None) -> list[tuple[str, Any]]:
        """(task label, skein container) of the running app's containers that have a log on a NodeManager."""
        from tfyarn.runtime.kv_yarn import TASKMAP_PREFIX

        got = self._on_am(app_id, "containers and task map", lambda app: (
            app.get_containers(states=ALL_CONTAINER_STATES), app.kv.get_prefix(TASKMAP_PREFIX)))
        if got is None:
            return []
        taskmap = {k[len(TASKMAP_PREFIX):]: v.decode() for k, v in got[1].items()}
        out = []
        for c in got[0]:
            label = taskmap.get(f"{c.service_name}_{c.instance}") or f"{c.service_name}:{c.instance}"
            if c.yarn_container_id and c.yarn_node_http_address and _shows(task, label, c.yarn_container_id):
                out.append((label, c))
        return out

    def _read_live(self, app_id: str, label: str, c: Any, tail: yarn_logs.LogTail,
                   all_files: bool) -> Iterator[str]:
        """New complete lines of one live container's files (NodeManager web API; ``yarn logs`` if it fails)."""
        cid, nm = c.yarn_container_id, c.yarn_node_http_address
        try:
            sizes = yarn_logs.nm_log_sizes(nm, cid)
            for name in yarn_logs.select_files(sizes, all_files):
                if sizes[name] is not None and sizes[name] <= tail.offset(cid, name):
                    continue
                data, start = yarn_logs.nm_read_log_bytes(nm, cid, name, tail.offset(cid, name), sizes[name])
                for line in tail.feed(cid, name, data, start):
                    yield f"{label} | {line}"
            return
        except (OSError, ValueError, urllib.error.URLError) as exc:
            log.debug("NodeManager logs of %s: %s; trying `yarn logs`", cid, exc)
            nm_error = exc
        try:
            cls = yarn_logs.parse_yarn_logs_output(yarn_logs.yarn_logs_cli(app_id, cid, timeout=60))
        except (OSError, RuntimeError, TimeoutError) as exc2:
            yield f"{label} | [tfyarn] logs unavailable: {nm_error}; {exc2}"
            return
        for cl in cls[:1]:
            yield from _new_lines(tail, label, cl, all_files)

    def _finished_logs(self, app_id: str, task: str | None, user: str) -> list[tuple[str, yarn_logs.ContainerLog]]:
        snap = self._load_state(app_id).get("snapshot") or {}
        taskmap = snap.get("taskmap") or {}
        if yarn_logs.aggregation_disabled(self.conf):   # nothing to wait for: the logs stay on the NodeManagers
            found = yarn_logs.nm_finished_logs(snap.get("tasks") or [])
            if not found:
                raise AppNotFound(f"no logs of {app_id}: log aggregation is off on this cluster and this machine has "
                                  f"no status of it naming its containers")
            return [(t, cl) for t, cl in found if _shows(task, t, cl.container_id)]
        deadline = time.monotonic() + self.aggregation_wait_s
        ran = {t["task"] for t in snap.get("tasks") or [] if t.get("state") != "PENDING"}
        while True:
            logs = yarn_logs.read_aggregated_logs(app_id, user, self.conf)
            if logs and ran - {taskmap.get(cl.task.replace(":", "_"), cl.task) for cl in logs} and \
                    time.monotonic() < deadline:    # one NodeManager uploaded, another not yet: every task that ran
                time.sleep(2.0)                     # has a log to come (after the deadline: what is there)
                continue
            if logs:
                break
            try:
                logs = yarn_logs.parse_yarn_logs_output(yarn_logs.yarn_logs_cli(app_id, timeout=120))
            except (OSError, RuntimeError, TimeoutError) as exc:
                log.debug("`yarn logs` for %s: %s", app_id, exc)
            if logs:
                break
            if time.monotonic() >= deadline:
                dirs = ", ".join(yarn_logs.aggregated_log_dirs(app_id, user, self.conf))
                raise WaitTimeout(f"timed out after {self.aggregation_wait_s:g}s waiting for the aggregated logs of "
                                  f"{app_id} (looked in {dirs}; is yarn.log-aggregation-enable true?)")
            time.sleep(2.0)
        labelled = [(taskmap.get(cl.task.replace(":", "_"), cl.task), cl) for cl in logs]
        return [(label, cl) for label, cl in labelled if _shows(task, label, cl.container_id)]

    def logs(self, app_id: str, task: str | None = None, follow: bool = False,
             all_files: bool = False, follow_timeout: float | None = None) -> Iterator[str]:
        """``<task> | <line>`` for one task (``worker:1``), one role (``worker``) or all; ``follow`` streams new lines
        of running containers until the app ends (or ``follow_timeout`` s)."""
        rep = self._report(app_id)
        spec = self._saved_spec(app_id)
        if task is not None and spec is not None and not task.startswith("container_"):
            select_tasks(spec.tasks(), task, app_id)     # an unknown task: AppNotFound naming the app's tasks
        user = rep.user or self.user
        if str(rep.state) not in yarn_rest.TERMINAL:
            yield from self._follow(app_id, task, user, follow, all_files, follow_timeout)
        else:
            for label, cl in self._finished_logs(app_id, task, user):
                yield from yarn_logs.lines_of(cl, all_files, label)

    def _follow(self, app_id: str, task: str | None, user: str, follow: bool, all_files: bool,
                follow_timeout: float | None) -> Iterator[str]:
        """Lines of the running app's containers; with ``follow`` new ones every ``log_poll_s`` until the app ends,
        then what its containers wrote after the last poll (from the aggregated logs), so every line comes once."""
        tail = yarn_logs.LogTail()
        labels: dict[str, str] = {}
        deadline = None if follow_timeout is None else time.monotonic() + follow_timeout
        while True:
            for label, c in self._live_containers(app_id, task):
                labels[c.yarn_container_id] = label
                yield from self._read_live(app_id, label, c, tail, all_files)
            if not follow:
                break
            if str(self._report(app_id).state) in yarn_rest.TERMINAL:
                yield from self._follow_rest(app_id, task, user, tail, labels, all_files)
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(self.log_poll_s)
        for cid, _name, text in tail.flush():
            yield f"{labels.get(cid, cid)} | {text}"

    def _follow_rest(self, app_id: str, task: str | None, user: str, tail: yarn_logs.LogTail,
                     labels: dict[str, str], all_files: bool) -> Iterator[str]:
        """After the end: the lines written since the last poll, from the aggregated logs once they hold every
        container followed (bounded by ``aggregation_wait_s``; a warning, not an error, when they cannot be read)."""
        deadline = time.monotonic() + self.aggregation_wait_s
        while True:
            try:
                finished = self._finished_logs(app_id, None, user)
            except WaitTimeout as exc:
                log.warning("the last lines of %s may be missing: %s", app_id, exc)
                return
            missing = set(labels) - {cl.container_id for _, cl in finished}
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(2.0)
        if missing:
            log.warning("the last lines of %s may be missing: no aggregated logs of %s after %gs", app_id,
                        ", ".join(sorted(missing)), self.aggregation_wait_s)
        for label, cl in finished:
            if cl.container_id in labels or task_matches(task, label, cl.container_id):
                yield from _new_lines(tail, labels.get(cl.container_id, label), cl, all_files)

    # -- waiting -------------------------------------------------------------------------------------------------
    def wait(self, app_id: str, timeout: float | None = None, poll: float = 1.0,
             on_update: Callable[[AppStatus], None] | None = None) -> AppStatus:
        """Poll every ``poll`` s (one RM call + one AM call): returns within ~``poll`` s of the app's end, with the
        job's rules enforced meanwhile (:meth:`follow`). ``timeout`` bounds this wait only (:class:`WaitTimeout`;
        the app runs on)."""
        return self._followed(app_id, None, timeout, poll, on_update)

    def _followed(self, app_id: str, sup: Supervisor | None, timeout: float | None, poll: float,
                  on_update: Callable[[AppStatus], None] | None) -> AppStatus:
        threading.Thread(target=preload_plotting, name="tfyarn-preload-matplotlib", daemon=True).start()
        st = self._wait_with(self.follow(app_id, sup), app_id, timeout, poll, on_update)
        log.debug("%s phases: %s", app_id, phases.text(self.phases(app_id, st)))
        self._report_at_end(st)            # after a kill for a stall too: where it stalled is what its report shows
        return st

    def follow(self, app_id: str, sup: Supervisor | None = None) -> Callable[[], AppStatus]:
        """One supervised status read of ``app_id`` per call (``wait``, ``run``, the Airflow trigger), judged by
        :class:`tfyarn.supervisor.Supervisor` (``sup``, else one from the app's spec, counting from its submit; none
        when the spec is unknown): a verdict (deadline, allocation, stall) kills the app, which ends TIMED_OUT saying
        why. While the app's own supervisor (:mod:`~tfyarn.backends.yarn.yarn_supervise`) is alive, the stall watch
        is its; the follower keeps the deadline and allocation checks and ends the app once every task is done."""
        if sup is None:
            spec = self._saved_spec(app_id, self._recover(app_id, running=True))   # submitted elsewhere: the app's
            if spec is not None:
                sup = Supervisor(spec, started=self._load_state(app_id).get("submitted") or time.time(),
                                 history_path=paths.yarn_report_dir(app_id) / HISTORY_FILE)
        if sup is not None:
            paths.yarn_report_dir(app_id).mkdir(parents=True, exist_ok=True)
            self._sups[app_id] = sup       # status reads feed its progress rate and history
            sup.begin_attempt()            # its stall watch starts once the app's KV answers

        def step() -> AppStatus:
            st = self.status(app_id)
            if st.state.is_terminal:
                return st
            self._heartbeat(app_id)
            if sup is None:
                return st
            if st.state is AppState.RUNNING:
                if self._supervised(app_id):
                    sup.end_attempt()      # the app's own supervisor watches for stalls (yarn_supervise)
                elif (app := self._app_client(app_id)) is not None:
                    sup.watch(SkeinKV(app.kv))
            verdict = sup.check(st)
            return st if verdict is None else self._end_by(app_id, verdict, sup)

        return step

    def _end_by(self, app_id: str, verdict: Verdict, sup: Supervisor) -> AppStatus:
        """Kill ``app_id`` for the supervisor's ``verdict``; its final status says why (saved: ``status`` later too)."""
        diag = verdict.diagnosis + (self._queue_state(sup.spec.queue) if verdict.reason == "allocation" else "")
        log.error("%s: %s; killing it", app_id, diag)
        self.kill(app_id)
        st = self.status(app_id)
        st.state, st.diagnostics = verdict.state, diag
        self._save_state(app_id, final=st.to_dict())
        return st

    def _supervised(self, app_id: str) -> bool:
        """The app's in-app supervisor is alive (:mod:`tfyarn.backends.yarn.yarn_supervise`): the stall watch is its,
        not this follower's."""
        return bool(self._on_am(app_id, "supervisor heartbeat", lambda app: app_end.follower_alive(
            SkeinKV(app.kv), time.time(), app_end.SUPERVISOR_KEY)))

    def _heartbeat(self, app_id: str) -> None:
        """Tell the tasks a follower is alive: the last task done then leaves the shutdown to us (runtime.app_end),
        so the KV's last records (every task's done and phase times) are read before the AM goes."""
        self._on_am(app_id, "follower heartbeat",
                    lambda app: app.kv.put(app_end.FOLLOWER_KEY, f"{time.time():.3f}".encode()))

    def _between_polls(self, app_id: str, poll: float, check_s: float = 0.2) -> None:
        """Sleep ``poll`` s, looking every ``check_s`` s for the tasks' ``control/all_done`` (one cheap KV read): once
        it is there, read the status one last time and shut the application down SUCCEEDED, then wait for the RM to
        say so (tens of ms), so ``wait`` returns within a fraction of a second of the last task's end."""
        end = time.monotonic() + poll
        app = self._app_client(app_id)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(check_s, left))
            if app is None:
                continue
            try:
                done = app.kv.get(app_end.ALL_DONE_KEY)
            except Exception as exc:  # noqa: BLE001 - the AM may be going: the next status read says so
                log.debug("all-done watch of %s: %s", app_id, exc)
                return
            if done is not None:
                self._end_app(app_id, app)
                return

    def _end_app(self, app_id: str, app: Any) -> None:
        """The KV's last state (phase times, final progress) into the snapshot, then the app's end — ours, also when
        the app has its own supervisor (it leaves the end to a live follower: the report is written after the end,
        not before it) — and the RM's word on it (tens of ms)."""
        st = self.status(app_id)
        log.debug("every task of %s is done: shutting it down", app_id)
        try:
            app.shutdown("SUCCEEDED", app_end.DONE_DIAGNOSTICS)
        except Exception as exc:  # noqa: BLE001 - the supervisor or the last task shuts it down when we cannot
            log.debug("shutdown of %s: %s", app_id, exc)
        self._apps.pop(app_id, None)
        deadline = time.monotonic() + app_end.SUPERVISOR_GRACE_S
        while not st.state.is_terminal and time.monotonic() < deadline:
            time.sleep(0.05)
            st = self.status(app_id)

    def phases(self, app_id: str, st: AppStatus | None = None) -> dict[str, Any]:
        """Seconds of each phase of the job's timeline (:mod:`tfyarn.backends.yarn.phases`), from what this machine saw:
        its submit, the RM's times, the tasks' phase records in the last KV snapshot."""
        saved = self._load_state(app_id)
        st = st or self.status(app_id)
        rm = {"started": st.started, "launched": saved.get("am_launched"), "finished": st.finished}
        gw = {k: saved.get(k) for k in ("run_started", "env_ready", "submit_call", "submitted")}
        rec = (saved.get("snapshot") or {}).get("phases") or {}
        return phases.durations(phases.marks(gw, rm, rec))

    def report_location(self, st: AppStatus, build: bool = True) -> str | None:
        """Next to the checkpoints (a URL any machine can read, e.g. the next Airflow task's worker) when the report
        there is this app's, else this machine's copy. ``build``: an ended app nobody wrote a report for (the
        operator's deferred wait samples nothing) gets one now, from the points its tasks recorded."""
        ckpt = (st.summary or {}).get("checkpoint_dir")
        mine = paths.yarn_report_dir(st.app_id) / REPORT_JSON

        def found() -> str | None:
            return (report_at(ckpt, st.app_id) if ckpt else None) or (str(mine) if mine.exists() else None)

        where = found()
        if where is None and build and st.state.is_terminal:
            self.write_report(st)
            where = found()
        return where

    def saved_report(self, app_id: str) -> str:
        """This machine's copy (it followed the job to its end), else :meth:`report_location`'s."""
        mine = paths.yarn_report_dir(app_id) / REPORT_JSON
        where = str(mine) if mine.exists() else self.report_location(self.status(app_id))
        if where is None:
            raise TfyarnError(f"no report of {app_id}: it has not ended, or ended before any task recorded "
                              f"progress (a report elsewhere: pass --from <the URL of its dir>)")
        return where

    def index_cache_dir(self) -> str | None:
        return hdfs.join(self.staging_dir, "index")

    def _report_at_end(self, st: AppStatus) -> None:
        """The run report of a job this process followed: now, or by a detached process (``detached_report``) that
        outlives this one, so the caller's exit does not wait ~3 s for a plot and HDFS uploads."""
        if not self.detached_report:
            self.write_report(st)
            return
        import subprocess
        import sys
        d = paths.yarn_report_dir(st.app_id)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "report.log", "ab") as out:
            subprocess.Popen([sys.executable, "-m", "tfyarn.backends.yarn.yarn_report", st.app_id],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        log.debug("run report of %s: written by a detached process (log %s)", st.app_id, d / "report.log")

    def write_report(self, st: AppStatus) -> Path | None:
        """The run report of an ended job in ``$TFYARN_HOME/yarn/<app>/`` (None: nothing to report): a copy of the
        in-app supervisor's, which saw the whole run, else one written here and next to the checkpoints
        (:func:`tfyarn.supervisor.write_report`) from the tasks' recorded points and this machine's samples. Called
        by whoever followed the job, and by the Airflow operator after a deferred wait. Never changes the outcome."""
        d = paths.yarn_report_dir(st.app_id)
        try:
            ckpt = checkpoint_url(self._saved_spec(st.app_id)) or (st.summary or {}).get("checkpoint_dir")
            extra = {"phases": self.phases(st.app_id, st)}
            if self._copy_in_app_report(st.app_id, ckpt, d, extra["phases"]):
                return d / REPORT_JSON
        except Exception:  # noqa: BLE001 - a report is a convenience
            log.warning("could not write the run report of %s", st.app_id, exc_info=True)
            return None
        local = write_report(d, st, ProgressHistory.load(d / HISTORY_FILE).points, ckpt, extra)
        if local is not None:
            self._publish(st, d, ckpt)
        return local

    def _publish(self, st: AppStatus, report_dir: Path, ckpt: str | None) -> None:
        """What the in-app supervisor leaves for other machines when this follower ended the app: the report in the
        staging dir (unless next to the checkpoints), the last snapshot (tasks, progress) and final status in the
        app's record."""
        from tfyarn.backends.yarn import yarn_supervise
        rec = yarn_supervise.read_record(self.staging_dir, st.app_id)
        if not rec:                          # an app without a supervisor, or another staging dir
            return
        yarn_supervise.publish_report(self.staging_dir, st.app_id, report_dir, ckpt)
        if not rec.get("final"):         # the supervisor wrote its record at the start only: the end is ours
            snap = self._load_state(st.app_id).get("snapshot") or rec.get("snapshot")
            try:
                yarn_supervise.write_record(self.staging_dir, st.app_id, rec | {"final": st.to_dict(),
                                                                                 "snapshot": snap})
            except Exception as exc:  # noqa: BLE001 - a record is a convenience for other machines
                log.warning("could not write the final record of %s: %s", st.app_id, exc)

    def _queue_state(self, queue: str | None) -> str:
        """What an allocation timeout's diagnosis adds: the queue's state and use (a full queue is the usual cause)."""
        if not queue:
            return ""
        try:
            q = self.client().get_queue(queue)
            return (f"; queue {queue!r} is {q.state} at {q.percent_used:.0f}% of its capacity "
                    f"(capacity {q.capacity:g}%, max {q.max_capacity:g}%)")
        except Exception as exc:  # noqa: BLE001 - the diagnosis must not fail on a missing queue report
            return f"; queue {queue!r}: no report ({exc})"

    def _copy_in_app_report(self, app_id: str, ckpt: str | None, dest: Path, phases: dict[str, Any]) -> bool:
        """The report the app's supervisor wrote (next to the checkpoints, else in the staging dir), copied here: it
        saw the whole run. ``phases``: this follower's, which add the gateway's (preflight, submit, ...)."""
        import fsspec

        from tfyarn.backends.yarn.yarn_supervise import report_url
        for where in filter(None, (ckpt, report_url(self.staging_dir, app_id))):
            try:
                url = report_at(where, app_id)
            except Exception as exc:  # noqa: BLE001 - e.g. HDFS unreachable (hdfs-native's RuntimeError): ours, then
                log.debug("no in-app report of %s in %s: %s", app_id, where, exc)
                continue
            if url is None:
                continue
            with fsspec.open(url, "rt") as f:
                report = json.load(f)
            theirs = report.get("phases") or {}
            report["phases"] = {k: v if v is not None else theirs.get(k) for k, v in (theirs | phases).items()}
            copy_report(report, f"{where.rstrip('/')}/{REPORT_PNG}" if report.get("plot") else None, dest)
            log.debug("run report of %s: the in-app supervisor's, from %s", app_id, where)
            return True
        return False


class _LazyClient:
    """The skein client, got (and its driver waited for) on first use only."""

    def __init__(self, get: Callable[[], Any]):
        self._get = get

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)


def _shows(task: str | None, label: str, container_id: str) -> bool:
    """``task`` selects the log of ``label``; the in-app supervisor's only when asked for by name (it is no task)."""
    if task is None:
        return label.split(":")[0] != yarn_spec.SUPERVISOR_SERVICE
    return task_matches(task, label, container_id)


def _new_lines(tail: yarn_logs.LogTail, label: str, cl: yarn_logs.ContainerLog, all_files: bool) -> Iterator[str]:
    """``<label> | <line>`` for the lines of ``cl`` that ``tail`` has not shown yet."""
    for name in yarn_logs.select_files(cl, all_files):
        for line in tail.feed(cl.container_id, name, cl.files[name].encode()):
            yield f"{label} | {line}"


class SubmittedThenInterrupted(Interrupted):
    """A stop signal arrived while the application was being submitted: it exists (``app_id``), and whoever owns the
    job (``run``) kills it."""

    def __init__(self, signame: str, app_id: str):
        super().__init__(signame)
        self.app_id = app_id


def pack(spec: JobSpec, staging_dir: str | None = None, progress: packaging.Progress | None = None,
         hadoop_conf_dir: str | None = None) -> packaging.EnvRef:
    """``tfyarn pack``: stage the spec's environment now (same cache as submit); 0 bytes when already staged."""
    b = YarnBackend(staging_dir=staging_dir, hadoop_conf_dir=hadoop_conf_dir, progress=progress)
    b.login(spec)
    return packaging.ensure_env(spec, b.staging_dir, progress, conf=b.conf)
