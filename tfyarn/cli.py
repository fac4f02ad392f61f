"""``tfyarn`` command line: a thin layer over :mod:`tfyarn.api`.

Exit codes (stable, for schedulers): 0 succeeded, 1 failed, 2 invalid spec or usage (nothing started), 3 killed,
4 timed out.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Callable

import click

from tfyarn import __version__
from tfyarn.errors import ExitCode, SpecError, TfyarnError
from tfyarn.common.interrupts import Interrupted

log = logging.getLogger("tfyarn")

_set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a spec value (YAML-parsed), e.g. --set roles.worker.instances=4. Repeatable.",
)


def _backend_option(f: Callable) -> Callable:
    f = click.option("--local", "backend", flag_value="local", help="Run on this machine (default without a cluster).")(
        f
    )
    f = click.option("--yarn", "backend", flag_value="yarn", help="Run on YARN (default when HADOOP_CONF_DIR is set).")(
        f
    )
    return f


#: Loggers whose detail ``-v`` turns on: tfyarn's own and skein's. Other libraries stay at WARNING unless ``-vv``: at
#: DEBUG they flood a run (matplotlib's font scoring while the report is drawn, fsspec's every file open).
VERBOSE_LOGGERS = ("tfyarn", "skein")


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose else logging.INFO)
    logging.basicConfig(
        level=logging.DEBUG if verbose >= 2 else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for name in VERBOSE_LOGGERS:
        logging.getLogger(name).setLevel(level)


def _fail(exc: TfyarnError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(int(exc.exit_code))


def _load(spec_path: str, overrides: tuple[str, ...]):
    from tfyarn.api import load

    try:
        return load(spec_path, overrides)
    except SpecError as exc:
        _fail(exc)


class _Group(click.Group):
    """Maps tfyarn errors raised below a command to their exit codes with a one-line message, and Ctrl-C to exit 130
    (click's default, exit 1, reads as a failed job to a scheduler; `logs -f` is stopped that way as a matter of
    course)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TfyarnError as exc:
            _fail(exc)
        except OSError as exc:
            # a path the command was given (or TFYARN_HOME) cannot be used: a usage problem, said in one line (a
            # job's own failures come back as its status, not as exceptions)
            log.debug("%s", exc, exc_info=True)
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            sys.exit(130)
        except Interrupted as exc:  # `run --yarn` stopped before its first submit returned (e.g. packing the env)
            click.echo(f"{exc}: stopped before anything was submitted", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tfyarn")
@click.option(
    "-v", "--verbose", count=True, help="More logging: -v tfyarn's (and skein's) debug detail, -vv every library's too."
)
@click.option("-q", "--quiet", is_flag=True, help="Only warnings, errors and the final result.")
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """Run distributed TensorFlow training on Hadoop YARN, or locally, to the end without hanging."""
    _setup_logging(verbose, quiet)
    ctx.obj = {"quiet": quiet, "verbose": verbose}


# ------------------------------------------------------------------------------------------------------------ spec
def _spec_command(name: str | None = None) -> Callable[[Callable], click.Command]:
    """A command on a job spec: its ``SPEC`` argument and ``--set`` overrides (``spec_path``, ``overrides``)."""

    def command(f: Callable) -> click.Command:
        return cli.command(name)(click.argument("spec_path", metavar="SPEC")(_set_option(f)))

    return command


@_spec_command()
@click.option(
    "--check-files",
    is_flag=True,
    help="Also check what run/submit check before starting: every data glob matches, the first records "
    "fit data.features, checkpoint.dir and export.dir are writable (a probe file is written and "
    "removed), checkpoint.init_from holds a checkpoint, and (when the tasks run this Python) the "
    "model's module and the roles' packages are installed.",
)
@click.option(
    "--probe",
    is_flag=True,
    help="YARN: start one short container with the job's environment and report what its Python imports "
    "(tfyarn's dependencies, TensorFlow, pyarrow, tf_keras); exit 2 when a task could not start.",
)
@_backend_option
def validate(spec_path: str, overrides: tuple[str, ...], check_files: bool, probe: bool, backend: str | None) -> None:
    """Check a spec and print what it would run (exit 2 and every problem if invalid)."""
    spec = _load(spec_path, overrides)
    if check_files:
        from tfyarn import api

        api.check_files(spec, backend)
    if probe:
        _probe(spec, backend, show=True)
    roles = ", ".join(f"{r}x{spec.instances(r)}" for r in spec.roles if spec.instances(r))
    if spec.job == "predict" and spec.predict:
        p = spec.predict
        click.echo(
            f"{spec_path}: ok — predict job {spec.name!r}, {roles}: {p.saved_model or p.checkpoint} over "
            f"{', '.join(p.input)} into {p.output} ({p.output_format}, batch {p.batch_size})"
        )
        return
    click.echo(
        f"{spec_path}: ok — job {spec.name!r}, mode {spec.mode}{' sync' if spec.sync else ''}, {roles}, "
        f"{spec.data.epochs} epochs, global batch {spec.global_batch_size} "
        f"({spec.data.batch_size} per worker x {spec.num_training_workers})"
        + (f"; exports a SavedModel to {spec.export.dir}" if spec.export else "")
    )


@cli.command()
def schema() -> None:
    """Print the JSON Schema of job specs (for editors: yaml-language-server)."""
    from tfyarn.spec import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@_spec_command("export")
@click.option(
    "--checkpoint",
    default=None,
    metavar="NAME",
    help="A committed checkpoint of checkpoint.dir, e.g. ckpt-120 (default: the latest).",
)
@click.option("--to", default=None, metavar="URL", help="Where the numbered version goes (default: export.dir).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
def export_(spec_path: str, overrides: tuple[str, ...], checkpoint: str | None, to: str | None, output: str) -> None:
    """Export a checkpoint as a SavedModel (TF Serving layout: URL/<global step>/); needs TensorFlow here."""
    from tfyarn import api

    spec = _load(spec_path, overrides)
    out = api.export(spec, checkpoint=checkpoint, to=to)
    if output == "json":
        click.echo(json.dumps(out))
    else:
        click.echo(
            f"exported {out['checkpoint']} as SavedModel version {out['version']}: {out['url']} ({out['seconds']:.1f}s)"
        )


# ------------------------------------------------------------------------------------------------------------ run
@_spec_command()
@_backend_option
@click.option("--output", type=click.Choice(["text", "json"]), default="text", help="Final status format.")
@click.option(
    "--probe",
    is_flag=True,
    help="YARN: first probe the job's environment in one short container (validate --probe); exit 2 without "
    "starting the job when its tasks could not start.",
)
@click.pass_context
def run(
    ctx: click.Context, spec_path: str, overrides: tuple[str, ...], backend: str | None, output: str, probe: bool
) -> None:
    """Run a job to its end and print a summary; the exit code is the job's outcome."""
    from tfyarn import api

    spec = _load(spec_path, overrides)
    if probe:
        _probe(spec, backend, show=not ctx.obj["quiet"])
    _follow_to_end(lambda **follow: api.run(spec, backend=backend, **follow), ctx.obj["quiet"], output)


def _follow_to_end(start: Callable[..., Any], quiet: bool, output: str) -> None:
    """Run a job through ``start`` (``api.run`` or ``api.predict`` given the progress view's echo and updates),
    print its outcome and exit with it. Task lines go through the view: on a TTY they must print above the live
    table, not through it; on YARN the run report's plot and uploads are not on the exit path (detached)."""
    from tfyarn.display import progress_view

    view = None if quiet else progress_view()
    try:
        st = start(echo=view.echo if view else None, on_update=view, detach_report=True)
    finally:
        if view:
            view.close()
    _print_final(st, output)


def _probe(spec, backend: str | None, show: bool) -> None:
    """The probe of ``spec``'s environment on YARN, said; exit 2 when its tasks could not start."""
    from tfyarn import api

    if (backend or api.default_backend_name()) != "yarn":
        _fail(TfyarnError("--probe starts a YARN container: give --yarn (or set HADOOP_CONF_DIR)"))
    report = api.probe(spec)
    if show:
        click.echo(f"probe {report.get('app_id')}: python {report.get('python', '?')} {report.get('version', '')}")
        for name, m in (report.get("modules") or {}).items():
            click.echo(f"  {name:14} {m.get('version') or 'ok' if m.get('ok') else 'missing: ' + str(m.get('error'))}")
    problem = api.probe_problem(report)
    if problem:
        click.echo(f"error: the job's tasks could not start: {problem}", err=True)
        sys.exit(ExitCode.INVALID)


@_spec_command()
@_backend_option
@click.option("--overwrite", is_flag=True, help="Replace predict.output when it holds anything (else refused).")
@click.option("--submit", "submit_", is_flag=True, help="Submit, print the app id and return (then status, wait ...).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", help="Final status format.")
@click.pass_context
def predict(
    ctx: click.Context,
    spec_path: str,
    overrides: tuple[str, ...],
    backend: str | None,
    overwrite: bool,
    submit_: bool,
    output: str,
) -> None:
    """Score predict.input with the trained model (docs/predict.md): workers only, every row written once; the
    exit code is the job's outcome, as for run."""
    from tfyarn import api

    spec = _load(spec_path, overrides + ("job=predict",))
    if submit_:
        app_id = api.submit(api.predict_job(spec, overwrite), backend)
        click.echo(json.dumps({"app_id": app_id}, indent=1) if output == "json" else app_id)
        return
    start = lambda **follow: api.predict(spec, backend=backend, overwrite=overwrite, **follow)  # noqa: E731
    _follow_to_end(start, ctx.obj["quiet"], output)


def _print_final(st, output: str) -> None:
    from tfyarn.display import summary_text

    if output == "json":
        click.echo(json.dumps(st.to_dict(), indent=1))
    else:
        click.echo(summary_text(st))
    if st.finished:  # the last phase of the job's timeline (-v; the others are in the run report)
        logging.getLogger("tfyarn.cli").debug("exiting %.2fs after %s ended", time.time() - st.finished, st.app_id)
    _exit(int(st.state.exit_code))


#: Set by :func:`main` (a real ``tfyarn`` process, not click's test runner): the job's outcome is known and printed,
#: so its exit code need not wait for the interpreter's teardown.
_FAST_EXIT = False


def _exit(code: int) -> None:
    """Exit with ``code``; in the ``tfyarn`` process itself without the interpreter's teardown, which took 1.5-3 s
    (grpc, skein, matplotlib) on a loaded gateway after the outcome was printed. The backend is closed by then and
    the run report is a detached process; output and log handlers are flushed here."""
    if not _FAST_EXIT:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@_spec_command()
@_backend_option
@click.option("--dry-run", is_flag=True, help="Print what would be submitted (YARN: the skein spec YAML).")
@click.option("--wait", "wait_", is_flag=True, help="Follow progress until the job ends; exit with its outcome.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@click.pass_context
def submit(
    ctx: click.Context,
    spec_path: str,
    overrides: tuple[str, ...],
    backend: str | None,
    dry_run: bool,
    wait_: bool,
    output: str,
) -> None:
    """Submit a job and print its app id (does not wait unless --wait; a stop signal then ends the wait, not the
    job: use `tfyarn run` to tie the job to this process). With --output json stdout holds exactly one JSON
    document: {"app_id"} (with --dry-run {"dry_run"}), or with --wait the final status."""
    from tfyarn import api

    spec = _load(spec_path, overrides)
    if dry_run:
        text = str(api.dryrun(spec, backend))
        click.echo(json.dumps({"dry_run": text}, indent=1) if output == "json" else text)
        return
    app_id = api.submit(spec, backend)
    if output != "json":
        click.echo(app_id)
    elif not wait_:
        click.echo(json.dumps({"app_id": app_id}, indent=1))
    else:
        click.echo(f"submitted {app_id}", err=True)
    if wait_:
        _wait_and_exit(app_id, None, output, ctx.obj["quiet"])


# ------------------------------------------------------------------------------------------------------------ apps
@cli.command()
@click.argument("app_id")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
def status(app_id: str, output: str) -> None:
    """Status of an app. Exit code: its outcome if finished (0/1/3/4), else 0."""
    from tfyarn import api
    from tfyarn.display import status_text

    st = api.status(app_id)
    if output == "json":
        click.echo(json.dumps(st.to_dict(), indent=1))
    else:
        click.echo(status_text(st))
    sys.exit(int(st.state.exit_code) if st.state.is_terminal else 0)


@cli.command()
@click.argument("app_id")
@click.option("--timeout", type=float, default=None, help="Seconds; exit 4 if the app is still running then.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@click.pass_context
def wait(ctx: click.Context, app_id: str, timeout: float | None, output: str) -> None:
    """Wait for an app to end; exit with its outcome."""
    _wait_and_exit(app_id, timeout, output, ctx.obj["quiet"])


def _wait_and_exit(app_id: str, timeout: float | None, output: str, quiet: bool) -> None:
    """Follow an app to its end and exit with its outcome. A stop signal (Ctrl-C, a scheduler's SIGTERM) ends the
    wait, not the app — it was submitted to run on its own — and says so (exit 128 + the signal: 130 for Ctrl-C)."""
    from tfyarn import api
    from tfyarn.display import progress_view
    from tfyarn.errors import WaitTimeout
    from tfyarn.common.interrupts import interruptible

    view = None if quiet else progress_view()
    try:
        with interruptible():
            try:
                st = api.wait(app_id, timeout=timeout, on_update=view, detach_report=True)
            finally:
                if view:
                    view.close()
    except Interrupted as exc:
        click.echo(
            f"stopped waiting ({exc.signame}); {app_id} is still running: `tfyarn wait {app_id}` follows "
            f"it, `tfyarn kill {app_id}` stops it",
            err=True,
        )
        sys.exit(exc.exit_code)
    except WaitTimeout as exc:
        if output == "json":  # a scheduler parsing stdout still gets the app's state (running)
            click.echo(json.dumps(api.status(app_id).to_dict(), indent=1))
        _fail(exc)
    _print_final(st, output)


@cli.command()
@click.argument("app_id")
@click.option("--task", default=None, metavar="ROLE:INDEX", help="One task, e.g. worker:1 (default: all).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the app ends.")
def logs(app_id: str, task: str | None, follow: bool) -> None:
    """Print the logs of an app's tasks."""
    from tfyarn import api
    from tfyarn.common.interrupts import interruptible

    # A stop signal ends the printing with 128 + its number (130 for Ctrl-C), also where SIGINT was inherited
    # as ignored (a job started in the background by a non-interactive shell) or SIGTERM would kill on the spot.
    try:
        with interruptible():
            for line in api.logs(app_id, task=task, follow=follow):
                click.echo(line)
    except Interrupted as exc:
        sys.exit(exc.exit_code)


@cli.command()
@click.argument("app_id")
def kill(app_id: str) -> None:
    """Kill an app and every one of its tasks (an app that has already ended is left as it is; exit 0 either way)."""
    from tfyarn import api
    from tfyarn.api import AppState

    st = api.status(app_id)
    if not st.state.is_terminal:
        st = api.kill(app_id)
        if st.state is AppState.KILLED:
            click.echo(f"killed {app_id}")
            return
    click.echo(f"{app_id} had already ended: {st.state.value}; nothing to kill")


@cli.command("list")
@_backend_option
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="TAG",
    help="Only apps carrying this tag (case-insensitive, as YARN stores them). Repeatable: all must match.",
)
@click.option("--running", is_flag=True, help="Only apps that have not ended.")
@click.option(
    "--output", type=click.Choice(["text", "json", "ids"]), default="text", help="ids: one app id a line (for scripts)."
)
def list_(backend: str | None, tags: tuple[str, ...], running: bool, output: str) -> None:
    """List tfyarn apps (e.g. a scheduler's retry finding the app of an earlier try: --running --tag ...)."""
    from tfyarn import api

    want = {t.lower() for t in tags}
    apps = [
        a
        for a in api.list_apps(backend)
        if want <= {t.lower() for t in a.tags} and not (running and a.state.is_terminal)
    ]
    if output == "json":
        click.echo(json.dumps([a.to_dict() for a in apps], indent=1))
    elif output == "ids":
        for a in apps:
            click.echo(a.app_id)
    else:
        for a in apps:
            click.echo(f"{a.app_id:<36} {a.state.value:<10} {a.name}")


@cli.command()
@click.argument("app_id", required=False)
@click.option(
    "--from",
    "source",
    metavar="URL",
    help="Directory holding report.json, e.g. a YARN job's checkpoint dir (hdfs://...).",
)
@click.option("--to", "dest", metavar="DIR", help="Copy report.json and report.png into this local directory.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
@click.option("--serve", is_flag=True, help="Serve the job's page from the report (until Ctrl-C).")
@click.option("--port", type=int, default=0, help="--serve: the port (default: any free one).")
@click.option("--host", default="127.0.0.1", help="--serve: the address to listen on.")
def report(
    app_id: str | None, source: str | None, dest: str | None, output: str, serve: bool, port: int, host: str
) -> None:
    """The run report of an app: loss and examples/s over time per worker (report.json + report.png).

    Local apps: from the app dir (built now if the run has none yet). YARN apps: this machine's copy, else the one
    next to the checkpoints or in the staging dir. --from: any directory holding report.json. --serve: the job's
    page (as it was served while the job ran) from the report, at the URL it prints.
    """
    from tfyarn import api
    from tfyarn.display import report_text

    if not app_id and not source:
        raise click.UsageError("give an APP_ID or --from URL (a directory holding report.json)")
    if serve:
        page = api.report_page(app_id, source, host=host, port=port)
        click.echo(f"page: {page.url} (Ctrl-C ends it)")
        sys.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        finally:
            page.close()
    rep, png = api.report(app_id, source, to=dest)
    click.echo(json.dumps(rep, indent=1, sort_keys=True) if output == "json" else report_text(rep, png))


@_spec_command()
@click.option(
    "--staging-dir",
    default=None,
    metavar="URL",
    help="Where packed envs are cached (default $TFYARN_STAGING_DIR or hdfs:///user/<you>/.tfyarn).",
)
def pack(spec_path: str, overrides: tuple[str, ...], staging_dir: str | None) -> None:
    """Pack the spec's Python environment and stage it for YARN (cached by content hash: unchanged = 0 bytes)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from tfyarn import api

    spec = _load(spec_path, overrides)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), transient=True, console=None) as bar:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int | None) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        ref = api.pack(spec, staging_dir, progress=progress)
    what = "already staged, 0 bytes uploaded" if ref.cached else f"uploaded {ref.uploaded_bytes:,} bytes"
    click.echo(f"{ref.source} env {ref.archive_url or ref.python} ({what})")


# ------------------------------------------------------------------------------------------------------------ data
@cli.group()
def driver() -> None:
    """tfyarn's shared skein driver (a JVM reused by later commands, stopped after $TFYARN_DRIVER_IDLE unused)."""


@driver.command("status")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
def driver_status(output: str) -> None:
    """Show the shared driver(s): address, pids, login, which commands use it, when it stops."""
    from tfyarn.api import driver_status as status_

    doc = status_()
    docs, own = doc["drivers"], doc["skein_global"]
    if output == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    if own:
        click.echo(
            f"skein global driver (`skein driver start`, used first): {own['address']} pid {own['pid']}"
            f"{'' if own['alive'] else ' (not running: stale ~/.skein/driver)'}"
        )
    if not docs:
        click.echo("no tfyarn shared driver running (the next command that needs one starts it)")
    for d in docs:
        who = d["principal"] or d["user"]
        use = (
            f"in use by pid {', '.join(map(str, d['used_by']))}"
            if d["used_by"]
            else f"idle {d['idle_for_s']:.0f}s, stops in {d['stops_in_s']:.0f}s"
        )
        click.echo(
            f"{d['address']} jvm pid {d['jvm_pid']} (keeper {d['keeper_pid']}) as {who}, "
            f"{d['hadoop_conf_dir'] or 'no HADOOP_CONF_DIR'}: "
            f"{use if d['alive'] else 'not running (stale record)'}; log {d['log']}"
        )


@driver.command("stop")
def driver_stop() -> None:
    """Stop tfyarn's shared driver(s) now (a `skein driver start` driver is left running)."""
    from tfyarn.api import driver_stop as stop_

    stopped = stop_()
    for d in stopped:
        click.echo(f"stopped the shared driver at {d['address']} (jvm pid {d['jvm_pid']})")
    if not stopped:
        click.echo("no tfyarn shared driver was running")


@cli.group()
def data() -> None:
    """TFRecord data: index (manifest) and synthetic data sets."""


@data.command("index")
@click.argument("urls", nargs=-1)
@click.option(
    "--spec",
    "spec_path",
    default=None,
    metavar="SPEC",
    help="Index the spec's data.train (and data.eval) with its compression and on_corrupt, into the cache "
    "its jobs read.",
)
@_set_option
@click.option(
    "--format",
    "data_format",
    type=click.Choice(["auto", "tfrecord", "parquet", "orc"]),
    default=None,
    help="[default: auto (by extension), or the spec's data.format]; parquet/orc: tables without a .parquet/.orc "
    "extension",
)
@click.option(
    "--compression",
    type=click.Choice(["auto", "none", "gzip", "parquet", "orc"]),
    default=None,
    help="TFRecord's [default: auto, or the spec's] (parquet/orc: the same as --format, kept for old scripts)",
)
@click.option("--on-corrupt", type=click.Choice(["fail", "skip"]), default=None, help="[default: fail, or the spec's]")
@click.option(
    "--cache-dir",
    default=None,
    metavar="URL",
    help="Where indexes of read-only data go. Default: the spec's data.index_cache; else, for hdfs:// or "
    "viewfs:// data, <YARN staging dir>/index (what YARN jobs read); else this machine's cache.",
)
@click.option("--staging-dir", default=None, metavar="URL", help="The YARN staging dir (default as for submit).")
def data_index(
    urls: tuple[str, ...],
    spec_path: str | None,
    overrides: tuple[str, ...],
    data_format: str | None,
    compression: str | None,
    on_corrupt: str | None,
    cache_dir: str | None,
    staging_dir: str | None,
) -> None:
    """Index data files once, ahead of the jobs that read them, and print a summary.

    Each file's index is cached beside it, or where its directory is not writable in the cache dir; the whole
    manifest is cached too, so a job over the same files reads no data before its first step."""
    from tfyarn import api

    sections: list[tuple[str, list[str]]] = []
    if spec_path:
        spec = _load(spec_path, overrides)
        sections = [("data.train", list(spec.data.train))]
        if spec.data.eval:
            sections.append(("data.eval", list(spec.data.eval)))
        data_format = data_format or spec.data.format
        compression = compression or spec.data.compression
        on_corrupt = on_corrupt or spec.data.on_corrupt
        cache_dir = cache_dir or spec.data.index_cache
    if compression in ("parquet", "orc"):  # the old spelling of --format
        data_format, compression = compression, "auto"
    if urls:
        sections.append(("", list(urls)))
    if not sections:
        raise click.UsageError("name the data (URLs or globs) or a --spec")
    for name, us in sections:
        t0 = time.monotonic()
        _, summary, took, cache_dir = api.index_data(
            us, compression or "auto", on_corrupt or "fail", cache_dir, staging_dir, format=data_format or "auto"
        )
        if name:
            click.echo(f"{name}:")
        click.echo(summary)
        click.echo(
            f"indexed {took['files_indexed']} files ({took['bytes_read']:,} bytes read), {took['cache_hits']}"
            f" indexes already cached, in {time.monotonic() - t0:.1f}s; cache dir for read-only data: "
            f"{cache_dir or 'this machine'}"
        )


@data.command("synth")
@click.argument("out_dir")
@click.option("--kind", type=click.Choice(["recommender", "logreg"]), default="recommender")
@click.option("--files", type=int, default=8, show_default=True)
@click.option("--records", type=int, default=20000, show_default=True, help="Records in all files together.")
@click.option("--skew", type=float, default=4.0, show_default=True, help="Largest/smallest file size ratio.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace a data set synth wrote there before (else refused).")
def data_synth(out_dir: str, kind: str, files: int, records: int, skew: float, seed: int, overwrite: bool) -> None:
    """Write a synthetic, learnable TFRecord data set with deliberately uneven file sizes."""
    from tfyarn import api

    paths = api.write_synthetic(
        out_dir, kind=kind, files=files, records=records, skew=skew, seed=seed, overwrite=overwrite
    )
    click.echo(f"wrote {len(paths)} files under {out_dir}")


def main() -> None:
    global _FAST_EXIT
    _FAST_EXIT = True
    cli(prog_name="tfyarn")


if __name__ == "__main__":
    main()
