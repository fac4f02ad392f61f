"""The ps chief's checkpoints: when one is due, saving (never a non-finite one), the counters that make a resume
exact, and finding what to restore."""

from __future__ import annotations

import logging
from typing import Any

from tfyarn.train import helpers, sharding
from tfyarn.train.checkpoint import PeriodicCheckpoints, check_fits, check_model_fits, local_dir_for, warm_start_source
from tfyarn.train.progress import NonFiniteLoss
from tfyarn.train.ps.graph import TrainGraph

log = logging.getLogger("tfyarn.train.ps")


class Checkpointer(PeriodicCheckpoints):
    """The ps chief's checkpoints: a Saver writes to local scratch in the step loop, the upload runs beside it."""

    def __init__(self, ctx: Any, tg: TrainGraph, steps: list[int]):
        super().__init__(ctx.spec, chief=True)
        self.ctx, self.tg, self.steps = ctx, tg, steps
        self.local = local_dir_for(ctx.workdir, "save") if self.store else None
        self.resumed_from: str | None = None  # the checkpoint the chief restored, for the summary
        self.resumed_step: int | None = None  # its global step (the name's may be older in async mode)
        self.warm_started_from: str | None = None  # checkpoint.init_from's checkpoint, for the summary

    def restore_prefix(self) -> str | None:
        """Download the latest checkpoint (if any) for the chief to restore from."""
        entry = self.store.latest() if self.store else None
        if self.store is None or entry is None:
            return None
        prefix = self.store.download(entry, local_dir_for(self.ctx.workdir, "restore"))
        import tensorflow as tf

        expected = {  # the Saver's list: every global variable of the graph (a shard: its table's full tensor)
            sharding.checkpoint_key(v): sharding.checkpoint_shape(v)
            for v in self.tg.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        }
        check_fits(prefix, expected, f"{entry['name']} in {self.store.url}")
        log.info("%s: resuming from %s (global step %d)", self.ctx.task_id, entry["name"], entry["global_step"])
        self.resumed_from = entry["name"]
        self.resumed_step = int(entry["global_step"])
        return prefix

    def warm_start_fn(self) -> Any:
        """With ``checkpoint.init_from`` and nothing to resume from: ``init_fn(sess)`` for the session manager, which
        runs it right after the variables' initialisation and never on a restore. It loads the model's variables
        from init_from's latest checkpoint (by creation order, shapes checked first); everything else starts afresh.
        None when there is no warm start."""
        src = warm_start_source(self.ctx.spec, self.ctx.workdir)
        if src is None:
            return None
        prefix, entry, keys = src
        what = f"{entry['name']} in {entry['url']} (checkpoint.init_from)"
        check_model_fits(prefix, self.tg.model_vars, keys, what)
        self.warm_started_from = f"{entry['url']}/{entry['name']}"

        def init_fn(sess: Any) -> None:
            import tensorflow as tf

            reader = tf.train.load_checkpoint(prefix)
            for key, var in zip(keys, self.tg.model_vars):
                # the variable's initializer fed with the value: no new op in the finalized graph (Variable.load);
                # a split table: each shard its rows of the full tensor, whatever the writer's number of ps
                value = reader.get_tensor(key)
                for shard, rows in sharding.shard_slices(var, value):
                    sess.run(shard.initializer, feed_dict={shard.initializer.inputs[1]: rows})
            log.info("%s: model variables initialised from %s", self.ctx.task_id, what)

        return init_fn

    def save(self, sess: Any, final: bool = False) -> dict[str, Any] | None:
        """Write a checkpoint of the current step: see :meth:`PeriodicCheckpoints.commit`."""
        if self.uploads is None or self.local is None:  # (both set with a checkpoint dir)
            return None
        if final:
            self.uploads.wait()
        import tensorflow as tf

        gs = int(sess.run(self.tg.global_step))
        if gs == self.last_step:
            return None
        prefix = self.tg.saver.save(
            sess, str(self.local / "ckpt"), global_step=gs, write_meta_graph=False, write_state=False
        )
        # Async: another worker's diverged update may have reached the ps after this task's last (finite) loss. A NaN
        # never leaves a variable once in it (every later update keeps it), so variables finite *after* the save
        # were finite during it; otherwise the files are not committed and the last committed checkpoint stays good.
        if self.ctx.spec.fail_on_nan_loss and not sess.run(self.tg.all_finite):
            raise NonFiniteLoss(
                f"{self.ctx.task_id}: the model's variables hold NaN/inf after the checkpoint at "
                f"global step {gs} was written (a worker's update diverged): not committed, the "
                f"latest committed checkpoint is the last good one"
            )
        # Async workers keep stepping while the Saver reads the ps: the counters in the files can be a step or two
        # past what was read above. The index must describe what was saved, so read them back from the files.
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        gs = int(reader.get_tensor(self.tg.global_step.op.name))
        ws = [int(x) for x in reader.get_tensor(self.tg.worker_steps.op.name)]
        ws = [gs] * len(ws) if self.ctx.spec.sync else ws
        meta = {
            "format": "v1-saver",
            "model_variables": self.tg.model_var_keys,
            "worker_steps": ws,
            "epoch": helpers.position(min(ws), self.steps)[0],
            "mode": "ps",
            "sync": self.ctx.spec.sync,
        }
        return self.commit(prefix, gs, meta, final)
