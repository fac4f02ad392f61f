"""Custom train functions for the shared-indexing job tests (tests/unit/data/test_shared_index_jobs.py): a task
that dies while the training tasks index the data together, then what each task's manifest was."""
import json
import os
import signal
import threading
import time

import tfyarn.train


def _kill_self_mid_share(ctx, pattern: str, at_least: int) -> None:
    """SIGKILL this process once ``at_least`` of the files the chief handed it (``assign``) have their index cached
    beside them: dead mid-indexing, part of its own work saved (what its replacement must reuse, not redo)."""
    from tfyarn.data.index_cache import _beside
    from tfyarn.data.listing import list_data
    from tfyarn.data.shared_index import Exchange
    ex = Exchange(ctx.kv, list(ctx.training_tasks), ctx.data_rank, ctx.app_id, ctx.attempt, None)

    def watch():
        assign = None
        while assign is None:
            assign = ex.get("assign")
            time.sleep(0.002)
        files = list_data(pattern).files
        mine = [_beside(files[i][0]).removeprefix("file://") for i in assign[str(ctx.data_rank)]]
        while sum(os.path.exists(b) for b in mine) < at_least:
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True, name="test-killer").start()


@tfyarn.train.custom_train
def die_while_indexing(ctx, helpers):
    """params: victim (task id), data_dir, out. The victim dies while indexing, on its first life of attempt 0."""
    from tfyarn.data.manifest import STATS
    p = helpers.params
    if (ctx.task_id == p["victim"] and ctx.attempt == 0 and os.environ.get("TFYARN_RESTART", "0") == "0"):
        _kill_self_mid_share(ctx, os.path.join(p["data_dir"], "*.tfrecord"), 3)
    before = STATS.snapshot()
    feeder = helpers.feeder()
    try:
        next(iter(feeder.epoch(0)))
        helpers.progress.report(step=1, epoch=0, loss=1.0, examples=1)
        got = STATS.snapshot()
        rec = {"task": ctx.task_id, "attempt": ctx.attempt, "restart": int(os.environ.get("TFYARN_RESTART", "0")),
               "records": [f.records for f in feeder.manifest.files],
               "files_indexed": got["files_indexed"] - before["files_indexed"]}
    finally:
        feeder.close()
    with open(os.path.join(p["out"], f"{ctx.task_id.replace(':', '-')}-{ctx.attempt}.json"), "w") as f:
        json.dump(rec, f)
