"""Big variables split by rows over the ps (ps mode): each shard its own variable on its own ps, so a table larger
than one ps fits, and a lookup gathers on the shards' ps, moving only the rows a batch touches.

Why TF1's ``PartitionedVariable``: ``tf.nn.embedding_lookup`` and ``tf.nn.safe_embedding_lookup_sparse`` take one
and gather each shard where it lives (``colocate_with`` the shard), the gradient of each shard stays an
``IndexedSlices`` that the v1 optimizers apply to its rows on the ps, and the Saver writes the shards as slices of
one full tensor (``save_slice_info``), which any other number of shards reads back. :class:`ShardedVariable` adds
``sparse_read``, which ``tf.gather`` calls, so ``tf.gather(table, ids)`` gathers on the shards too.

The shards follow ``partition_strategy="div"`` (TF2's ``tf.nn.embedding_lookup``): shard ``i`` holds a contiguous
block of rows, the first ``rows % n`` shards one row more. How many shards a variable gets is a :class:`Policy`
(the spec's ``ps:`` section); outside ps mode (allreduce, the evaluator, an export) there is none and every
variable stays whole, so one model definition serves everywhere.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

_state = threading.local()


#: The most bytes one shard holds, whatever ``max_shards`` says. Why: TF's gRPC refuses a tensor over 2 GiB
#: (``Cannot encode a Tensor that exceeds the 2GB protobuf limit``), and the chief's Saver, its warm start and
#: any whole read move each variable between its ps and the chief in one tensor.
MAX_SHARD_BYTES = 2**30


@dataclass(frozen=True)
class Policy:
    """Which variables are split, in how many shards: a variable of ``min_bytes`` or more with at least 2 rows,
    in ``min(max_shards, rows)`` shards (``max_shards`` defaults to the number of ps), and any variable in enough
    shards that none holds more than ``max_shard_bytes`` (two shards may then share a ps)."""

    min_bytes: int
    max_shards: int
    max_shard_bytes: int = MAX_SHARD_BYTES

    def shards(self, shape: Any, dtype: Any) -> int:
        import tensorflow as tf

        shape = tf.TensorShape(shape)
        if shape.rank is None or shape.rank < 1 or not shape.is_fully_defined():
            return 1
        nbytes = shape.num_elements() * tf.as_dtype(dtype).size
        wanted = min(self.max_shards, shape[0]) if self.max_shards >= 2 and nbytes >= self.min_bytes else 1
        pieces = -(-nbytes // self.max_shard_bytes)
        return min(shape[0], max(wanted, pieces))

    def is_big(self, shape: Any, dtype: Any) -> bool:
        """Whether a fully defined variable of ``shape`` reaches ``min_bytes`` (split or not)."""
        import tensorflow as tf

        shape = tf.TensorShape(shape)
        return shape.is_fully_defined() and shape.num_elements() * tf.as_dtype(dtype).size >= self.min_bytes


class TooBigForPs(ValueError):
    """Weights ps mode would hold over :data:`MAX_SHARD_BYTES` in one piece; ``lines``: one per weight."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def refuse_too_big(variables: list[Any], keras: bool) -> None:
    """Raise :class:`TooBigForPs` if any of ``variables`` (built under the ps policy: a split table's shards) holds
    more than :data:`MAX_SHARD_BYTES`: a Keras weight other than an Embedding's (never split), or a variable whose
    rows are too big to cut it small enough (ps mode splits by rows). Shapes only, nothing allocated: run before
    the session starts (preflight's ps sizing and Keras check, each ps-mode task), since such a job would fail late
    in TF's gRPC, or hang or run out of memory, after its tasks started."""
    limit, lines, seen = MAX_SHARD_BYTES, list[str](), set[int]()
    for v in variables:
        nbytes = v.shape.num_elements() * v.dtype.size if v.shape.is_fully_defined() else 0
        table = getattr(v, "_tfyarn_table", None)
        whole = v if table is None else table  # (a shard: its table)
        if nbytes <= limit or id(whole) in seen:
            continue
        seen.add(id(whole))
        shape = [int(d) for d in whole.get_shape()]  # (a TensorShape, or a split table's list)
        name = v.op.name if whole is v else whole.name
        size = _size(math.prod(shape) * v.dtype.size, limit)
        what = f"model: weight {name} is {size} ({' x '.join(map(str, shape))} {v.dtype.base_dtype.name}) and ps mode"
        why = f"over the {_size(limit)} it allows a variable (TF's gRPC moves no tensor over 2 GiB; checkpoints move "
        why += "each ps variable in one piece)"
        if keras and whole is v:
            lines.append(
                f"{what} would keep it whole on one ps, {why}: ps mode splits only Embedding tables, so make it a "
                f"keras.layers.Embedding if it is a lookup table, make the layer smaller, or train with mode: "
                f"allreduce (no ps)"
            )
        else:
            lines.append(
                f"{what}, which splits by rows ({shape[0]} here), would keep {_size(nbytes, limit)} of it in one "
                f"piece on a ps, {why}: give it more, shorter rows (a lookup table: tfyarn.train.table with a row "
                f"per id), make it smaller, or train with mode: allreduce (no ps)"
            )
    if lines:
        raise TooBigForPs(lines)


