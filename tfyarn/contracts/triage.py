"""Why a task ended badly, in one of two classes: the cluster's doing (infrastructure) or the user's
code.

Why: on a shared cluster YARN takes containers away (preemption, a lost node, the NodeManager's
memory check) and HDFS or a token can fail for a while; none of that is the job's fault, and
retrying it costs nothing the user budgeted (``max_restarts``, ``retry.max_attempts``). An exception
in the model, a NaN loss or a bad input file fails the same way on every try: retrying it only
wastes attempts. Pure functions of what a backend knows about an ended task: YARN's container exit
status and diagnostics, the process's exit code, the task's own one-line failure record."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

INFRA = "infrastructure"
USER = "user code"

#: YARN's ContainerExitStatus values (org.apache.hadoop.yarn.api.records.ContainerExitStatus)
ABORTED, DISKS_FAILED, PREEMPTED = -100, -101, -102
KILLED_EXCEEDED_VMEM, KILLED_EXCEEDED_PMEM = -103, -104
KILLED_BY_APPMASTER, KILLED_BY_RESOURCEMANAGER, KILLED_AFTER_APP_COMPLETION = -105, -106, -107

#: Causes that use none of ``max_restarts`` / ``retry.max_attempts`` (a separate bound limits them): the cluster
#: took the container away. Memory kills and HDFS/token faults are infrastructure too, but they repeat when the spec
#: asks too little memory or the cluster stays broken, so they keep counting.
FREE_CAUSES = frozenset({"preempted", "node_lost", "peer_lost", "transport", "peer_restarted"})
#: The separate, generous bounds that keep a job on a cluster that keeps taking its containers from looping forever:
#: in-place replacements per task (YARN: added to skein's per-service budget) and job attempts.
FREE_RESTARTS = 10
FREE_ATTEMPTS = 10


@dataclass(frozen=True)
class Triage:
    """``cls``: :data:`INFRA` or :data:`USER`; ``cause``: a short key (``preempted``, ``node_lost``, ``memory``,
    ``hdfs``, ``token``, ``peer_lost``, ``io``, ``am_lost``, ``timeout``, ``signal``, ``nan_loss``, ``bad_input``,
    ``exception``, ``exit``, ``transport``, ``peer_restarted``); ``words``: what happened, for status and the
    summary ("preempted by the scheduler"); ``rule``: which rule decided and on what evidence, in words."""

    cls: str
    cause: str
    words: str
    rule: str = ""  # which rule decided, in words ("TF's error came From /job:ps/replica:0/task:0, ...")

    @property
    def infrastructure(self) -> bool:
        return self.cls == INFRA

    @property
    def free(self) -> bool:
        """Does not use up the user's restart or attempt budget (:data:`FREE_CAUSES`)."""
        return self.cause in FREE_CAUSES

    def to_dict(self) -> dict[str, str]:
        """The status JSON's ``triage`` record (docs/commands.md)."""
        return {"class": self.cls, "cause": self.cause, "words": self.words, "rule": self.rule}


_TEXT_RULES: tuple[tuple[str, str, str, re.Pattern[str]], ...] = tuple(
    (cls, cause, words, re.compile(rx, re.IGNORECASE))
    for cls, cause, words, rx in (
        # its Python lacks a module it needs (contracts.startup): no attempt on the same nodes would start
        (USER, "cannot_start", "could not start (its Python lacks a module)", r"^cannot start: "),
        (INFRA, "preempted", "preempted by the scheduler", r"preempt"),
        (INFRA, "node_lost", "lost with its node", r"lost with its node|lost node|\*lost\* node"
         r"|node .*(lost|expired|unhealthy)|nodemanager .*(not answer|unreachable)"),
        (INFRA, "memory", "killed by the NodeManager for memory",
         r"beyond (physical|virtual) memory|exceeded (p|v)mem"),
        (INFRA, "token", "its delegation token expired",
         r"token .*(expired|is expired|not found in cache)|InvalidToken|CREDENTIALS_EXPIRED"),
        (INFRA, "hdfs", "HDFS unavailable", r"HdfsUnavailable|HDFS unavailable|All DataNodes failed"
         r"|Failed to complete file in time|BlocksNotFound|DataTransferError"),
        # train.allreduce.collective_failure's words
        (INFRA, "peer_lost", "lost a peer (another task died)", r"failed because a peer is unreachable"),
        (INFRA, "io", "lost its connection or disk", r"^(ConnectionError|ConnectionRefusedError|ConnectionResetError"
         r"|BrokenPipeError|TimeoutError|KVUnavailable)\b|No space left on device"),
        # YARN's words for a killed/lost skein AM
        (INFRA, "am_lost", "its ApplicationMaster died", r"AM Container for appattempt\S* exited"),
        # a step or collective past timeouts.step (tfyarn's exit 4): a peer gone or stuck, not the code
        (INFRA, "timeout", "timed out waiting on its peers (timeouts.step)",
         r"^(timed out: )?(DeadlineExceededError|WaitTimeout)\b|^timed out\b|collective .*timed out"),
        (USER, "nan_loss", "its loss became NaN/inf", r"^NonFiniteLoss\b|training diverged"),
        (USER, "bad_input", "bad input data", r"^(DataError|NoDataError)\b"),
    )
)  # fmt: skip


