"""What a cluster serves, read from it: API discovery of some group/versions and the kube-apiserver's feature
gates (``kubernetes_feature_enabled`` of its ``/metrics``). Under compatibility versions (KEP-4330,
``--emulated-version``) ``/version`` names the binary (v1.36.2) while discovery and the gates are the emulated
minor's, so these two are what ``manifests`` and ``pool`` go by (``deploy/minors.py`` makes them a ``Served``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from webhook.cluster.kubeapi import ApiError, KubeApi, resources_served

_GATE = re.compile(r"^kubernetes_feature_enabled\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.eE+-]+)\s*$")
_NAME = re.compile(r'\bname="(?P<name>[^"]*)"')
_STAGE = re.compile(r'\bstage="(?P<stage>[^"]*)"')


def discovery(api: KubeApi, group_versions: Iterable[str]) -> dict[str, frozenset[str] | None]:
    """group/version -> the resources its discovery lists (None: not served). Raises ``ApiError`` when discovery
    cannot be read."""
    return {group_version: resources_served(api, group_version) for group_version in group_versions}


def parse_feature_gates(metrics: str) -> dict[str, tuple[bool, str]]:
    """``kubernetes_feature_enabled{name="X",stage="BETA"} 1`` lines -> {X: (True, "BETA")} (stage "" when GA)."""
    gates: dict[str, tuple[bool, str]] = {}
    for line in metrics.splitlines():
        found = _GATE.match(line)
        if not found:
            continue
        name = _NAME.search(found["labels"])
        stage = _STAGE.search(found["labels"])
        if name:
            gates[name["name"]] = (float(found["value"]) == 1.0, stage["stage"] if stage else "")
    return gates


def feature_gates(api: KubeApi) -> dict[str, tuple[bool, str]] | None:
    """The kube-apiserver's feature gates, None when its ``/metrics`` cannot be read (RBAC: ``get`` on the
    non-resource URL ``/metrics``) or lists none."""
    text = getattr(api, "text", None)  # the raw client; a view or stand-in that reads objects only has none
    if text is None:
        return None
    try:
        gates = parse_feature_gates(text("/metrics"))
    except ApiError:
        return None
    return gates or None


def served(
    api: KubeApi, group_versions: Iterable[str], *, gates: bool = True
) -> tuple[dict[str, frozenset[str] | None], dict[str, tuple[bool, str]] | None]:
    """``discovery`` and (``gates``) ``feature_gates``: what ``deploy.minors.from_cluster`` reads."""
    return discovery(api, group_versions), feature_gates(api) if gates else None