def _size(n: int, limit: int | None = None) -> str:
    """``n`` bytes in GiB, MiB or KiB (2 decimals at most); in bytes if it would read as ``limit`` but is not."""
    text = f"{n:,} bytes"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            text = f"{n / scale:.2f}".rstrip("0").rstrip(".") + f" {unit}"
            break
    return f"{n:,} bytes" if limit is not None and n != limit and text == _size(limit) else text


def policy_for(spec: Any, num_ps: int) -> Policy:
    """The spec's ``ps:`` section for a job of ``num_ps`` ps."""
    ps = spec.ps
    return Policy(int(ps.min_shard_size), int(ps.max_shards or num_ps), MAX_SHARD_BYTES)  # (read now: tests lower it)


def current() -> Policy | None:
    """The policy in force (None: every variable whole)."""
    return getattr(_state, "policy", None)


def row_splits(rows: int, n: int) -> list[int]:
    """Rows of each of ``n`` shards in the "div" layout: the first ``rows % n`` get one more."""
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


@functools.cache
def _sharded_class() -> type:
    """:class:`ShardedVariable`, made on first use (its base class is TensorFlow's: no TF import at module load)."""
    from tensorflow.python.ops.variables import PartitionedVariable

    class ShardedVariable(PartitionedVariable):
        """A PartitionedVariable split by rows ("div") that ``tf.gather`` reads shard by shard on the ps."""

        def sparse_read(self, indices: Any, name: str | None = None) -> Any:
            import tensorflow as tf

            return tf.nn.embedding_lookup(list(self), indices, name=name)

        @property
        def shards(self) -> list[Any]:
            return list(self)

        @property
        def trainable(self) -> bool:
            return all(v.trainable for v in self)

        @property
        def op(self) -> Any:  # (the first shard's: code that names variables by ``v.op.name`` gets the table's)
            return SimpleNamespace(name=self.name)

    return ShardedVariable


def builds_own_tables(model: Any) -> bool:
    """Whether ``model`` splits its tables itself (the Keras adapter: its embeddings), so no ``tf.Variable`` of its
    build may be intercepted (Keras wraps each in objects of its own)."""
    return bool(getattr(model, "tfyarn_shards_itself", False))


def is_sharded(v: Any) -> bool:
    return _sharded_class.cache_info().currsize > 0 and isinstance(v, _sharded_class())


def checkpoint_key(v: Any) -> str:
    """The key a Saver writes ``v`` under: a table's (or a shard's) full name, else the variable's op name."""
    if is_sharded(v):
        return v.name
    info = getattr(v, "_save_slice_info", None)
    return info.full_name if info is not None else v.op.name


def checkpoint_shape(v: Any) -> list[int]:
    """The shape ``v`` has in a checkpoint: a table's (or a shard's) full shape."""
    info = getattr(v, "_save_slice_info", None) if not is_sharded(v) else None
    return list(info.full_shape) if info is not None else list(v.shape)  # (a split table's shape is a list)


def flatten(variables: list[Any]) -> list[Any]:
    """Tables replaced by their shards (what an optimizer, a Saver or an initializer takes)."""
    return [s for v in variables for s in (v.shards if is_sharded(v) else [v])]


def shard_slices(v: Any, value: Any) -> list[tuple[Any, Any]]:
    """(variable, its part of ``value``) for each shard of ``v`` (a whole variable: itself and all of ``value``)."""
    if not is_sharded(v):
        return [(v, value)]
    out = []
    for s in v.shards:
        info = s._save_slice_info
        out.append((s, value[tuple(slice(o, o + n) for o, n in zip(info.var_offset, info.var_shape))]))
    return out


