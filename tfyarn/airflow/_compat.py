"""Airflow 3 (``airflow.sdk``) first, Airflow 2.x names as a fallback — imported only by the operator and trigger."""

from __future__ import annotations

try:  # Airflow 3
    from airflow.sdk import BaseOperator
    from airflow.sdk.exceptions import AirflowException
except ImportError:  # Airflow 2.x
    from airflow.exceptions import AirflowException
    from airflow.models import BaseOperator

from airflow.triggers.base import BaseTrigger, TriggerEvent  # noqa: TID253 - this module is the Airflow import

__all__ = ["AirflowException", "BaseOperator", "BaseTrigger", "TriggerEvent"]
