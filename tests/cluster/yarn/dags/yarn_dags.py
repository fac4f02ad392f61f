"""The DAG of the cluster suite's Airflow test, run for real with ``dag.test()``: ``python yarn_dags.py``.

The same TfyarnOperator a user puts in a DAG, with ``backend="yarn"``: ``train`` polls, ``train_deferred`` defers to
the TfyarnTrigger (``dag.test()`` runs the trigger in-process, as a triggerer would). The spec is
``TFYARN_TEST_SPEC``, each task's checkpoint dir ``$TFYARN_TEST_CKPT/<task>``; ``record`` writes the XComs it pulled
to ``TFYARN_TEST_OUT`` (what a downstream task sees), and ``__main__`` prints every task instance's final state as
one line ``TI_STATES {...}``.
"""
import datetime
import json
import os
from pathlib import Path

from airflow.sdk import DAG

try:
    from airflow.providers.standard.operators.python import PythonOperator
except ImportError:  # Airflow 2
    from airflow.operators.python import PythonOperator

from tfyarn.airflow import TfyarnOperator

SPEC = os.environ.get("TFYARN_TEST_SPEC", "/nonexistent/spec.yaml")
OUT = os.environ.get("TFYARN_TEST_OUT", "/nonexistent/out.json")
CKPT = os.environ.get("TFYARN_TEST_CKPT", "/nonexistent/ckpt")   # each task's checkpoints in their own dir under it
DATE = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)  # run_id = manual__2026-01-01T00:00:00+00:00
TRAINS = {"train": {}, "train_deferred": {"deferrable": True}}


def _record(**context):
    ti = context["ti"]
    out = {t: {"app_id": ti.xcom_pull(task_ids=t, key="app_id"), "summary": ti.xcom_pull(task_ids=t, key="summary"),
               "result": ti.xcom_pull(task_ids=t)} for t in TRAINS}
    Path(OUT).write_text(json.dumps(out))


with DAG("tfyarn_yarn", schedule=None, start_date=DATE, catchup=False) as dag:
    ops = [TfyarnOperator(task_id=tid, spec=SPEC, backend="yarn", overrides=[f"checkpoint.dir={CKPT}/{tid}"],
                          poll_interval=2.0, log_interval=5.0, **kw) for tid, kw in TRAINS.items()]
    ops >> PythonOperator(task_id="record", python_callable=_record, trigger_rule="all_done")

if __name__ == "__main__":
    dr = dag.test(logical_date=DATE, run_after=DATE)
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dr.get_task_instances()}
    print("TI_STATES " + json.dumps(states), flush=True)
