"""``audit``: running pods, nodes and namespaces against the policy, and the pools' capacity.

The webhook only sees pods as they are admitted; this reads what is already there. Pods are judged
by the admission engine itself (``engine.decide`` on a CREATE of the pod as it is now, with the
reserved nodes, the namespace labels and the namespace's DRA claims read from the cluster): its
violations and the patch it would still send are the findings, so the audit can never disagree
with admission. Two readings of the decision:

- the policy is judged in ``enforce`` mode, and the namespace mode label is left out: in ``audit``
  mode ``decide`` sends no patch, and the point here is what the policy *would* do;
- only patch operations outside ``/metadata/annotations`` count as "missing mutations": the
  annotations are the webhook's record, not isolation.

With ``--gpu-metrics`` (Prometheus, or a file of the exporter's series) the reserved GPUs are also judged on what
AMD's device metrics exporter reports (``ops/gpus/``): use nobody was allocated, a class kept off them confirmed
by the GPU, unhealthy or hot GPUs, inference's load. When those series cannot be read, one warning says so and
every other finding is reported as usual: the exit code is not changed by it.

Rule ids are stable (metrics labels, PolicyReport rules, docs/operations.md).
Exit codes: 0 no finding, 1 findings, 2 the cluster or the policy could not be read.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, TextIO, get_args

import yaml

from webhook.cluster import discovery
from webhook.cluster.inventory import POOLS, NodeInfo, Pool, Snapshot
from webhook.cluster.kubeapi import ApiError, Forbidden, KubeApi, NotFound
from webhook.cluster.view import FrozenView, ViewApi
from webhook.core.claims import MODE_CLASSES, MODE_TAINTS
from webhook.core.policy import Mode, Policy, PolicyError, compile_policy, default_policy, load_policy
from webhook.deploy import device_classes, minors, reserved_names
from webhook.deploy.device_classes import DeviceReservation
from webhook.ops.audit.devices import DeviceAudit, TaintRuleReading, read_taint_rules
from webhook.ops.audit.findings import POLICY_NAME as POLICY_NAME
from webhook.ops.audit.findings import RULES as RULES
from webhook.ops.audit.findings import SOURCE as SOURCE
from webhook.ops.audit.findings import Finding as Finding
from webhook.ops.audit.findings import Rule as Rule
from webhook.ops.audit.pods import UNCLASSIFIED, Pending, PodAudit
from webhook.ops.capacity import RESERVED, SHARED, SIDES, CapacityModel, GpuView, Holder
from webhook.ops.devices import minor as device_minor
from webhook.ops.devices.plan import reservation_text
from webhook.ops.gpus import judge as gpu_judge
from webhook.ops.gpus.series import Readings
from webhook.ops.gpus.source import GpuSourceError
from webhook.ops.prometheus import add_prometheus_options

EXIT_CLEAN: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_ERROR: Final = 2

# Pages decoded ahead while the previous one is judged (bounded: each holds ~500 pods).
PREFETCH_PAGES: Final = 2
PSS_ENFORCE_LABEL: Final = "pod-security.kubernetes.io/enforce"

_MODES: Final = get_args(Mode)


@dataclass
class PoolCapacity:
    """One pool in the capacity section: its nodes, their GPUs, the GPUs allocated per class and the pods
    waiting per class (the capacity model's numbers, as ``audit -o json`` and the gauges show them)."""

    nodes: int = 0
    gpus_allocatable: int = 0
    gpus_requested: dict[str, int] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)

    @classmethod
    def of(cls, model: CapacityModel, side: Pool, pending: dict[str, Pending]) -> PoolCapacity:
        return cls(
            len(model.pool_nodes(side)),
            model.capacity(side),
            model.allocated_by_class(side, UNCLASSIFIED),
            pending,
        )

    def to_json(self, now: datetime) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpusAllocatable": self.gpus_allocatable,
            "gpusRequested": dict(sorted(self.gpus_requested.items())),
            "pendingPods": {
                cls: {"pods": p.pods, "oldestWaitSeconds": round(p.wait_seconds(now))}
                for cls, p in sorted(self.pending.items())
            },
        }


