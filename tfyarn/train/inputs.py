"""The model's inputs per spec feature, in each place a batch enters TF: allreduce's step signature,
ps mode's placeholders, export's serving signature.

A variable-length feature (``shape: [null]``) reaches the model as a ``tf.SparseTensor`` [B, longest
list in the batch] — what ``tf.io.parse_example`` gives for a ``VarLenFeature``, so
``tf.nn.safe_embedding_lookup_sparse`` and other embedding code work unchanged; with ``pad_to: N``
it is a dense [B, N] tensor. The feeder's batch holds a :class:`tfyarn.data.ragged.SparseValue`
(indices, values, dense_shape) for it. Why placeholders per component in ps mode:
``Session.make_callable`` feeds only plain tensors, and a SparseTensor built from three placeholders
is what ``tf.compat.v1.sparse_placeholder`` is. Why components in the serving signature: a
SavedModel signature's inputs are flat named tensors (a SparseTensorSpec there is flattened under
generated names), so ``hist`` is served as ``hist_indices``, ``hist_values``, ``hist_dense_shape`` —
TF Serving's convention for sparse inputs.
"""

from __future__ import annotations

from typing import Any

SPARSE_PARTS = ("indices", "values", "dense_shape")


def tf_dtype(name: str) -> Any:
    """Spec dtype name → tf.DType (``bytes`` and ``string`` are both tf.string)."""
    import tensorflow as tf

    return tf.as_dtype("string" if name == "bytes" else name)


def is_sparse(f: Any) -> bool:
    return getattr(f, "varlen", False) and getattr(f, "pad_to", None) is None


def dims(f: Any) -> tuple[int, ...]:
    """A dense feature's dimensions after the batch: its shape, or (pad_to,) for a padded
    variable-length one."""
    return (f.pad_to,) if getattr(f, "varlen", False) else tuple(f.shape)


def spec_of(f: Any, batch_size: int | None, name: str) -> Any:
    """The TypeSpec of one feature's batch."""
    import tensorflow as tf

    if is_sparse(f):
        return tf.SparseTensorSpec([batch_size, None], tf_dtype(f.dtype))
    return tf.TensorSpec((batch_size, *dims(f)), tf_dtype(f.dtype), name=name)


def to_tensors(batch: dict[str, Any], signature: dict[str, Any]) -> dict[str, Any]:
    """A feeder batch → tensors of the signature's dtypes (SparseTensor for sparse specs)."""
    import tensorflow as tf

    out = {}
    for k, spec in signature.items():
        v = batch[k]
        if isinstance(spec, tf.SparseTensorSpec):
            out[k] = tf.SparseTensor(*map(tf.convert_to_tensor, v, (tf.int64, spec.dtype, tf.int64)))
        else:
            out[k] = tf.convert_to_tensor(v, dtype=spec.dtype)
    return out


def placeholders(features: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """ps mode: ``({name: placeholder or SparseTensor}, {name: the placeholders to feed, in
    order})``."""
    import tensorflow as tf

    model_in, feeds = {}, {}
    for name, f in features.items():
        if is_sparse(f):
            parts = [
                tf.compat.v1.placeholder(tf.int64, [None, 2], name=f"in_{name}_indices"),
                tf.compat.v1.placeholder(tf_dtype(f.dtype), [None], name=f"in_{name}_values"),
                tf.compat.v1.placeholder(tf.int64, [2], name=f"in_{name}_dense_shape"),
            ]
            model_in[name], feeds[name] = tf.SparseTensor(*parts), parts
        else:
            p = tf.compat.v1.placeholder(tf_dtype(f.dtype), [None, *dims(f)], name=f"in_{name}")
            model_in[name], feeds[name] = p, [p]
    return model_in, feeds


def feed_values(batch: dict[str, Any], names: list[str], feeds: dict[str, list[Any]]) -> list[Any]:
    """The values to feed ``[p for n in names for p in feeds[n]]`` from a feeder batch."""
    out: list[Any] = []
    for n in names:
        out.extend(batch[n] if len(feeds[n]) == 3 else (batch[n],))
    return out


def serving_signature(features: dict[str, Any], exclude: str | None) -> dict[str, Any]:
    """Flat, named TensorSpecs of the serving function (sparse features as their three
    components)."""
    import tensorflow as tf

    out = {}
    for name, f in features.items():
        if name == exclude:
            continue
        if is_sparse(f):
            out[f"{name}_indices"] = tf.TensorSpec([None, 2], tf.int64, name=f"{name}_indices")
            out[f"{name}_values"] = tf.TensorSpec([None], tf_dtype(f.dtype), name=f"{name}_values")
            out[f"{name}_dense_shape"] = tf.TensorSpec([2], tf.int64, name=f"{name}_dense_shape")
        else:
            out[name] = spec_of(f, None, name)
    return out


def from_serving(flat: dict[str, Any], features: dict[str, Any], exclude: str | None) -> dict[str, Any]:
    """The model's inputs from the serving function's flat inputs."""
    import tensorflow as tf

    return {
        name: tf.SparseTensor(*(flat[f"{name}_{p}"] for p in SPARSE_PARTS)) if is_sparse(f) else flat[name]
        for name, f in features.items()
        if name != exclude
    }
