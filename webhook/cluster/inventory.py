"""What the cluster holds, as the policy sees it: nodes and their pool, pods and the GPUs they take.

Pure functions over raw API objects (dicts exactly as the apiserver returns them), and a
``Snapshot`` that reads them through ``webhook.cluster.kubeapi``. Shared by ``audit`` and ``pool``.

- A node is in the **reserved** pool when it carries the policy's reserved label
  (``reservedNodes.nodeSelector``): the label is what the inference placement requires. Every other
  node is **shared**. Its GPUs are its allocatable GPU resources (``amd.com/gpu`` and the partition
  resources of the policy's ``scope``), one per device or partition. (A node split by device-level
  reservation is shared here; ``audit`` and ``pool status`` count its reserved GPUs in the reserved pool.)
- A pod's GPU request is its *effective* request, computed as the scheduler does
  (``computePodResourceRequest``): the larger of the sum over its containers (and restartable
  "sidecar" init containers) and the largest init container (plus the sidecars started before
  it), plus ``spec.overhead``. Requests default to limits for extended resources.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, Final, Literal

from webhook.cluster import slices
from webhook.cluster.kubeapi import Forbidden, KubeApi, NotFound, api_path
from webhook.core import claims as dra
from webhook.core.decision import NO_CLAIMS, ClaimFacts, DeviceFacts, NamespaceFacts, NodeFacts
from webhook.core.policy import Policy

log = logging.getLogger("webhook.inventory")

Pool = Literal["reserved", "shared"]
POOLS: Final[tuple[Pool, ...]] = ("reserved", "shared")
# The AMD GPU operator taints a node whose GPUs fail its health checks.
UNHEALTHY_TAINT: Final = "amd-gpu-unhealthy"
# Pods that hold or wait for resources: the apiserver filters out the finished ones.
ACTIVE_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"


# -- nodes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    labelled: bool  # carries the reserved label (key=value)
    tainted: bool  # carries the reserved taint (key, value and effect)
    unhealthy: bool  # tainted amd-gpu-unhealthy by the AMD GPU operator
    unschedulable: bool  # cordoned
    gpus: int  # allocatable GPU devices and partitions (device plugin, or DRA slots: the larger)
    gpu_resources: Mapping[str, int]  # per resource name
    resource_version: str = ""

    @property
    def pool(self) -> Pool:
        return "reserved" if self.labelled else "shared"


def quantity(value: Any) -> int:
    """A resource quantity as a whole number (extended resources such as GPUs are integers);
    0 when it cannot be read."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    return _quantity_text(str(value))


