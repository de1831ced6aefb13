"""The params ConfigMap of the reserved-node-names policy (``webhook.deploy.reserved_names``) kept
equal to the nodes that carry the reserved label: ``pool apply`` and ``pool release`` call ``sync``
after they changed the nodes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from webhook.cluster.kubeapi import KubeApi, NotFound
from webhook.core.policy import Policy
from webhook.deploy.reserved_names import CONFIGMAP_PATH, NAMESPACE, PARAMS_CONFIGMAP, configmap


@dataclass(frozen=True)
class Synced:
    result: str  # created, updated, unchanged
    names: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]


def labelled_nodes(api: KubeApi, policy: Policy) -> list[str]:
    key, value = policy.spec.reserved_nodes.label
    return sorted(node["metadata"]["name"] for node in api.list("/api/v1/nodes", label_selector=f"{key}={value}"))


def sync(api: KubeApi, policy: Policy, *, dry_run: bool = False) -> Synced:
    """Make the params ConfigMap list exactly the nodes carrying the reserved label (a merge patch: keys
    of nodes no longer labelled are set to null)."""
    key, value = policy.spec.reserved_nodes.label
    names = labelled_nodes(api, policy)
    wanted = configmap(names, f"{key}={value}")
    try:
        current = api.get(f"{CONFIGMAP_PATH}/{PARAMS_CONFIGMAP}")
    except NotFound:
        api.post(CONFIGMAP_PATH, wanted, dry_run=dry_run)
        return Synced("created", tuple(names), tuple(names), ())
    data: Mapping[str, str] = current.get("data") or {}
    added = tuple(name for name in names if name not in data)
    removed = tuple(sorted(name for name in data if name not in names))
    if not added and not removed:
        return Synced("unchanged", tuple(names), (), ())
    body = {"data": {**wanted["data"], **dict.fromkeys(removed)}}
    api.patch(f"{CONFIGMAP_PATH}/{PARAMS_CONFIGMAP}", body, dry_run=dry_run)
    return Synced("updated", tuple(names), added, removed)


def synced_line(synced: Synced, dry_run: bool) -> str:
    what = f"configmap/{PARAMS_CONFIGMAP} -n {NAMESPACE}"
    listed = ", ".join(synced.names) or "no nodes"
    changes = []
    if synced.added:
        changes.append("+" + ",".join(synced.added))
    if synced.removed:
        changes.append("-" + ",".join(synced.removed))
    suffix = f" ({' '.join(changes)})" if changes else ""
    return f"{what} {synced.result}{' (server dry run)' if dry_run else ''}: the backstop knows {listed}{suffix}"
