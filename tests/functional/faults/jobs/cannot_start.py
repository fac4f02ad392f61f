"""A model whose code imports a module the job's Python does not have (contract: a task that cannot start)."""
import importlib

ABSENT = "tfyarn_test_absent_module"


def model(**params):
    importlib.import_module(ABSENT)  # ModuleNotFoundError, as a missing dependency raises it
