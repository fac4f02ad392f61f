"""What a task knows about itself and the job: the contract between the runtime and the training code.

Built by :mod:`tfyarn.runtime.main` after rendezvous; handed to :func:`tfyarn.train.run_task` (and to a user's
custom ``train(ctx)``). Deliberately plain data plus the KV handle: no TensorFlow import here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfyarn.runtime.kv import KV
from tfyarn.spec import JobSpec


# KV key layout (one place, so launcher, runtime, trainers and backends agree).
def addr_key(task: str) -> str:
    """``addr/worker:1`` → 'host:port' of that task's TF server."""
    return f"addr/{task}"


PROGRESS_PREFIX = "progress/"
FAILURE_PREFIX = "failure/"


def progress_key(task: str) -> str:
    """``progress/worker:1`` → JSON {step, global_step, epoch, examples_per_sec, loss, time, ...}."""
    return PROGRESS_PREFIX + task


def failure_key(task: str) -> str:
    """``failure/worker:1`` → a one-line diagnosis written by the task before it exits non-zero."""
    return FAILURE_PREFIX + task


DONE_KEY = "control/done"            # chief: training finished; ps/evaluator/tensorboard exit cleanly
ABORT_KEY = "control/abort"          # launcher/anyone: stop now, value = reason
SUMMARY_KEY = "summary"              # chief: final run summary JSON
STEPS_ALIGNED_KEY = "control/steps_aligned"  # ps chief: step counters consistent; workers may step
TOTAL_STEPS_KEY = "plan/total_steps" # chief: global step target (for progress bars)
TENSORBOARD_URL_KEY = "tensorboard/url"
PAGE_URL_KEY = "page/url"             # whoever serves the job's page (tfyarn.web): its URL
EVAL_KEY = "eval/latest"             # evaluator: JSON of its newest evaluation (checkpoint, step, metrics)


@dataclass(frozen=True)
class TaskContext:
    spec: JobSpec
    role: str                       # chief | worker | ps | evaluator | tensorboard
    index: int
    kv: KV
    cluster: dict[str, list[str]] = field(default_factory=dict)  # TF cluster spec: role → ['host:port', ...]
    host: str = "127.0.0.1"
    port: int | None = None         # the port reserved for this task's TF server (cluster roles only)
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
