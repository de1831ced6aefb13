"""Day-2 commands against a cluster, one package per thing an operator does:

- ``audit/``: running pods, nodes, devices and namespaces held against the policy; findings and reports.
- ``pool/``: the ``pool`` verbs: reserve nodes or devices, evict, release, show, recommend a size.
- ``devices/``: device-level reservation as data: the split, our DeviceClasses, memory modes, the plan.
- ``lending/``: lending idle reserved GPUs and reclaiming them, and inference's demand on the pool.
- ``recommend/``: sizing the reservation from the demand's history.

Shared by all of them, at this level: the capacity model (``capacity.py``), the reserved pool as data
(``reservation.py``), raw Kubernetes JSON read without trusting its types (``raw.py``) and the Prometheus HTTP
API's transport (``prometheus.py``). The packages are layered (``[tool.importlinter]``, docs/architecture.md):
``pool`` > ``audit`` | ``recommend`` > ``devices`` | ``lending`` > the shared modules. ``ops`` may import
``cluster``, ``deploy`` and ``core``."""
