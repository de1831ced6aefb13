"""Device-level reservation as data: which devices of which nodes are reserved (``split.py``), what our two
DeviceClasses must say and who owns ``amd.com/gpu`` (``ownership.py``), AutoPartition's memory modes
(``memory_mode.py``), the plan of ``pool apply --devices-per-node`` (``plan.py``) and its status
(``status.py``). No I/O. May import the shared modules of ``ops`` only."""