#: TF's error classes of the distributed runtime: a peer or the transport may have raised them (TF's own
#: ClusterCoordinator treats a worker's Unavailable/Aborted as a failure to reschedule, not a fatal one)
TF_DISTRIBUTED = ("UnavailableError", "AbortedError", "DeadlineExceededError", "CancelledError")
_TF_KIND = re.compile(r"^(?:[\w.]+\.)?(" + "|".join(TF_DISTRIBUTED) + r")\b")
_TF_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")
_TF_FROM = re.compile(r"\bFrom /job:(\w+)/(?:replica:\d+/)?task:(\d+)")
#: tfyarn's note of the failing op's device (:func:`tf_failure_text`)
_TF_OP_DEVICE = re.compile(r"\(TF op \S+ on /job:(\w+)/(?:replica:\d+/)?task:(\d+)")
#: the job name a chief or worker boots under before it joins the cluster (train/ps/server.py): itself
_BOOT_JOB = "tfyarn_boot"
#: what TF 2.21 appends to an error: the process's recent warnings, whatever they were about
_RECENT_LOGS = "Recent warning and error logs:"
TIMED_OUT = "timed out: "  # tfyarn.errors.timeout_message's mark (a step past timeouts.step)
# (cause, words, rule, pattern): the words TF's runtime and gRPC write when the transport or a restarted
# peer failed a call, whichever task the message names (TF 2.21's strings, libtensorflow_framework.so)
_TF_TRANSPORT: tuple[tuple[str, str, str, re.Pattern[str]], ...] = tuple(
    (cause, words, rule, re.compile(rx, re.IGNORECASE))
    for cause, words, rule, rx in (
        ("transport", "lost a call to a peer (TF retried it under load)",
         "TF's gRPC retried a call and its peer refused the duplicate ({m})",
         r"The same \w+ \(\w+\) request was received twice"),
        ("peer_restarted", "lost its session on a restarted peer",
         "TF names a session or graph a restarted peer no longer knows ({m})",
         r"(Session|Graph) handle is not found|is not found\. Possibly,? this (master|worker)"
         r"|Possibly,? this worker .*just restarted"),
        ("transport", "lost its connection to a peer", "TF's gRPC transport failed ({m})",
         r"Socket closed|Connection reset|failed to connect to all addresses|Stream removed"
         r"|Connection refused|Broken pipe|RecvAsync is cancelled|RecvFromRemote\w* is cancelled"),
    )
)  # fmt: skip


def _tf_task(job: str, index: str, task: str | None) -> tuple[str, bool | None]:
    """``ps:0`` for TF's ``/job:ps/replica:0/task:0`` and whether it is another task than ``task`` (None:
    unknown, no own task given; a ps is never the one running a step)."""
    name = f"{job}:{int(index)}"
    if job == _BOOT_JOB:
        return name, False
    if task is None:
        return name, True if job == "ps" else None
    return name, name != task


