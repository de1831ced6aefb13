"""Reading the cluster, once per ``pool`` command (``read_pool``): the nodes and the pods (``Cluster``) and,
for the verbs that need them, what Dynamic Resource Allocation says (``DraState``: DeviceClasses, the
driver's devices, ResourceClaims, our DeviceTaintRules, the API's versions). Every verb plans from this one
read; only a write that meets a conflict (409) reads its object again (``read_node``, ``pool_write``).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from webhook.cluster.inventory import NodeInfo, PodInfo, Snapshot, node_info, pod_info
from webhook.cluster.kubeapi import ApiError, Forbidden, KubeApi, NotFound, api_path
from webhook.cluster.slices import Device, Gpu, PublishedDevices
from webhook.core import claims as dra
from webhook.core import engine
from webhook.core.lending import is_borrower
from webhook.core.policy import Policy
from webhook.deploy import device_taint_rules, reserved_devices
from webhook.deploy.device_classes import DeviceReservation, with_tainted
from webhook.ops.capacity import CapacityModel, Holder, split_node_names
from webhook.ops.devices.ownership import ClassInfo, class_infos, current_reservation
from webhook.ops.devices.split import DEVICE_PLUGIN_PREFIX, split_labelled
from webhook.ops.raw import mapping
from webhook.ops.reservation import PoolNode, PoolPod, Reservation

MIRROR_ANNOTATION = engine.MIRROR_ANNOTATION


@dataclass(frozen=True)
class PoolRead:
    """What one ``pool`` command read of the cluster: the nodes and pods, and the DRA state (None for a
    whole-node release, which reads none)."""

    cluster: Cluster
    dra: DraState | None

    @property
    def devices(self) -> DraState:
        """The DRA state, for the verbs that read it (``dra_reads``)."""
        if self.dra is None:
            raise ValueError("this pool command read no DRA state")
        return self.dra


def dra_reads(args: argparse.Namespace) -> tuple[bool, bool] | None:
    """What a command reads of DRA, as (claims, required) (see ``read_dra``), or None: the device verbs need
    it all; ``status`` and whole-node ``plan``/``apply`` (which refuse a split node) read it when they may;
    a whole-node ``release`` reads none."""
    devices = getattr(args, "devices_per_node", None) is not None or getattr(args, "devices", False)
    if args.action == "release":
        return (True, True) if devices else None
    if args.action == "status":
        return (True, False)
    return (True, True) if devices else (False, False)


def read_pool(api: KubeApi, policy: Policy, args: argparse.Namespace) -> PoolRead:
    """The nodes and pods, then (``dra_reads``) the DRA state: once, for the whole command."""
    cluster = read_cluster(api, policy)
    reads = dra_reads(args)
    if reads is None:
        return PoolRead(cluster, None)
    claims, required = reads
    return PoolRead(cluster, read_dra(api, policy, claims=claims, required=required))


# --- nodes and pods ----------------------------------------------------------------------------


def pool_node(info: NodeInfo) -> PoolNode:
    return PoolNode(
        info.name, info.labels, info.taints, info.resource_version, info.gpus, info.unschedulable, info.unhealthy
    )


@dataclass(frozen=True)
class PodUsage:
    """What a pod holds, as the capacity model counts it (``CapacityModel.add_pod``)."""

    resource_gpus: int
    claim_results: tuple[tuple[str, str, str], ...]
    extended_results: tuple[tuple[str, str, str], ...]
    uid: str
    created: datetime | None
    borrower: bool = False  # core/lending.is_borrower
    terminating: bool = False  # being deleted (an eviction under way): what it holds is leaving


@dataclass(frozen=True)
class Cluster:
    nodes: list[PoolNode]
    pods: list[PoolPod]
    uids: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, name) of a pod -> its uid
    plugin_gpus: dict[str, int] = field(default_factory=dict)  # node -> allocatable amd.com/ GPU resources
    usage: dict[tuple[str, str], PodUsage] = field(default_factory=dict)  # (namespace, name) -> what it holds
    # (driver, pool, device) -> its GPU, of every GPU driver's published device
    gpu_by_result: Mapping[tuple[str, str, str], Gpu] = field(default_factory=dict)


def classify(raw: Mapping[str, Any], snapshot: Snapshot, policy: Policy) -> str:
    """The pod's class as admission decides it (the engine itself), "" when the policy skips it."""
    namespace = str((raw.get("metadata") or {}).get("namespace", ""))
    decision = engine.decide(
        operation="CREATE",
        pod=raw,
        namespace=snapshot.namespace_facts(namespace),
        nodes=snapshot.node_facts(),
        policy=policy,
        claims=snapshot.claim_facts(namespace),
        devices=snapshot.devices,
    )
    return decision.workload_class or ""


