"""Every key of a job's KV, in one place: what it holds, who writes it and who reads it.

Why one module: the launcher (local), the container script and the in-app supervisor (YARN), the tasks, the trainers,
the shared indexing and the followers on a gateway all talk through the same few dozen keys. Each writer and reader
imports its key from here, so a renamed key cannot leave one side behind; :data:`KEYS` is the table that
docs/ARCHITECTURE.md's "KV key layout" shows (tests/unit/contracts/test_kv_keys.py holds the two
together, and finds key literals written anywhere else in tfyarn).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

# ---------------------------------------------------------------------------------------------------- per task
ADDR_PREFIX = "addr/"
#: JSON {step, global_step, epoch, examples_per_sec, loss, time, ...}
PROGRESS_PREFIX = "progress/"
#: a one-line diagnosis written by the task before it exits non-zero
FAILURE_PREFIX = "failure/"
#: how a task's last process ended (JSON, :func:`tfyarn.task.yarn.exit_report.exit_record`)
EXIT_PREFIX = "exit/"
#: JSON of wall times of a task's phases (start, main, imported, done)
PHASE_PREFIX = "phase/"
#: the last stack-dump request id a task answered (its stacks are in its log)
STACKS_PREFIX = "stacks/"
#: a restarted ps-mode worker's lost in-flight steps/records: ``rejoin/<task>/<restart>``
REJOIN_PREFIX = "rejoin/"
#: YARN task index claims: ``slot/<role>:<index>`` (owned by the claiming container)
SLOT_PREFIX = "slot/"
#: ``slot-done/<role>:<index>``: that task finished its role (not owned: it outlives the container)
SLOT_DONE_PREFIX = "slot-done/"
#: ``taskmap/<container id>`` → ``role:index`` (not owned: status and logs use it after the container)
TASKMAP_PREFIX = "taskmap/"
#: shared indexing: ``index/<attempt>/<name>/{probe,assign,part,manifest,beat}…``
INDEX_PREFIX = "index/"
#: JSON {cpu_percent, rss_mib, peak_rss_mib, memory_mib, time}: what the task's process tree uses (every task)
RESOURCES_PREFIX = "resources/"

# ------------------------------------------------------------------------------------------------ job-wide keys
DONE_KEY = "control/done"  # chief: training finished; ps/evaluator/tensorboard exit cleanly
ABORT_KEY = "control/abort"  # launcher/anyone: stop now, value = reason
STEPS_ALIGNED_KEY = "control/steps_aligned"  # ps chief: step counters consistent; workers may step
DUMP_REQUEST_KEY = "control/dump_stacks"  # a new request id: every task dumps its stacks once
ALL_DONE_KEY = "control/all_done"  # JSON {time, by}: every task reported done (put by the last one)
FOLLOWER_KEY = "control/follower"  # wall time of a follower's last poll
SUPERVISOR_KEY = "control/supervisor"  # wall time of the in-app supervisor's last round
END_KEY = "control/end"  # JSON: how the app ends (contracts.job_end)
SUMMARY_KEY = "summary"  # chief: final run summary JSON
TOTAL_STEPS_KEY = "plan/total_steps"  # chief: global step target (for progress bars)
TENSORBOARD_URL_KEY = "tensorboard/url"
PAGE_URL_KEY = "page/url"  # the job's page (tfyarn.web): its URL
EVAL_KEY = "eval/latest"  # evaluator: JSON of its newest evaluation (checkpoint, step, metrics)
SPEC_KEY = "spec"  # the job's spec JSON as shipped (no ``kerberos``)
#: JSON {attempt, first, time}: the job attempt running in the app now (YARN in-app attempts, contracts.in_app)
ATTEMPT_KEY = "control/attempt"
#: JSON {by, diagnosis, time}: a failed task hands its attempt's end to the in-app supervisor (contracts.in_app)
ATTEMPT_END_KEY = "control/attempt_end"
#: ``attempts/<n>``: JSON of in-app attempt n's end {attempt, diagnosis, cause, started, ended, wall_s, reached,
#: resumes_at, lost_steps}; outlives the attempts (status and the summary's totals)
ATTEMPTS_PREFIX = "attempts/"
#: ``cause/<task>/<skein container>``: JSON, why that container of the task failed and what followed (a restart in
#: place, counted or not, or the attempt's end), with the triage rule that decided (task.yarn.exit_report)
CAUSE_PREFIX = "cause/"


def _per_task(prefix: str) -> Callable[[str], str]:
    """The key of one task's record under ``prefix``: ``addr/worker:1``."""

    def key(task: str) -> str:
        return prefix + task

    return key


