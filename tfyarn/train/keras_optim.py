"""ps mode's ``tf.compat.v1.train`` equivalent of a compiled Keras optimizer, same hyperparameters.

Why: ps mode is a TF1 graph, and Keras optimizers (Keras 3 and tf_keras's non-legacy ones) do not update there
(``apply_gradients`` returns a Variable, or runs and changes nothing: ../shared/NOTES.md). The v1 optimizers do, on
the ps, with their slots placed beside each variable. What cannot be mapped faithfully is refused at build, before
any step, naming what is supported (:data:`SUPPORTED`).
"""

from __future__ import annotations

import numbers
from typing import Any

#: Keras optimizer class → what ps mode runs for it.
SUPPORTED = {
    "SGD": "GradientDescentOptimizer / MomentumOptimizer (momentum, nesterov)",
    "Adagrad": "AdagradOptimizer",
    "Adam": "AdamOptimizer",
    "RMSprop": "RMSPropOptimizer",
    "Ftrl": "FtrlOptimizer",
}

#: Options with no v1 counterpart: set, they are refused (a silent difference would train another model).
_UNMAPPED = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema", "amsgrad", "loss_scale_factor")


#: Keras optimizer → (its v1 twin, {v1 argument: (Keras option, default)}) besides the learning rate; a value is
#: taken as its default's type. SGD is apart: its twin depends on ``momentum``.
_TWINS: dict[str, tuple[str, dict[str, tuple[str, Any]]]] = {
    "Adagrad": ("AdagradOptimizer", {"initial_accumulator_value": ("initial_accumulator_value", 0.1)}),
    "Adam": ("AdamOptimizer", {"beta1": ("beta_1", 0.9), "beta2": ("beta_2", 0.999), "epsilon": ("epsilon", 1e-7)}),
    "RMSprop": (
        "RMSPropOptimizer",
        {
            "decay": ("rho", 0.9),
            "momentum": ("momentum", 0.0),
            "epsilon": ("epsilon", 1e-7),
            "centered": ("centered", False),
        },
    ),
    "Ftrl": (
        "FtrlOptimizer",
        {  # the same names in both
            arg: (arg, default)
            for arg, default in (
                ("learning_rate_power", -0.5),
                ("initial_accumulator_value", 0.1),
                ("l1_regularization_strength", 0.0),
                ("l2_regularization_strength", 0.0),
                ("l2_shrinkage_regularization_strength", 0.0),
                ("beta", 0.0),
            )
        },
    ),
}


class UnsupportedOptimizer(ValueError):
    """The compiled optimizer (or one of its options) has no ps-mode equivalent."""


def optimizer_config(opt: Any) -> tuple[str, dict[str, Any]]:
    """(class name, ``get_config()``) of a Keras optimizer; call it eagerly (Keras 3 reads its variables)."""
    return type(opt).__name__, dict(opt.get_config())


def v1_equivalent(name: str, config: dict[str, Any], ref: str = "model") -> Any:
    """The v1 optimizer doing what Keras optimizer ``name`` with ``config`` (:func:`optimizer_config`) would;
    :class:`UnsupportedOptimizer` otherwise."""
    import tensorflow as tf

    v1, c, lr = tf.compat.v1.train, config, config.get("learning_rate")
    try:
        if name not in SUPPORTED:
            raise UnsupportedOptimizer(f"{name} has no ps-mode equivalent")
        if not isinstance(lr, numbers.Real):
            raise UnsupportedOptimizer(
                f"learning_rate {lr!r}: ps mode takes a constant learning rate (a schedule has no v1 equivalent here)"
            )
        for key in _UNMAPPED:
            if c.get(key) not in (None, False, 0, 0.0):
                raise UnsupportedOptimizer(f"option {key}={c[key]!r} has no tf.compat.v1.train equivalent")
        if name == "SGD":
            if not c.get("momentum"):
                return v1.GradientDescentOptimizer(float(lr))
            return v1.MomentumOptimizer(float(lr), float(c["momentum"]), use_nesterov=bool(c.get("nesterov")))
        twin, options = _TWINS[name]
        return getattr(v1, twin)(float(lr), **{arg: type(d)(c.get(key, d)) for arg, (key, d) in options.items()})
    except UnsupportedOptimizer as exc:
        supported = ", ".join(f"{k} ({v})" for k, v in SUPPORTED.items())
        raise UnsupportedOptimizer(
            f"{ref}: the compiled optimizer cannot run in ps mode: {exc}. Supported in ps "
            f"mode: {supported}; or use mode: allreduce (the Keras optimizer itself)"
        ) from None
