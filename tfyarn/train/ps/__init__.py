"""ps mode: between-graph replication in TF1 graph mode, every training task feeding its own ready batches.

Why each piece is the way it is (the seeds' failures and NOTES.md's measurements):

* **Placement by size** (:mod:`.placement`), not round-robin, which can put two big embeddings on one ps and make
  every worker wait on it.
* **Placeholders fed from the Feeder**: no dataset or iterator op exists in the graph, so none can land on a ps.
* **Sync without deadlock** (:class:`.graph.LockstepSync`): ``SyncReplicasOptimizer`` aggregates *any* N gradients
  and shares one token queue, so a fast worker takes a slow worker's token, runs ahead, and the job hangs at epoch
  end. Here each worker has its **own** token queue and pushes exactly one gradient per round: rounds are lockstep,
  no worker runs an extra step. Every task stops on the **global** step target, never on local data.
* **Nothing unbounded**: ``operation_timeout_in_ms`` = ``timeouts.step`` turns a lost peer into an error; workers
  poll for the chief's initialisation every 0.25 s; no MonitoredTrainingSession (its 120 s stop grace); device
  filters so a worker only talks to the ps tasks.
* **Resume**: per-worker step counters on a ps, checkpointed with the model, give each worker's plan position.
* **Worker rejoin** (async, ``TFYARN_RESTART`` > 0): the counters survived on the ps; a second counter bumped when a
  step begins tells a step that was in flight at the kill, which is run again and reported (:func:`.loop._rejoin`).
  The session carries the current ``cluster_def``, so the ps reach the restarted worker at its new address.

* **Few RPCs per step** (:mod:`.packing`, async): each tensor crossing between a worker and a ps is a gRPC call,
  the bulk of a small model's step, so each ps's gradients travel packed in two tensors.

Modules, in the order a task uses them: :mod:`.server`, :mod:`.placement`, :mod:`.graph` (with :mod:`.packing`),
:mod:`.session`, :mod:`.checkpointer`, :mod:`.loop`.
"""

from __future__ import annotations

from tfyarn.train.ps.loop import train
from tfyarn.train.ps.server import serve

__all__ = ["serve", "train"]
