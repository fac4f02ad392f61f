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


@tfyarn.train.custom_train
def lockstep(ctx, helpers):
    """Like synchronous training: the chief never gets more than 2 steps ahead of worker:0 (KV as the barrier).

    Freezing worker:0 therefore freezes global progress — what the stall watchdog must catch.
    """
    import json
    for step in range(1, 100000):
        if ctx.task_id == "chief:0":
            while True:
                raw = ctx.kv.get("progress/worker:0")
                if raw and json.loads(raw).get("step", 0) >= step - 2:
                    break
                time.sleep(0.02)
        helpers.progress.report(step=step, epoch=0, loss=1.0, examples=1)
        time.sleep(0.05)
