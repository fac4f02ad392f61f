"""tfyarn: distributed TensorFlow training on Hadoop YARN (or one machine), run to the end without hanging.

Importing ``tfyarn`` is cheap and imports no TensorFlow; see :mod:`tfyarn.api` for the Python API.
"""

__version__ = "0.1.0"


def progress(
    step: int,
    loss: float | None = None,
    examples: int = 0,
    epoch: int = 0,
    global_step: int | None = None,
    metrics: dict[str, float] | None = None,
) -> None:
    """From your own training program (``entrypoint:``): this task's step (and loss, examples in it, epoch,
    metrics by name) for status, the run history and the stall watchdog. Outside a tfyarn task it does nothing, so
    the program runs unchanged anywhere. Imports no TensorFlow. A Keras ``fit`` can call it through the
    callback of ``tfyarn/keras.py`` (the name spelled out here would make this package look like Keras code to
    warm_imports.code_uses_keras, which reads the sources a model module imports)."""
    from tfyarn.task.entrypoint import program_reporter

    reporter = program_reporter()
    if reporter is not None:
        reporter.report(
            step=int(step),
            epoch=int(epoch),
            loss=loss,
            examples=int(examples),
            global_step=global_step,
            metrics=metrics,
        )
