"""``pool plan|apply|release|status|recommend``: the reserved pool changed and shown. Reads the cluster once per
command (``read.py``), plans with ``devices`` and the shared model, writes only in ``write.py`` (nodes, evictions,
DeviceClasses, DeviceTaintRules, the reserved-names ConfigMap). The top of ``ops``: may import every other
package of it."""