@dataclass(frozen=True)
class DeviceCapacity:
    """The split nodes of an active device reservation, for the capacity section: the capacity model's
    split nodes, each side's GPUs and what is allocated there per class."""

    driver: str
    reservation: DeviceReservation
    model: CapacityModel

    def node_counts(self) -> list[tuple[str, int, int, dict[str, dict[str, int]]]]:
        return [
            (
                name,
                self.model.nodes[name].side(RESERVED).capacity,
                self.model.nodes[name].side(SHARED).capacity,
                {side: self.model.nodes[name].side(side).allocated_by_class(UNCLASSIFIED) for side in SIDES},
            )
            for name in self.model.split_names()
        ]

    def gpus(self) -> list[tuple[str, list[tuple[GpuView, list[Holder]]]]]:
        """Each split node's GPUs (the driver's devices grouped by GPU, PCI order) with the pods holding their
        allocated devices: the layout a GPU published as several devices (partitions, AutoPartition layouts)
        is in, and who holds it."""
        holding = self.model.holding()
        known = {
            h.ref: h for node in self.model.nodes.values() for side in node.sides.values() for h, _ in side.holders
        }
        return [
            (
                name,
                [
                    (
                        view,
                        [
                            known.get(ref) or Holder(ref[0], ref[1], "")
                            for ref in dict.fromkeys(r for d in view.allocated for r in holding.get(d.key, ()))
                        ],
                    )
                    for view in self.model.gpu_views(name, holding)
                ],
            )
            for name in self.model.split_names()
        ]

    def totals(self) -> tuple[int, int, dict[str, dict[str, int]]]:
        allocated: dict[str, dict[str, int]] = {side: {} for side in SIDES}
        reserved = shared = 0
        for _, on_reserved, on_shared, per_side in self.node_counts():
            reserved, shared = reserved + on_reserved, shared + on_shared
            for side, per_class in per_side.items():
                for cls, count in per_class.items():
                    allocated[side][cls] = allocated[side].get(cls, 0) + count
        return reserved, shared, {side: dict(sorted(per_class.items())) for side, per_class in allocated.items()}

    def to_json(self) -> dict[str, Any]:
        reserved, shared, allocated = self.totals()
        gpus = dict(self.gpus())
        return {
            "driver": self.driver,
            "mode": MODE_TAINTS if self.reservation.by_taints else MODE_CLASSES,
            "devicesPerNode": self.reservation.devices_per_node,
            "pciBusIds": list(self.reservation.pci_bus_ids),
            "reservedDevices": reserved,
            "sharedDevices": shared,
            "devicesAllocated": allocated,
            "nodes": [
                {
                    "name": name,
                    "reservedDevices": r,
                    "sharedDevices": sh,
                    "devicesAllocated": per_side,
                    "gpuList": [_gpu_json(view, holders) for view, holders in gpus.get(name, [])],
                }
                for name, r, sh, per_side in self.node_counts()
            ],
        }


def _gpu_json(view: GpuView, holders: list[Holder]) -> dict[str, Any]:
    """A GPU as ``pool status -o json`` shows it (``gpuList``)."""
    return {
        "pciBusId": view.pci_bus_id or None,
        "state": view.state,
        "devices": len(view.devices),
        "allocated": [d.name for d in view.allocated],
        "pods": [{"namespace": h.namespace, "name": h.name, "class": h.class_name or None} for h in holders],
    }