def make_sharded(name: str, shape: Any, dtype: Any, n: int, create: Callable[[int, list[int], list[int]], Any]) -> Any:
    """A :class:`ShardedVariable` ``name`` of ``shape`` in ``n`` row shards; ``create(i, offset, shard_shape)``
    makes shard ``i`` (a ``tf.Variable`` named ``<name>/part_<i>``)."""
    import tensorflow as tf
    from tensorflow.python.ops.variables import Variable

    shape = tf.TensorShape(shape).as_list()
    parts, offset = [], 0
    for i, rows in enumerate(row_splits(shape[0], n)):
        shard_shape = [rows, *shape[1:]]
        start = [offset] + [0] * (len(shape) - 1)
        v = create(i, start, shard_shape)
        v._set_save_slice_info(Variable.SaveSliceInfo(name, shape, start, shard_shape))
        parts.append(v)
        offset += rows
    table = _sharded_class()(name, shape, tf.as_dtype(dtype), parts, [n] + [1] * (len(shape) - 1))
    for v in parts:
        v._tfyarn_table = table  # (for :func:`tables`: creators see shards)
    return table


def tables(created: list[Any]) -> list[Any]:
    """Variables as created (a variable creator sees shards), each split table's shards replaced by the table."""
    out, seen = [], set()
    for v in created:
        t = getattr(v, "_tfyarn_table", None)
        if t is None:
            out.append(v)
        elif id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def table(name: str, shape: Any, initializer: Any = None, dtype: Any = "float32", trainable: bool = True) -> Any:
    """Declare an embedding table in :meth:`Model.build`: under ps mode's policy a table of ``ps.min_shard_size``
    or more is split by rows over the ps, each shard initialised where it lives (``initializer(shape, dtype)`` of
    the shard: nothing of the full table on the worker); elsewhere a plain ``tf.Variable``. Read it with
    ``tf.nn.embedding_lookup``, ``tf.nn.safe_embedding_lookup_sparse`` or ``tf.gather``."""
    import tensorflow as tf

    init = initializer or tf.random_normal_initializer(stddev=0.05)
    dtype = tf.as_dtype(dtype)
    pol = current()
    n = pol.shards(shape, dtype) if pol is not None else 1
    with _suspended():  # (the creator would compute a callable's value on the worker; TF colocates it with the var)
        if n < 2:
            return tf.Variable(lambda: init(shape, dtype), name=name, dtype=dtype, trainable=trainable)

        def create(i: int, start: list[int], shard_shape: list[int]) -> Any:
            shard_init = shard_initializer(init, i)
            return tf.Variable(
                lambda: shard_init(shard_shape, dtype), name=f"{name}/part_{i}", dtype=dtype, trainable=trainable
            )

        return make_sharded(_scoped(name), shape, dtype, n, create)


def shard_initializer(init: Any, i: int) -> Any:
    """``init`` for shard ``i``: a seeded initializer gets seed + i (else every shard of a table, seeded alike and
    of one shape, would start as the same rows); an unseeded one a fresh instance (Keras 3 fixes a seed per
    instance). Anything without a config is used as it is."""
    if i == 0 or not (hasattr(init, "get_config") and hasattr(type(init), "from_config")):
        return init
    config = dict(init.get_config())
    if isinstance(config.get("seed"), int):
        config["seed"] += i
    try:
        return type(init).from_config(config)
    except (TypeError, ValueError):
        return init


def _scoped(name: str) -> str:
    """``name`` under the graph's current name scope, as a variable's op would be named."""
    import tensorflow as tf

    scope = tf.compat.v1.get_default_graph().get_name_scope()
    return f"{scope}/{name}" if scope else name


@contextlib.contextmanager
def _suspended() -> Iterator[None]:
    old = getattr(_state, "active", False)
    _state.active = False
    try:
        yield
    finally:
        _state.active = old


@contextlib.contextmanager
def sharding(policy: Policy | None, intercept: bool = True) -> Iterator[None]:
    """Put ``policy`` in force (for :func:`table` and Keras embeddings); with ``intercept`` also split any
    ``tf.Variable(initial_value)`` the policy says to (the initial value computed whole, then sliced: a model that
    keeps its tables below one worker's memory may stay as written; :func:`table` avoids the copy)."""
    import tensorflow as tf

    old = current(), getattr(_state, "active", False)
    _state.policy, _state.active = policy, intercept and policy is not None

    def creator(next_creator: Callable[..., Any], **kw: Any) -> Any:
        if not getattr(_state, "active", False) or policy is None:
            return next_creator(**kw)
        return _maybe_split(policy, next_creator, kw)

    try:
        with tf.variable_creator_scope(creator):
            yield
    finally:
        _state.policy, _state.active = old


