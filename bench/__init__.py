"""Benchmarks of rocm-isolation-webhook: ``make bench`` (``python -m bench.run``) writes docs/benchmarks.md."""

import sys
from pathlib import Path

# ``bench.apiserver_admission`` drives the end-to-end suite's control plane and harness, which import the
# tests' shared object builders (tests/cluster_objects.py) by module name, as pytest puts tests/ on the path.
_TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
