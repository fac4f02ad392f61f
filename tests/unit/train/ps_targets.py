"""Task entry points for the ps-mode tests (run inside harness processes; ``targets=`` of ``LocalCluster``).

``fake_feeder``: a stand-in with the Feeder API (equal steps per worker, deterministic recommender batches) so the
trainer can be exercised without TFRecord files; ``slow``: the same task with a delay before each step (a slow worker,
to show a fast one cannot run ahead in sync mode).
"""
from __future__ import annotations

import os
import time

import numpy as np


class FakeFeeder:
    """Feeder API: ``steps(epoch)``, ``epoch(epoch, start_step)``, ``close``, context manager."""

    def __init__(self, ctx, steps_per_epoch: int):
        self.ctx, self.n = ctx, steps_per_epoch
        self.bs = ctx.spec.data.batch_size

    def steps(self, epoch: int) -> int:
        return self.n

    def epoch(self, epoch: int, start_step: int = 0):
        # generated deterministically (seeded by epoch and rank), so start_step skips exactly the first batches
        rng = np.random.default_rng(1000 * epoch + self.ctx.data_rank)
        for s in range(self.n):
            u = rng.integers(0, 100, self.bs)
            i = rng.integers(0, 100, self.bs)
            if s >= start_step:
                yield {"user_id": u, "item_id": i, "label": ((u + i) % 2).astype(np.float32)}

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def fake(ctx) -> None:
    from tfyarn.train import helpers, run_task
    n = int(os.environ.get("TFYARN_TEST_FAKE_STEPS", "10"))
    helpers.train_manifest = lambda c: None                       # no TFRecord files to index
    helpers.make_feeder = lambda c, manifest=None: FakeFeeder(c, n)
    run_task(ctx)


def _slow_steps(delay: float) -> None:
    """Wrap the trainer's step so each takes ``delay`` s longer (before the step, like a slow reader)."""
    from tfyarn.train.progress import ProgressReporter
    orig = ProgressReporter.report

    def report(self, *a, **kw):
        time.sleep(delay)
        return orig(self, *a, **kw)
    ProgressReporter.report = report


def slow(ctx) -> None:
    _slow_steps(float(os.environ.get("TFYARN_TEST_SLOW_S", "0.2")))
    from tfyarn.train import run_task
    run_task(ctx)


def slow_fake(ctx) -> None:
    _slow_steps(float(os.environ.get("TFYARN_TEST_SLOW_S", "0.2")))
    fake(ctx)
