"""The reserved-node-names ConfigMap as ``pool apply|release`` write it (``reserved_names_sync``),
against an API that keeps nodes and one ConfigMap. On the real apiserver: tests/e2e/test_mutating_policy.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from webhook.cluster.kubeapi import NotFound
from webhook.core.policy import default_policy
from webhook.deploy import render, reserved_names
from webhook.ops.pool import reserved_names as reserved_names_sync

PATH = f"{reserved_names.CONFIGMAP_PATH}/{reserved_names.PARAMS_CONFIGMAP}"


class Api:
    """Nodes and one ConfigMap, with the calls ``sync`` makes recorded."""

    def __init__(self, nodes: dict[str, dict[str, str]], data: dict[str, str] | None) -> None:
        self.nodes = nodes
        self.data = data
        self.calls: list[tuple[str, str, Any, bool]] = []

    def list(self, path: str, *, label_selector: str | None = None) -> Iterator[dict[str, Any]]:
        assert path == "/api/v1/nodes" and label_selector
        key, _, value = label_selector.partition("=")
        for name, labels in self.nodes.items():
            if labels.get(key) == value:
                yield {"metadata": {"name": name, "labels": labels}}

    def get(self, path: str) -> dict[str, Any]:
        assert path == PATH
        if self.data is None:
            raise NotFound("not found", status=404, method="GET", path=path)
        return {"metadata": {"name": reserved_names.PARAMS_CONFIGMAP}, "data": dict(self.data)}

    def post(self, path: str, body: Mapping[str, Any], *, dry_run: bool = False) -> Any:
        self.calls.append(("POST", path, body, dry_run))
        if not dry_run:
            self.data = dict(body["data"])
        return body

    def patch(self, path: str, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        self.calls.append(("PATCH", path, body, dry_run))
        if not dry_run:
            assert self.data is not None
            for key, value in body["data"].items():
                if value is None:
                    self.data.pop(key, None)
                else:
                    self.data[key] = value
        return {}


POOL = {"rocm-isolation.io/pool": "inference"}


def test_sync_creates_the_configmap_with_the_labelled_nodes() -> None:
    api = Api({"inf-1": POOL, "inf-2": POOL, "gpu-1": {}}, None)
    synced = reserved_names_sync.sync(api, default_policy())  # type: ignore[arg-type]
    assert synced.result == "created" and synced.names == ("inf-1", "inf-2")
    assert api.data == {"inf-1": "rocm-isolation.io/pool=inference", "inf-2": "rocm-isolation.io/pool=inference"}
    method, path, body, _ = api.calls[0]
    assert (method, path) == ("POST", reserved_names.CONFIGMAP_PATH)
    assert body["metadata"]["namespace"] == render.NAMESPACE


def test_sync_adds_and_removes_keys_and_leaves_a_matching_configmap_alone() -> None:
    api = Api({"inf-1": POOL, "inf-3": POOL}, {"inf-1": "x", "inf-2": "x"})
    synced = reserved_names_sync.sync(api, default_policy())  # type: ignore[arg-type]
    assert (synced.result, synced.added, synced.removed) == ("updated", ("inf-3",), ("inf-2",))
    assert sorted(api.data or {}) == ["inf-1", "inf-3"]
    api.calls.clear()
    assert reserved_names_sync.sync(api, default_policy()).result == "unchanged"  # type: ignore[arg-type]
    assert api.calls == []


def test_sync_in_server_dry_run_writes_nothing() -> None:
    api = Api({"inf-1": POOL}, {"inf-2": "x"})
    synced = reserved_names_sync.sync(api, default_policy(), dry_run=True)  # type: ignore[arg-type]
    assert synced.result == "updated" and api.data == {"inf-2": "x"}
    assert api.calls[0][3] is True
    line = reserved_names_sync.synced_line(synced, True)
    assert "(server dry run)" in line and "+inf-1" in line and "-inf-2" in line