#: ``addr/worker:1`` → 'host:port' of that task's TF server; the others likewise, one record per task.
addr_key = _per_task(ADDR_PREFIX)
progress_key = _per_task(PROGRESS_PREFIX)
failure_key = _per_task(FAILURE_PREFIX)
exit_key = _per_task(EXIT_PREFIX)
stacks_ack_key = _per_task(STACKS_PREFIX)
resources_key = _per_task(RESOURCES_PREFIX)


def cause_key(task: str, container: str) -> str:
    return f"{CAUSE_PREFIX}{task}/{container}"


def rejoin_key(task: str, restart: int) -> str:
    return f"{REJOIN_PREFIX}{task}/{restart}"


def attempt_record_key(attempt: int) -> str:
    """``attempts/<n>``: how in-app attempt ``n`` ended."""
    return f"{ATTEMPTS_PREFIX}{attempt}"


def index_namespace(attempt: int, name: str) -> str:
    """``index/<attempt>/<name>``: one job attempt's keys for one shared manifest (``name``: ``train``)."""
    return f"{INDEX_PREFIX}{attempt}/{name}"


class KvKey(NamedTuple):
    pattern: str  # as docs/ARCHITECTURE.md writes it
    value: str
    writers: str  # modules (tfyarn.<…>) or roles that put it
    readers: str


