"""The chief's Saver and finiteness check, reading each variable on its ps without a copy.

Why: a variable that took sparse updates is in TF's copy-on-read mode, where each ``ReadVariableOp`` copies it
whole; TF1's Saver reads every variable of a ps at once, so a checkpoint made each ps hold its variables twice
(measured: +782 MiB on a ps of 2 x 409 MB). TF's own no-copy read (``read_value_no_copy``) creates its
``DisableCopyOnRead`` as a dangling op in graph mode, which nothing runs. Here the read waits for it. A sparse update
from another worker between the two turns the copy back on (its read then copies, as before): preflight still
counts a copy of every variable for a checkpointed job (:mod:`tfyarn.train.ps.memory_check`).
"""

from __future__ import annotations

from typing import Any

from tfyarn.train.sharding import checkpoint_key


def read_no_copy(v: Any) -> Any:
    """``v``'s value read on its ps after ``DisableCopyOnRead`` (a variable that is not a resource variable: its own
    ``read_value``)."""
    import tensorflow as tf
    from tensorflow.python.ops import gen_resource_variable_ops

    handle = getattr(v, "handle", None)
    if handle is None or handle.dtype != tf.resource:
        return v.read_value()
    with tf.compat.v1.device(v.device), tf.name_scope("tfyarn_read_no_copy"):
        off = gen_resource_variable_ops.disable_copy_on_read(handle)
        with tf.control_dependencies([off]):
            return gen_resource_variable_ops.read_variable_op(handle, v.dtype.base_dtype)


def saver(variables: list[Any], **kwargs: Any) -> Any:
    """A ``tf.compat.v1.train.Saver`` of ``variables`` writing what TF's would (the same keys and slices: a split
    table's shards as slices of one full tensor) but reading each with :func:`read_no_copy`."""
    import tensorflow as tf
    from tensorflow.python.training.saving.saveable_object_util import ResourceVariableSaveable

    names: dict[str, Any] = {}
    for v in variables:
        info, key = getattr(v, "_save_slice_info", None), checkpoint_key(v)
        read = read_no_copy(v)
        item = ResourceVariableSaveable(read, info.spec if info else "", key) if read.op.type == "ReadVariableOp" else v
        if info is None:
            names[key] = item
        else:  # a shard: one slice of its table's full tensor
            names.setdefault(key, []).append(item)
    return tf.compat.v1.train.Saver(names, **kwargs)
