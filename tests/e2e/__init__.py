"""The end-to-end suite on a real Kubernetes control plane (see conftest.py and harness.py)."""
