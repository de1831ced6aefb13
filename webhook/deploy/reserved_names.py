"""The reserved node names the apiserver's pod backstop reads: its params ConfigMap.

The ValidatingAdmissionPolicy ``rocm-isolation-reserved-nodes`` (``reserved_nodes``) sees no Node objects,
so a training pod that names a reserved node (``spec.nodeName``: the scheduler and with it the NoSchedule
taint are skipped, and the kubelet does not check NoSchedule; or ``matchFields metadata.name``) would
pass it while the webhook is down. It reads the reserved nodes from a ConfigMap in the webhook's
namespace (one data key per node). The replica of ``serve`` holding the audit Lease keeps it equal to
the nodes carrying the reserved label in its watch cache, within seconds, whatever tool labelled them
(``webhook.service.names_sync``); ``pool apply`` and ``pool release`` rewrite it too, with the same
content, after they changed the nodes (``webhook.ops.pool.reserved_names``); ``audit`` reports when the
two disagree (no replica running, or a node labelled while none was: ``disagreement``).

The ConfigMap is shipped with the manifests without ``data`` (so that re-applying them never manages
or empties it, and ``serve`` needs no ``create``). Should it be missing, the policy's bindings
(``parameterNotFoundAction: Allow``) skip the policy: the pod backstop is off until it is back
(``reserved_nodes`` says why that is the trade), and ``serve``, ``audit`` and an alert say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

PARAMS_CONFIGMAP = "rocm-isolation-reserved-node-names"
NAMESPACE = "rocm-isolation-system"


# --- the params object, kept by pool apply | release ----------------------------------------------

CONFIGMAP_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


def configmap(names: Iterable[str], reserved_label: str) -> dict[str, Any]:
    """The params object: one key per reserved node (node names are valid ConfigMap keys)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": PARAMS_CONFIGMAP,
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/name": "rocm-isolation-webhook",
                "app.kubernetes.io/part-of": "rocm-isolation-webhook",
            },
            "annotations": {
                "rocm-isolation.io/written-by": "rocm-isolation-webhook pool apply|release: the nodes labelled "
                + reserved_label
            },
        },
        "data": {name: reserved_label for name in sorted(names)},
    }


def disagreement(data: Mapping[str, str] | None, labelled: Iterable[str]) -> list[str]:
    """What ``audit`` reports: the params object missing while nodes are reserved, or listing other nodes
    than those carrying the reserved label (someone labelled or unlabelled a node by hand)."""
    names = sorted(labelled)
    if data is None:
        if not names:
            return []
        return [
            f"the ConfigMap {NAMESPACE}/{PARAMS_CONFIGMAP} is missing: the apiserver skips the pod backstop's "
            f"name checks (the ValidatingAdmissionPolicy rocm-isolation-reserved-node-names) while the reserved "
            f"nodes are {', '.join(names)}, so only the webhook keeps training pods from naming them "
            "(spec.nodeName); run "
            "`rocm-isolation-webhook pool apply` (or re-apply the manifests) to write it"
        ]
    out = []
    unknown = [name for name in names if name not in data]
    stale = sorted(name for name in data if name not in names)
    if unknown:
        out.append(
            f"nodes {', '.join(unknown)} carry the reserved label but are not in the ConfigMap "
            f"{NAMESPACE}/{PARAMS_CONFIGMAP}: the backstop lets training pods name them; run "
            "`rocm-isolation-webhook pool apply --nodes ...` instead of labelling by hand"
        )
    if stale:
        out.append(
            f"the ConfigMap {NAMESPACE}/{PARAMS_CONFIGMAP} lists {', '.join(stale)}, which no longer carry the "
            "reserved label: training pods naming them are denied; run `rocm-isolation-webhook pool release`"
        )
    return out