#: The protocol, one row per key (docs/ARCHITECTURE.md's table shows the patterns in this order).
KEYS: tuple[KvKey, ...] = (
    KvKey(
        "addr/<task>",
        "host:port of the task's TF server",
        "task.rendezvous (again after an in-place restart)",
        "task.rendezvous of every peer; runner.local_app clears it on a restart",
    ),
    KvKey(
        "progress/<task>",
        "JSON {step, global_step, epoch, examples_per_sec, steps_per_sec, global_steps_per_sec, "
        "loss, time, attempt, restart, done}; a user's program's also {reported (false: no step of its own), "
        "taken {batches, examples, epochs, seconds, examples_per_sec}, beat, program_s}",
        "train.progress (trainers, ≤ 1/s; task.entrypoint's program records through it)",
        "runner.supervisor, contracts.progress, tasklib.watchdog, backends.yarn.states (status snapshots)",
    ),
    KvKey(
        "failure/<task>",
        "one-line diagnosis",
        "task.main (before a non-zero exit), train.strategy",
        "backends.yarn.states, runner.local_app, task.yarn.app_end, data.shared_index",
    ),
    KvKey(
        "exit/<task>",
        "JSON {code, died_at, container, skein_container, failure}",
        "task.yarn.exit_report (YARN container script); task.main deletes it when the task restarts",
        "backends.yarn.states, data.shared_index, task.yarn.app_end (a side task's failure)",
    ),
    KvKey(
        "phase/<task>",
        "JSON {start, main, imported, done}",
        "task.yarn.app_end",
        "backends.yarn.states (snapshots), backends.yarn.phases (run report)",
    ),
    KvKey(
        "stacks/<task>",
        "the last dump request id the task answered",
        "tasklib.watchdog (each task)",
        "tasklib.watchdog (the stall watch)",
    ),
    KvKey(
        "rejoin/<task>/<restart>",
        "JSON lost in-flight steps/records",
        "train.ps.loop (a restarted worker)",
        "train.ps.loop (the chief's summary)",
    ),
    KvKey("slot/<role>:<i>", "claiming container id (owned)", "task.yarn.kv_yarn", "task.yarn.kv_yarn"),
    KvKey(
        "slot-done/<role>:<i>",
        "1: the task finished its role",
        "task.yarn.kv_yarn",
        "task.yarn.kv_yarn, task.yarn.app_end",
    ),
    KvKey(
        "taskmap/<container>",
        "role:index",
        "task.yarn.kv_yarn",
        "backends.yarn.states, backends.yarn (logs), task.yarn.exit_report",
    ),
    KvKey(
        "resources/<task>",
        "JSON {cpu_percent, rss_mib, peak_rss_mib, memory_mib, time}",
        "task.resources (every task, every 2 s)",
        "contracts.progress (status: runner.local_app, backends.yarn.states)",
    ),
    KvKey(
        "index/<attempt>/<name>/…",
        "probe/<rank>, assign, part/<rank>, manifest, beat/<rank>",
        "data.shared_index",
        "data.shared_index",
    ),
    KvKey(
        "control/done",
        "set when training finished",
        "train (the chief); runner.local_app",
        "train (ps, evaluator), train.tensorboard, runner.local_app, tasklib.watchdog",
    ),
    KvKey("control/abort", "reason", "runner.local_app", "train (ps server, loop, evaluator, strategy)"),
    KvKey("control/steps_aligned", "set once step counters agree", "train.ps (the chief)", "train.ps (workers)"),
    KvKey(
        "control/dump_stacks",
        "request id",
        "tasklib.watchdog (the stall watch), an operator",
        "tasklib.watchdog (each task)",
    ),
    KvKey(
        "control/all_done",
        "JSON {time, by}",
        "task.yarn.app_end (the last task done), runner.yarn_app.supervise (a side task's container failed last)",
        "runner.follow (the follower), runner.yarn_app.supervise",
    ),
    KvKey(
        "control/follower",
        "wall time of the follower's last poll",
        "runner.follow (the follower)",
        "task.yarn.app_end, runner.yarn_app.supervise",
    ),
    KvKey(
        "control/supervisor",
        "wall time of the in-app supervisor's last round",
        "runner.yarn_app.supervise",
        "task.yarn.app_end, runner.follow (the follower)",
    ),
    KvKey(
        "control/end",
        "JSON {state, reason, exit_codes, by, time}: how the app ends, put before its shutdown",
        "the ender, through contracts.job_end: task.yarn.app_end (the last task), "
        "task.yarn.exit_report (a failed task), runner.yarn_app.supervise, "
        "backends.yarn.end (the follower's end)",
        "backends.yarn.states (snapshots: status, the follower's record, the supervisor's staging-dir record)",
    ),
    KvKey("summary", "final run summary JSON", "train (the chief)", "runner.supervisor, backends.yarn.states"),
    KvKey("plan/total_steps", "global step target", "train (the chief)", "train (workers), runner.supervisor"),
    KvKey("eval/latest", "latest evaluation metrics", "train.evaluator", "contracts.progress"),
    KvKey("tensorboard/url", "URL", "train.tensorboard", "contracts.progress"),
    KvKey("page/url", "URL of the job's page", "runner.local_app, runner.yarn_app.page", "contracts.progress"),
    KvKey(
        "control/attempt",
        "JSON {attempt, first, time}: the attempt running now, the first skein instance of each service in it",
        "runner.yarn_app.attempts (the in-app supervisor, before it starts an attempt's containers)",
        "task.main (the task's attempt), task.yarn.kv_yarn (restarts), task.yarn.exit_report, backends.yarn.states",
    ),
    KvKey(
        "control/attempt_end",
        "JSON {by, diagnosis, time}: the attempt's end handed to the in-app supervisor",
        "task.yarn.exit_report (a failed task, when the supervisor is alive and may retry)",
        "runner.yarn_app.supervise, task.yarn.exit_report",
    ),
    KvKey(
        "attempts/<n>",
        "JSON {attempt, diagnosis, cause, started, ended, wall_s, reached, resumes_at, lost_steps}",
        "runner.yarn_app.attempts (the in-app supervisor, each attempt's end)",
        "backends.yarn.states (status: attempt, totals), task.yarn.exit_report (the attempt budget)",
    ),
    KvKey(
        "cause/<task>/<container>",
        "JSON {task, container, time, free, then, class, cause, words, rule}: why that container failed "
        "(contracts.triage) and what followed",
        "task.yarn.exit_report",
        "task.yarn.exit_report (cluster faults used), backends.yarn.states (status `causes`)",
    ),
    KvKey(
        "spec",
        "the job's spec JSON (as shipped, no kerberos)",
        "runner.yarn_app.supervise",
        "backends.yarn (status/wait on a machine that did not submit the app)",
    ),
)
