"""Build hook: the decision core compiled with mypyc, when asked for (``ROCM_ISOLATION_COMPILE=1``).

Every pod creation in the cluster waits for ``decide()``; compiled, it takes about half the CPU
(docs/benchmarks.md). The compiled modules are the same typed source (mypy --strict), so the pure
Python package stays the reference: it is what a plain ``pip install`` builds, and what runs when
no C compiler is available. ``make`` compiles in place (``make compile``); the Dockerfile builds a
compiled wheel. Metadata lives in pyproject.toml.
"""

from __future__ import annotations

import os

from setuptools import setup

# The modules on the per-review path that are ours (no I/O): the envelope, the handler, the engine and what it calls.
COMPILED_MODULES = [
    "webhook/core/assessment.py",
    "webhook/core/checks.py",
    "webhook/core/decision.py",
    "webhook/core/engine.py",
    "webhook/core/handler.py",
    "webhook/core/patch.py",
    "webhook/core/placement.py",
    "webhook/core/pods.py",
    "webhook/core/review.py",
    "webhook/core/rules.py",
    "webhook/core/scheduling.py",
]

ext_modules = []
if os.environ.get("ROCM_ISOLATION_COMPILE") == "1":
    from mypyc.build import mypycify

    ext_modules = mypycify(COMPILED_MODULES, opt_level="3")

setup(ext_modules=ext_modules)