@lru_cache(maxsize=4096)
def _quantity_text(value: str) -> int:
    # A cluster writes few distinct quantities ("1", "8", "500m"): each parsed once, not once per pod.
    text = value.strip()
    suffixes = {"k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    multiplier = 1
    for suffix, factor in suffixes.items():
        if text.endswith(suffix) and len(text) > len(suffix):
            text, multiplier = text[: -len(suffix)], factor
            break
    else:
        if text.endswith("m") and len(text) > 1:  # milli-units: 1000m is 1
            try:
                return int(Decimal(text[:-1]) / 1000)
            except InvalidOperation:
                return 0
    try:
        return int(Decimal(text) * multiplier)
    except InvalidOperation:
        return 0


def gpu_resources(resources: Any, policy: Policy) -> dict[str, int]:
    """The GPU entries of a resource map (allocatable, requests or limits)."""
    if not isinstance(resources, Mapping):
        return {}
    return {str(name): quantity(value) for name, value in resources.items() if policy.gpu(str(name))}


def same_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same taint (key, value, effect), an absent value being the empty one."""
    return (
        a.get("key") == b.get("key")
        and (a.get("value") or "") == (b.get("value") or "")
        and a.get("effect") == b.get("effect")
    )


def node_info(node: Mapping[str, Any], policy: Policy) -> NodeInfo:
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    taints = tuple(t for t in (spec.get("taints") or []) if isinstance(t, Mapping))
    key, value = policy.spec.reserved_nodes.label
    reserved_taint = policy.spec.reserved_nodes.taint
    ours = reserved_taint.model_dump() if reserved_taint is not None else None
    gpus = gpu_resources((node.get("status") or {}).get("allocatable"), policy)
    return NodeInfo(
        name=str(metadata.get("name", "")),
        labels=labels,
        taints=taints,
        labelled=labels.get(key) == value,
        tainted=ours is not None and any(same_taint(t, ours) for t in taints),
        unhealthy=any(t.get("key") == UNHEALTHY_TAINT for t in taints),
        unschedulable=bool(spec.get("unschedulable")),
        gpus=sum(gpus.values()),
        gpu_resources=gpus,
        resource_version=str(metadata.get("resourceVersion", "")),
    )


# -- pods -----------------------------------------------------------------------------------------


def _container_gpus(container: Any, policy: Policy) -> dict[str, int]:
    if not isinstance(container, Mapping):
        return {}
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        return {}
    # The apiserver defaults requests to limits for extended resources; read both to be safe.
    found = gpu_resources(resources.get("limits"), policy)
    found.update(gpu_resources(resources.get("requests"), policy))
    return found


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, count in more.items():
        total[name] = total.get(name, 0) + count


def gpu_request(pod: Mapping[str, Any], policy: Policy) -> dict[str, int]:
    """The pod's effective GPU request per resource name, as the scheduler counts it."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        _add(total, _container_gpus(container, policy))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in spec.get("initContainers") or []:
        wanted = _container_gpus(container, policy)
        if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
            # A sidecar runs next to the app containers, and next to every init container after it.
            _add(total, wanted)
            _add(sidecars, wanted)
            during = dict(sidecars)
        else:
            during = dict(sidecars)
            _add(during, wanted)
        for name, count in during.items():
            init_peak[name] = max(init_peak.get(name, 0), count)
    for name, count in init_peak.items():
        total[name] = max(total.get(name, 0), count)
    _add(total, gpu_resources(spec.get("overhead"), policy))
    return {name: count for name, count in total.items() if count}


def claim_names(pod: Mapping[str, Any], *, extended: bool = True) -> list[str]:
    """The ResourceClaims a pod holds: named ones, those made from its templates and (``extended``) the
    one the scheduler made for its DRA extended resources (``status.resourceClaimStatuses``,
    ``extendedResourceClaimStatus``)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    names = [str(c.get("resourceClaimName")) for c in spec.get("resourceClaims") or [] if c.get("resourceClaimName")]
    names += [
        str(c.get("resourceClaimName")) for c in status.get("resourceClaimStatuses") or [] if c.get("resourceClaimName")
    ]
    made = extended_resource_claim(pod)
    if made and extended:
        names.append(made)
    return names


def extended_resource_claim(pod: Mapping[str, Any]) -> str:
    """The ResourceClaim the scheduler made for the pod's DRA extended resources (``status.
    extendedResourceClaimStatus``): the devices behind the GPUs of its resources. "" when none."""
    made = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    return str(made) if made else ""


def reserved_for(claim: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The pods a ResourceClaim is reserved for (``status.reservedFor[]`` entries of core ``pods``), as
    (name, uid): the pods holding its devices."""
    status = claim.get("status")
    entries = status.get("reservedFor") if isinstance(status, Mapping) else None
    found = []
    for ref in entries if isinstance(entries, list) else []:
        if not isinstance(ref, Mapping) or ref.get("resource") != "pods" or ref.get("apiGroup"):
            continue
        name, uid = ref.get("name"), ref.get("uid")
        if isinstance(name, str) and name:
            found.append((name, uid if isinstance(uid, str) else ""))
    return tuple(found)


