"""A real Airflow home for the operator tests (tests/functional/ops/test_airflow.py,
tests/cluster/yarn/test_cluster_ops.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def migrated_airflow_env(home: Path, dags: Path) -> dict[str, str]:
    """The environment of an AIRFLOW_HOME at ``home`` with a migrated SQLite DB whose DAG folder is ``dags``."""
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/a.db",
           "AIRFLOW__CORE__UNIT_TEST_MODE": "False"}
    airflow = [sys.executable, "-c", "from airflow.__main__ import main; main()"]
    proc = subprocess.run([*airflow, "db", "migrate"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"airflow db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return env
