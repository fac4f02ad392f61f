"""A YARN job's attempts as ``tfyarn run`` follows them: each an application of its own, scheduled and followed
by the runner (:class:`~tfyarn.runner.attempts.ScheduledAttempts`), the attempts the app's in-app supervisor ran
itself taken into the run's count.

Why here: the app's own attempts (:mod:`.supervise`) and the run's are one budget, one numbering, one diagnosis —
the job's rules, which are the runner's; the YARN backend only keeps the app's records
(:mod:`tfyarn.backends.yarn.records`) and the staging dir skein left.
"""

from __future__ import annotations


from tfyarn.backends.yarn import records, skein_staging
from tfyarn.contracts.status import AppStatus
from tfyarn.runner.attempts import ScheduledAttempts
from tfyarn.runner.yarn_app.attempts import absorb


class YarnAttempts(ScheduledAttempts):
    """:class:`~tfyarn.runner.attempts.ScheduledAttempts` of YARN apps: after each app's end, skein's
    staging dir it left removed (an AM killed leaves it: issue 30) and the attempts it ran itself absorbed."""

    def to_end(self, app_id: str) -> AppStatus:
        st = super().to_end(app_id)
        skein_staging.remove_after(self.backend, app_id)
        # the attempts its in-app supervisor ran: the run's own (numbering, budget, totals, diagnosis)
        absorb(self.sup, records.load(app_id).get("snapshot") or {}, app_id)
        return st