def holds(pod: tuple[str, str], reserved: Iterable[tuple[str, str]]) -> bool:
    """Whether the pod (name, uid) holds a claim reserved for ``reserved`` (name, uid): a claim reserved for
    nobody yet is its pod's; one reserved for an earlier pod of the same name (another uid) is not."""
    found = list(reserved)
    name, uid = pod
    return not found or any(n == name and (not u or not uid or u == uid) for n, u in found)


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node: str  # spec.nodeName; empty while not scheduled
    phase: str
    gpus: int  # effective GPU request, all GPU resources together
    owner: tuple[str, str] | None  # (kind, name) of the controller
    created: datetime | None
    claims: bool  # references Dynamic Resource Allocation claims

    @property
    def bound(self) -> bool:
        return bool(self.node)

    @property
    def pending(self) -> bool:
        """Waiting to be scheduled (not bound to a node yet)."""
        return not self.node and self.phase in ("Pending", "")


def owner_of(metadata: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in metadata.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return None


def pod_info(pod: Mapping[str, Any], policy: Policy) -> PodInfo:
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return PodInfo(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or ""),
        gpus=sum(gpu_request(pod, policy).values()),
        owner=owner_of(metadata),
        created=parse_time(metadata.get("creationTimestamp")),
        claims=bool(spec.get("resourceClaims")),
    )


# -- reading the cluster --------------------------------------------------------------------------


