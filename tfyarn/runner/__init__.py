"""The runner: a job run to its end on any backend — its attempts, its deadline, following each
app, deciding when it ends, and never leaving one running.

Why a floor of its own, above ``backends/``: a backend (:class:`tfyarn.backends.base.Backend`) is only
the scheduler's verbs (dryrun, schedule, status, logs, kill, list, end an app, its KV), as torchx
keeps its ``Scheduler`` apart from the ``Runner`` that drives it. What a run does with them — the
job attempts of ``retry.max_attempts`` (with the separate bound on attempts the cluster ended), the
deadline (``timeouts.active_deadline`` and the caller's ``timeout``), the allocation timeout and the
stall watch (:mod:`.supervisor`, pure verdicts), the backoff, the diagnosis that folds the earlier
attempts in — is here, once:

- :func:`run`: :mod:`.attempts` (the loop), each attempt an app scheduled and followed, or a round of
  the backend's application master (:mod:`.local_app`, the local launcher);
- :func:`wait` / :func:`follow_to_end`: :mod:`.follow` (status read, verdict, end);
- :func:`never_left_running`: :mod:`.owned`;
- the drivers that apply the same rules inside an app: :mod:`.local_app` and :mod:`.yarn_app` (the
  in-app supervisor).
"""

from tfyarn.runner.attempts import Attempts, ScheduledAttempts, run, run_attempts
from tfyarn.runner.follow import follow_to_end, poll_to_end, wait
from tfyarn.runner.owned import never_left_running

__all__ = [
    "Attempts",
    "ScheduledAttempts",
    "follow_to_end",
    "never_left_running",
    "poll_to_end",
    "run",
    "run_attempts",
    "wait",
]