@dataclass
class Report:
    now: datetime
    findings: list[Finding] = field(default_factory=list)
    capacity: dict[Pool, PoolCapacity] = field(default_factory=lambda: {pool: PoolCapacity() for pool in POOLS})
    pods_checked: int = 0
    warnings: list[str] = field(default_factory=list)
    # The split nodes while a device-level reservation is active; None otherwise.
    devices: DeviceCapacity | None = None
    # --gpu-metrics: what the exporter's series said (None: not asked), or why they could not be read.
    gpus: gpu_judge.Judgement | None = None
    gpu_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        capacity: dict[str, Any] = {pool: self.capacity[pool].to_json(self.now) for pool in POOLS}
        if self.devices is not None:
            capacity["devices"] = self.devices.to_json()
        out: dict[str, Any] = {"findings": [f.to_json() for f in self.findings], "capacity": capacity}
        if self.gpus is not None or self.gpu_error is not None:
            out["gpuMetrics"] = self.gpu_json()
        return out

    def gpu_json(self) -> dict[str, Any]:
        """``gpuMetrics`` of ``-o json``: read or not, the notes (one line each), each reserved GPU's load."""
        judged = self.gpus
        return {
            "read": judged is not None,
            "error": self.gpu_error,
            "gpusJudged": judged.gpus_judged if judged else 0,
            "staleNodes": judged.stale if judged else [],
            "notes": judged.lines if judged else [],
            "reservedGpus": [
                {
                    "node": load.node,
                    "gpu": load.gpu,
                    "pciBusId": load.pci_bus_id or None,
                    "activityPercent": round(load.activity_percent, 1),
                    "inference": load.inference,
                }
                for load in (judged.loads if judged else [])
            ],
        }

    def counts(self) -> dict[str, int]:
        """Findings per rule, every rule present (0 when none)."""
        counts = dict.fromkeys(RULES, 0)
        for finding in self.findings:
            counts[finding.rule] += 1
        return counts


# -- judging --------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def enforcing(policy: Policy) -> Policy:
    """The policy in enforce mode (in audit mode ``decide`` sends no patch: nothing to compare)."""
    if policy.spec.mode == "enforce":
        return policy
    spec = policy.document.spec.model_copy(update={"mode": "enforce"})
    return compile_policy(policy.document.model_copy(update={"spec": spec}), source=policy.source)


def judge_node(node: NodeInfo, policy: Policy) -> list[Finding]:
    key, value = policy.spec.reserved_nodes.label
    taint = policy.spec.reserved_nodes.taint
    found = []

    def add(rule: str, message: str) -> None:
        found.append(Finding(rule, "Node", node.name, message))

    if node.labelled and taint is not None and not node.tainted:
        add(
            "node-label-without-taint",
            f"node {node.name} is labelled {key}={value} but lacks the taint {taint.key}={taint.value}:{taint.effect}: "
            f"any pod that does not avoid the label can be scheduled onto it; taint it "
            f"(kubectl taint nodes {node.name} {taint.key}={taint.value}:{taint.effect})",
        )
    if node.tainted and not node.labelled and taint is not None:
        add(
            "node-taint-without-label",
            f"node {node.name} has the taint {taint.key}={taint.value}:{taint.effect} but not the label {key}={value}: "
            f"inference pods require the label and other pods do not tolerate the taint, so nothing GPU-bound runs "
            f"there; label it (kubectl label nodes {node.name} {key}={value}) or remove the taint",
        )
    if node.labelled and node.gpus == 0:
        add(
            "reserved-node-without-gpus",
            f"node {node.name} is in the reserved pool ({key}={value}) but has no allocatable AMD GPU: no GPU "
            "resource in its allocatable, no device of the GPU drivers in its ResourceSlices (is the AMD device "
            "plugin or DRA driver running there?)",
        )
    if node.labelled and node.unhealthy:
        add(
            "reserved-node-gpu-unhealthy",
            f"node {node.name} is in the reserved pool and tainted amd-gpu-unhealthy by the AMD GPU operator: its GPUs "
            "take no new inference pods until the operator clears the taint",
        )
    return found


def judge_namespace(name: str, labels: Mapping[str, str], policy: Policy) -> list[Finding]:
    spec = policy.spec
    found = []
    value = labels.get(spec.labels.namespace_class)
    if value is not None and value not in spec.classes:
        found.append(
            Finding(
                "namespace-unknown-class",
                "Namespace",
                name,
                f"namespace {name} is labelled {spec.labels.namespace_class}={value}, which is no class of the policy "
                f"({', '.join(spec.classes)}); its GPU pods get the default class {spec.default_class}",
            )
        )
    mode = labels.get(spec.labels.namespace_mode)
    if mode is not None and mode not in _MODES:
        found.append(
            Finding(
                "namespace-unknown-mode",
                "Namespace",
                name,
                f"namespace {name} is labelled {spec.labels.namespace_mode}={mode}, which is not enforce, warn or "
                f"audit; the policy's mode {spec.mode} applies",
            )
        )
    return found


