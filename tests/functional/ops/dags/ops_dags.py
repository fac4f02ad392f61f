"""DAGs of the Airflow tests, run for real with ``dag.test()`` on SQLite: ``python ops_dags.py DAG_ID``.

The spec comes from ``TFYARN_TEST_SPEC``; ``TFYARN_TEST_OUT`` is where the ``record`` task writes the XComs it pulled
(what a downstream task of a user's DAG would see). ``__main__`` prints each task instance's final state as one JSON
line ``TI_STATES {...}`` for the test to read.
"""
import datetime
import json
import os
import sys
from pathlib import Path

from airflow.sdk import DAG

try:
    from airflow.providers.standard.operators.python import PythonOperator
except ImportError:  # Airflow 2
    from airflow.operators.python import PythonOperator

from tfyarn.airflow import TfyarnOperator

SPEC = os.environ.get("TFYARN_TEST_SPEC", "/nonexistent/spec.yaml")
OUT = os.environ.get("TFYARN_TEST_OUT", "/nonexistent/out.json")
STOP = os.environ.get("TFYARN_TEST_STOP", "/nonexistent/stop")
DATE = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)  # run_id = manual__2026-01-01T00:00:00+00:00
FAST = {"backend": "local", "poll_interval": 0.5, "log_interval": 1.0}


def _record(task_ids, **context):
    ti = context["ti"]
    out = {t: {"app_id": ti.xcom_pull(task_ids=t, key="app_id"), "summary": ti.xcom_pull(task_ids=t, key="summary"),
               "result": ti.xcom_pull(task_ids=t)} for t in task_ids}
    Path(OUT).write_text(json.dumps(out))


def _dag(dag_id, trains):
    with DAG(dag_id, schedule=None, start_date=DATE, catchup=False) as dag:
        ops = [TfyarnOperator(task_id=tid, spec=SPEC, **{**FAST, **kw}) for tid, kw in trains.items()]
        record = PythonOperator(task_id="record", python_callable=_record, trigger_rule="all_done",
                                op_kwargs={"task_ids": list(trains)})
        ops >> record
    return dag


ops_dag = _dag("tfyarn_ops", {
    "train": {},
    "train_deferred": {"deferrable": True},
    "train_fail": {"overrides": ["model=ops_jobs:fail_after_progress"]},
    "train_timeout": {"overrides": ["model=ops_jobs:long"], "execution_timeout": datetime.timedelta(seconds=6)},
})
retry_dag = _dag("tfyarn_retry", {
    "adopt": {"on_existing": "adopt"},
    "replace": {"on_existing": "kill"},
})
predict_dag = _dag("tfyarn_predict", {
    "score": {"predict": True, "overwrite": True},
})

if __name__ == "__main__":
    dag = {"tfyarn_ops": ops_dag, "tfyarn_retry": retry_dag, "tfyarn_predict": predict_dag}[sys.argv[1]]
    dr = dag.test(logical_date=DATE, run_after=DATE)
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dr.get_task_instances()}
    print("TI_STATES " + json.dumps(states), flush=True)
