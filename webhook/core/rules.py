"""The decision core's names: the annotations and labels it writes, and its rule identifiers (stable:
metrics labels, docs/policy.md). Every module of the engine reads them here; ``engine`` re-exports them."""

from __future__ import annotations

CLASS_ANNOTATION = "rocm-isolation.io/class"


MUTATIONS_ANNOTATION = "rocm-isolation.io/mutations"


# The class a pod was placed as, by the webhook or the placement MutatingAdmissionPolicy: a label, so that
# the policy's binding skips, in Go, a pod already placed (in the apiserver's second pass of the mutating
# chain it would otherwise evaluate its match condition again). Nothing trusts it: a pod created with it
# is still placed by the webhook and judged by the backstop; it is left out of topology spread selectors.
PLACED_LABEL = "rocm-isolation.io/placed"


MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


PSS_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"


KFD_TOPOLOGY_PATH = "/sys/class/kfd/kfd/topology/nodes"


KFD_VOLUME_NAME = "rocm-kfd-topology"


KFD_VOLUME = {"name": KFD_VOLUME_NAME, "hostPath": {"path": KFD_TOPOLOGY_PATH, "type": "Directory"}}


KFD_MOUNT = {"name": KFD_VOLUME_NAME, "mountPath": KFD_TOPOLOGY_PATH, "readOnly": True}


# The AMD GPU operator's own taints: warn when a pod tolerates them, never add them.
AMD_OPERATOR_TAINT_KEYS = ("amd-gpu-unhealthy", "amd-dcm")


# Stable rule identifiers (metrics labels, docs/policy.md).
RULE_MUTATED = "mutated"


RULE_COMPLIANT = "compliant"


RULE_CHECKED = "update-checked"


RULE_EXCLUDED = "excluded-namespace"


RULE_NOT_GPU = "not-gpu-pod"


RULE_MIRROR = "mirror-pod"


RULE_OPERATION = "operation-ignored"


RULE_DELETING = "pod-terminating"


RULE_MALFORMED = "malformed-pod"


DENY_NODE_NAME = "deny-node-name"


DENY_NODE_SELECTOR = "deny-node-selector"


DENY_NODE_AFFINITY = "deny-node-affinity"


DENY_TOLERATION = "deny-toleration"


DENY_CLASS = "deny-class-not-allowed"


DENY_DIRECT_ACCESS = "deny-direct-gpu-access"


DENY_EPHEMERAL = "deny-ephemeral-gpu-access"


DENY_RESERVED_DEVICES = "deny-reserved-devices"


DENY_RULES = (
    DENY_NODE_NAME, DENY_NODE_SELECTOR, DENY_NODE_AFFINITY, DENY_TOLERATION, DENY_CLASS, DENY_DIRECT_ACCESS,
    DENY_EPHEMERAL, DENY_RESERVED_DEVICES,
)  # fmt: skip


# Lending (webhook.core.lending): a borrower prefers shared nodes with this weight (the maximum).
BORROWER_PREFERENCE_WEIGHT = 100


PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


HOSTNAME_KEY = "kubernetes.io/hostname"


# The one subresource the engine reads: kubectl debug adds containers to a running pod through it.
EPHEMERAL_CONTAINERS = "ephemeralcontainers"


# Phrases of two warnings that the offline dry run recognises (it says them its own way): one source.
CLAIM_UNRESOLVED = "could not be resolved (not known to the webhook yet)"


LABELS_UNKNOWN = ": labels unknown (no cluster connection); class from "
