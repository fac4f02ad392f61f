"""ps mode: between-graph replication in TF1 graph mode, every training task feeding its own ready batches.

Why each piece is the way it is (the seeds' failures and NOTES.md's measurements):

* **Placement by size** (:class:`SizeBalancer`): variables go to the ps with the least bytes so far, largest first
  (a dry build learns the sizes), instead of round-robin, which can put two big embeddings on one ps and make every
  worker wait on it (seed 001).
* **Placeholders fed from the Feeder** (its prefetch thread hides the fetch): no dataset or iterator op exists in the
  graph at all, so none can land on a ps (asserted in tests).
* **Sync without deadlock** (:class:`LockstepSync`): ``SyncReplicasOptimizer`` aggregates *any* N gradients and shares
  one token queue, so a fast worker takes a slow worker's token, runs ahead, and the job hangs at epoch end. Here each
  worker has its **own** token queue, receives exactly one token per aggregated round, and pushes exactly one gradient
  per round: rounds are lockstep, a fast worker cannot run an extra step, and every worker runs the planner's equal
  step count. Every task stops on the **global** step target (epochs x steps per epoch), never on local data.
* **Nothing unbounded**: ``operation_timeout_in_ms`` = ``timeouts.step`` turns a lost peer into an error; workers wait
  for the chief's initialisation with a 0.25 s poll (not 30 s); no MonitoredTrainingSession (its 120 s stop grace);
  device filters so a worker only talks to the ps tasks (and itself).
* **Resume**: a ``tfyarn_worker_steps`` variable on a ps counts each worker's steps and is checkpointed with the model,
  so a restarted job knows each worker's epoch and position in the epoch plan (sync: all equal the global step).
* **Worker rejoin** (async; a worker restarted in place, ``TFYARN_RESTART`` > 0): its counter on the ps survived, so it
  resumes at its own position in the epoch plan. The counter is bumped on the ps right after the update (same ps,
  no round trip to the worker), and a second counter ``tfyarn_worker_started`` is bumped on the ps when a step
  begins: started > counted after a kill means a step was in flight. That step's interrupted run is lost (it applied
  nothing, or — gradient transfer cut mid-step — part of the variables); the restarted worker runs it again from its
  counter and *reports* it (``rejoin/<task>/<n>`` in the KV, ``lost_steps``/``lost_records`` in the summary). The
  session carries the current ``cluster_def`` (ClusterSpec propagation), so the ps reach the restarted worker at its
  new address instead of the one their server was started with. Sync mode does not rejoin (see :func:`.loop._rejoin`).

Modules, in the order a task uses them: :mod:`.server` (TF servers, session config, the ps task),
:mod:`.placement`, :mod:`.graph` (the replica, :class:`LockstepSync`), :mod:`.session`, :mod:`.checkpointer`,
:mod:`.loop` (the step loop, rejoin, the chief's finish).
"""
from __future__ import annotations

from tfyarn.train.ps.loop import train
from tfyarn.train.ps.server import serve

__all__ = ["serve", "train"]
