"""The job as an MLflow run (``tracking: {mlflow: URI, experiment: NAME}``; extra ``tracking``:
mlflow-skinny).

Why the chief: it is the one task every mode has, it holds the spec's params and the summary, and
its own progress history (:mod:`tfyarn.train.history`) already comes at a bounded rate from a
background thread — the run's per-step points are logged from there, never from the training loop.
The run's id goes into the summary (``mlflow``), so whoever writes the run report afterwards (the
local launcher, the in-app supervisor or a follower on YARN) adds the report, the evaluation metrics
and the outcome to the same run (:func:`log_report`). Tracking is advisory: an unreachable server or
a missing mlflow is a warning, never the job's failure."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("tfyarn.train.tracking")

#: Metrics taken from the chief's progress points (MLflow metrics and the chief's TensorBoard scalars alike).
POINT_METRICS = ("loss", "examples_per_sec", "global_steps_per_sec")
#: Keys of an evaluation record that are not metrics (``display`` shows the same split).
EVAL_META = ("checkpoint", "global_step", "epoch", "batches", "examples", "time", "eval_seconds")


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def spec_params(spec: Any) -> dict[str, str]:
    """What the run's params say of the job: the model, mode and data settings, each role's size,
    and the model's own params (``params.<name>``); MLflow params are strings."""
    out: dict[str, Any] = {
        "model": spec.model,
        "mode": spec.mode,
        "sync": spec.sync,
        "batch_size": spec.data.batch_size,
        "global_batch_size": spec.global_batch_size,
        "epochs": spec.data.epochs,
        "shuffle_seed": spec.data.shuffle_seed,
        "checkpoint_dir": spec.checkpoint.dir,
    }
    for role, r in spec.roles.items():
        out[f"roles.{role}"] = f"{r.instances} x {r.memory_mib} MiB, {r.vcores} vcores"
    for k, v in spec.params.items():
        out[f"params.{k}"] = v if isinstance(v, str) else json.dumps(v)
    return {k: str(v)[:6000] for k, v in out.items() if v is not None}


#: This process's run (a chief has one; TaskContext is frozen).
_current: "MlflowRun | None" = None


class MlflowRun:
    """One job attempt's MLflow run, created by the chief; :meth:`points` is a history sink (the
    upload thread)."""

    def __init__(self, uri: str, run_id: str, experiment_id: str):
        self.uri, self.run_id, self.experiment_id = uri, run_id, experiment_id
        self.client = _client(uri)
        self._warned = False

    @classmethod
    def start(cls, ctx: Any) -> "MlflowRun":
        t = ctx.spec.tracking
        client = _client(t.mlflow)
        name = t.experiment or ctx.spec.name
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        run = client.create_run(
            exp_id,
            run_name=f"{ctx.spec.name} {ctx.app_id}" + (f" attempt {ctx.attempt + 1}" if ctx.attempt else ""),
            tags={
                "tfyarn.app_id": ctx.app_id,
                "tfyarn.attempt": str(ctx.attempt),
                "tfyarn.job": ctx.spec.name,
                **{f"tfyarn.tag.{x}": "1" for x in ctx.spec.tags},
            },
        )
        from mlflow.entities import Param

        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in spec_params(ctx.spec).items()])
        log.info("MLflow run %s in experiment %r (%s)", run.info.run_id, name, t.mlflow)
        return cls(t.mlflow, run.info.run_id, exp_id)

    def points(self, pending: list[dict[str, Any]]) -> None:
        """Log the chief's progress points (step = the global step); a failure is logged once and
        dropped."""
        from mlflow.entities import Metric

        metrics = [
            Metric(
                key,
                float(p[key]),
                int(float(p.get("time") or time.time()) * 1000),
                int(p.get("global_step") or p.get("step") or 0),
            )
            for p in pending
            for key in POINT_METRICS
            if p.get(key) is not None
        ]
        try:
            for i in range(0, len(metrics), 1000):  # MLflow's batch limit
                self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        except Exception as exc:  # noqa: BLE001 - advisory (a server gone away, a network blip)
            if not self._warned:
                self._warned = True
                log.warning("could not log progress to MLflow run %s: %s", self.run_id, exc)

    def record(self) -> dict[str, str]:
        """What the summary keeps of the run (``summary["mlflow"]``): the report writer logs into
        it."""
        return {"tracking_uri": self.uri, "run_id": self.run_id, "experiment_id": self.experiment_id}


def attach(ctx: Any, history: Any) -> MlflowRun | None:
    """On the chief of a job with ``tracking``: start its run and make ``history`` (a TaskHistory)
    send it the points it records. None elsewhere, or when MLflow cannot be used (a warning)."""
    if ctx.spec.tracking is None or not ctx.is_chief:
        return None
    try:
        run = MlflowRun.start(ctx)
    except Exception as exc:  # noqa: BLE001 - no mlflow in the env, an unreachable server, ...
        log.warning("no MLflow tracking (tracking.mlflow %s): %s", ctx.spec.tracking.mlflow, exc)
        return None
    if history is not None:
        history.sink = run.points
    global _current
    _current = run
    return run


def with_run(ctx: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """The chief's summary with its MLflow run named (``mlflow``), the summary logged to the run as
    ``summary.json`` and its end figures as metrics."""
    run = _current
    if run is None:
        return summary
    summary = summary | {"mlflow": run.record()}
    try:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        finals = {
            "final_loss": summary.get("last_loss"),
            "final_examples_per_sec": summary.get("examples_per_sec"),
            "train_s": summary.get("train_s"),
        }
        run.client.log_batch(
            run.run_id,
            metrics=[
                Metric(k, float(v), now, int(summary.get("global_step") or 0))
                for k, v in finals.items()
                if v is not None
            ],
        )
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "summary.json"
            path.write_text(json.dumps(summary, indent=1, sort_keys=True, default=str))
            run.client.log_artifact(run.run_id, str(path))
    except Exception as exc:  # noqa: BLE001 - advisory
        log.warning("could not log the summary to MLflow run %s: %s", run.run_id, exc)
    return summary


def log_report(status: dict[str, Any], report_dir: Path) -> bool:
    """After the run report is written (whoever writes it): the report's files, the newest
    evaluation's metrics and the outcome into the run the summary names; False when there is none or
    it failed (a warning)."""
    rec = (status.get("summary") or {}).get("mlflow")
    if not rec:
        return False
    try:
        from mlflow.entities import Metric

        client = _client(rec["tracking_uri"])
        run_id = rec["run_id"]
        ev = (status.get("summary") or {}).get("eval") or {}
        step = int(ev.get("global_step") or 0)
        now = int(time.time() * 1000)
        metrics = [
            Metric(f"eval_{k}", float(v), now, step)
            for k, v in ev.items()
            if k not in EVAL_META and isinstance(v, (int, float))
        ]
        if metrics:
            client.log_batch(run_id, metrics=metrics)
        for f in sorted(Path(report_dir).glob("report.*")):
            client.log_artifact(run_id, str(f), "report")
        ended = {"SUCCEEDED": "FINISHED", "KILLED": "KILLED"}.get(str(status.get("state")), "FAILED")
        client.set_terminated(run_id, ended)
        return True
    except Exception as exc:  # noqa: BLE001 - advisory: the job's outcome stands
        log.warning("could not log the run report to MLflow (%s): %s", rec.get("tracking_uri"), exc)
        return False
