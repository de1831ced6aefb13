"""The GPUs' own word (issue 48): what AMD's device metrics exporter reports, held against what the cluster
admitted.

Owns: reading the exporter's series (the Prometheus text exposition of its ``/metrics``, from a file, or
Prometheus's HTTP API: ``exposition``, ``source``), normalising them (both name prefixes, ``gpu_*`` and
``amd_gpu_*``; both label schemes, scraped with ``honorLabels`` or without it: ``series``), mapping each GPU to
the capacity model's node, side and GPU (``mapping``), judging the reserved GPUs (``judge``) and showing their
load in ``pool status`` (``status``).

May import: ``ops/capacity.py`` (the capacity model it maps onto), ``ops/prometheus.py`` (the transport
``pool recommend`` shares), ``cluster.slices`` and ``core``. Not the audit, pool or service: ``audit`` turns
what ``judge`` says into findings; everything here but ``source`` is pure.
"""
