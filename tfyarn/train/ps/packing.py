"""Gradients to their ps in one or two tensors instead of one per gradient part.

Why: in ps mode every tensor crossing between a worker and a ps is its own gRPC ``RecvTensor``
call, and on small models those calls, not the math, are the step (BENCHMARKS.md "Keras models":
a 1 ms step in one process took 5-7 ms against a ps, 3-4 ms of it the worker's CPU). A Dense
kernel, its bias and an embedding's sparse gradient (values and indices) are 8 calls for the
recommender; packed they are 2: the float values of every gradient bound for one ps flattened
into one tensor, the indices (after a header of each sparse gradient's row count) into another.
The ps unpacks them beside the variables: the optimizer sees the same gradients.
"""

from __future__ import annotations

from typing import Any


def _groups(gvs: list[tuple[Any, Any]]) -> dict[tuple[str, Any], list[int]]:
    """(ps device, value dtype) → positions of the float gradients (dense or sparse) of variables
    with a static shape: the ones packed."""
    import tensorflow as tf

    out: dict[tuple[str, Any], list[int]] = {}
    for i, (g, v) in enumerate(gvs):
        values = g.values if isinstance(g, tf.IndexedSlices) else g
        if not values.dtype.is_floating or not v.shape.is_fully_defined():
            continue
        out.setdefault((v.device, values.dtype.base_dtype), []).append(i)
    return out


def pack_gradients(gvs: list[tuple[Any, Any]], worker_device: str) -> list[tuple[Any, Any]]:
    """``gvs`` with every group of two or more gradients bound for the same ps sent packed (module
    docstring): the same gradients, in the same order, now produced on their variable's ps."""
    out = list(gvs)
    for (device, dtype), idx in _groups(gvs).items():
        if len(idx) > 1:
            for i, g in zip(idx, _send_group([gvs[i] for i in idx], device, dtype, worker_device)):
                out[i] = (g, gvs[i][1])
    return out


def _send_group(gvs: list[tuple[Any, Any]], device: str, dtype: Any, worker: str) -> list[Any]:
    import tensorflow as tf

    sparse = [isinstance(g, tf.IndexedSlices) for g, _ in gvs]
    n_sparse = sum(sparse)
    with tf.compat.v1.device(worker), tf.name_scope("tfyarn_pack_grads"):
        flat = [tf.reshape(g.values if s else g, [-1]) for (g, _), s in zip(gvs, sparse)]
        floats = tf.concat(flat, 0)
        if n_sparse:  # each sparse gradient's row count, then every one's indices
            ids = [g.indices for (g, _), s in zip(gvs, sparse) if s]
            counts = [tf.shape(i, out_type=tf.int64) for i in ids]
            ints = tf.concat(counts + [tf.cast(i, tf.int64) for i in ids], 0)
    with tf.compat.v1.device(device), tf.name_scope("tfyarn_unpack_grads"):  # on the ps
        if n_sparse:
            rows = ints[:n_sparse]
            indices = tf.split(ints[n_sparse:], rows, num=n_sparse)
        sizes, k = [], 0
        for (_, v), s in zip(gvs, sparse):
            if s:
                sizes.append(rows[k] * v.shape[1:].num_elements())
                k += 1
            else:
                sizes.append(tf.constant(v.shape.num_elements(), tf.int64))
        parts = tf.split(floats, tf.stack(sizes), num=len(gvs))
        out, k = [], 0
        for (g, v), s, part in zip(gvs, sparse, parts):
            if not s:
                out.append(tf.reshape(part, v.shape))
                continue
            values = tf.reshape(part, [-1, *v.shape[1:].as_list()])
            i = indices[k] if g.indices.dtype == tf.int64 else tf.cast(indices[k], g.indices.dtype)
            out.append(tf.IndexedSlices(values, i, tf.constant(v.shape.as_list(), tf.int64)))
            k += 1
    return out
