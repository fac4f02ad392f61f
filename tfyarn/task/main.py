"""What every task runs first: read its identity from the environment, rendezvous, then hand over to its role.

Identity comes from the environment the backend sets (see docs/ARCHITECTURE.md), so the same entry point runs as a
local process and as a YARN container. On failure the task writes a one-line diagnosis to ``failure/<task>`` in the KV
(the launcher / application status shows it) and exits non-zero: 4 for a timeout, 1 otherwise.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Callable

from tfyarn.contracts import startup
from tfyarn.errors import ExitCode, WaitTimeout, timeout_message
from tfyarn.tasklib.context import TaskContext, failure_key
from tfyarn.tasklib.kv import KV, HttpKV, KVUnavailable
from tfyarn.task.yarn.kv_yarn import NoTaskLeft
from tfyarn.tasklib.watchdog import install_stack_dumps
from tfyarn.spec import load_spec_json

log = logging.getLogger("tfyarn.task")
_T0 = time.time()  # when this task's Python started running tfyarn (its imports before this are Python's own)


def _task_label() -> str:
    """``role:index`` from the environment; ``role:?`` until a YARN task has claimed its index."""
    return f"{os.environ.get('TFYARN_ROLE', '?')}:{os.environ.get('TFYARN_INDEX', '').strip() or '?'}"


def _configure_logging(task: str) -> None:
    level = os.environ.get("TFYARN_LOG_LEVEL", "INFO").upper()
    fmt = f"%(asctime)s %(levelname)s [{task}] %(name)s: %(message)s"
    root = logging.getLogger()
    if root.handlers:  # again, once the index is known: every later line names the real task
        for h in root.handlers:
            h.setFormatter(logging.Formatter(fmt))
        return
    logging.basicConfig(level=level, stream=sys.stderr, format=fmt)


def _identity(kv: KV, instances_of: Callable[[str], int]) -> tuple[str, int]:
    """This task's role and index. Locally both are in the environment; on YARN the index is claimed through the
    KV (``kv_yarn.claim_task_index``), because skein numbers a restarted container anew (worker_0 → worker_3)."""
    role = os.environ.get("TFYARN_ROLE")
    if not role:
        raise RuntimeError("TFYARN_ROLE is not set: this entry point is started by a tfyarn backend")
    index = os.environ.get("TFYARN_INDEX", "").strip()
    if index:
        return role, int(index)
    container = os.environ.get("SKEIN_CONTAINER_ID")
    if not container:
        raise RuntimeError("neither TFYARN_INDEX nor SKEIN_CONTAINER_ID is set: cannot tell which task this is")
    from tfyarn.task.yarn.kv_yarn import SkeinKV, claim_task_index

    if not isinstance(kv, SkeinKV):  # only skein's KV claims slots (a YARN container's: make_kv)
        raise RuntimeError(f"no TFYARN_INDEX, and a {type(kv).__name__} cannot claim a task index")
    return role, claim_task_index(kv, role, instances_of(role), container)


def kv_scheme() -> str:
    """The scheme of ``TFYARN_KV``, the task contract's KV: ``skein`` (``skein:``, a YARN container: the app's
    skein KV) or ``http`` (``http://127.0.0.1:PORT``, the local launcher's); anything else is an error."""
    value = os.environ.get("TFYARN_KV", "")
    scheme, colon, _ = value.partition(":")
    if not colon or scheme not in ("skein", "http"):
        raise RuntimeError(
            f"TFYARN_KV={value!r}: expected skein: (a YARN container) or http://HOST:PORT (the local launcher's KV);"
            " this entry point is started by a tfyarn backend"
        )
    return scheme


def make_kv() -> KV:
    """The KV that ``TFYARN_KV`` names: the YARN application's skein KV or the launcher's HTTP KV."""
    if kv_scheme() == "http":
        return HttpKV(os.environ["TFYARN_KV"])
    from tfyarn.task.yarn.kv_yarn import SkeinKV  # only inside YARN containers

    return SkeinKV.from_current()


def prctl(option: int, arg: int | bytes) -> None:
    """Linux's prctl(2); a no-op elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        with suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg, 0, 0, 0)


def set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG). Not inherited by a forked child:
    each link of the chain (launcher → forkserver → task) sets it for itself, then checks ``os.getppid()`` (the
    parent may have died before the call)."""
    prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _die_with_parent() -> None:
    """Locally, a task must not outlive its parent (``TFYARN_PARENT_PID``: the launcher or the forkserver), even a
    SIGKILLed one: PR_SET_PDEATHSIG, and a watcher thread for other systems and a parent that died before the call."""
    parent = os.environ.get("TFYARN_PARENT_PID")
    if not parent:
        return
    parent_pid = int(parent)
    set_parent_death_signal()

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(ExitCode.KILLED)

    if os.getppid() != parent_pid:
        os._exit(ExitCode.KILLED)
    threading.Thread(target=watch, name="tfyarn-parent-watch", daemon=True).start()


def _report_failure(kv: KV | None, task: str, message: str) -> None:
    if kv is not None:
        with suppress(KVUnavailable):
            kv.put(failure_key(task), message[:2000])


def _attempt_from_kv(kv: KV) -> None:
    """On YARN the in-app supervisor runs a job's further attempts in the same application: the attempt is
    ``control/attempt``'s (contracts.in_app), else the app's own ``TFYARN_ATTEMPT``; set in the env, where the
    context, the history's file names and the user's code read it."""
    from tfyarn.contracts.in_app import attempt_number, parse_attempt
    from tfyarn.contracts.kv_keys import ATTEMPT_KEY

    env = int(os.environ.get("TFYARN_ATTEMPT") or 0)
    os.environ["TFYARN_ATTEMPT"] = str(attempt_number(parse_attempt(kv.get(ATTEMPT_KEY)), env))


def build_context(kv: KV) -> TaskContext:
    from tfyarn.task.rendezvous import rendezvous, task_host

    spec = load_spec_json(Path(os.environ["TFYARN_SPEC_FILE"]).read_text())
    role, index = _identity(kv, spec.instances)
    if not os.environ.get("TFYARN_INDEX", "").strip():
        # on YARN the index was just claimed: from now on this task's failure record, its answers to the stall
        # watchdog's stack-dump requests and its log lines carry its name (they said worker:? and collided)
        os.environ["TFYARN_INDEX"] = str(index)
        _configure_logging(_task_label())
        from tfyarn.contracts.kv_keys import exit_key
        from tfyarn.task.yarn.kv_yarn import restarts_before

        _attempt_from_kv(kv)  # an in-app attempt's number (the in-app supervisor's), before anything reads it
        restarts = restarts_before(kv, _task_label(), os.environ.get("SKEIN_CONTAINER_ID", ""))
        os.environ["TFYARN_RESTART"] = str(restarts)  # what the local launcher sets: the rejoin reads it
        if restarts:
            log.info("%s: restart %d (container %s)", _task_label(), restarts, os.environ.get("SKEIN_CONTAINER_ID"))
            kv.delete(exit_key(_task_label()))  # how the previous container ended is history now
    install_stack_dumps(kv, _task_label())  # the stall watchdog asks for stacks by SIGUSR1 or through the KV
    from tfyarn.task.resources import start_publisher

    memory = spec.role(role).memory_mib
    start_publisher(kv, _task_label(), memory)  # CPU % and RSS: status, the page (YARN too)
    kv.delete(failure_key(_task_label()))  # a restarted task's earlier failure is history (YARN deletes nothing)
    host = task_host()
    cluster, port = rendezvous(spec, role, index, kv, host)
    ctx = TaskContext(
        spec=spec,
        role=role,
        index=index,
        kv=kv,
        cluster=cluster,
        host=host,
        port=port,
        workdir=Path.cwd(),
        app_id=os.environ.get("TFYARN_APP_ID", "local"),
        attempt=int(os.environ.get("TFYARN_ATTEMPT", "0")),
    )
    if cluster:
        os.environ["TF_CONFIG"] = ctx.tf_config_json()
    return ctx


def run_role(ctx: TaskContext, phase_kv: KV | None = None) -> None:
    """Hand over to the role's code; with ``phase_kv`` (YARN) the task's start and import times are recorded
    (``phase/<task>``: where a job's start-up time goes, for status and scripts/bench_yarn.py)."""
    if phase_kv is not None:
        from tfyarn.task.yarn.app_end import record_phase

        start = os.environ.get("TFYARN_CONTAINER_START", "")
        record_phase(
            phase_kv, ctx.task_id, start=float(start) if start.replace(".", "", 1).isdigit() else _T0, main=_T0
        )
    if ctx.role == "tensorboard":
        from tfyarn.train.tensorboard import run

        run(ctx)
    else:
        from tfyarn.task.warm_imports import import_tensorflow

        import_tensorflow()  # without its eager import of Keras (~0.9 s); a model that uses Keras imports it itself
        if phase_kv is not None:
            record_phase(phase_kv, ctx.task_id, imported=time.time())
        if ctx.spec.entrypoint and ctx.role in ("chief", "worker"):  # the user's own program (entrypoint:)
            from tfyarn.task.entrypoint import run as run_entrypoint

            kv = phase_kv
            run_entrypoint(ctx, finish=(lambda: _yarn_task_done(kv, ctx)) if kv is not None else None)
            return
        if ctx.spec.job == "predict":  # batch scoring: workers only (docs/predict.md)
            from tfyarn.predict import run as run_predict

            run_predict(ctx)
            return
        from tfyarn.train import run_task

        run_task(ctx)


def _yarn_task_done(kv: KV, ctx: TaskContext) -> None:
    """On YARN, after a task succeeded: its phase, its slot kept taken, and the app ended if it was the last."""
    from tfyarn.task.yarn.app_end import finish_yarn_task, record_phase
    from tfyarn.task.yarn.kv_yarn import mark_slot_done

    record_phase(kv, ctx.task_id, done=time.time())
    try:
        mark_slot_done(kv, ctx.task_id)
    except KVUnavailable as exc:  # the AM may be shutting down (the job is over): nothing to guard
        log.info("%s: could not mark its slot done: %s", ctx.task_id, exc)
    else:
        finish_yarn_task(kv, ctx.spec, ctx.task_id)  # the last task done ends the app at once


def _is_tf_deadline(exc: BaseException) -> bool:
    """TF's ``DeadlineExceededError``: a step past the session's operation timeout (``timeouts.step``: a ps that
    stopped answering) — a timeout like tfyarn's own waits (exit 4), checked by name so this needs no TF import."""
    return type(exc).__name__ == "DeadlineExceededError" and type(exc).__module__.startswith("tensorflow")


def _failure_text(exc: BaseException) -> str:
    """``Type: message``; for a TF error, the words triage reads (where it came ``From``, the failing op's device)
    kept within the record's size and on one line (contracts.triage.tf_failure_text); no TF import."""
    kind = type(exc).__name__
    if not type(exc).__module__.startswith("tensorflow"):
        return f"{kind}: {exc}"
    from tfyarn.contracts.triage import tf_failure_text

    node = getattr(exc, "node_def", None)
    op = getattr(exc, "op", None)
    device = getattr(op, "device", "") or getattr(node, "device", "") or None
    name = getattr(op, "name", "") or getattr(node, "name", "") or None
    return tf_failure_text(kind, str(getattr(exc, "message", exc)), name, device)


def main() -> int:
    task = _task_label()
    _configure_logging(task)
    _die_with_parent()
    faulthandler.enable()  # a crash in TF's C++ still leaves a Python stack in the log
    code_dir = os.environ.get("TFYARN_CODE_DIR")
    if code_dir:
        sys.path.insert(0, code_dir)
    kv: KV | None = None
    try:
        kv = make_kv()
        install_stack_dumps()  # SIGUSR1 at once; the KV route once the task knows its index (build_context)
        ctx = build_context(kv)
        on_yarn = kv_scheme() == "skein"
        started = time.monotonic()
        run_role(ctx, kv if on_yarn else None)
        log.info("%s finished in %.1fs", ctx.task_id, time.monotonic() - started)
        if on_yarn:  # skein frees this task's slot as it exits; keep it taken
            _yarn_task_done(kv, ctx)
        return ExitCode.SUCCEEDED
    except NoTaskLeft as exc:  # YARN: the replacement of a task killed after it had finished
        log.info("nothing to do: %s", exc)
        return ExitCode.SUCCEEDED
    except WaitTimeout as exc:
        log.error("%s", exc)
        _report_failure(kv, _task_label(), timeout_message(str(exc)))
        return ExitCode.TIMED_OUT
    except KeyboardInterrupt:
        return ExitCode.KILLED
    except BaseException as exc:
        task = _task_label()  # (the index may have been claimed since the start)
        log.exception("task %s failed", task)
        message = _failure_text(exc)
        if isinstance(exc, ImportError):  # this Python lacks a module the task needs: say which, and which Python
            message = startup.cannot_start(startup.import_error_text(exc))
        if _is_tf_deadline(exc):
            _report_failure(kv, task, timeout_message(message))
            return ExitCode.TIMED_OUT
        _report_failure(kv, task, message)
        return ExitCode.FAILED
    finally:
        logging.shutdown()