def judge_namespace_pod_security(name: str, labels: Mapping[str, str], policy: Policy) -> list[Finding]:
    """Pod Security baseline closes the privileged route at admission: a namespace whose classes are all
    kept off the reserved nodes should enforce it (docs/operations.md, "Pod Security"). Judged for the
    namespaces a class label or rule classifies, and those running GPU pods (not every namespace that
    falls to the default class)."""
    if name in policy.spec.excluded_namespaces or not policy.spec.scope.routes.privileged_containers:
        return []
    classes = policy.namespace_classes(name, labels)
    if any(policy.spec.classes[cls].placement != "unreserved" for cls in classes.allowed):
        return []
    level = labels.get(PSS_ENFORCE_LABEL)
    if level in ("baseline", "restricted"):
        return []
    return [
        Finding(
            "namespace-allows-privileged",
            "Namespace",
            name,
            f"namespace {name} (class {', '.join(classes.allowed)}, {classes.source}) "
            + (f"enforces Pod Security {level}" if level else "enforces no Pod Security level")
            + ": its pods may be privileged, and a privileged container sees every GPU of its node; label it "
            f"(kubectl label namespace {name} {PSS_ENFORCE_LABEL}=baseline)",
        )
    ]


def judge_device_classes(snapshot: Snapshot, policy: Policy) -> list[Finding]:
    """GPU DeviceClasses (by driver) that the CEL cannot know: named neither in gpuDeviceClasses nor, for
    their extendedResourceName, in extendedResourceNames."""
    scope = policy.spec.scope
    devices = snapshot.devices
    found = []
    for name in sorted(devices.gpu_classes):
        info = snapshot.device_classes[name]
        missing = []
        if not policy.gpu_device_classes(name):
            missing.append(f"add {name} to spec.scope.gpuDeviceClasses")
        extended = info.extended_resource_name
        if extended and extended not in scope.extended_resource_names and not policy.gpu(extended):
            missing.append(f"add {extended} (its extendedResourceName) to spec.scope.extendedResourceNames")
        if missing:
            found.append(
                Finding(
                    "deviceclass-not-in-policy",
                    "DeviceClass",
                    name,
                    f"DeviceClass {name} hands out devices of a GPU driver ({', '.join(scope.gpu_drivers)}), but the "
                    "ValidatingAdmissionPolicy and the webhook's matchConditions cannot look DeviceClasses up: "
                    + "; ".join(missing),
                )
            )
    return found


def _judge_reserved_node_names(api: KubeApi, labelled: list[str], report: Report) -> None:
    """The backstop's params ConfigMap against the labelled nodes (reserved_names.py)."""
    path = f"{reserved_names.CONFIGMAP_PATH}/{reserved_names.PARAMS_CONFIGMAP}"
    try:
        data: dict[str, str] = api.get(path).get("data") or {}
    except NotFound:
        # Until the first pool apply (or on a cluster reserved by hand): said, not a finding.
        report.warnings.extend(reserved_names.disagreement(None, labelled))
        return
    except Forbidden as err:
        report.warnings.append(f"the backstop's reserved node names were not checked: {err}")
        return
    for message in reserved_names.disagreement(data, labelled):
        report.findings.append(
            Finding(
                "reserved-node-names-out-of-date",
                "ConfigMap",
                reserved_names.PARAMS_CONFIGMAP,
                message,
                namespace=reserved_names.NAMESPACE,
            )
        )


def _taint_rules(api: KubeApi, snapshot: Snapshot, report: Report) -> TaintRuleReading | None:
    """Our DeviceTaintRules, read only while our reserved class records an active reservation (none
    otherwise: nothing of them is judged)."""
    obj = snapshot.device_class_objects.get(snapshot.policy.spec.reserved_devices.reserved_class_name)
    reservation = device_classes.reservation_of(obj)
    if reservation is None or not reservation.active:
        return None
    return read_taint_rules(api, report.warnings)


def capacity_model(snapshot: Snapshot, devices: DeviceAudit) -> CapacityModel:
    """The capacity model of the nodes read: each node whole on its side, the split nodes on both."""
    return CapacityModel.build(
        ((node.name, node.gpus, node.labelled) for node in snapshot.nodes.values()),
        devices.published,
        devices.reservation,
        devices.split or (),
        snapshot.policy.spec.reserved_devices.driver,
    )