def tf_distributed(failure: str, task: str | None = None) -> Triage | None:
    """A TF distributed-runtime error (:data:`TF_DISTRIBUTED`) that a peer or the transport raised: the
    cluster's fault, None when the record says no peer was involved (the user's code raised it, e.g. an
    ``AbortedError`` the model raises: it stays the user's) or is no such error. ``task``: the failing task
    (``worker:1``), to tell its own partition (``From /job:worker/replica:0/task:1``) from a peer's.

    Rules, in order: TF/gRPC's transport words or a restarted peer's (whichever task is named); the error
    came ``From`` another task (TF's master prefixes a partition's error with its task); the failing op ran on
    another task (its device, :func:`tf_failure_text`); an Unavailable/Cancelled error naming another task."""
    text = (failure or "").strip()
    text = text[len(TIMED_OUT) :] if text.lower().startswith(TIMED_OUT) else text  # errors.timeout_message's
    text = text.split(_RECENT_LOGS, 1)[0]  # TF appends earlier log lines (other errors, other tasks'): not this one
    m = _TF_KIND.match(text)
    if m is None:
        return None
    kind = m.group(1)
    for cause, words, rule, rx in _TF_TRANSPORT:
        hit = rx.search(text)
        if hit:
            return Triage(INFRA, cause, words, f"{kind}: " + rule.format(m=f'"{hit.group(0)}"'))
    for hit, words, rule in _peer_mentions(text, kind):
        name, other = _tf_task(hit.group(1), hit.group(2), task)
        if other:
            said = {"kind": kind, "name": name, "hit": hit.group(0), "this": task or "this one"}
            return Triage(INFRA, "peer_lost", words.format(**said), rule.format(**said))
    return None


def _peer_mentions(text: str, kind: str) -> Iterator[tuple[re.Match[str], str, str]]:
    """Where a TF error of ``kind`` names a task, in the order :func:`tf_distributed` trusts them, each with the
    words and the rule that blame that task when it is a peer (``{name}``, ``{kind}``, ``{hit}``, ``{this}``)."""
    for hit in _TF_FROM.finditer(text):
        yield hit, "got {kind} from its peer {name}", '{kind} came "{hit}", another task than {this}'
    op = _TF_OP_DEVICE.search(text)
    if op:
        yield (
            op,
            "got {kind} from an op on its peer {name}",
            "{kind} raised by an op placed on {name}, another task than {this}",
        )
    if kind in ("UnavailableError", "CancelledError"):
        for hit in _TF_TASK.finditer(text):
            yield hit, "lost its peer {name}", "{kind} names another task ({hit})"


_NODE_LINE = re.compile(r"^Node: '[^']*'\s*$", re.MULTILINE)
FAILURE_CHARS = 2000


def tf_failure_text(
    kind: str, message: str, op: str | None = None, device: str | None = None, limit: int = FAILURE_CHARS
) -> str:
    """The failure record of a TF error (``Kind: message``) that keeps what triage reads within ``limit``:
    TF's "Graph execution error" puts each node's definition traceback *before* the runtime's own words (the
    ``From /job:…`` part), so those tracebacks are cut (the task's log has them), as is the process's
    recent log TF appends (it may hold other errors' words), and the record is one line
    (a diagnosis splits tasks at newlines and ``; ``); ``device``: the failing
    op (``op``: its name) and device, noted as ``(TF op NAME on DEVICE)`` when the device names a task."""
    body = message.split(_RECENT_LOGS, 1)[0].strip()
    nodes = list(_NODE_LINE.finditer(body))
    if body.startswith("Graph execution error:") and nodes:
        body = "Graph execution error: " + body[nodes[-1].end() :].strip()
    # one line without "; ": a diagnosis joins tasks' records with "; " and attempt_cause splits there
    body = " ".join(body.replace("; ", ", ").split())
    note = f" (TF op {op or '?'} on {device})" if device and _TF_TASK.search(device) else ""
    head = f"{kind}: "
    room = limit - len(head) - len(note)
    if len(body) > room:
        body = body[: max(room - 3, 0)] + "..."
    return head + body + note


