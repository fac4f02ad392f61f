"""Submitting a job to YARN: the dry run (the skein ApplicationSpec and the files it ships, nothing started) and
``schedule`` (preflight, the environment staged, the files shipped, the application submitted).

Why a part of its own: what a submit needs (packaging, preflight, the shipped files) is nothing that following,
status or logs need.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

from tfyarn.cluster import hdfs, kerberos
from tfyarn.common import paths
from tfyarn.gateway import packaging
from tfyarn.cluster._skein import skein
from tfyarn.backends.base import Request
from tfyarn.backends.yarn import appspec, records
from tfyarn.backends.yarn.connection import YarnConnection
from tfyarn.errors import TfyarnError
from tfyarn.common.interrupts import Interrupted, deferring_stop_signals
from tfyarn.spec import JobSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass
class YarnRequest(Request):
    """A YARN submit: the skein ApplicationSpec and the files it ships (:meth:`YarnBackend.dryrun`)."""

    app: Any = None  # skein.ApplicationSpec
    shipped: appspec.Shipped | None = None

    def __str__(self) -> str:
        """The skein YAML (``skein.ApplicationSpec.from_yaml`` loads it), then what submit ships and stages."""
        assert self.shipped is not None
        env = self.shipped.env
        staged = {
            "pack": f"this Python's {env.kind} packed to {env.archive_url} (packed and uploaded at submit "
            f"unless already there)",
            "archive": f"the archive {env.archive_url}",
            "python": f"the nodes' {env.python}",
            "none": "the nodes' python3",
        }[env.source]
        files = [self.shipped.spec_file, self.shipped.tfyarn_src, self.shipped.code]
        return "\n".join(
            [appspec.to_yaml(self.app).rstrip(), f"# environment: {staged}", *(f"# ships: {f}" for f in files if f)]
        )


class SubmittedThenInterrupted(Interrupted):
    """A stop signal arrived while the application was being submitted: it exists (``app_id``), and whoever owns the
    job (``run``) kills it."""

    def __init__(self, signame: str, app_id: str):
        super().__init__(signame)
        self.app_id = app_id


class _LazyClient:
    """The skein client, got (and its driver waited for) on first use only."""

    def __init__(self, get: Callable[[], Any]):
        self._get = get

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)


class Submitter:
    """The submit part of the YARN backend: ``conn`` its connection, the AM's container, ``preflight`` (checks in
    ``schedule``), ``progress`` (of the environment's packing and upload), ``cluster`` (an injected preflight
    ClusterInfo)."""

    def __init__(
        self,
        conn: YarnConnection,
        master_memory_mib: int = 512,
        master_vcores: int = 1,
        preflight: bool = True,
        progress: packaging.Progress | None = None,
        cluster: Any = None,
    ):
        self.conn, self.master_memory_mib, self.master_vcores = conn, master_memory_mib, master_vcores
        self.preflight, self.progress, self.cluster = preflight, progress, cluster

    def dryrun(self, spec: JobSpec, attempt: int = 0) -> YarnRequest:
        """The skein ApplicationSpec for ``spec`` and the files it ships. Nothing is packed, uploaded or written: the
        env archive's URL and the shipped files' paths are content hashes, made to exist by :meth:`schedule`."""
        self.conn.login(spec)
        submitted, spec = spec, self.with_index_cache(spec)  # the spec saved and shown is the one given
        env = packaging.ensure_env(spec, self.conn.staging_dir, self.progress, dry_run=True, conf=self.conn.conf)
        shipped = self._ship(submitted, env, write=False)
        # every filesystem a task reads or writes: each needs a delegation token on a secure cluster
        ckpt, export = spec.checkpoint, spec.export.dir if spec.export else None
        urls = [*spec.data.train, *spec.data.eval, ckpt.dir, ckpt.init_from, export, self.conn.staging_dir]
        fss = hdfs.filesystems_for_tokens(urls, self.conn.conf)  # (None: not set)
        app = appspec.build_application_spec(
            spec,
            shipped,
            master_memory_mib=self.master_memory_mib,
            master_vcores=self.master_vcores,
            file_systems=fss,
            attempt=attempt,
            staging_dir=self.conn.staging_dir,
        )
        return YarnRequest(submitted, attempt, app=app, shipped=shipped)

    def _ship(self, spec: JobSpec, env: packaging.EnvRef, write: bool) -> appspec.Shipped:
        spec, local = self.with_index_cache(spec), paths.cache_dir() / "ship"
        code = appspec.build_code_zip(spec.code, local, write=write) if spec.code else None
        return appspec.Shipped(
            env=env,
            spec_file=appspec.write_spec_file(spec, local, write=write),
            tfyarn_src=appspec.build_tfyarn_zip(local, write=write),
            code=code,
        )

    def with_index_cache(self, spec: JobSpec) -> JobSpec:
        """``spec`` with ``data.index_cache`` set, when unset, to ``<staging dir>/index``: the tasks' cluster-wide
        cache of data indexes (read-only data is indexed once per cluster, not once per node or run)."""
        if spec.data.index_cache:
            return spec
        data = spec.data.model_copy(update={"index_cache": self.conn.index_cache_dir()})
        return spec.model_copy(update={"data": data})

    def run_preflight(self, spec: JobSpec) -> list[str]:
        # preflight loads the data layer, predict and numpy: only a submission pays for them (status stays light)
        from tfyarn.gateway import preflight  # noqa: PLC0415
        from tfyarn.backends.yarn.cluster_info import SkeinClusterInfo  # noqa: PLC0415 - (preflight's)

        self.conn.login(spec)
        spec = self.with_index_cache(spec)  # staging dir: the user may be the keytab's
        cluster = self.cluster
        if cluster is None:  # the client only when the RM's REST API cannot say: the driver may still be starting
            cluster = SkeinClusterInfo(_LazyClient(lambda: self.conn.client(spec)), self.conn.conf)
        return preflight.run_preflight(
            spec, cluster, master_memory_mib=self.master_memory_mib, master_vcores=self.master_vcores, size_ps=True
        )

    def schedule(self, request: Request) -> str:
        """Preflight, stage the environment (0 bytes when cached) and the shipped files the request names, submit its
        ApplicationSpec; return the YARN application id. The skein driver starts meanwhile (:meth:`start_driver`):
        its JVM is the only one a job needs."""
        assert isinstance(request, YarnRequest) and request.shipped is not None, f"not a YARN request: {request!r}"
        spec, attempt, app = request.spec, request.attempt, request.app
        if not self.conn.injected:
            self.conn.require_hadoop()  # a usage error before anything starts, not a driver thread's
        self.conn.start_driver(spec)
        if self.preflight and attempt == 0:
            self.run_preflight(spec)
        env = packaging.stage_env(request.shipped.env, self.progress, conf=self.conn.conf)
        if self._ship(spec, env, write=True) != dataclasses.replace(request.shipped, env=env):
            raise TfyarnError("the job's code, spec or tfyarn changed since its dry run: dry-run it again")
        env_ready = time.time()
        client = self.conn.client(spec)  # the driver started in the background: waited for here
        t0 = time.monotonic()
        submit_call = time.time()
        with deferring_stop_signals() as stopped:  # a stop until app_id is known must not leave an app nobody knows of
            try:
                app_id = client.submit(app)
            except skein().exceptions.DriverError as exc:
                refused = kerberos.proxy_refusal(exc, spec.user)
                if refused is None:
                    raise
                raise refused from None
            log.info(
                "submitted %s as %s (%.1fs; env %s, %d bytes uploaded)",
                spec.name,
                app_id,
                time.monotonic() - t0,
                "cached" if env.cached else env.source,
                env.uploaded_bytes,
            )
            records.save(
                app_id,
                name=spec.name,
                spec=spec.to_json(),
                submitted=time.time(),
                env=env.to_dict(),
                submit_call=submit_call,
                run_started=request.run_started,
                env_ready=env_ready,
            )
        if stopped:
            raise SubmittedThenInterrupted(stopped[0], app_id)
        if request.run_started is not None:  # a run follows it: no JVM needed for that (connection.release_driver)
            self.conn.release_driver()
        return app_id
