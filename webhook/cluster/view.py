"""The Lease holder's view of the cluster: what the lending keeper reads, watched instead of listed per round.

Before it, every lending round LISTed every node, namespace, active pod, ResourceClaim, ResourceSlice and
DeviceClass (and ``/version`` and discovery): 341 MB a minute from the apiserver at 400 nodes and 20,000 pods,
rounds of 8 s against their 5 s interval. Here each collection is one reflector (``cluster/cache.Reflector``:
a paginated list, then a watch with bookmarks, 410 relist, backoff), started when this replica takes the
Lease and stopped when it loses it (only the holder pays for the view), and a round reads memory:

- ``ViewApi`` answers the reads of ``KubeApi`` that ``ops/pool_read``, ``cluster/inventory`` and the keeper
  make (``list`` with label and field selectors evaluated as the apiserver does, ``get`` of one object,
  ``/version``, API discovery) from the view, so the keeper, ``pool`` and ``audit`` build the capacity model
  with one code path; writes (taints, the lendable class, evictions) go to the apiserver.
- Until every reflector has listed once (``synced``), and again after a policy reload changes what is kept,
  the view is not synced: a round decides nothing then (``NotSynced``; no eviction, no taint, no class
  written), and ``ViewApi`` refuses writes as a second guard.
- What is kept of each object is ``cluster/projection.py``: pods only when they can matter to capacity or
  lending, and only the fields decisions read.
- The resource.k8s.io version of each DRA resource is the newest its API discovery lists, read when the view
  starts (with ``/version``) and again at each resync; a read of another version goes to the apiserver. The
  admissionregistration.k8s.io versions' discovery is read with it (``PLACEMENT_DISCOVERY``): with resource.k8s.io's
  it tells the cluster's Kubernetes minor (``deploy/minors.from_cluster``), so that ``audit`` on the view (serve's
  background audit) judges the device reservation as that minor can hold it, without a request of its own.
- Pods are watched with the apiserver's ``status.phase!=Succeeded,status.phase!=Failed``: a pod that
  finishes leaves the view by the watch's DELETED event. A pod list that does not ask for exactly that
  cannot be answered from the view and raises ``ValueError``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack
from urllib.parse import unquote

import orjson

from webhook.cluster import projection
from webhook.cluster.cache import Extract, Reflector
from webhook.cluster.kubeapi import ApiError, KubeApi, ListOptions, NotFound, resources_served
from webhook.cluster.selectors import field_matcher, label_matcher
from webhook.core import claims as dra
from webhook.core.policy import Policy

log = logging.getLogger("webhook.cluster")

ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
_ACTIVE_TERMS = frozenset(ACTIVE_PODS.split(","))
DRA_RESOURCES = ("deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates", "devicetaintrules")
DRA_VERSIONS = (*dra.VERSIONS, "v1alpha3")  # newest first; devicetaintrules came in v1alpha3
# What else discovery is read of (and a dump holds): the MutatingAdmissionPolicy's versions, which with DRA's tell the
# minor (``deploy/minors.DISCOVERED``).
PLACEMENT_DISCOVERY = ("admissionregistration.k8s.io/v1", "admissionregistration.k8s.io/v1beta1")
_NAMESPACED = frozenset({"pods", "resourceclaims", "resourceclaimtemplates"})
YIELD_EVERY = 64  # objects a round reads between two hand-overs of the GIL (about 1 ms of work)


class NotSynced(Exception):
    """The view has not listed every collection yet (or relists after a policy reload): nothing may be
    decided from it."""


def raw_list_call(api_client: Any, path: str) -> Callable[..., Any]:
    """A reflector's list/watch call for any collection path, reading raw JSON over the client's transport
    (the generated per-resource methods do not exist for every version the view may watch)."""
    names = {
        "label_selector": "labelSelector",
        "field_selector": "fieldSelector",
        "resource_version": "resourceVersion",
        "allow_watch_bookmarks": "allowWatchBookmarks",
        "timeout_seconds": "timeoutSeconds",
        "watch": "watch",
        "limit": "limit",
        "_continue": "continue",
    }

    def call(*, _preload_content: bool = False, _request_timeout: Any = None, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        query = [
            (names[key], ("true" if value else "false") if isinstance(value, bool) else str(value))
            for key, value in kwargs.items()
            if value not in (None, "")
        ]
        method, url, headers, body, _ = api_client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        answer = api_client.call_api(method, url, header_params=headers, body=body, _request_timeout=_request_timeout)
        # As the generated methods do without preloading: a non-2xx answer raises (the reflector reads its
        # status: 410 relists, anything else backs off), a 2xx one is the stream itself.
        if not 200 <= answer.status <= 299:
            answer.read()
            raise ApiException.from_response(http_resp=answer, body=None, data=None)
        return answer.response

    return call


class ClusterView:
    """The collections the lending keeper reads, each kept by a reflector while ``start``ed."""

    def __init__(
        self,
        api_client: Any,
        policy: Callable[[], Policy],
        *,
        resync_seconds: float = 600.0,
        watch_timeout_seconds: int = 300,
        page_size: int = 500,
        on_bytes: Callable[[str, str, int], None] | None = None,
    ) -> None:
        self._api_client = api_client
        self._on_bytes = on_bytes  # (resource, "list" | "watch", bytes): serve's metric of what the view costs
        self._reads = KubeApi(api_client)  # discovery and /version, at start and each resync
        self._policy = policy
        # No metrics of the admission cache's (cluster_synced{resource}): the same resource names, another
        # collection; serve exports the view's own (rocm_isolation_lending_view_*).
        self._common: dict[str, Any] = {
            "resync_seconds": resync_seconds,
            "watch_timeout_seconds": watch_timeout_seconds,
            "page_size": page_size,
        }
        self.resync_seconds = resync_seconds
        self._lock = threading.Lock()
        self._reflectors: dict[str, Reflector] = {}  # collection path -> its reflector
        self._relevance: projection.PodRelevance | None = None  # which pods, and for which policy
        self._drivers: frozenset[str] = frozenset()
        self._shared = projection.Shared()  # what the replicas of a workload repeat, kept once
        self.version: dict[str, Any] | None = None  # GET /version
        self.version_error: ApiError | None = None  # or why it could not be read
        self.discovery: dict[str, frozenset[str] | None] = {}  # "group/version" -> resources (None: not served)
        self.dra_versions: dict[str, str] = {}  # DRA resource -> the version watched
        self._discovered_at = 0.0
        self.discovered = False  # a discovery succeeded (until then the DRA collections are unknown: not synced)
        self.started = False

    # -- life ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Discover the DRA versions, then list and watch every collection (in the reflectors' threads)."""
        with self._lock:
            if self.started:
                return
            self.started = True
            self._follow_policy(self._policy())
            self._discover()
            for reflector in (
                self._add("nodes", "/api/v1/nodes", projection.node_projection),
                self._add("namespaces", "/api/v1/namespaces", projection.without_managed_fields),
                self._add("pods", "/api/v1/pods", self._pod, field_selector=ACTIVE_PODS),
                *self._follow_dra_versions(),
            ):
                reflector.start()
        log.info("lending view: watching the cluster", extra={"collections": sorted(self._reflectors)})

    def _follow_dra_versions(self) -> list[Reflector]:
        """A reflector per DRA resource at the version discovery gives (a new one, the old one stopped, after
        an upgrade changed it); the new ones, to start."""
        added: list[Reflector] = []
        for resource, version in self.dra_versions.items():
            path = f"/apis/{dra.GROUP}/{version}/{resource}"
            if path in self._reflectors:
                continue
            for other in [p for p, r in self._reflectors.items() if r.resource == resource]:
                self._reflectors.pop(other).stop()
            extract: Extract = projection.without_managed_fields
            if resource in ("resourceclaims", "resourceclaimtemplates"):
                extract = projection.claim_projection
            elif resource == "resourceslices":
                extract = self._slice
            added.append(self._add(resource, path, extract))
        return added

    def stop(self) -> None:
        """Stop every reflector and forget what they held (the memory goes with the Lease)."""
        with self._lock:
            reflectors = list(self._reflectors.values())
            self._reflectors = {}
            self.started = False
            self.discovered = False
        for reflector in reflectors:
            reflector.stop()
        if reflectors:
            log.info("lending view: stopped (not holding the Lease)")

    def _add(self, resource: str, path: str, extract: Extract, *, field_selector: str | None = None) -> Reflector:
        reflector = self._reflectors[path] = Reflector(
            resource,
            raw_list_call(self._api_client, path),
            extract=extract,
            namespaced=resource in _NAMESPACED,
            field_selector=field_selector,
            on_bytes=None if self._on_bytes is None else functools.partial(self._on_bytes, resource),
            **self._common,
        )
        return reflector

    def _discover(self) -> None:
        """``/version`` and which resource.k8s.io (and admissionregistration.k8s.io) versions list which resources;
        a failure leaves what was known, and the view unsynced until a discovery succeeds (retried every round: ``refresh_discovery``)."""
        try:
            self.version, self.version_error = self._reads.get("/version"), None
        except ApiError as err:  # what the apiserver said is said again until the next discovery
            self.version, self.version_error = None, err
            log.warning("lending view: cannot read the apiserver's version", extra={"error": str(err)})
        try:
            discovery = {f"{dra.GROUP}/{v}": resources_served(self._reads, f"{dra.GROUP}/{v}") for v in DRA_VERSIONS}
            discovery.update({gv: resources_served(self._reads, gv) for gv in PLACEMENT_DISCOVERY})
        except ApiError as err:
            log.warning("lending view: API discovery failed", extra={"error": str(err)})
            return
        self.discovered = True
        self.discovery = discovery
        self._discovered_at = time.monotonic()
        versions: dict[str, str] = {}
        for resource in DRA_RESOURCES:
            for version in DRA_VERSIONS:
                if resource in (discovery.get(f"{dra.GROUP}/{version}") or ()):
                    versions[resource] = version
                    break
        self.dra_versions = versions

    def refresh_discovery(self) -> None:
        """Discovery and ``/version`` again once per resync (a control plane upgrade changes them), and every
        round until one succeeded; the DRA reflectors follow what it says."""
        if not self.started:
            return
        if self.discovered and time.monotonic() - self._discovered_at <= self.resync_seconds:
            return
        self._discover()
        with self._lock:
            for reflector in self._follow_dra_versions():
                reflector.start()

    # -- what is kept ----------------------------------------------------------------------------------

    def _follow_policy(self, policy: Policy) -> None:
        self._relevance = projection.PodRelevance(policy)
        self._drivers = frozenset(policy.spec.scope.gpu_drivers) | {policy.spec.reserved_devices.driver}

    def _pod(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        relevance = self._relevance
        if relevance is not None and not relevance(pod):
            return None
        pods = self._reflectors.get("/api/v1/pods")
        if len(self._shared) > 4 * (pods.count if pods is not None else 0) + 10_000:
            self._shared.clear()  # copies of workloads long gone: pods keep theirs, new ones share anew
        return projection.pod_projection(pod, self._shared)

    def _slice(self, resource_slice: Mapping[str, Any]) -> dict[str, Any] | None:
        driver = (resource_slice.get("spec") or {}).get("driver")
        return projection.without_managed_fields(resource_slice) if driver in self._drivers else None

    def follow(self, policy: Policy) -> None:
        """A reloaded policy may keep other pods (its GPU routes, its borrowers' label) and other drivers'
        slices: those two collections are listed again, and the view is not synced until they are."""
        if not self.started or (self._relevance is not None and policy is self._relevance.policy):
            return
        with self._lock:
            self._follow_policy(policy)
            for reflector in self._reflectors.values():
                if reflector.resource in ("pods", "resourceslices"):
                    reflector.synced.clear()
                    reflector.relist(reflector.label_selector)
        log.info("lending view: policy reloaded, pods and slices listed again")

    # -- state -------------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        reflectors = list(self._reflectors.values())
        return self.started and self.discovered and bool(reflectors) and all(r.synced.is_set() for r in reflectors)

    def status(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "synced": self.synced,
            "collections": {
                reflector.resource: {
                    "synced": reflector.synced.is_set(),
                    "count": reflector.count,
                    "resourceVersion": reflector.resource_version,
                    **({"lastError": reflector.last_error} if reflector.last_error else {}),
                }
                for reflector in list(self._reflectors.values())
            },
        }

    def reflector(self, path: str) -> Reflector | None:
        return self._reflectors.get(path)

    @property
    def reflectors(self) -> list[Reflector]:
        return list(self._reflectors.values())

    def api(self, writes: KubeApi) -> ViewApi:
        return ViewApi(self, writes)

    def dump(self, path: Path) -> bool:
        """Write what the view holds to ``path`` (``FrozenView.load`` reads it: the background audit's child
        process audits it instead of listing the cluster); False, and nothing written, while not synced."""
        if not self.synced:
            return False
        collections: dict[str, Any] = {}
        for where, reflector in list(self._reflectors.items()):
            collections[where] = {
                "resource": reflector.resource,
                "namespaced": reflector.namespaced,
                "items": reflector.values(),
            }
        document = {
            "version": self.version,
            "discovery": {gv: None if names is None else sorted(names) for gv, names in self.discovery.items()},
            "collections": collections,
        }
        path.write_bytes(orjson.dumps(document))
        return True


class FrozenView:
    """A ``ClusterView`` as it was dumped (``ClusterView.dump``): synced by construction, never changing."""

    started = True
    synced = True
    version_error: ApiError | None = None

    def __init__(self, document: Mapping[str, Any]) -> None:
        version = document.get("version")
        self.version: dict[str, Any] | None = version if isinstance(version, dict) else None
        discovery = document.get("discovery") or {}
        self.discovery: dict[str, frozenset[str] | None] = {
            str(gv): None if names is None else frozenset(names) for gv, names in discovery.items()
        }
        self._held = {
            str(where): Reflector.frozen(
                str(held["resource"]), held.get("items") or [], namespaced=bool(held["namespaced"])
            )
            for where, held in (document.get("collections") or {}).items()
        }

    @classmethod
    def load(cls, path: Path) -> FrozenView:
        return cls(orjson.loads(path.read_bytes()))

    def reflector(self, path: str) -> Reflector | None:
        return self._held.get(path)

    def api(self, writes: KubeApi) -> ViewApi:
        return ViewApi(self, writes)


def _parse(path: str) -> tuple[str, str | None, str, str | None]:
    """A REST path as (collection path, namespace, resource, name): ``/api/v1/namespaces/a/pods/b`` is
    (``/api/v1/pods``, a, pods, b); a namespace object ``/api/v1/namespaces/a`` is (``/api/v1/namespaces``,
    None, namespaces, a)."""
    parts = [unquote(p) for p in path.split("?", 1)[0].strip("/").split("/")]
    root = parts[:2] if parts[0] == "api" else parts[:3]
    rest = parts[len(root) :]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        raise ValueError(f"not a collection or object path: {path}")
    resource, name = rest[0], (rest[1] if len(rest) > 1 else None)
    if len(rest) > 2:
        raise ValueError(f"subresources are not in the view: {path}")
    return "/" + "/".join([*root, resource]), namespace, resource, name


class ViewApi(KubeApi):
    """A ``KubeApi`` whose reads the view answers; writes (and a read the view does not hold: another API
    version, a resource it does not watch) go to the apiserver through the same client. Writes are refused
    while the view is not synced."""

    def __init__(self, view: ClusterView | FrozenView, writes: KubeApi) -> None:
        super().__init__(writes.api_client, page_size=writes.page_size, timeout=writes.timeout)
        self.view = view
        self.passed_through = 0  # reads the view could not answer (tests: a round makes none)
        self.sent: dict[str, int] = {}  # requests sent to the apiserver, by method (tests: no GET per round)

    # -- reads -------------------------------------------------------------------------------------------

    def _held(self, path: str) -> tuple[Reflector, str | None, str | None] | None:
        try:
            collection, namespace, _, name = _parse(path)
        except ValueError:
            return None
        reflector = self.view.reflector(collection)
        return None if reflector is None else (reflector, namespace, name)

    def _pass(self, path: str) -> None:
        self.passed_through += 1
        log.debug("lending view: read not held, sent to the apiserver", extra={"path": path})

    def get(self, path: str, *, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        self._require(path)
        if path == "/version" and not query:
            if self.view.version is not None:
                return dict(self.view.version)
            if self.view.version_error is not None:
                raise self.view.version_error
        group_version = path.removeprefix("/apis/")
        if path.startswith("/apis/") and group_version in self.view.discovery and not query:
            resources = self.view.discovery[group_version]
            if resources is None:
                raise NotFound("the server could not find the requested resource", status=404, path=path)
            return {"kind": "APIResourceList", "resources": [{"name": name} for name in sorted(resources)]}
        held = self._held(path)
        if held is None or held[2] is None or query:
            self._pass(path)
            return super().get(path, query=query)
        reflector, namespace, name = held
        items = reflector.items.get(namespace or "", {}) if reflector.namespaced else reflector.items
        found = items.get(name or "")
        if found is None:
            raise NotFound(f'{reflector.resource} "{name}" not found', status=404, reason="NotFound", path=path)
        return dict(found)

    def serving_versions(self, group: str, versions: Sequence[str], resource: str) -> tuple[str, ...]:
        self._require(f"/apis/{group}")
        if group == dra.GROUP and all(f"{group}/{v}" in self.view.discovery for v in versions):
            return tuple(v for v in versions if resource in (self.view.discovery[f"{group}/{v}"] or ()))
        self._pass(f"/apis/{group}")
        return super().serving_versions(group, versions, resource)

    def list(self, path: str, **options: Unpack[ListOptions]) -> Iterator[dict[str, Any]]:
        self._require(path)
        held = self._held(path)
        if held is None or held[2] is not None:
            if self._dra_not_served(path):
                raise NotFound("the server could not find the requested resource", status=404, path=path)
            self._pass(path)
            yield from super().list(path, **options)
            return
        reflector, namespace, _ = held
        fields = options.get("field_selector")
        if reflector.resource == "pods":
            terms = [t.strip() for t in (fields or "").split(",") if t.strip()]
            if not set(terms) >= _ACTIVE_TERMS:
                raise ValueError(f"the view holds active pods only: a pod list must select {ACTIVE_PODS}")
            fields = ",".join(t for t in terms if t not in _ACTIVE_TERMS)  # the watch's own selector holds them
        labels_match = label_matcher(options.get("label_selector"))
        fields_match = field_matcher(fields)
        for index, obj in enumerate(reflector.values(namespace)):
            if labels_match(obj) and fields_match(obj):
                yield obj
            if index % YIELD_EVERY == YIELD_EVERY - 1:
                # Hand the GIL over: a round reads 10,000s of objects in one thread of the process that answers
                # admission reviews, which would otherwise wait up to the switch interval (5 ms) at each turn.
                time.sleep(0)

    def _dra_not_served(self, path: str) -> bool:
        """A DRA collection of a version that discovery does not list for it: 404, as the apiserver says."""
        try:
            collection, _, resource, _ = _parse(path)
        except ValueError:
            return False
        prefix = f"/apis/{dra.GROUP}/"
        if not collection.startswith(prefix):
            return False
        group_version = collection[len("/apis/") : -len(resource) - 1]
        if group_version not in self.view.discovery:
            return False
        return resource not in (self.view.discovery[group_version] or ())

    def _require(self, path: str) -> None:
        """Nothing is read before the view is synced, not even through to the apiserver: a round decides on
        one view of the cluster or not at all."""
        if not self.view.synced:
            raise NotSynced(f"GET {path}: the view of the cluster is not synced")

    # -- writes: to the apiserver, only from a synced view ---------------------------------------------

    def _send(
        self, method: str, path: str, query: Mapping[str, str] | None, body: Any, content_type: str
    ) -> tuple[int, bytes, Mapping[str, str]]:
        if method != "GET" and not self.view.synced:
            raise NotSynced(f"{method} {path}: the view of the cluster is not synced, nothing is written")
        self.sent[method] = self.sent.get(method, 0) + 1
        return super()._send(method, path, query, body, content_type)
