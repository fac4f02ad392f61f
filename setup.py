"""The C extension only; everything else about the package is in pyproject.toml (setuptools' ``ext-modules`` table
there is still experimental).

``tfyarn.data._records`` holds the input path's per-record loops (TFRecord framing, CRC32C, Example parsing; see its
source). It is optional: without a C compiler the install succeeds and the same functions run in Python, numpy and
TensorFlow, only slower (``tfyarn.data.native.records`` is None then).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("tfyarn.data._records", ["tfyarn/data/_records.c"], extra_compile_args=["-O2"],
                             optional=True)])
