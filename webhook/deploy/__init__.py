"""What gets deployed: the manifests renderer, the CEL of the matchConditions and the
ValidatingAdmissionPolicies (the pod backstop and its reserved-node-names ConfigMap, the device-level
backstop), the placement MutatingAdmissionPolicy, the monitoring dashboard. Pure rendering: may import ``core`` only."""
