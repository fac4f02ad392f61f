"""A YARN job's control: the in-app supervisor (``python -m tfyarn.runner.yarn_app.supervise``, a service of every
application) with its in-app attempts, lost-node watch and re-requests, the job's page it serves, and the follower's
side of ``tfyarn run``'s attempts. They apply :class:`tfyarn.runner.supervisor.Supervisor`'s rules through the YARN
backend's parts (states, records, the RM's REST API); the backend imports nothing from here."""
