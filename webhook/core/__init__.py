"""The decision core: the policy, the pod's GPU routes, node reachability, ``decide()``, the
AdmissionReview envelope and the handler. Pure: no network, no FastAPI, no Kubernetes client; it
imports nothing of the other parts (``make test`` checks it: the import-linter contracts in
pyproject.toml). The per-review modules are compiled with mypyc (setup.py)."""