def served_by(api: KubeApi) -> minors.Served | None:
    """What the cluster's minor serves (API discovery; the apiserver's feature gates where RBAC lets us read its
    /metrics, else that minor's stock defaults), None when discovery is unreadable. On the lending keeper's view
    (``cluster/view.py``; serve's background audit reads its dump) discovery is the view's and no feature gate is
    read: the background audit adds no request, and serve's account may not read /metrics (the stock defaults)."""
    view = isinstance(api, ViewApi)
    if type(api) is not KubeApi and not view:
        return None
    try:
        return minors.from_cluster(*discovery.served(api, minors.DISCOVERED, gates=not view))
    except ApiError:
        return None


GpuSource = Callable[[float, gpu_judge.Thresholds], Readings]  # (now, thresholds) -> the exporter's series


def judge_gpus(report: Report, model: CapacityModel, policy: Policy, source: GpuSource) -> None:
    """The reserved GPUs on what the exporter reports (``ops/gpus``): findings, or one warning."""
    limits = gpu_judge.thresholds(policy)
    try:
        readings = source(report.now.timestamp(), limits)
    except GpuSourceError as err:
        report.gpu_error = str(err)
        report.warnings.append(f"{err}: the GPUs were not judged (every other finding is reported)")
        return
    judged = gpu_judge.judge(readings, model, limits, gpu_judge.kept_off(policy))
    report.gpus = judged
    report.warnings.extend(f"GPU metrics: {line}" for line in judged.lines)
    for seen in judged.observations:
        if seen.pod is not None:
            report.findings.append(Finding(seen.rule, "Pod", seen.pod.name, seen.message, namespace=seen.pod.namespace))
        else:
            report.findings.append(Finding(seen.rule, "Node", seen.node, seen.message))


def run_audit(
    api: KubeApi, policy: Policy, *, now: datetime | None = None, gpu_source: GpuSource | None = None
) -> Report:
    """Read the cluster and judge it (and, given ``gpu_source``, the reserved GPUs on what they report). Raises
    ``ApiError`` when the cluster cannot be read. The device reservation is judged as the cluster's minor can hold
    it (``devices/minor.py``: no extendedResourceName where the apiserver drops it)."""
    policy, _ = device_minor.policy_for(policy, served_by(api))
    snapshot = Snapshot.read(api, policy)
    report = Report(now=now or datetime.now(UTC), warnings=list(snapshot.warnings))
    for node in snapshot.nodes.values():
        report.findings.extend(judge_node(node, policy))
    _judge_reserved_node_names(api, [n.name for n in snapshot.nodes.values() if n.labelled], report)
    # A namespace being deleted is not judged itself (its pods are).
    namespaces = {name: labels for name, labels in snapshot.namespaces.items() if name not in snapshot.terminating}
    for name, labels in namespaces.items():
        report.findings.extend(judge_namespace(name, labels, policy))
    report.findings.extend(judge_device_classes(snapshot, policy))
    devices = DeviceAudit.of(snapshot, _taint_rules(api, snapshot, report))
    report.warnings.extend(devices.warnings)
    report.findings.extend(devices.findings())
    model = capacity_model(snapshot, devices)
    pods = PodAudit(snapshot, enforcing(policy), model, devices if devices.split is not None else None)
    with _collector_paused():
        for pod in Snapshot.pods(api, on_restart=pods.restart):
            pods.add(pod)
    report.findings.extend(pods.findings)
    report.findings.extend(pods.judge_waiting(report.now))
    report.pods_checked = pods.pods_checked
    report.capacity = {pool: PoolCapacity.of(model, pool, pods.pending[pool]) for pool in POOLS}
    if devices.split is not None and devices.reservation is not None:
        report.devices = DeviceCapacity(policy.spec.reserved_devices.driver, devices.reservation, model)
    if gpu_source is not None:
        judge_gpus(report, model, policy, gpu_source)
    for name, labels in sorted(namespaces.items()):
        explicit = policy.namespace_classes(name, labels).source != "the policy's defaultClass"
        if explicit or name in pods.gpu_namespaces:
            report.findings.extend(judge_namespace_pod_security(name, labels, policy))
    return report


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cycle collector while pods stream through. A page of JSON holds no reference cycle
    (reference counting frees it), yet its ~100,000 new containers trigger collections that walk
    them for nothing: with the collector on, decoding a page takes up to twice as long."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# -- output ---------------------------------------------------------------------------------------


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        out.write(
            "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "   " + row[-1] + "\n"
        )