def _maybe_split(policy: Policy, next_creator: Callable[..., Any], kw: Any) -> Any:
    import tensorflow as tf

    value = kw.get("initial_value")
    if not callable(value) and not tf.is_tensor(value):  # a Python or NumPy value: its Const made on the ps too
        kw = {**kw, "initial_value": functools.partial(_identity, value)}
        value = kw["initial_value"]
    if callable(value):
        known = _callable_value_type(value, kw)
        if known is not None and policy.shards(*known) < 2:
            # kept whole, the callable left to TF: its ops colocated with the variable, on its ps (called here, the
            # value would be computed on the worker and sent: over 2 GB, gRPC refuses it)
            return next_creator(**kw)
        value = value()
    dtype = kw.get("dtype")
    value = tf.convert_to_tensor(value, dtype=dtype)
    n = policy.shards(value.shape, value.dtype)
    if n < 2:
        return next_creator(**{**kw, "initial_value": value})
    name = (kw.get("name") or "Variable").split(":")[0]
    full = _scoped(name)
    rest = {k: v for k, v in kw.items() if k not in ("initial_value", "name", "shape")}

    def create(i: int, start: list[int], shard_shape: list[int]) -> Any:
        piece = tf.slice(value, start, shard_shape)
        return next_creator(**{**rest, "initial_value": piece, "name": f"{name}/part_{i}"})

    with _suspended():
        return make_sharded(full, value.shape, value.dtype, n, create)


def _identity(value: Any) -> Any:
    return value


def _callable_value_type(value: Callable[[], Any], kw: Any) -> tuple[Any, Any] | None:
    """(shape, dtype) of what a variable's callable initial value makes, learnt by building it in a scratch graph
    (nothing runs); None when it cannot be built there (it reads the model's graph, say)."""
    import tensorflow as tf

    try:
        with tf.Graph().as_default():
            t = tf.convert_to_tensor(value(), dtype=kw.get("dtype"))
    except Exception:  # noqa: BLE001 - whatever the user's callable raises away from its graph: build it in place
        return None
    return t.shape, t.dtype


def touched_rows_only(opt: Any) -> Any:
    """``opt`` updating a split table's touched rows only. All v1 optimizers do already but Adam, whose sparse
    update decays both moments and moves every row of the variable each step (work on the ps growing with the
    table, not the batch): on a shard it becomes lazy, as TF Addons' LazyAdam (a row's moments and value change
    only in the steps that look it up). Other variables keep Adam's own update."""
    import tensorflow as tf

    if type(opt) is not tf.compat.v1.train.AdamOptimizer:
        return opt
    opt.__class__ = _lazy_adam_class()
    return opt


@functools.cache
def _lazy_adam_class() -> type:
    import tensorflow as tf

    class LazyAdamOnShards(tf.compat.v1.train.AdamOptimizer):
        def _resource_apply_sparse(self, grad: Any, var: Any, indices: Any) -> Any:
            if getattr(var, "_tfyarn_table", None) is None:
                return super()._resource_apply_sparse(grad, var, indices)
            # (indices are unique here: Optimizer._resource_apply_sparse_duplicate_indices summed the duplicates)
            b1p, b2p = (tf.cast(p, var.dtype.base_dtype) for p in self._get_beta_accumulators())
            lr = tf.cast(self._lr_t, var.dtype.base_dtype)
            b1 = tf.cast(self._beta1_t, var.dtype.base_dtype)
            b2 = tf.cast(self._beta2_t, var.dtype.base_dtype)
            eps = tf.cast(self._epsilon_t, var.dtype.base_dtype)
            lr = lr * tf.sqrt(1 - b2p) / (1 - b1p)
            m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
            m_rows = b1 * tf.gather(m, indices) + (1 - b1) * grad
            v_rows = b2 * tf.gather(v, indices) + (1 - b2) * tf.square(grad)
            m_up = m.scatter_update(tf.IndexedSlices(m_rows, indices))
            v_up = v.scatter_update(tf.IndexedSlices(v_rows, indices))
            step = lr * m_rows / (tf.sqrt(v_rows) + eps)
            return tf.group(var.scatter_sub(tf.IndexedSlices(step, indices)), m_up, v_up)

    return LazyAdamOnShards


