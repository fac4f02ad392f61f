"""Models for the fault-injection tests (shipped as the job's ``code`` dir, like a user's code).

``slow_recommender``: the built-in recommender with a fixed sleep inside every training step (a ``numpy_function``
on the training task's own device), so a short job still has enough wall time for a kill to land mid-epoch at a
chosen step. ``fail_task`` / ``fail_at_step`` / ``fail_attempts``: that task's step raises at that step (of its own
count in this process) on job attempts below ``fail_attempts`` (a user's model failing mid-run; tests/contract);
``fail_how: kill``: the task SIGKILLs itself there instead, as when its container or node is lost (infrastructure).
Nothing else differs from ``tfyarn.models.recommender``.
"""
import os
import signal
import time

from tfyarn.models.recommender import Recommender


class SlowRecommender(Recommender):
    def __init__(self, step_delay_s: float = 0.05, fail_task: str = "", fail_at_step: int = 0,
                 fail_attempts: int = 1000, fail_how: str = "raise", **params):
        super().__init__(**params)
        self.fail_how = fail_how
        self.step_delay_s = float(step_delay_s)
        me = f"{os.environ.get('TFYARN_ROLE')}:{os.environ.get('TFYARN_INDEX')}"
        attempt = int(os.environ.get("TFYARN_ATTEMPT", "0"))
        self.fail_at_step = int(fail_at_step) if me == fail_task and attempt < int(fail_attempts) else 0
        self.steps = 0

    def __call__(self, features, training):
        import numpy as np
        import tensorflow as tf

        out = super().__call__(features, training)
        if not training or (self.step_delay_s <= 0 and not self.fail_at_step):
            return out

        def sleep():
            self.steps += 1
            if self.steps == self.fail_at_step and self.fail_how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.steps == self.fail_at_step:
                raise RuntimeError(f"the model's step {self.steps} failed on purpose")
            time.sleep(self.step_delay_s)
            return np.int64(0)

        tick = tf.numpy_function(sleep, [], tf.int64, stateful=True)
        with tf.control_dependencies([tick]):
            return tf.identity(out)


def slow_recommender(**params) -> SlowRecommender:
    return SlowRecommender(**params)


# ---------------------------------------------------------------------------------------------------- slow reader
import fsspec  # noqa: E402
from fsspec.implementations.local import LocalFileSystem  # noqa: E402


class SlowFileSystem(LocalFileSystem):
    """``slowfile://<path>``: the local file system with ``SLOWFILE_DELAY_S`` (default 0.2 s) added to every read
    call, like a congested HDFS datanode, and ``SLOWFILE_PUT_DELAY_S`` (default 0) to every file upload
    (``put_file``: how checkpoints reach their store). Real fsspec I/O through tfyarn, nothing of tfyarn replaced."""
    protocol = "slowfile"
    root_marker = "/"

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith("slowfile://"):
            path = path[len("slowfile://"):]
        return LocalFileSystem._strip_protocol(path)

    def unstrip_protocol(self, name):
        return f"slowfile://{self._strip_protocol(name)}"

    def _open(self, path, mode="rb", **kw):
        f = super()._open(path, mode=mode, **kw)
        if "r" not in mode:
            return f
        delay = float(os.environ.get("SLOWFILE_DELAY_S", "0.2"))
        read = f.read

        def slow_read(*a, **k):
            time.sleep(delay)
            return read(*a, **k)
        f.read = slow_read
        return f

    def put_file(self, lpath, rpath, **kw):
        time.sleep(float(os.environ.get("SLOWFILE_PUT_DELAY_S", "0")))
        return super().put_file(lpath, rpath, **kw)

    def cat_file(self, path, start=None, end=None, **kw):
        time.sleep(float(os.environ.get("SLOWFILE_DELAY_S", "0.2")))
        return super().cat_file(path, start=start, end=end, **kw)


fsspec.register_implementation("slowfile", SlowFileSystem, clobber=True)


# ------------------------------------------------------------------------------------------------------- security
import tfyarn.train  # noqa: E402


@tfyarn.train.custom_train
def dump_kv_and_env(ctx, helpers):
    """Return everything a task can see (the whole KV, its environment): the security test greps it for the keytab."""
    return {"kv": ctx.kv.items(""), "env": dict(os.environ)}


@tfyarn.train.custom_train
def chief_quick_worker_forever(ctx, helpers):
    """The chief trains 3 steps and ends; worker:0 never ends (ignores control/done): the shutdown timeout's case."""
    if ctx.task_id == "chief:0":
        for step in range(1, 4):
            helpers.progress.report(step=step, epoch=0, loss=1.0, examples=1, force=True)
        return {"steps": 3}
    while True:
        time.sleep(0.2)