@dataclass
class Snapshot:
    """Nodes (with the GPUs DRA drivers publish for them), namespace labels and DRA claims, read once;
    pods are streamed on demand (a large cluster has 100,000s: they are never all held in memory)."""

    policy: Policy
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    # Namespaces being deleted (deletionTimestamp set, phase Terminating): their own settings are no
    # longer worth a finding; the pods still in them are judged like any other.
    terminating: frozenset[str] = frozenset()
    claims: dict[str, ClaimFacts] = field(default_factory=dict)
    claims_version: str | None = None  # the resource.k8s.io version read; None when DRA is not served
    # DeviceClasses (what each selects, its extendedResourceName) and, per namespace and ResourceClaim,
    # the devices allocated to it as (driver, pool, device) (the ground truth of what a pod got).
    device_classes: dict[str, dra.DeviceClassInfo] = field(default_factory=dict)
    allocations: dict[str, dict[str, tuple[tuple[str, str, str], ...]]] = field(default_factory=dict)
    # The devices of the GPU drivers (and of the device reservation's driver) in the ResourceSlices: the
    # one reading of the slices (``cluster/slices.py``), counted in the nodes' gpus.
    published: slices.PublishedDevices = field(default_factory=lambda: slices.PublishedDevices(frozenset()))
    # Per namespace and allocated ResourceClaim, the pods it is reserved for (``status.reservedFor``), as
    # (name, uid): the pods that hold its devices.
    claim_holders: dict[str, dict[str, tuple[tuple[str, str], ...]]] = field(default_factory=dict)
    # The DeviceClasses as read (a few small objects: the device reservation is read back from its class).
    device_class_objects: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    # Whether the ResourceSlices were read (False: DRA not served, or the list was refused).
    slices_read: bool = False
    warnings: list[str] = field(default_factory=list)
    _devices: DeviceFacts | None = field(default=None, repr=False)
    _node_facts: NodeFacts | None = field(default=None, repr=False)

    @classmethod
    def read(cls, api: KubeApi, policy: Policy, *, claims: bool = True) -> Snapshot:
        snapshot = cls(policy)
        snapshot.read_nodes(api)
        snapshot.read_namespaces(api)
        if claims:
            snapshot.read_claims(api)
        return snapshot

    def read_nodes(self, api: KubeApi) -> None:
        nodes: dict[str, NodeInfo] = {}
        for node in api.list(api_path("v1", "nodes"), on_restart=nodes.clear):
            info = node_info(node, self.policy)
            nodes[info.name] = info
        self.nodes = nodes
        self._node_facts = None

    def read_namespaces(self, api: KubeApi) -> None:
        namespaces: dict[str, dict[str, str]] = {}
        terminating: set[str] = set()

        def restart() -> None:
            namespaces.clear()
            terminating.clear()

        for namespace in api.list(api_path("v1", "namespaces"), on_restart=restart):
            metadata = namespace.get("metadata") or {}
            name = str(metadata.get("name", ""))
            labels = metadata.get("labels") or {}
            namespaces[name] = {str(k): str(v) for k, v in labels.items()}
            if metadata.get("deletionTimestamp") or (namespace.get("status") or {}).get("phase") == "Terminating":
                terminating.add(name)
        self.namespaces = namespaces
        self.terminating = frozenset(terminating)

    def read_claims(self, api: KubeApi) -> None:
        """ResourceClaims and ResourceClaimTemplates of every namespace, DeviceClasses and the GPU drivers'
        ResourceSlices, from the newest resource.k8s.io version the cluster serves."""
        for version in dra.VERSIONS:
            group_version = f"{dra.GROUP}/{version}"
            try:
                found_claims = self._device_classes(
                    api,
                    api_path(group_version, "resourceclaims"),
                    allocations=self.allocations,
                    holders=self.claim_holders,
                )
                found_templates = self._device_classes(api, api_path(group_version, "resourceclaimtemplates"))
            except NotFound:
                continue
            except Forbidden as err:
                self.warnings.append(
                    f"DRA claims not read ({err.message}): pods that reference a claim count as GPU pods"
                )
                return
            self.claims_version = version
            for namespace in set(found_claims) | set(found_templates):
                self.claims[namespace] = ClaimFacts(
                    claims=found_claims.get(namespace, {}), templates=found_templates.get(namespace, {})
                )
            try:
                self.device_classes, self.device_class_objects = self._read_device_classes(
                    api, api_path(group_version, "deviceclasses")
                )
            except (NotFound, Forbidden) as err:
                self.warnings.append(
                    f"DeviceClasses not read ({err}): only the policy's gpuDeviceClasses and extendedResourceNames "
                    "are known as GPU classes"
                )
            self._read_slices(api, api_path(group_version, "resourceslices"))
            return

    @property
    def gpu_drivers(self) -> frozenset[str]:
        return frozenset(self.policy.spec.scope.gpu_drivers)

    def _read_slices(self, api: KubeApi, path: str) -> None:
        """The devices of each node's ResourceSlices; their GPUs are added to the node's gpus."""
        published = slices.PublishedDevices(self.gpu_drivers | {self.policy.spec.reserved_devices.driver})
        try:
            for resource_slice in api.list(path, on_restart=published.clear):
                published.add(resource_slice)
        except (NotFound, Forbidden) as err:
            self.warnings.append(
                f"ResourceSlices not read ({err}): GPUs published by DRA drivers are not counted as allocatable"
            )
            return
        self.slices_read = True
        self.published = published
        for name, gpus in published.gpus_per_node(self.gpu_drivers).items():
            node = self.nodes.get(name)
            if node is not None:
                # A node where both the device plugin and the DRA driver publish (a migration) has the
                # same GPUs twice: the larger count, not the sum.
                self.nodes[name] = replace(node, gpus=max(node.gpus, gpus))

    def claim_results(self, pod: Mapping[str, Any], *, extended: bool = False) -> list[tuple[str, str, str]]:
        """The (driver, pool, device)s of the GPU drivers that the pod's claims were allocated: its own
        claims, or (``extended``) the claim the scheduler made for its DRA extended resources."""
        metadata = pod.get("metadata") or {}
        namespace = str(metadata.get("namespace", ""))
        allocated = self.allocations.get(namespace)
        if not allocated:
            return []
        if extended:
            made = extended_resource_claim(pod)
            names = [made] if made else []
        else:
            names = claim_names(pod, extended=False)
        drivers = self.gpu_drivers
        holders = self.claim_holders.get(namespace, {})
        me = (str(metadata.get("name", "")), str(metadata.get("uid", "")))
        return [
            result
            for claim in names
            if holds(me, holders.get(claim, ()))
            for result in allocated.get(claim, ())
            if result[0] in drivers
        ]

    def dra_gpus_held(self, pod: Mapping[str, Any], counted: set[slices.Gpu]) -> int:
        """The GPUs a pod holds through its own claims that are not yet in ``counted`` (added to it): a
        claim several pods share counts once. The claim the scheduler made for DRA extended resources is
        left out: those GPUs are in the pod's resources (``gpu_request``)."""
        results = self.claim_results(pod)
        if not results:
            return 0
        new = slices.allocated_gpus(results, self.published.gpus_by_result()) - counted
        counted |= new
        return len(new)

    @staticmethod
    def _device_classes(
        api: KubeApi,
        path: str,
        allocations: dict[str, dict[str, tuple[tuple[str, str, str], ...]]] | None = None,
        holders: dict[str, dict[str, tuple[tuple[str, str], ...]]] | None = None,
    ) -> dict[str, dict[str, frozenset[str]]]:
        found: dict[str, dict[str, frozenset[str]]] = {}
        # List items carry no kind (the list does): it comes from the path.
        kind = dra.TEMPLATE_KIND if path.endswith("resourceclaimtemplates") else dra.CLAIM_KIND

        def restart() -> None:
            found.clear()
            if allocations is not None:
                allocations.clear()
            if holders is not None:
                holders.clear()

        for obj in api.list(path, on_restart=restart):
            metadata = obj.get("metadata") or {}
            namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
            try:
                classes = dra.device_classes(obj, kind)
                allocated = dra.allocated_results(obj) if allocations is not None else ()
            except dra.MalformedClaim:
                continue  # left out: the engine counts an unresolvable claim as a GPU request
            found.setdefault(namespace, {})[name] = classes
            if allocated and allocations is not None:
                allocations.setdefault(namespace, {})[name] = allocated
                pods = reserved_for(obj)
                if pods and holders is not None:
                    holders.setdefault(namespace, {})[name] = pods
        return found

    @staticmethod
    def _read_device_classes(
        api: KubeApi, path: str
    ) -> tuple[dict[str, dra.DeviceClassInfo], dict[str, Mapping[str, Any]]]:
        found: dict[str, dra.DeviceClassInfo] = {}
        objects: dict[str, Mapping[str, Any]] = {}

        def restart() -> None:
            found.clear()
            objects.clear()

        for obj in api.list(path, on_restart=restart):
            name = str((obj.get("metadata") or {}).get("name", ""))
            objects[name] = obj
            try:
                found[name] = dra.device_class_info(obj)
            except dra.MalformedClaim:
                continue  # validated by the apiserver: not expected; the policy's own names still apply
        return found, objects

    # -- facts for the engine -------------------------------------------------------------------

    @property
    def reserved_node_names(self) -> frozenset[str]:
        return frozenset(name for name, node in self.nodes.items() if node.labelled)

    def node_facts(self) -> NodeFacts:
        """Worked out once per snapshot (``pool`` and the lending keeper ask once per pod)."""
        if self._node_facts is None:
            self._node_facts = NodeFacts(reserved_node_names=self.reserved_node_names)
        return self._node_facts

    def namespace_facts(self, namespace: str) -> NamespaceFacts:
        # A namespace that is not listed (deleted meanwhile) is unknown, not unlabelled.
        return NamespaceFacts(name=namespace, labels=self.namespaces.get(namespace))

    def claim_facts(self, namespace: str) -> ClaimFacts:
        return self.claims.get(namespace, NO_CLAIMS)

    @property
    def devices(self) -> DeviceFacts:
        """The cluster's GPU DeviceClasses as the policy's drivers recognise them (worked out once)."""
        if self._devices is None:
            self._devices = dra.device_facts(
                self.device_classes,
                self.policy.spec.scope.gpu_drivers,
                self.policy.spec.reserved_devices.reserved_class_name,
            )
        return self._devices

    # -- pods -----------------------------------------------------------------------------------

    @staticmethod
    def pods(
        api: KubeApi,
        *,
        namespace: str | None = None,
        field_selector: str | None = ACTIVE_PODS,
        label_selector: str | None = None,
        on_restart: Any = None,
    ) -> Iterator[dict[str, Any]]:
        """Raw pods, page by page: by default those that are not finished (the apiserver filters);
        ``field_selector="spec.nodeName=NODE"`` reads one node's pods."""
        yield from api.list(
            api_path("v1", "pods", namespace=namespace),
            field_selector=field_selector,
            label_selector=label_selector,
            on_restart=on_restart,
        )
