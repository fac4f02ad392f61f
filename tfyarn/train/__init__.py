"""Training inside a task: the model API and :func:`run_task`, the role dispatch the runtime calls
(docs/ARCHITECTURE.md, "Role dispatch"). TF is imported lazily: the gateway imports the model API too."""

from __future__ import annotations

import logging
from typing import Any

from tfyarn.train.model import Model, build_model, custom_train, is_custom_train, load, load_unbuilt, resolve_ref
from tfyarn.train.sharding import table

__all__ = ["Model", "custom_train", "is_custom_train", "build_model", "load", "run_task", "table"]

log = logging.getLogger("tfyarn.train")


def run_task(ctx: Any) -> Any:
    """Dispatch by role and ``spec.mode``: ps → :mod:`tfyarn.train.ps`; allreduce → :mod:`tfyarn.train.allreduce`;
    evaluator → :mod:`tfyarn.train.evaluator`. A custom train function (``@custom_train``) replaces the built-in loop
    on training tasks in either mode (ps tasks still serve until done)."""
    spec = ctx.spec
    role = ctx.role
    if role == "evaluator":
        from tfyarn.train import evaluator

        return evaluator.run(ctx)
    if role == "ps":
        if spec.mode != "ps":
            raise ValueError(f"{ctx.task_id}: a ps task in mode {spec.mode!r} (only mode 'ps' has parameter servers)")
        from tfyarn.train import ps

        return ps.serve(ctx)
    if role not in ("chief", "worker"):
        raise ValueError(f"{ctx.task_id}: run_task does not handle role {role!r}")
    code_dir = spec.code or None
    # allreduce: the factory runs after the strategy exists (allreduce.build), never before: a Keras model touches
    # TF's eager context, and MultiWorkerMirroredStrategy must then configure collectives ("at program startup")
    target = resolve_ref(spec.model, code_dir)
    if not is_custom_train(target) and spec.mode == "ps":
        target = load_unbuilt(spec.model, spec.params, code_dir, data=spec.data)
    if is_custom_train(target):
        if spec.export is not None:
            raise ValueError(
                f"export: {spec.model} is a custom train function; tfyarn cannot know which model it "
                f"trained. Remove export from the spec and save a SavedModel in the function"
            )
        from tfyarn.train import helpers

        return helpers.run_custom(ctx, target)
    if spec.mode == "ps":
        from tfyarn.train import ps

        return ps.train(ctx, target)
    from tfyarn.train import allreduce

    return allreduce.run(ctx)
