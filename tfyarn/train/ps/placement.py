"""Variables to ps tasks by size (largest first, to the least-loaded ps), not round-robin: round-robin can put two
big embeddings on one ps and make every worker wait on it (seed 001's fast-worker problem)."""

from __future__ import annotations

from typing import Any

from tfyarn.train.model import build_model

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
    """Largest-first greedy (LPT): each variable to the ps with the fewest bytes so far. name → ps index."""
    loads = [0] * num_ps
    out = {}
    for name, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        i = min(range(num_ps), key=lambda j: (loads[j], j))
        out[name] = i
        loads[i] += size
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


def variable_sizes(model_factory: Any) -> dict[str, int]:
    """Build the model in a scratch graph: op name → bytes of each variable it creates (no session, no devices)."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        build_model(model_factory)
        return {op.name: _op_bytes(op) for op in g.get_operations() if op.type in _VAR_OPS}