def _per_class(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{cls}={value}" for cls, value in sorted(values.items())) or "-"


def write_table(report: Report, out: TextIO) -> None:
    if report.findings:
        rows = [["RULE", "KIND", "NAME", "MESSAGE"]]
        for f in report.findings:
            rows.append([f.rule, f.kind, f"{f.namespace}/{f.name}" if f.namespace else f.name, f.message])
        _table(rows, out)
    else:
        out.write(f"No findings ({report.pods_checked} GPU pods checked).\n")
    out.write("\n")
    rows = [["POOL", "NODES", "GPUS", "REQUESTED", "PENDING (OLDEST WAIT)"]]
    for pool in POOLS:
        capacity = report.capacity[pool]
        pending = {cls: f"{p.pods} ({round(p.wait_seconds(report.now))}s)" for cls, p in capacity.pending.items()}
        rows.append(
            [
                pool,
                str(capacity.nodes),
                str(capacity.gpus_allocatable),
                _per_class(capacity.gpus_requested),
                _per_class(pending),
            ]
        )
    _table(rows, out)
    if report.devices is not None:
        write_device_table(report.devices, out)
    if report.gpus is not None and report.gpus.loads:
        out.write("\nReserved GPUs as the exporter reports them (mean activity over the window):\n")
        rows = [["NODE", "GPU", "PCI BUS ID", "ACTIVITY", "INFERENCE"]]
        for load in report.gpus.loads:
            rows.append(
                [
                    load.node,
                    load.gpu,
                    load.pci_bus_id or "-",
                    f"{load.activity_percent:.0f} %",
                    "yes" if load.inference else "no",
                ]
            )
        _table(rows, out)


def write_device_table(devices: DeviceCapacity, out: TextIO) -> None:
    """The split nodes of the active device reservation: their reserved and shared GPUs, and the GPUs
    allocated on each side per class."""
    out.write(
        f"\nSplit nodes (device-level reservation, driver {devices.driver}): {reservation_text(devices.reservation)}\n"
    )
    rows = [["NODE", "RESERVED", "SHARED", "ALLOCATED ON RESERVED", "ALLOCATED ON SHARED"]]
    for name, reserved, shared, per_side in devices.node_counts():
        rows.append([name, str(reserved), str(shared), _per_class(per_side[RESERVED]), _per_class(per_side[SHARED])])
    reserved, shared, allocated = devices.totals()
    rows.append(["(all)", str(reserved), str(shared), _per_class(allocated[RESERVED]), _per_class(allocated[SHARED])])
    _table(rows, out)
    # GPUs published as several devices (partitions, AutoPartition layouts) and allocated: the layout each
    # is in and who holds it (the counts above are GPUs; a whole GPU needs no row of its own).
    rows = [["NODE", "GPU (PCI BUS ID)", "SIDE", "LAYOUT ALLOCATED", "PODS"]]
    for name, views in devices.gpus():
        for view, holders in views:
            if view.layouts and view.allocated:
                rows.append(
                    [
                        name,
                        view.pci_bus_id or view.key,
                        view.state,
                        f"{view.text()} (of {len(view.devices)} devices)",
                        ", ".join(f"{h.namespace}/{h.name} ({h.class_name or UNCLASSIFIED})" for h in holders) or "-",
                    ]
                )
    if len(rows) > 1:
        out.write("\nGPUs of split nodes published as several devices, in the layout allocated:\n")
        _table(rows, out)


def policy_reports(report: Report) -> list[dict[str, Any]]:
    """A PolicyReport per namespace with findings, and one ClusterPolicyReport (nodes, namespaces,
    DeviceClasses), in ``wgpolicyk8s.io/v1alpha2`` as Kyverno and Policy Reporter read them: what the
    background audit writes to the cluster (``webhook.ops.audit.reports``)."""
    from webhook.ops.audit import reports

    return reports.documents(report.findings, int(report.now.timestamp()), reports.WGPOLICY)


def write_output(report: Report, output: str, out: TextIO) -> None:
    if output == "json":
        out.write(json.dumps(report.to_json(), indent=2) + "\n")
    elif output == "policyreport":
        yaml.safe_dump_all(policy_reports(report), out, sort_keys=False, explicit_start=True)
    else:
        write_table(report, out)


# -- command --------------------------------------------------------------------------------------

EPILOG = (
    """\
rules:
"""
    + "\n".join(f"  {rule.id:38} {rule.title}" for rule in RULES.values())
    + """

exit codes: 0 no finding, 1 findings, 2 the cluster or the policy could not be read (the GPU metrics of
--gpu-metrics not read: one warning, the exit code of the other findings)
"""
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "--kubeconfig", help="kubeconfig to read the cluster with (default: in-cluster, $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")
    parser.add_argument(
        "-n",
        "--namespace",
        help="report the pods and the Namespace of this namespace only (nodes are cluster-scoped: all reported)",
    )
    parser.add_argument("--policy", metavar="FILE", help="IsolationPolicy YAML (default: the built-in policy)")
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "policyreport"),
        default="table",
        help="table (default), json, or policyreport (wgpolicyk8s.io/v1alpha2 PolicyReport/ClusterPolicyReport YAML)",
    )
    parser.add_argument(
        "--page-size", type=int, default=500, help="objects per list request (limit/continue; default: 500)"
    )
    parser.add_argument(
        "--from-view",
        metavar="FILE",
        help="read the cluster from a dump of serve's watched view (what serve's background audit passes its child "
        "process, so that an audit lists nothing); what the dump does not hold is read from the cluster",
    )
    gpus = parser.add_argument_group("the GPUs' own word (AMD's device metrics exporter: docs/operations.md)")
    gpus.add_argument(
        "--gpu-metrics",
        metavar="URL|FILE",
        help="also judge the reserved GPUs on the exporter's series: a Prometheus URL (http(s)://...) scraping it, "
        "or a file of its /metrics text (several scrapes with timestamps for a sustained use; FILE.gz: gzipped)",
    )
    add_prometheus_options(gpus, "--gpu-metrics")