class PodMemo:
    """What ``read_cluster`` works out of each pod, kept for the next read of the same objects: the lending
    keeper reads the same unchanged pods from its view every round (the view replaces an object that
    changes, never modifies it), and deciding 10,000s of pods again each round would outlast the round.

    Keyed by the pod object's identity (kept, so the id is not reused) and what the answer depends on: the
    policy for ``pod_info`` and borrowing; for the class, also the facts of its namespace (labels, claims),
    the reserved node names and the cluster's GPU DeviceClasses. Those facts are compared once per namespace
    and read (an unchanged namespace keeps the same key object), a pod's key by identity. ``prune`` forgets
    the pods not read."""

    def __init__(self) -> None:
        # id(pod) -> [pod, policy, its PodInfo, borrower, facts key, class]; the class slots None until asked
        self._pods: dict[int, list[Any]] = {}
        self._facts: dict[str, tuple[Any, ...]] = {}  # namespace -> its facts key, this read
        self._previous: dict[str, tuple[Any, ...]] = {}  # and the read before
        self._seen: set[int] = set()

    def start(self) -> None:
        self._previous.update(self._facts)
        self._facts = {}
        self._seen = set()

    def info(self, raw: Mapping[str, Any], policy: Policy) -> tuple[PodInfo, bool]:
        self._seen.add(id(raw))
        known = self._pods.get(id(raw))
        if known is None or known[0] is not raw or known[1] is not policy:
            known = self._pods[id(raw)] = [raw, policy, pod_info(raw, policy), is_borrower(raw, policy), None, ""]
        return known[2], known[3]

    def classify(self, raw: Mapping[str, Any], snapshot: Snapshot, policy: Policy) -> str:
        namespace = str((raw.get("metadata") or {}).get("namespace", ""))
        key = self._facts.get(namespace)
        if key is None:
            labels = snapshot.namespaces.get(namespace)
            claims = snapshot.claim_facts(namespace)
            key = (
                policy,
                None if labels is None else frozenset(labels.items()),
                frozenset(claims.claims.items()),
                frozenset(claims.templates.items()),
                snapshot.node_facts().reserved_node_names,
                snapshot.devices,
            )
            before = self._previous.get(namespace)
            self._facts[namespace] = key = before if before == key else key
        known = self._pods.get(id(raw))
        if known is None or known[0] is not raw:
            self.info(raw, policy)
            known = self._pods[id(raw)]
        if known[4] is not key:
            known[4], known[5] = key, classify(raw, snapshot, policy)
        return str(known[5])

    def prune(self) -> None:
        for gone in [k for k in self._pods if k not in self._seen]:
            del self._pods[gone]
        self._previous = {ns: key for ns, key in self._previous.items() if ns in self._facts}


def pool_pod(
    raw: Mapping[str, Any],
    snapshot: Snapshot,
    policy: Policy,
    counted: set[Gpu] | None = None,
    info: PodInfo | None = None,
    memo: PodMemo | None = None,
) -> PoolPod | None:
    """A bound, unfinished pod that holds GPUs (its resources, and the DRA GPU slots of its claims not in
    ``counted`` yet) or that the policy classifies; None otherwise. ``info``: its ``pod_info``, when read."""
    info = info or pod_info(raw, policy)
    if not info.bound:
        return None
    gpus = info.gpus + snapshot.dra_gpus_held(raw, set() if counted is None else counted)
    class_name = classify(raw, snapshot, policy) if memo is None else memo.classify(raw, snapshot, policy)
    if not class_name and gpus == 0:
        return None
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    cls = policy.spec.classes.get(class_name)
    return PoolPod(
        namespace=info.namespace,
        name=info.name,
        node=info.node,
        owner=f"{info.owner[0]}/{info.owner[1]}" if info.owner else "",
        gpus=gpus,
        class_name=class_name,
        inference=cls is not None and cls.placement == "reserved",
        daemonset=info.owner is not None and info.owner[0] == "DaemonSet",
        mirror=MIRROR_ANNOTATION in annotations,
    )


