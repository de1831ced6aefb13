"""What gets deployed: the manifests renderer, the CEL of the matchConditions and the
ValidatingAdmissionPolicies, the placement MutatingAdmissionPolicy, the reserved-node-names policy
and its ConfigMap, the monitoring dashboard. Pure rendering: may import ``core`` only."""