def classify(
    *,
    exit_status: int | None = None,
    diagnostics: str = "",
    exit_code: int | None = None,
    failure: str = "",
    task: str | None = None,
) -> Triage:
    """Classify one ended task. ``exit_status``: YARN's container exit status (None locally);
    ``diagnostics``: YARN's or skein's container diagnostics; ``exit_code``: the task process's exit
    code (negative: the signal, as Popen); ``failure``: the task's own failure record (``Type:
    message``, task/main.py); ``task``: which task it is (``worker:1``: tells a TF error from its own
    partition from a peer's, :func:`tf_distributed`).

    YARN's word comes first (a preempted container's Python sees only SIGTERM), then the task's own
    record, then the exit code: 1-127 the code's own exit (user), a signal or 128-255 killed from
    outside (infrastructure), as Kubeflow's ``ExitCode`` restart policy reads it."""
    said = f"YARN's exit status {exit_status}"
    if exit_status == PREEMPTED or exit_status == KILLED_BY_RESOURCEMANAGER and "preempt" in diagnostics.lower():
        return Triage(INFRA, "preempted", "preempted by the scheduler", f"{said} (preempted)")
    if exit_status in (KILLED_EXCEEDED_PMEM, KILLED_EXCEEDED_VMEM):
        return Triage(INFRA, "memory", "killed by the NodeManager for memory", f"{said} (memory limit)")
    if exit_status == ABORTED and "lost" in diagnostics.lower():
        return Triage(INFRA, "node_lost", "lost with its node", f"{said} with 'lost' in its diagnostics")
    if exit_status == DISKS_FAILED:
        return Triage(INFRA, "node_lost", "its node's disks failed", f"{said} (disks failed)")
    for text, whose in ((diagnostics, "YARN's diagnostics"), (failure, "the task's failure record")):
        t = tf_distributed(text, task) if text else None
        if t is not None:
            return Triage(t.cls, t.cause, t.words, f"{whose}: {t.rule}")
        for cls, cause, words, rx in _TEXT_RULES:
            hit = rx.search(text.strip()) if text else None
            if hit:
                return Triage(cls, cause, words, f'{whose} say "{hit.group(0).strip()}"')
    if exit_status in (KILLED_BY_RESOURCEMANAGER, ABORTED):
        return Triage(
            INFRA,
            "preempted" if exit_status == KILLED_BY_RESOURCEMANAGER else "node_lost",
            "killed by the ResourceManager" if exit_status == KILLED_BY_RESOURCEMANAGER else "released by YARN",
            said,
        )
    if exit_code is not None and (exit_code < 0 or exit_code >= 128):
        # killed from outside: whatever it printed last is not why (a Python exception exits 1)
        sig = -exit_code if exit_code < 0 else exit_code - 128
        return Triage(INFRA, "signal", f"killed by signal {sig}", f"exit code {exit_code}: killed from outside")
    kind = failure.split(":", 1)[0].strip()
    # "ValueError: ...": what it raised
    if ":" in failure and kind.replace(".", "_").isidentifier():
        short = kind.rsplit(".", 1)[-1]
        why = (
            "no peer or transport named (no From /job: of another task, no op on one, no gRPC words)"
            if _TF_KIND.match(failure.strip())
            else "an exception of the job's own code"
        )
        return Triage(USER, "exception", f"raised {short}", f"the task's failure record: {short}, {why}")
    if exit_code:
        return Triage(USER, "exit", f"exited with code {exit_code}", f"exit code {exit_code}: the code's own exit")
    return Triage(INFRA, "signal", "ended without an exit code", "no exit code, status or record")


def restarts(policy: str, exit_code: int | None, triage: Triage | None = None) -> bool:
    """Does a role's ``restart`` policy restart this failure (both backends)? ``never``: no.
    ``on_failure``: any. ``exit_code``: only a process killed from outside (exit 128-255 or a
    signal; no code at all: YARN took the container) — or, given ``triage``, anything the cluster
    did; never the code's own exit 1-127."""
    if policy == "never":
        return False
    if policy == "on_failure":
        return True
    if triage is not None and triage.infrastructure:
        return True
    return exit_code is None or exit_code < 0 or exit_code >= 128


def describe(task: str, t: Triage, step: int | None = None, detail: str = "") -> str:
    """One line for status, the summary and the end text: ``worker:1 preempted by the scheduler at
    step 5,688 (queue a over its share)``."""
    at = f" at step {step:,}" if step is not None else ""
    return f"{task} {t.words}{at}" + (f" ({detail})" if detail else "")


