"""Day-2 commands against a cluster: ``audit`` (and its reports), ``pool`` (the reservation plan,
evictions, the reserved-names ConfigMap kept in sync). May import ``cluster``, ``deploy`` and
``core``."""
