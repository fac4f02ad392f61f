"""Batch scoring (``tfyarn predict SPEC``, docs/predict.md): a trained model over a whole table, in equal row ranges
over the workers, each output part written exactly once.

``run(ctx)`` is what a worker of a ``job: predict`` spec runs (the task's role dispatch calls it instead of
training); :mod:`signature` reads a SavedModel's signature without TensorFlow (the gateway's check) and
:mod:`output` holds the output dir's rules (also the gateway's ``--overwrite`` check). TF is imported lazily.
"""

from __future__ import annotations

from typing import Any


def run(ctx: Any) -> dict[str, Any]:
    from tfyarn.predict.job import run as run_job

    return run_job(ctx)
