"""tfyarn: distributed TensorFlow training on Hadoop YARN (or one machine), run to the end without hanging.

Importing ``tfyarn`` is cheap and imports no TensorFlow; see :mod:`tfyarn.api` for the Python API.
"""
__version__ = "0.1.0"
