"""Custom train functions used by the launcher tests (shipped as the job's `code` dir, like a user's code)."""
import os
import time

import tfyarn.train


def _worker_raises(make_error):
    """A custom train function: worker:0 raises ``make_error()`` after a moment; the chief would run for minutes if
    nobody stopped it."""
    @tfyarn.train.custom_train
    def train(ctx, helpers):
        if ctx.task_id == "worker:0":
            time.sleep(0.5)
            raise make_error()
        time.sleep(300)
    return train


def _tf_deadline():
    import tensorflow as tf
    return tf.errors.DeadlineExceededError(None, None, "Timed out waiting for the step's ops on /job:ps/task:0")


def _wait_timeout():
    from tfyarn.errors import WaitTimeout
    return WaitTimeout("waited 1s (timeouts.step) for workers to finish their 8 steps")


fail_on_worker = _worker_raises(lambda: RuntimeError("boom from worker:0"))
#: worker:0's step fails as a ps-mode step does past the session's operation timeout (timeouts.step)
deadline_on_worker = _worker_raises(_tf_deadline)
#: worker:0 gives up a bounded wait whose message does not say "timed out" (as ps mode's timeouts.step)
wait_timeout_on_worker = _worker_raises(_wait_timeout)


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


@tfyarn.train.custom_train
def count(ctx, helpers):
    """Run params['steps'] steps of 0.05 s. The chief is lost (SIGKILLs itself, as when its container or node is
    lost) on the job attempts below params['chief_lost_attempts'] (``chief_fails_first_attempt``: 1)."""
    import signal

    steps = int(helpers.params.get("steps", 40))
    lost = int(helpers.params.get("chief_lost_attempts", 1 if helpers.params.get("chief_fails_first_attempt") else 0))
    if ctx.task_id == "chief:0" and ctx.attempt < lost:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    exit_code = helpers.params.get("worker_exit_code")
    for step in range(1, steps + 1):
        if exit_code is not None and ctx.task_id == "worker:0" and step == 5 and os.environ["TFYARN_RESTART"] == "0":
            os._exit(int(exit_code))
        helpers.progress.report(step=step, epoch=0, loss=1.0 / step, examples=1)
        time.sleep(0.05)
    return {"steps": steps}


@tfyarn.train.custom_train
def probe(ctx, helpers):
    """Write what this task's process looks like to probe.json in its cwd, print numbered lines to stdout and stderr,
    then run until stopped if params say so (the forkserver tests)."""
    import json
    import random
    import sys
    import tempfile

    import numpy as np
    info = {"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "cwd": os.getcwd(),
            "env": dict(os.environ), "stdin": os.readlink("/proc/self/fd/0"), "argv": sys.argv,
            "comm": open("/proc/self/comm").read().strip(), "np_random": float(np.random.random()),
            "random": random.random(), "keras_preloaded": "keras" in sys.modules,
            "tf_imported": "tensorflow" in sys.modules, "tmpdir": tempfile.gettempdir()}
    with open("probe.json", "w") as f:
        json.dump(info, f)
    if helpers.params.get("tf_log"):
        import tensorflow as tf
        tf.get_logger().warning("probe message through the tensorflow logger")
    for i in range(int(helpers.params.get("lines", 0))):
        print(f"probe stdout {i} of {ctx.task_id}", flush=True)
        print(f"probe stderr {i} of {ctx.task_id}", file=sys.stderr, flush=True)
    if helpers.params.get("exit_hooks"):  # an interpreter exit joins non-daemon threads, then runs atexit functions
        import atexit
        import threading
        atexit.register(lambda: open("atexit.txt", "w").write("ran"))

        def late():
            time.sleep(0.5)
            with open("late.txt", "w") as f:
                f.write("ran")
        threading.Thread(target=late, daemon=False).start()
    if helpers.params.get("child"):
        import subprocess
        subprocess.Popen(["sleep", "300"])  # in the task's process group: stopping the task must end it too
    for step in range(1, 100000 if helpers.params.get("run_long") else 2):
        helpers.progress.report(step=step, epoch=0, loss=1.0, examples=1)
        time.sleep(0.05)


@tfyarn.train.custom_train
def allreduce_sum(ctx, helpers):
    """A custom loop on ``helpers.strategy()``: every training task all-reduces its rank + 1, then reports whether
    SIGTERM is still the task's to handle (TF's coordination service installs a handler that swallows it)."""
    import tensorflow as tf
    strategy = helpers.strategy()

    @tf.function
    def total():
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(lambda: tf.constant(float(ctx.data_rank + 1))), axis=None)

    with open("/proc/self/status") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt"))
    return {"sum": float(total()), "replicas": strategy.num_replicas_in_sync, "sigterm_caught": bool(caught >> 14 & 1)}


@tfyarn.train.custom_train
def done_then_linger(ctx, helpers):
    """Trains ``steps`` steps (the job's planned total), committing a real checkpoint file set at ``checkpoint_at``
    (when checkpoint.dir is set), then lingers ``chief_linger_s`` (chief: as a slow final checkpoint would) or
    ``worker_linger_s`` (workers: the chief's summary is written meanwhile) — a job to stop once training is done."""
    from tfyarn.train.progress import publish_total_steps
    p = helpers.params
    steps = int(p.get("steps", 10))
    if ctx.is_chief:
        publish_total_steps(ctx.kv, steps)
    for step in range(1, steps + 1):
        helpers.progress.report(step=step, epoch=0, loss=1.0 / step, examples=10, force=step == steps)
        time.sleep(0.02)
        if ctx.is_chief and step == int(p.get("checkpoint_at", 0)) and helpers.checkpoint_store() is not None:
            prefix = os.path.join(str(ctx.workdir), f"ckpt-{step}")
            for suffix in (".index", ".data-00000-of-00001"):
                with open(prefix + suffix, "wb") as f:
                    f.write(b"fake checkpoint bytes")
            helpers.upload_checkpoint(prefix, step)
    time.sleep(float(p.get("chief_linger_s" if ctx.is_chief else "worker_linger_s", 0)))
    return {"last_checkpoint": f"ckpt-{steps}"} if int(p.get("checkpoint_at", 0)) == steps else {}