def read_cluster(api: KubeApi, policy: Policy, memo: PodMemo | None = None) -> Cluster:
    """Nodes and pods, once; with ``memo`` (the lending keeper's), what each pod's reading and class were
    when the same object was read before."""
    snapshot = Snapshot.read(api, policy)
    if memo is not None:
        memo.start()
    pods: list[PoolPod] = []
    uids: dict[tuple[str, str], str] = {}
    counted: set[Gpu] = set()

    usage: dict[tuple[str, str], PodUsage] = {}

    def restart() -> None:
        pods.clear()
        uids.clear()
        usage.clear()
        counted.clear()

    for raw in Snapshot.pods(api, on_restart=restart):
        info, borrower = (pod_info(raw, policy), None) if memo is None else memo.info(raw, policy)
        found = pool_pod(raw, snapshot, policy, counted, info, memo)
        if found is not None:
            pods.append(found)
            ref = (found.namespace, found.name)
            uids[ref] = info.uid
            usage[ref] = PodUsage(
                info.gpus,
                tuple(snapshot.claim_results(raw)),
                tuple(snapshot.claim_results(raw, extended=True)),
                info.uid,
                info.created,
                is_borrower(raw, policy) if borrower is None else borrower,
                bool((raw.get("metadata") or {}).get("deletionTimestamp")),
            )
    if memo is not None:
        memo.prune()
    plugin = {
        info.name: sum(n for name, n in info.gpu_resources.items() if name.startswith(DEVICE_PLUGIN_PREFIX))
        for info in snapshot.nodes.values()
    }
    return Cluster(
        [pool_node(info) for info in snapshot.nodes.values()],
        pods,
        uids,
        plugin,
        usage,
        snapshot.published.gpus_by_result(),
    )


def reservation_now(policy: Policy, state: DraState | None) -> DeviceReservation | None:
    """The device reservation our reserved class records (with the devices our rules taint), None when there
    is none, or when a class of our names is not ours."""
    if state is None:
        return None
    devices = policy.spec.reserved_devices
    if any(
        name in state.classes and not state.classes[name].ours
        for name in (devices.reserved_class_name, devices.shared_class_name)
    ):
        return None
    current = current_reservation(policy, state.classes)
    return None if current is None else with_tainted(current, device_taint_rules.tainted_keys(state.rules))


def capacity_model(policy: Policy, read: PoolRead, reservation: Reservation) -> CapacityModel:
    """The capacity model of what the command read (``ops/capacity.py``): the nodes on their side, the split
    nodes on both, every pod read with what it holds."""
    cluster, state = read.cluster, read.dra
    current = reservation_now(policy, state)
    published = state.published if state is not None else {}
    split_value = policy.spec.reserved_devices.node_label_value
    rule_nodes = (
        []
        if state is None
        else [d.node or d.pool for obj in state.rules if (d := device_taint_rules.tainted_device(obj)) is not None]
    )
    whole = [n.name for n in cluster.nodes if n.labelled(reservation)]
    split = split_node_names(
        published,
        current,
        labelled=[
            n.name for n in cluster.nodes if split_value is not None and split_labelled(n, reservation, split_value)
        ],
        rule_nodes=rule_nodes,
        whole=whole,
    )
    model = CapacityModel.build(
        ((n.name, n.gpus, n.labelled(reservation)) for n in cluster.nodes),
        published,
        current,
        split,
        policy.spec.reserved_devices.driver,
    )
    for pod in cluster.pods:
        usage = cluster.usage.get((pod.namespace, pod.name))
        if usage is None:
            continue
        holder = Holder(
            pod.namespace, pod.name, pod.class_name, pod.inference, usage.uid, usage.borrower, usage.created
        )
        model.add_pod(
            holder, pod.node, usage.resource_gpus, usage.claim_results, usage.extended_results, cluster.gpu_by_result
        )
    return model


def read_node(api: KubeApi, name: str, policy: Policy) -> PoolNode:
    return pool_node(node_info(api.get(api_path("v1", "nodes", name=name)), policy))


# --- Dynamic Resource Allocation ---------------------------------------------------------------