@contextlib.contextmanager
def keras_tables(keras: Any, policy: Policy | None) -> Iterator[None]:
    """While a Keras model is built in ps mode's graph: an ``Embedding`` whose table the policy splits creates its
    shards instead of one weight (``embeddings_part_<i>``, Keras weights like any other) and looks ids up with
    ``tf.nn.embedding_lookup`` on them (on the shards' ps); its :class:`ShardedVariable` is ``layer.tfyarn_table``.
    A table kept whole is looked up the same way, on its ps (``layer.tfyarn_table`` is its ``tf.Variable``).
    Why: Keras reads an Embedding's whole table into the step (``ops.take`` of a dense read), shipping it from the
    ps to the worker every step. Any other layer, and every table below ``ps.min_shard_size``, is left as Keras
    makes it."""
    if policy is None:
        yield
        return
    original = keras.layers.Embedding.build

    def build(self: Any, input_shape: Any = None) -> Any:
        if self.built:
            return None
        dtype = getattr(self, "variable_dtype", None) or self.dtype or "float32"
        shape = (int(self.input_dim), int(self.output_dim))
        n = policy.shards(shape, dtype)
        if getattr(self, "quantization_mode", None) or getattr(self, "lora_rank", None):
            return original(self, input_shape)
        keras_init = self.embeddings_initializer
        init = tf_twin(keras_init) if policy.is_big(shape, dtype) else keras_init
        if n < 2:  # whole, but looked up on its ps too (Keras would read the whole table into the step)
            self.embeddings_initializer = init
            try:
                original(self, input_shape)
            finally:
                self.embeddings_initializer = keras_init
            w = getattr(self, "_embeddings", None)
            w = self.embeddings if w is None else w
            self.tfyarn_table = as_tf_variable(w)
            self.call = _sharded_call(self)
            return None
        weights = [
            self.add_weight(
                shape=(rows, shape[1]),
                initializer=shard_initializer(init, i),
                name=f"embeddings_part_{i}",
                dtype=dtype,
                trainable=True,
            )
            for i, rows in enumerate(row_splits(shape[0], n))
        ]
        shards = [as_tf_variable(w) for w in weights]
        full = shards[0].op.name.rsplit("_part_0", 1)[0]
        self.tfyarn_table = make_sharded(full, shape, dtype, n, lambda i, start, shard_shape: shards[i])
        self.call = _sharded_call(self)
        self.built = True
        return None

    with _embedding_build(keras, build):
        yield


def tf_twin(init: Any) -> Any:
    """TF's own initializer for a Keras random one (same distribution, bounds and seed), else ``init``. Why: Keras's
    stateless random ops hold a second copy of the value while it is made (measured: a 976 MiB table's init took
    2022 MiB on its ps, TF's 1013), and a big table's ps has no room for it."""
    import tensorflow as tf

    config = init.get_config() if hasattr(init, "get_config") else {}
    seed = config.get("seed") if isinstance(config.get("seed"), int) else None
    kind = type(init).__name__
    if kind == "RandomUniform":
        return tf.random_uniform_initializer(config["minval"], config["maxval"], seed)
    if kind == "RandomNormal":
        return tf.random_normal_initializer(config["mean"], config["stddev"], seed)
    return init


@contextlib.contextmanager
def stub_tables(keras: Any) -> Iterator[None]:
    """While a Keras model is made eagerly only to be read (its compiled optimizer's config): every ``Embedding``
    builds a one-row table. Why: an eager weight is allocated at once, and a ps-mode worker or preflight would hold
    whole the tables the ps are there to split; the layer's output shape does not depend on its rows."""
    original = keras.layers.Embedding.build

    def build(self: Any, input_shape: Any = None) -> Any:
        rows, self.input_dim = self.input_dim, 1
        try:
            return original(self, input_shape)
        finally:
            self.input_dim = rows

    with _embedding_build(keras, build):
        yield


@contextlib.contextmanager
def _embedding_build(keras: Any, build: Callable[..., Any]) -> Iterator[None]:
    """Keras's ``Embedding.build`` replaced by ``build`` while the block runs, put back after."""
    cls = keras.layers.Embedding
    original = cls.build
    cls.build = build
    try:
        yield
    finally:
        cls.build = original


def as_tf_variable(w: Any) -> Any:
    """A Keras weight → its ``tf.Variable`` (Keras 3 wraps one in ``.value``; Keras 2 weights are tf.Variables)."""
    import tensorflow as tf

    return w if isinstance(w, tf.Variable) or not hasattr(w, "value") else w.value


def _sharded_call(layer: Any) -> Callable[..., Any]:
    def call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        ids = inputs if inputs.dtype in (tf.int32, tf.int64) else tf.cast(inputs, tf.int64)
        out = tf.nn.embedding_lookup(layer.tfyarn_table, ids)
        dtype = getattr(layer, "compute_dtype", None)
        return tf.cast(out, dtype) if dtype and out.dtype != dtype else out

    return call
