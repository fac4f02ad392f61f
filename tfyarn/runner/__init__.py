"""The runner: a job run to its end on any backend — its attempts, its deadline, following each
app, and never leaving one running.

Why a floor of its own: a backend (:class:`tfyarn.backends.base.Backend`) is only the scheduler's
verbs (dryrun, schedule, status, logs, kill, list, the end of an app), as torchx keeps its
``Scheduler`` apart from the ``Runner`` that drives it. What a run does with them — the job
attempts of ``retry.max_attempts`` (with the separate bound on attempts the cluster ended), the
deadline (``timeouts.active_deadline`` and the caller's ``timeout``), the backoff, the diagnosis
that folds the earlier attempts in, and when the run report is written — is here, once:

- :func:`run`: :mod:`.attempts` (the loop) over the backend's hook :meth:`Backend.attempts`;
- :func:`wait` / :func:`follow_to_end`: :mod:`.follow` (the poll loop) over the backend's hooks
  ``follow``/``pause``/``followed``;
- :func:`never_left_running`: :mod:`.owned`.

It sits below ``backends/`` (it imports no backend: it drives whatever has the hooks), so a
backend's own processes (local's detached launcher) run their job through it too.
"""

from tfyarn.runner.attempts import Attempts, ScheduledAttempts, run
from tfyarn.runner.follow import follow_to_end, poll_to_end, wait
from tfyarn.runner.owned import never_left_running

__all__ = [
    "Attempts",
    "ScheduledAttempts",
    "follow_to_end",
    "never_left_running",
    "poll_to_end",
    "run",
    "wait",
]