@dataclass
class DraState:
    """What device-level reservation reads of Dynamic Resource Allocation, raw."""

    version: str | None  # the resource.k8s.io version read; None when none is served (or not readable)
    classes: dict[str, ClassInfo]
    published: dict[str, tuple[Device, ...]]  # the driver's devices per node
    claims: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    # Our DeviceTaintRules, and any rule of one of our names (refused by the plan, never written over).
    rules: list[dict[str, Any]] = field(default_factory=list)
    # The resource.k8s.io versions serving devicetaintrules, newest first; None when discovery failed.
    rule_versions: tuple[str, ...] | None = ()
    server_version: tuple[int, int, int] | None = None  # the kube-apiserver's (GET /version)

    @property
    def rule_version(self) -> str | None:
        return self.rule_versions[0] if self.rule_versions else None


def read_dra(api: KubeApi, policy: Policy, *, claims: bool, required: bool) -> DraState:
    """DeviceClasses, the driver's devices in ResourceSlices and (``claims``) ResourceClaims, from the newest
    resource.k8s.io version served. ``required``: an error (RBAC) is raised (exit 2), else it is a warning
    and nothing is known (whole-node commands and status keep working without DRA permissions)."""
    driver = policy.spec.reserved_devices.driver
    for version in dra.VERSIONS:
        group_version = f"{dra.GROUP}/{version}"
        found: list[dict[str, Any]] = []
        try:
            for obj in api.list(api_path(group_version, "deviceclasses"), on_restart=found.clear):
                found.append(obj)
        except NotFound:
            continue
        try:
            published = PublishedDevices(frozenset({driver}))
            for resource_slice in api.list(api_path(group_version, "resourceslices"), on_restart=published.clear):
                published.add(resource_slice)
            raw_claims: list[dict[str, Any]] = []
            if claims:
                for claim in api.list(api_path(group_version, "resourceclaims"), on_restart=raw_claims.clear):
                    raw_claims.append(claim)
        except (NotFound, Forbidden) as err:
            if required:
                raise
            return DraState(None, {}, {}, [], [f"device-level reservation not read ({err})"])
        state = DraState(version, class_infos(found), published.per_node(driver), raw_claims)
        read_taint_rules(api, state, required=required)
        return state
    return DraState(None, {}, {}, [])


def read_taint_rules(api: KubeApi, state: DraState, *, required: bool) -> None:
    """Our DeviceTaintRules, in the newest version that serves them (none when none does)."""
    state.rule_versions = device_taint_rule_versions(api)
    state.server_version = server_version(api)
    version = state.rule_version
    if version is None:
        return
    path = api_path(f"{dra.GROUP}/{version}", device_taint_rules.RESOURCE)
    found: list[dict[str, Any]] = []
    try:
        for obj in api.list(path, on_restart=found.clear):
            # Ours, and any other of our rules' names: a rule of that name that is not ours is refused by
            # the plan (rule_changes), never written over.
            name = str(mapping(obj.get("metadata")).get("name", ""))
            if device_taint_rules.is_ours(obj) or name.startswith(device_taint_rules.NAME_PREFIX):
                found.append(obj)
    except (NotFound, Forbidden) as err:
        if required:
            raise
        state.warnings.append(f"DeviceTaintRules not read ({err})")
        return
    state.rules[:] = found


def server_version(api: KubeApi) -> tuple[int, int, int] | None:
    """The kube-apiserver's version (``gitVersion`` v1.36.2, or its ``major``/``minor`` when that does not
    parse), None when it cannot be read."""
    try:
        document = api.get("/version")
    except ApiError:
        return None
    found = re.match(r"v?(\d+)\.(\d+)\.(\d+)", str(document.get("gitVersion") or ""))
    if found:
        major, minor, patch = (int(part) for part in found.groups())
        return (major, minor, patch)
    return None


def device_taint_rule_versions(api: KubeApi) -> tuple[str, ...] | None:
    """The resource.k8s.io versions whose API discovery lists ``devicetaintrules``, newest first; None when
    discovery could not be read."""
    try:
        return api.serving_versions(device_taint_rules.GROUP, device_taint_rules.VERSIONS, device_taint_rules.RESOURCE)
    except ApiError:
        return None


def missing_device_backstop(api: KubeApi) -> list[str] | None:
    """The device-level backstop's ValidatingAdmissionPolicies (``deploy/reserved_devices``) the cluster does not
    hold, e.g. manifests rendered for 1.33 (no DRA there) still installed after the move to 1.34; None when they
    could not be read (forbidden, unreachable): nothing is said then."""
    missing = []
    for name in reserved_devices.POLICY_NAMES:
        try:
            api.get(api_path("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", name=name))
        except NotFound:
            missing.append(name)
        except ApiError:
            return None
    return missing
