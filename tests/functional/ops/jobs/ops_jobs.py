"""Custom train functions for the operations tests (shipped as the job's `code` dir, like a user's code).

They need no TensorFlow: they report progress the way the built-in loops do, so the launcher, the live view, the run
report and the Airflow operator see a real job's progress records through the real KV.
"""
import os
import time

import tfyarn.train
from tfyarn.train.progress import publish_total_steps


def _steps(helpers, n: int, dt: float, offset: float = 0.0) -> None:
    helpers.progress.begin()
    for step in range(1, n + 1):
        helpers.progress.report(step=step, epoch=(step - 1) * 2 // n, loss=2.0 / step + offset, examples=32)
        time.sleep(dt)


@tfyarn.train.custom_train
def short(ctx, helpers):
    """A few seconds of decreasing loss on every training task (steps and pace from params)."""
    p = helpers.params
    if ctx.is_chief:
        publish_total_steps(ctx.kv, int(p.get("steps", 40)))
    _steps(helpers, int(p.get("steps", 40)), float(p.get("dt", 0.05)), offset=0.01 * ctx.data_rank)
    return {"pid": os.getpid()}


@tfyarn.train.custom_train
def long(ctx, helpers):
    """Runs until stopped, reporting progress (for kill / adopt / on_kill tests)."""
    _steps(helpers, 100000, 0.05)


@tfyarn.train.custom_train
def fail_after_progress(ctx, helpers):
    """worker:0 trains a little, then fails with a clear message (the job's diagnosis)."""
    if ctx.task_id == "worker:0":
        _steps(helpers, 10, 0.05)
        raise RuntimeError("loss became NaN at step 10 on worker:0")
    _steps(helpers, 100000, 0.05)


@tfyarn.train.custom_train
def until_file(ctx, helpers):
    """Trains until the file ``params.stop_file`` exists (the test decides when the 'earlier try's app' ends)."""
    stop = helpers.params["stop_file"]
    helpers.progress.begin()
    step = 0
    while not os.path.exists(stop):
        step += 1
        helpers.progress.report(step=step, epoch=0, loss=1.0 / step, examples=32)
        time.sleep(0.05)
