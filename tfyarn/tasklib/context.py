"""What a task knows about itself and the job: the contract between the runtime and the training code.

Built by :mod:`tfyarn.task.main` after rendezvous; handed to :func:`tfyarn.train.run_task` (and to a user's
custom ``train(ctx)``). Deliberately plain data plus the KV handle: no TensorFlow import here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The KV key layout is tfyarn.contracts.kv_keys; re-exported here for the task code that reads it from its context.
from tfyarn.contracts.kv_keys import (  # noqa: F401 - re-exports
    ABORT_KEY,
    DONE_KEY,
    EVAL_KEY,
    FAILURE_PREFIX,
    PROGRESS_PREFIX,
    STEPS_ALIGNED_KEY,
    SUMMARY_KEY,
    TENSORBOARD_URL_KEY,
    TOTAL_STEPS_KEY,
    addr_key,
    failure_key,
    progress_key,
)
from tfyarn.tasklib.kv import KV
from tfyarn.spec import JobSpec


@dataclass(frozen=True)
class TaskContext:
    spec: JobSpec
    role: str  # chief | worker | ps | evaluator | tensorboard
    index: int
    kv: KV
    cluster: dict[str, list[str]] = field(default_factory=dict)  # TF cluster spec: role → ['host:port', ...]
    host: str = "127.0.0.1"
    port: int | None = None  # the port reserved for this task's TF server (cluster roles only)
    workdir: Path = Path(".")
    app_id: str = "local"
    attempt: int = 0

    @property
    def task_id(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def is_chief(self) -> bool:
        """The chief initialises, checkpoints and writes summaries: chief:0, or worker:0 when there is no chief."""
        return self.role == "chief" or (self.role == "worker" and self.index == 0 and not self.cluster.get("chief"))

    @property
    def training_tasks(self) -> list[str]:
        return self.spec.training_tasks

    @property
    def data_rank(self) -> int:
        """This task's index among the training tasks (its share in the epoch plan); -1 if it does not train."""
        tasks = self.training_tasks
        return tasks.index(self.task_id) if self.task_id in tasks else -1

    @property
    def num_data_workers(self) -> int:
        return len(self.training_tasks)

    def tf_config(self) -> dict[str, Any]:
        """TF_CONFIG for this task. Evaluator and tensorboard are outside the cluster ('evaluator' type, no address)."""
        return {"cluster": self.cluster, "task": {"type": self.role, "index": self.index}}

    def tf_config_json(self) -> str:
        return json.dumps(self.tf_config())
