"""The one compiled module (accounting/_streamed.c); everything else is in pyproject.toml.
Optional: where it cannot be built, accounting/work.py runs the same loop in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "accounting._streamed", ["accounting/_streamed.c"],
    # IEEE doubles as Python computes them: no fused multiply-add, no fast-math
    extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"], optional=True)])
