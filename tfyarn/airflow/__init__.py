"""Airflow integration (extra ``airflow``): :class:`TfyarnOperator` and its :class:`TfyarnTrigger`.

    from tfyarn.airflow import TfyarnOperator
    train = TfyarnOperator(task_id="train", spec="/specs/ctr-yarn.yaml", overrides=["data.epochs=3"])

Names are resolved lazily, so ``import tfyarn.airflow`` costs nothing and works without Airflow installed (e.g. to
use :mod:`tfyarn.airflow.tags`); Airflow is imported when the operator or trigger class is first used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TfyarnOperator", "TfyarnTrigger"]


def __getattr__(name: str) -> Any:
    if name == "TfyarnOperator":
        from tfyarn.airflow.operator import TfyarnOperator

        return TfyarnOperator
    if name == "TfyarnTrigger":
        from tfyarn.airflow.trigger import TfyarnTrigger

        return TfyarnTrigger
    raise AttributeError(f"module 'tfyarn.airflow' has no attribute {name!r}")