def gpu_source(args: argparse.Namespace) -> GpuSource | None:
    """Where ``--gpu-metrics`` reads the exporter's series (``ops/gpus/source.reader``); None without it."""
    from webhook.ops.gpus import source

    given = getattr(args, "gpu_metrics", None)
    if not given:
        return None
    return source.reader(
        given, args.token, args.token_file, args.certificate_authority, bool(args.insecure_skip_tls_verify)
    )


def _in_namespace(finding: Finding, namespace: str) -> bool:
    """As kubectl's ``-n``: namespaced objects of that namespace, the Namespace itself, cluster-scoped objects."""
    if finding.namespace is not None:
        return finding.namespace == namespace
    return finding.kind != "Namespace" or finding.name == namespace


def _explain(err: ApiError) -> str:
    text = f"audit: cannot read the cluster: {err}"
    if isinstance(err, Forbidden):
        text += (
            "\n  the audit needs get/list on nodes, namespaces and pods, and on resource.k8s.io "
            "resourceclaims and resourceclaimtemplates"
        )
    return text


def main(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy) if args.policy else default_policy()
    except PolicyError as err:
        print(f"audit: {err}", file=sys.stderr)
        return EXIT_ERROR
    if args.page_size < 1:
        print("audit: --page-size must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    try:
        api = KubeApi.connect(args.kubeconfig, context=args.context, page_size=args.page_size, prefetch=PREFETCH_PAGES)
        if args.from_view:
            try:
                api = FrozenView.load(Path(args.from_view)).api(api)
            except (OSError, ValueError, KeyError, TypeError) as err:
                print(f"audit: cannot read the view dump {args.from_view}: {err}", file=sys.stderr)
                return EXIT_ERROR
        try:
            report = run_audit(api, policy, gpu_source=gpu_source(args))
        finally:
            api.close()
        if args.namespace:
            report.findings = [f for f in report.findings if _in_namespace(f, args.namespace)]
    except ApiError as err:
        print(_explain(err), file=sys.stderr)
        return EXIT_ERROR
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    write_output(report, args.output, sys.stdout)
    return EXIT_FINDINGS if report.findings else EXIT_CLEAN
