"""The compiled modules (accounting/_streamed.c, accounting/_requestrow.c,
accounting/_untrack.c, accounting/_queued.c, core/_times.c); everything else is in
pyproject.toml. Optional: where they cannot be built, accounting/work.py,
accounting/heads.py, accounting/ledger/base.py, accounting/queued.py and core/codec.py run
the same code in Python, and the accounting child leaves its records to the
garbage collector."""

from setuptools import Extension, setup

# IEEE doubles as Python computes them: no fused multiply-add, no fast-math
_FLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[
    Extension("accounting._streamed", ["accounting/_streamed.c"], extra_compile_args=_FLAGS,
              optional=True),
    Extension("accounting._requestrow", ["accounting/_requestrow.c"],
              extra_compile_args=_FLAGS, optional=True),
    Extension("accounting._untrack", ["accounting/_untrack.c"], extra_compile_args=_FLAGS,
              optional=True),
    Extension("accounting._queued", ["accounting/_queued.c"], extra_compile_args=_FLAGS,
              optional=True),
    Extension("core._times", ["core/_times.c"], extra_compile_args=_FLAGS, optional=True),
])
