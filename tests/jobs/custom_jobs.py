"""Custom train functions used by the launcher tests (shipped as the job's `code` dir, like a user's code)."""
import os
import time

import tfyarn.train


@tfyarn.train.custom_train
def fail_on_worker(ctx, helpers):
    """worker:0 fails after a moment; the chief would run for minutes if nobody stopped it."""
    if ctx.task_id == "worker:0":
        time.sleep(0.5)
        raise RuntimeError("boom from worker:0")
    time.sleep(300)


@tfyarn.train.custom_train
def run_long(ctx, helpers):
    """Every training task runs 'forever' (until stopped), reporting progress."""
    for step in range(1, 100000):
        helpers.progress.report(step=step, epoch=0, loss=1.0 / step, examples=10)
        time.sleep(0.05)


@tfyarn.train.custom_train
def quick(ctx, helpers):
    return {"pid": os.getpid()}
