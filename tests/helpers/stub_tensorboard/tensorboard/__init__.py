"""A stand-in for the ``tensorboard`` package (not in the test venv, nor a TF dependency) on the tensorboard role's
PYTHONPATH in local tests: the role's own code runs (mirror, URL, its wait for ``control/done``) over a plain HTTP
server of its log dir instead of TensorBoard."""
