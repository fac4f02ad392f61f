"""Variables to ps tasks by size (largest first, to the least-loaded ps), not round-robin: round-robin can put two
big embeddings on one ps and make every worker wait on it. The shards of a split
table (:mod:`tfyarn.train.sharding`) are placed the same way, each on a ps that holds no other shard of it."""

from __future__ import annotations

import re
from typing import Any

from tfyarn.train import sharding
from tfyarn.train.model import build_model

_SHARD_RE = re.compile(r"^(.*)(?:/|_)part_\d+$")  # (tfyarn.train.table's; a Keras Embedding's: embeddings_part_0)

_VAR_OPS = ("VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable")


def _op_bytes(op: Any) -> int:
    import tensorflow as tf

    try:
        n = tf.TensorShape(op.get_attr("shape")).num_elements()
        size = tf.as_dtype(op.get_attr("dtype")).size
    except (ValueError, TypeError):
        return 1
    return max(1, (n or 1) * size)


def plan_placement(sizes: dict[str, int], num_ps: int) -> dict[str, int]:
    """Largest-first greedy (LPT): each variable to the ps with the fewest bytes so far, a table's shard to the
    least-loaded ps without another shard of that table (while there is one). name → ps index."""
    loads = [0] * num_ps
    out: dict[str, int] = {}
    used: dict[str, set[int]] = {}  # table → ps holding one of its shards
    for name, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        m = _SHARD_RE.match(name)
        taken = used.setdefault(m.group(1), set()) if m else set()
        free = [j for j in range(num_ps) if j not in taken] or list(range(num_ps))
        i = min(free, key=lambda j: (loads[j], j))
        out[name] = i
        loads[i] += size
        taken.add(i)
    return out


class SizeBalancer:
    """``ps_strategy`` for ``replica_device_setter``: planned variables go where :func:`plan_placement` said; any
    other variable (global step, counters, optimizer variables without a primary) to the least-loaded ps."""

    def __init__(self, num_ps: int, planned: dict[str, int] | None = None):
        self.num_ps = num_ps
        self.planned = dict(planned or {})
        self.loads = [0] * num_ps
        self.placed: dict[str, int] = {}

    def __call__(self, op: Any) -> int:
        least_loaded = min(range(self.num_ps), key=lambda j: (self.loads[j], j))
        if op.type not in _VAR_OPS:
            # accumulators, queues, hash tables: an explicit device scope (the variable's ps) overrides this choice
            return least_loaded
        i = self.planned.get(op.name)
        if i is None:
            i = self._primary(op.name)
        if i is None:
            i = least_loaded
        self.loads[i] += _op_bytes(op)
        self.placed[op.name] = i
        return i

    def _primary(self, name: str) -> int | None:
        """Optimizer slots ('<var>/Adagrad') end up colocated with their variable (TF applies colocation after
        device functions), so account their bytes to the variable's ps."""
        owners = [var for var in self.placed if name.startswith(var + "/")]
        return self.placed[max(owners, key=len)] if owners else None


def variable_sizes(model_factory: Any, policy: sharding.Policy | None = None) -> dict[str, int]:
    """Build the model in a scratch graph (split by ``policy``): op name → bytes of each variable it creates (no
    session, no devices; nothing is initialised, so a big table costs no memory here)."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default(), sharding.sharding(policy, intercept=not sharding.builds_own_tables(model_factory)):
        build_model(model_factory)
        return {op.name: _op_bytes(op) for op in g.get_operations() if op.type in _VAR_OPS}
