"""``serve``'s Lease holder keeping the reserved-node-names ConfigMap in step with the labelled nodes of its
watch cache (webhook/service/names_sync.py), against an API holding one ConfigMap (the calls recorded)
and a cache whose reserved names the test sets. On the real apiserver: tests/e2e/test_e2e_names_sync.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from webhook.cluster.cache import ClusterCache
from webhook.cluster.kubeapi import Conflict, KubeApi, NotFound
from webhook.core.decision import NodeFacts
from webhook.core.policy import Policy, default_policy
from webhook.deploy import reserved_names
from webhook.ops.pool import reserved_names as reserved_names_sync
from webhook.service.names_sync import PATH, ReservedNamesSync


class Api:
    def __init__(self, data: dict[str, str] | None) -> None:
        self.data = data
        self.version = 1
        self.patches: list[Mapping[str, Any]] = []
        self.conflict_next = False

    def get(self, path: str) -> dict[str, Any]:
        assert path == PATH
        if self.data is None:
            raise NotFound("not found", status=404, method="GET", path=path)
        meta = {"name": reserved_names.PARAMS_CONFIGMAP, "resourceVersion": str(self.version)}
        return {"metadata": meta, "data": dict(self.data)}

    def patch(self, path: str, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        assert path == PATH and not dry_run and self.data is not None
        version = (body.get("metadata") or {}).get("resourceVersion")
        if self.conflict_next or (version is not None and version != str(self.version)):
            self.conflict_next = False
            raise Conflict("conflict", status=409, method="PATCH", path=path)
        self.patches.append(body)
        for key, value in body["data"].items():
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value
        self.version += 1
        return {}


class Cache:
    def __init__(self, names: frozenset[str] | None) -> None:
        self.names = names

    def nodes(self, policy: Policy) -> NodeFacts:
        return NodeFacts(self.names)


def syncer(api: Api, cache: Cache, leading: list[bool] | None = None) -> tuple[ReservedNamesSync, list[str]]:
    results: list[str] = []
    lead = leading if leading is not None else [True]
    sync = ReservedNamesSync(
        cast(KubeApi, api),
        cast(ClusterCache, cache),
        default_policy,
        lambda: lead[0],
        on_write=results.append,
    )
    return sync, results


def test_a_node_labelled_by_any_tool_is_added_and_an_unlabelled_one_removed() -> None:
    api = Api({"inf-1": "rocm-isolation.io/pool=inference", "old": "rocm-isolation.io/pool=inference"})
    cache = Cache(frozenset({"inf-1", "inf-2"}))
    sync, results = syncer(api, cache)
    assert sync.run_once() == "updated"
    assert api.data == {"inf-1": "rocm-isolation.io/pool=inference", "inf-2": "rocm-isolation.io/pool=inference"}
    # The precondition: the resourceVersion read.
    assert api.patches[0]["metadata"]["resourceVersion"] == "1"
    assert results == ["updated"]
    # Nothing changed: no read, no write (the names last written are remembered).
    assert sync.run_once() == "unchanged" and len(api.patches) == 1
    cache.names = frozenset({"inf-2"})
    assert sync.run_once() == "updated"
    assert api.data == {"inf-2": "rocm-isolation.io/pool=inference"}


def test_the_same_content_as_pool_writes_so_the_two_never_fight() -> None:
    class PoolApi(Api):
        def list(self, path: str, *, label_selector: str | None = None) -> Any:
            return iter([{"metadata": {"name": name}} for name in ("inf-1", "inf-2")])

    api = PoolApi({})
    reserved_names_sync.sync(cast(KubeApi, api), default_policy())
    written_by_pool = dict(api.data or {})
    sync, _ = syncer(api, Cache(frozenset({"inf-1", "inf-2"})))
    assert sync.run_once() == "unchanged"
    assert api.data == written_by_pool and len(api.patches) == 1  # pool's own patch only


def test_only_the_lease_holder_writes_and_reads_afresh_when_it_leads_again() -> None:
    api = Api({})
    leading = [False]
    sync, _ = syncer(api, Cache(frozenset({"inf-1"})), leading)
    assert sync.run_once() == "skipped" and api.patches == []
    leading[0] = True
    assert sync.run_once() == "updated"
    leading[0] = False
    assert sync.run_once() == "skipped"
    api.data = {}  # another replica (or someone) changed it meanwhile
    leading[0] = True
    assert sync.run_once() == "updated" and api.data == {"inf-1": "rocm-isolation.io/pool=inference"}


def test_unknown_names_missing_configmap_and_conflicts_are_said_and_retried() -> None:
    api = Api(None)
    cache = Cache(None)
    sync, results = syncer(api, cache)
    assert sync.run_once() == "skipped"  # the node watch has not listed yet: nothing is known
    cache.names = frozenset({"inf-1"})
    assert sync.run_once() == "missing"  # shipped with the manifests; never created here (no RBAC for it)
    api.data = {}
    api.conflict_next = True
    assert sync.run_once() == "conflict"
    assert sync.run_once() == "updated"
    assert results == ["missing", "conflict", "updated"]