# "chief:0: exit code 1: ValueError: x" (YARN, task.yarn.exit_report.describe) or
# "chief:0 exited with code -9: ..." (the local launcher)
_TASK_PART = re.compile(
    r"^([\w.-]+:[\w?]+)(?::\s*|\s+(?=\w))"
    r"(?:(?:exit code|exited with code) (-?\d+)(?:\s*\([^)]*\))?:?\s*)?"
)


def attempt_cause(diagnosis: str) -> Triage | None:
    """Why a job attempt ended, from its diagnosis (task parts, root cause first, ``; `` or newline
    apart): the first part's class — free only if no part is the user's code (a preempted worker and
    a chief's ValueError in one attempt count). None for an empty diagnosis."""
    causes = []
    for p in (p.strip() for p in re.split(r";\s|\n", diagnosis or "")):
        m = _TASK_PART.match(p)
        if m:
            text = p[m.end() :]
            causes.append(
                classify(
                    diagnostics=text, failure=text, exit_code=int(m.group(2)) if m.group(2) else None, task=m.group(1)
                )
            )
        elif p:  # YARN's/skein's own text ("Failure in service worker"): only a rule's match counts
            t = classify(diagnostics=p)
            if t.cause not in ("signal", "exception"):
                causes.append(t)
    if not causes:
        return None
    if causes[0].free and any(c.cls == USER for c in causes):
        return next(c for c in causes if c.cls == USER)
    return causes[0]


@dataclass(frozen=True)
class RetryDecision:
    """May a failed job attempt be followed by another, and why (one line for the log and the
    diagnosis). True-ish when it may."""

    retry: bool
    reason: str
    cause: Triage | None = None

    def __bool__(self) -> bool:
        return self.retry


def should_retry(diagnosis: str, state: str = "FAILED") -> RetryDecision:
    """The retry decision of issue 30, apart from any budget: an attempt that FAILED because of the
    user's code (an exception in the model or script, a NaN loss, a bad input file: the same on
    every try) is not retried — the job stops at once with its own error; anything else (the
    cluster's doing, an unknown cause, a timeout) may be, within the budgets
    (:class:`AttemptBudget`). One small pure function so that whichever loop runs the attempts
    calls it."""
    cause = attempt_cause(diagnosis)
    if state == "FAILED" and cause is not None and cause.cls == USER:
        return RetryDecision(
            False,
            f"not retried: the job's own code failed ({cause.words}), which fails the same way on "
            f"every attempt; retry.max_attempts retries only the cluster's faults (rule: {cause.rule})",
            cause,
        )
    why = cause.words if cause is not None else "cause unknown"
    how = f"{cause.cls}; rule: {cause.rule}" if cause is not None and cause.rule else "not the user code"
    return RetryDecision(True, f"retried: {why} ({how})", cause)


class AttemptBudget:
    """Job attempts, two budgets: ``retry.max_attempts`` for failures of the job's own,
    :data:`FREE_ATTEMPTS` more for attempts the cluster ended (preemption, a lost node, a peer lost
    with them): these do not use up the user's."""

    def __init__(self, max_attempts: int, free_max: int = FREE_ATTEMPTS):
        self.max_attempts, self.free_max = max_attempts, free_max
        self.counted, self.free = 1, 0  # the first attempt counts
        self.causes: list[Triage | None] = []
        self.refused: RetryDecision | None = None  # set when the user's code ended the job

    def next(self, diagnosis: str, state: str = "FAILED") -> bool:
        """After an attempt failed with ``diagnosis``: may another one start? Counts it in its
        budget if so. Never after the user's code failed (:func:`should_retry`; then
        :attr:`refused` says why)."""
        decision = should_retry(diagnosis, state)
        if not decision:
            self.refused = decision
            return False
        cause = decision.cause
        if cause is not None and cause.free:
            if self.free >= self.free_max:
                return False
            self.free += 1
        else:
            if self.counted >= self.max_attempts:
                return False
            self.counted += 1
        self.causes.append(cause)
        return True

    def note(self) -> str:
        """``2 attempts ended by the cluster (not counted in retry.max_attempts)``, or empty."""
        return (
            (f"{self.free} attempt{'s' * (self.free != 1)} ended by the cluster (not counted in retry.max_attempts)")
            if self.free
            else ""
        )
