"""Device-level reservation (design.md, "Reserved capacity: nodes or devices") on a real control plane
of its own (v1.36.2), set up by the operator's commands and held by the apiserver alone: the product's
ValidatingAdmissionPolicies and placement MutatingAdmissionPolicy installed from its manifests, the webhook
not running (no MutatingWebhookConfiguration) except in ``TestWithTheWebhookUp``, and the split made by
``pool apply --devices-per-node N`` (the two DeviceClasses, read by the real scheduler's allocator at every
allocation, and the split nodes' label), changed by ``pool apply`` / ``pool release --devices --all``.

The cluster, started once for the module (the session's DRA nodes are not touched):

- two MI210 nodes running AMD's DRA driver and no device plugin (no ``amd.com/gpu`` in allocatable), each
  with one ResourceSlice in the shape the current driver publishes: driver ``gpu.amd.com``, pool named
  after the node, four full GPUs named ``gpu-<card>-<render>`` from their DRM minors, listed in name order
  (the driver's first-fit order), which is not PCI order, the same PCI slots on both nodes; ``pool`` labels
  them ``rocm-isolation.io/pool=inference-devices``, where the placement policy sends inference pods;
- one device-plugin node (``amd.com/gpu: 4``, no slices) reserved whole by ``pool apply --nodes``: label and
  taint of the pool;
- AMD's chart DeviceClass ``gpu.amd.com`` (``extendedResourceName: amd.com/gpu``, PR #73), created
  before the product's classes, which reserve the two GPUs with the lowest PCI bus IDs of each node;
- a training namespace (no label: the default class), an inference namespace, and a training namespace
  that allows ``adminAccess`` claims.

Pod authors change nothing while the webhook runs: ``TestWithTheWebhookUp`` starts it (the webhook's
ServiceAccount, the manifests' MutatingWebhookConfiguration) for its own tests and stops it after; every
other test proves what holds with it down.

No kubelet: pods are bound and stay ``Pending``; a device is held by a claim's allocation.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cluster_objects import (
    chart_class,
    device_slice,
    exactly,
    first_available,
    gpu_device,
    new_claim,
    new_claim_pod,
    new_claim_template,
    new_namespace,
    new_pod,
)

from webhook.core.engine import CLASS_ANNOTATION
from webhook.core.policy import default_policy
from webhook.deploy import device_classes
from webhook.deploy.device_classes import pci_sort_key
from webhook.deploy.reserved_devices import CLAIMS_POLICY, PODS_POLICY, TEMPLATES_POLICY

from .controlplane import ASSETS_ENV, LOOPBACK, ControlPlane, free_port, loopback_only
from .harness import (
    DRIVER,
    MI210_LABELS,
    WEBHOOK_CONFIGURATION,
    Webhook,
    cli,
    install,
    make_node,
    render_manifests,
    service_account_kubeconfig,
    start_webhook,
)
from .kube import ApiError, Kube, Obj, wait_until

POLICY = default_policy()
RESERVED_NODES = POLICY.spec.reserved_nodes
DEVICES = POLICY.spec.reserved_devices
RESERVED_CLASS = DEVICES.reserved_class_name
SHARED_CLASS = DEVICES.shared_class_name
DEVICE_CLASS_RESOURCE = "deviceclass.resource.kubernetes.io/"
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
PCI_BUS_ID = device_classes.PCI_BUS_ID_ATTRIBUTE
INFERENCE_LABELS = {POLICY.spec.labels.namespace_class: "inference"}
ADMIN_ACCESS_LABELS = {"resource.kubernetes.io/admin-access": "true"}

DRA_NODES = ("mi210-dra-1", "mi210-dra-2")
DEVICE_PLUGIN_NODE = "mi210-dp-reserved"
# (device, PCI bus ID, NUMA node, PCIe root) of one MI210 node, in the order the driver lists them: by
# name, as strings ("gpu-9-..." last), which is its first-fit order and not PCI order. The first device
# listed is a reserved one, so an allocator that ignored the classes would hand it out first.
GPUS = (
    ("gpu-17-145", "0000:2c:00.0", 0, "pci0000:20"),
    ("gpu-25-153", "0000:c1:00.0", 1, "pci0000:c0"),
    ("gpu-33-161", "0000:29:00.0", 0, "pci0000:20"),
    ("gpu-9-137", "0000:9a:00.0", 1, "pci0000:80"),
)
PCI_ORDER = tuple(sorted((pci for _, pci, _, _ in GPUS), key=pci_sort_key))
# A pod that should not be scheduled: seen failing by the scheduler, then still unbound this much later.
SETTLE_SECONDS = 3.0

# AMD's chart DeviceClass as PR #73 renders it: it claims amd.com/gpu too. Ours must be newer to own it.
AMD_CHART_CLASS: Obj = chart_class(created=None)


def amd_resource_slice(node: str) -> Obj:
    """What ROCm/k8s-gpu-dra-driver publishes for an MI210 node (cmd/gpu-kubeletplugin/deviceinfo.go, the
    attributes of docs/driver-attributes.md): unqualified names are the driver's domain."""
    devices = [
        gpu_device(
            name,
            pci,
            device_id="0x740f",
            attributes={
                "productName": {"string": "AMD_Instinct_MI210"},
                "numaNode": {"int": numa},
                "driverVersion": {"version": "6.10.5"},
                "resource.kubernetes.io/pcieRoot": {"string": root},
            },
            capacity={"memory": {"value": "64Gi"}, "computeUnits": {"value": "104"}, "simdUnits": {"value": "416"}},
        )
        for name, pci, numa, root in GPUS
    ]
    return device_slice(node, devices, driver=DRIVER)


def pool(plane: ControlPlane, *args: str, exit_code: int = 0) -> subprocess.CompletedProcess[str]:
    """``rocm-isolation-webhook pool ARGS`` as an operator runs it (the admin's kubeconfig)."""
    result = cli("pool", *args, kubeconfig=plane.admin_kubeconfig)
    assert result.returncode == exit_code, (
        f"pool {' '.join(args)} exited {result.returncode}, not {exit_code}:\n{result.stdout}\n{result.stderr}"
    )
    return result


@dataclass
class Split:
    plane: ControlPlane
    kube: Kube
    training: str
    inference: str
    admin_access: str
    # (pool, device) -> PCI bus ID, read back from the live ResourceSlices.
    pci: dict[tuple[str, str], str]

    @property
    def namespaces(self) -> tuple[str, str, str]:
        return (self.training, self.inference, self.admin_access)

    def pids(self) -> dict[str, int]:
        """The control-plane processes that a resize must not restart, all alive."""
        pids = {}
        for component in self.plane.processes.components:
            if component.name in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
                assert component.process.poll() is None, f"{component.name} exited:\n{component.tail()}"
                pids[component.name] = component.process.pid
        assert len(pids) == 3, pids
        return pids


def _created_second(obj: Obj) -> int:
    return calendar.timegm(time.strptime(obj["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))


def _backstop_answer(kube: Kube, namespace: str) -> str:
    try:
        kube.create(new_claim("backstop-probe", namespace, exactly(DRIVER)), dry_run=True)
    except ApiError as err:
        return "denied" if CLAIMS_POLICY in err.message else f"other: {err.message}"
    return "admitted"


def wait_backstop(split: Split, *, active: bool) -> None:
    """The claims policy reads the reserved class as its parameter through an informer: poll until a
    training claim of ``gpu.amd.com`` gets the answer the class now implies."""
    wanted = "denied" if active else "admitted"
    wait_until(
        lambda: _backstop_answer(split.kube, split.training) == wanted,
        timeout=60,
        what=f"the reserved-device backstop to be {'active' if active else 'inactive'}",
    )


def split_label(kube: Kube, node: str) -> str | None:
    """The node's value of the reserved-nodes label key (``inference-devices`` on a split node)."""
    labels: dict[str, str] = kube.get("Node", node)["metadata"].get("labels") or {}
    return labels.get(RESERVED_NODES.label[0])


def reserve_devices(split: Split, per_node: int) -> str:
    """``pool apply --devices-per-node N``: the N lowest PCI bus IDs of the live slices (not their name
    order) reserved, every DRA node labelled, and the backstop acting on it before the test goes on. Its
    output."""
    out = pool(split.plane, "apply", "--devices-per-node", str(per_node)).stdout
    ids = ", ".join(PCI_ORDER[:per_node])
    devices = "device" if per_node == 1 else "devices"
    assert f"After apply: {per_node} {devices} per node, PCI bus IDs {ids} (" in out, out
    assert all(split_label(split.kube, node) == DEVICES.node_label_value for node in DRA_NODES), out
    wait_backstop(split, active=True)
    return out


def release_devices(split: Split) -> str:
    """``pool release --devices --all``: both classes select every device, the split label is removed, and
    the backstop stops denying. Its output."""
    out = pool(split.plane, "release", "--devices", "--all").stdout
    assert "After release: released (both classes select every device)." in out, out
    assert all(split_label(split.kube, node) is None for node in DRA_NODES), out
    wait_backstop(split, active=False)
    return out


def dra_only_node(kube: Kube, node: str) -> None:
    """An MI210 node running AMD's DRA driver and no device plugin: no amd.com/gpu in its status at all."""
    make_node(kube, node, MI210_LABELS, gpus=0)
    gone = {"amd.com/gpu": None}
    kube.patch("Node", node, {"status": {"capacity": gone, "allocatable": gone}}, subresource="status")


def install_without_webhook(plane: ControlPlane, *, for_the_cluster: bool = False) -> list[Obj]:
    """The product's manifests installed without the MutatingWebhookConfiguration (the webhook is not running:
    ``running_webhook`` installs it), rendered for what the cluster serves (``for_the_cluster``: an older minor) or
    for 1.36; what was rendered."""
    rendered = render_manifests(plane.pki.ca_file, 1, kubeconfig=plane.admin_kubeconfig if for_the_cluster else None)
    install(plane, [d for d in rendered if d["kind"] != "MutatingWebhookConfiguration"])
    return rendered


def make_namespaces(kube: Kube, namespaces: Mapping[str, Mapping[str, str]]) -> None:
    """Each namespace with its labels, and its default ServiceAccount (the controller-manager's; pod creation needs
    it) waited for."""
    for name, labels in namespaces.items():
        kube.create(new_namespace(name, labels))
    for name in namespaces:
        wait_until(partial(kube.get_or_none, "ServiceAccount", "default", name), what=f"{name}'s ServiceAccount")


def live_pci(kube: Kube) -> dict[tuple[str, str], str]:
    """(pool, device) -> PCI bus ID, read back from the live ResourceSlices."""
    return {
        (s["spec"]["pool"]["name"], d["name"]): d["attributes"][PCI_BUS_ID]["string"]
        for s in kube.list("ResourceSlice")
        for d in s["spec"].get("devices") or []
    }


def build_split(
    plane: ControlPlane,
    kube: Kube,
    nodes: Sequence[str],
    training: str,
    inference: str,
    admin_access: str,
    *,
    for_the_cluster: bool = False,
) -> Split:
    """What both device modules' clusters start from, on a started control plane: ``nodes`` made DRA-only
    MI210 nodes, each with the ResourceSlice AMD's driver publishes; AMD's chart DeviceClass; the product's
    manifests without the MutatingWebhookConfiguration (``install_without_webhook``); the three namespaces
    (training: no label, inference, ``adminAccess`` allowed) and their ServiceAccounts; the (pool, device) -> PCI
    bus ID map read back from the live ResourceSlices."""
    for node in nodes:
        dra_only_node(kube, node)
        kube.apply(amd_resource_slice(node))
    kube.create(AMD_CHART_CLASS)
    install_without_webhook(plane, for_the_cluster=for_the_cluster)
    make_namespaces(kube, {training: {}, inference: INFERENCE_LABELS, admin_access: ADMIN_ACCESS_LABELS})
    return Split(plane, kube, training, inference, admin_access, live_pci(kube))


def empty_devices(split: Split) -> None:
    """Every device of the split free again: its namespaces' pods (the waiting ones first), claims and templates
    deleted, and the claims gone."""
    delete_pods(split, bound=False)
    delete_pods(split, bound=True)
    delete_claims(split)
    wait_until(
        lambda: not any(split.kube.list("ResourceClaim", ns) for ns in split.namespaces),
        timeout=60,
        what="every claim of the test deleted",
    )


def delete_pods(split: Split, *, bound: bool | None = None) -> None:
    """Force-delete the pods of the split's namespaces (``bound``: only those bound to a node, or not)."""
    for ns in split.namespaces:
        for pod_obj in split.kube.list("Pod", ns):
            if bound is None or bool(pod_obj["spec"].get("nodeName")) == bound:
                split.kube.delete("Pod", pod_obj["metadata"]["name"], ns, force=True)


def delete_claims(split: Split) -> None:
    """Delete the ResourceClaims and ResourceClaimTemplates of the split's namespaces (not waited for)."""
    for ns in split.namespaces:
        for kind in ("ResourceClaim", "ResourceClaimTemplate"):
            for obj in split.kube.list(kind, ns):
                split.kube.delete(kind, obj["metadata"]["name"], ns)


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    loopback_only()
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), tmp_path_factory.mktemp("controlplane-devices"))
    try:
        plane.start()
        kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
        make_node(kube, DEVICE_PLUGIN_NODE, MI210_LABELS, gpus=4)
        # The webhook is not running: its configuration is installed by TestWithTheWebhookUp only.
        made = build_split(plane, kube, DRA_NODES, "reservation-training", "reservation-inference", "reservation-admin")
        chart_class = kube.get("DeviceClass", DRIVER)

        # What the operator runs: the device-plugin node reserved whole, the DRA nodes split.
        whole = pool(plane, "apply", "--nodes", DEVICE_PLUGIN_NODE).stdout
        assert f"node/{DEVICE_PLUGIN_NODE} labeled and tainted" in whole, whole
        applied = reserve_devices(made, 2)
        for name in (RESERVED_CLASS, SHARED_CLASS):
            assert f"deviceclass/{name} created" in applied, applied
        # Two classes naming amd.com/gpu: the newer one wins, and within one second the name that sorts
        # first (gpu.amd.com). pool makes ours the newer (re-creating it once that second has passed).
        shared = kube.get("DeviceClass", SHARED_CLASS)
        assert _created_second(shared) > _created_second(chart_class), (shared["metadata"], chart_class["metadata"])
        status = pool(plane, "status").stdout
        owner = (
            f"{DEVICES.extended_resource_name} maps to deviceclass/{SHARED_CLASS} (the newest DeviceClass naming it)"
        )
        assert owner in status, status
        yield made
        plane.check_alive()
    finally:
        plane.stop()


@pytest.fixture(autouse=True)
def emptied(split: Split) -> Iterator[None]:
    """Each test starts with every device free: its pods, claims and templates deleted after it, and the
    claims gone (a claim's devices are free once it is). The pods left waiting go first: deleted after the
    bound ones, one could be scheduled onto the devices they free and deleted in the middle of its binding
    (seen on v1.36.2: an inference pod's extended-resource claim, its PreBind stuck for the 90 s the next
    test waited, "get updated claim ... after conflict: not found" in the end, its device held meanwhile)."""
    yield
    kube = split.kube
    delete_pods(split, bound=False)
    wait_until(
        lambda: not any(p for ns in split.namespaces for p in kube.list("Pod", ns) if not p["spec"].get("nodeName")),
        what="the waiting pods deleted",
    )
    delete_pods(split, bound=True)
    delete_claims(split)
    wait_until(
        lambda: not any(kube.list("ResourceClaim", ns) for ns in split.namespaces),
        timeout=60,
        what="every claim of the test deleted",
    )


# --- objects ----------------------------------------------------------------------------------------


def on_node(node: str) -> dict[str, Any]:
    return {"nodeSelector": {"kubernetes.io/hostname": node}}


# --- what was allocated -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    node: str
    name: str
    pci: str

    def __str__(self) -> str:
        return f"{self.node}/{self.name} ({self.pci})"


def shown(devices: list[Device] | set[Device]) -> str:
    return "[" + ", ".join(str(d) for d in sorted(devices, key=lambda d: (d.node, d.pci))) + "]"


def reserved_ids(devices_per_node: int) -> set[str]:
    return set(PCI_ORDER[:devices_per_node])


def shared_ids(devices_per_node: int) -> set[str]:
    return set(PCI_ORDER[devices_per_node:])


def assert_placed_for_inference(split: Split, pod_obj: Obj) -> None:
    """Every required node-affinity term of the pod asks for ``rocm-isolation.io/pool In [inference,
    inference-devices]`` (the placement of the inference class), and a bound pod is on a node that says so."""
    key, whole = RESERVED_NODES.label
    affinity = (pod_obj["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    wanted = {whole, DEVICES.node_label_value}

    def places(term: Obj) -> bool:
        return any(
            e["key"] == key and e["operator"] == "In" and set(e["values"]) == wanted
            for e in term.get("matchExpressions") or []
        )

    assert terms and all(places(t) for t in terms), pod_obj["spec"].get("affinity")
    node = pod_obj["spec"].get("nodeName")
    if node:
        assert split_label(split.kube, node) in wanted, f"{pod_obj['metadata']['name']} is on {node}"


def _claim_names(pod_obj: Obj) -> list[str]:
    """The pod's claims: named in its spec, made from a template (status), made by the scheduler (status)."""
    status = pod_obj.get("status") or {}
    names = [c["resourceClaimName"] for c in pod_obj["spec"].get("resourceClaims") or [] if c.get("resourceClaimName")]
    names += [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or [] if s.get("resourceClaimName")]
    extended = status.get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):
        names.append(extended["resourceClaimName"])
    return names


def claim_devices(split: Split, claim_obj: Obj) -> list[Device]:
    allocation = (claim_obj.get("status") or {}).get("allocation") or {}
    devices = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        assert result["driver"] == DRIVER, result
        devices.append(Device(result["pool"], result["device"], split.pci[(result["pool"], result["device"])]))
    return devices


@dataclass
class Allocation:
    node: str
    claims: list[Obj]
    devices: list[Device]

    @property
    def pcis(self) -> set[str]:
        return {d.pci for d in self.devices}


def allocated(split: Split, ns: str, name: str, *, timeout: float = 90) -> Allocation:
    """Once the scheduler bound ``ns/name``: its node, its claims (the extended-resource one included)
    and the devices they were allocated, each on the pod's own node."""
    kube = split.kube

    def bound() -> Allocation | None:
        live = kube.get("Pod", name, ns)
        node = live["spec"].get("nodeName")
        names = _claim_names(live)
        if not node or not names:
            return None
        claims = [kube.get("ResourceClaim", n, ns) for n in names]
        if not all((c.get("status") or {}).get("allocation") for c in claims):
            return None
        return Allocation(node, claims, [d for c in claims for d in claim_devices(split, c)])

    def last_event() -> str:
        events = kube.list("Event", ns, fields=f"involvedObject.name={name}")
        return events[-1]["message"] if events else "no event"

    try:
        result: Allocation = wait_until(bound, timeout=timeout, what=f"{ns}/{name} bound with its claims allocated")
    except AssertionError as err:
        raise AssertionError(f"{err}; the scheduler's last word: {last_event()}") from None
    for device in result.devices:
        assert device.node == result.node, f"{ns}/{name} on {result.node} was allocated {device}"
    return result


def extended_claim(alloc: Allocation) -> Obj:
    """The claim the scheduler made for the pod's extended resource (``amd.com/gpu`` or
    ``deviceclass.resource.kubernetes.io/<class>``): it carries the annotation and one request of the
    class the resource maps to."""
    made = [c for c in alloc.claims if (c["metadata"].get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM) == "true"]
    assert len(made) == 1, [c["metadata"] for c in alloc.claims]
    return made[0]


def requested_class(claim_obj: Obj) -> str:
    (request,) = claim_obj["spec"]["devices"]["requests"]
    return str(request["exactly"]["deviceClassName"])


def template_class(template: Obj) -> str:
    return requested_class(template["spec"])


def never_scheduled(split: Split, ns: str, *names: str) -> dict[str, str]:
    """Each pod tried by the scheduler (a FailedScheduling event) and still unbound, its claims still
    unallocated, ``SETTLE_SECONDS`` later; the scheduler's last message for each."""
    kube = split.kube

    def failed(name: str) -> list[Obj]:
        events = kube.list("Event", ns, fields=f"involvedObject.name={name}")
        return [e for e in events if e.get("reason") == "FailedScheduling"]

    for name in names:
        wait_until(partial(failed, name), timeout=60, what=f"the scheduler to try {ns}/{name}")
    time.sleep(SETTLE_SECONDS)
    messages = {}
    for name in names:
        live = kube.get("Pod", name, ns)
        claims = [kube.get("ResourceClaim", n, ns) for n in _claim_names(live)]
        got = [d for c in claims for d in claim_devices(split, c)]
        assert not live["spec"].get("nodeName") and not got, (
            f"{ns}/{name} was scheduled on {live['spec'].get('nodeName')} with {shown(got)}"
        )
        messages[name] = failed(name)[-1]["message"]
    return messages


def training_devices(split: Split) -> list[Device]:
    """Every device allocated to a claim of a non-inference namespace."""
    return [
        d
        for ns in (split.training, split.admin_access)
        for c in split.kube.list("ResourceClaim", ns)
        for d in claim_devices(split, c)
    ]


# --- admission: every route that names a class reaching reserved devices ----------------------------

# (what is created, in which namespace, the policy that must deny it)
Route = Callable[[Split], tuple[Obj, str]]
DENIED_ROUTES: dict[str, Route] = {
    "template-gpu.amd.com": lambda s: (new_claim_template("t", s.training, exactly(DRIVER)), TEMPLATES_POLICY),
    "template-firstAvailable-reserved": lambda s: (
        new_claim_template("t", s.training, first_available(SHARED_CLASS, RESERVED_CLASS)),
        TEMPLATES_POLICY,
    ),
    "claim-gpu.amd.com": lambda s: (new_claim("c", s.training, exactly(DRIVER)), CLAIMS_POLICY),
    "claim-reserved-class": lambda s: (new_claim("c", s.training, exactly(RESERVED_CLASS)), CLAIMS_POLICY),
    "claim-firstAvailable-reserved": lambda s: (
        new_claim("c", s.training, first_available(SHARED_CLASS, RESERVED_CLASS)),
        CLAIMS_POLICY,
    ),
    "claim-firstAvailable-gpu.amd.com": lambda s: (
        new_claim("c", s.training, first_available(SHARED_CLASS, DRIVER)),
        CLAIMS_POLICY,
    ),
    "claim-adminAccess-gpu.amd.com": lambda s: (
        new_claim("c", s.admin_access, exactly(DRIVER, adminAccess=True)),
        CLAIMS_POLICY,
    ),
    "pod-deviceclass-gpu.amd.com": lambda s: (
        new_pod("p", s.training, {DEVICE_CLASS_RESOURCE + DRIVER: "1"}),
        PODS_POLICY,
    ),
    "pod-deviceclass-reserved": lambda s: (
        new_pod("p", s.training, {DEVICE_CLASS_RESOURCE + RESERVED_CLASS: "1"}),
        PODS_POLICY,
    ),
    "pod-init-container-deviceclass-reserved": lambda s: (
        new_pod(
            "p",
            s.training,
            initContainers=[
                {
                    "name": "warmup",
                    "image": "rocm/pytorch:latest",
                    "resources": {"limits": {DEVICE_CLASS_RESOURCE + RESERVED_CLASS: "1"}},
                }
            ],
        ),
        PODS_POLICY,
    ),
}


def assert_denied_by_the_backstop(split: Split, route: str) -> None:
    """``route`` denied by the product's policy named for it, in enforce mode, and nothing created."""
    obj, policy = DENIED_ROUTES[route](split)
    meta = obj["metadata"]
    with pytest.raises(ApiError) as denied:
        split.kube.create(obj)
    message = denied.value.message
    assert denied.value.status == 403, message
    assert f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}-enforce' denied request" in message, message
    assert split.kube.get_or_none(obj["kind"], meta["name"], meta["namespace"]) is None


@pytest.mark.parametrize("route", DENIED_ROUTES)
def test_a_training_route_to_the_reserved_devices_is_denied_at_admission(split: Split, route: str) -> None:
    """(a) templates, (b) claims, (d) pods' DRA extended resources, (e) firstAvailable, (g) adminAccess
    (the namespace allows it, so the apiserver's own check passes and only the backstop stands): denied
    by the product's policy, in enforce mode, and nothing is created."""
    assert_denied_by_the_backstop(split, route)


def test_training_pods_get_shared_devices_only_and_wait_once_those_are_taken(split: Split) -> None:
    """(c) ``amd.com/gpu`` and (d) ``deviceclass.resource.kubernetes.io/rocm-isolation-shared`` pods: admitted,
    bound to the DRA nodes, their scheduler-made claims of the shared class allocated shared devices only.
    With the four shared devices taken, the next training pods of every route wait (no reserved device
    is handed out, four are free)."""
    ns = split.training
    kube = split.kube
    kube.create(new_pod("amd-gpu", ns, {DEVICES.extended_resource_name: "2"}))
    kube.create(new_pod("implicit-shared", ns, {DEVICE_CLASS_RESOURCE + SHARED_CLASS: "2"}))
    nodes = set()
    for name in ("amd-gpu", "implicit-shared"):
        alloc = allocated(split, ns, name)
        nodes.add(alloc.node)
        made = extended_claim(alloc)
        assert requested_class(made) == SHARED_CLASS, made["spec"]
        assert len(alloc.devices) == 2 and alloc.pcis <= shared_ids(2), f"{name} was allocated {shown(alloc.devices)}"
    assert nodes == set(DRA_NODES)

    kube.create(new_pod("amd-gpu-next", ns, {DEVICES.extended_resource_name: "1"}))
    kube.create(new_pod("implicit-shared-next", ns, {DEVICE_CLASS_RESOURCE + SHARED_CLASS: "1"}))
    kube.create(new_claim("shared-next", ns, exactly(SHARED_CLASS)))
    kube.create(new_claim_pod("claim-next", ns, claim_name="shared-next"))
    never_scheduled(split, ns, "amd-gpu-next", "implicit-shared-next", "claim-next")
    held = training_devices(split)
    assert len(held) == 4 and not {d.pci for d in held} & reserved_ids(2), f"training holds {shown(held)}"


def test_a_shared_claim_whose_own_selector_names_a_reserved_device_is_never_allocated(split: Split) -> None:
    """(f) The claim's class is the shared one, so the backstop admits it; its own CEL selector names a
    reserved PCI bus ID, and the class's selector (applied first) excludes that device: with every device
    of the cluster free, the claim stays unallocated and its pod unscheduled."""
    ns = split.training
    target = PCI_ORDER[0]
    selector = f'device.attributes["resource.kubernetes.io"].pciBusID == "{target}"'
    split.kube.create(new_claim("aimed", ns, exactly(SHARED_CLASS, selectors=[{"cel": {"expression": selector}}])))
    split.kube.create(new_claim_pod("aimed", ns, claim_name="aimed"))
    message = never_scheduled(split, ns, "aimed")["aimed"]
    assert "cannot allocate all claims" in message, message
    assert training_devices(split) == []


def test_inference_claims_and_pods_get_reserved_devices_only(split: Split) -> None:
    """A claim template of the reserved class (the resourceclaim controller's claim) and
    ``deviceclass.resource.kubernetes.io/rocm-isolation-reserved`` pods (the scheduler's claims) in the
    inference namespace get reserved devices; the pods are placed by the placement MutatingAdmissionPolicy
    (``rocm-isolation.io/pool In [inference, inference-devices]``) and bound to the split nodes, which
    ``pool`` labelled. Once the four are taken the next inference pod waits with four shared devices free
    (no spill-over: ``inferenceSpillover`` is off)."""
    ns = split.inference
    kube = split.kube
    kube.create(new_claim_template("reserved-pair", ns, exactly(RESERVED_CLASS, count=2)))
    kube.create(new_claim_pod("from-template", ns, template="reserved-pair"))
    alloc = allocated(split, ns, "from-template")
    (made,) = alloc.claims
    assert made["metadata"]["ownerReferences"][0]["name"] == "from-template"  # the controller's
    assert len(alloc.devices) == 2 and alloc.pcis <= reserved_ids(2), f"allocated {shown(alloc.devices)}"
    resource = {DEVICE_CLASS_RESOURCE + RESERVED_CLASS: "1"}
    for name in ("implicit-reserved-1", "implicit-reserved-2"):
        kube.create(new_pod(name, ns, resource))
    for name in ("implicit-reserved-1", "implicit-reserved-2"):
        alloc = allocated(split, ns, name)
        assert requested_class(extended_claim(alloc)) == RESERVED_CLASS
        assert len(alloc.devices) == 1 and alloc.pcis <= reserved_ids(2), f"{name} was allocated {shown(alloc.devices)}"
        assert_placed_for_inference(split, kube.get("Pod", name, ns))
    kube.create(new_pod("implicit-reserved-3", ns, resource))
    never_scheduled(split, ns, "implicit-reserved-3")


def test_the_audit_counts_each_side_of_the_split_nodes_in_its_pool(split: Split) -> None:
    """``audit`` on what the real scheduler allocated: the reserved pool is the device-plugin node reserved
    whole and the split nodes' reserved GPUs, the shared pool their shared GPUs (every split node in both);
    an inference claim's reserved devices are requested in the reserved pool, a training ``amd.com/gpu: 2``
    pod's devices (its scheduler-made claim) in the shared pool, once."""
    ns = split.inference
    split.kube.create(new_claim_template("reserved-pair", ns, exactly(RESERVED_CLASS, count=2)))
    split.kube.create(new_claim_pod("llm", ns, template="reserved-pair"))
    split.kube.create(new_pod("amd-gpu", split.training, {DEVICES.extended_resource_name: "2"}))
    assert allocated(split, ns, "llm").pcis <= reserved_ids(2)
    assert allocated(split, split.training, "amd-gpu").pcis <= shared_ids(2)
    result = cli("audit", "-o", "json", kubeconfig=split.plane.admin_kubeconfig)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    capacity = json.loads(result.stdout)["capacity"]
    per_node = len(GPUS)
    assert capacity["reserved"] == {
        "nodes": 1 + len(DRA_NODES),
        "gpusAllocatable": per_node + 2 * len(DRA_NODES),
        "gpusRequested": {"inference": 2},
        "pendingPods": {},
    }
    assert capacity["shared"] == {
        "nodes": len(DRA_NODES),
        "gpusAllocatable": (per_node - 2) * len(DRA_NODES),
        "gpusRequested": {"training": 2},
        "pendingPods": {},
    }
    devices = capacity["devices"]
    assert (devices["reservedDevices"], devices["sharedDevices"]) == (2 * len(DRA_NODES), 2 * len(DRA_NODES))
    assert devices["devicesAllocated"] == {"reserved": {"inference": 2}, "shared": {"training": 2}}


def test_pool_status_the_audit_and_the_gauges_give_one_inventory(split: Split) -> None:
    """One capacity model: on one cluster (a node reserved whole, split nodes, GPUs held on both sides),
    the pools ``pool status -o json`` prints equal the audit's capacity section, which equals the
    gauges the background audit exports from it."""
    from webhook.service.auditloop import publish
    from webhook.service.metrics import Metrics

    ns = split.inference
    split.kube.create(new_claim_template("reserved-one", ns, exactly(RESERVED_CLASS, count=1)))
    split.kube.create(new_claim_pod("llm", ns, template="reserved-one"))
    split.kube.create(new_pod("amd-gpu", split.training, {DEVICES.extended_resource_name: "1"}))
    assert allocated(split, ns, "llm").pcis <= reserved_ids(2)
    assert allocated(split, split.training, "amd-gpu").pcis <= shared_ids(2)
    audit = cli("audit", "-o", "json", kubeconfig=split.plane.admin_kubeconfig)
    assert audit.returncode in (0, 1), audit.stdout + audit.stderr
    document = json.loads(audit.stdout)
    status = json.loads(pool(split.plane, "status", "-o", "json").stdout)
    metrics = Metrics()
    publish(document, metrics)

    def gauge(name: str, **labels: str) -> float:
        value = metrics.registry.get_sample_value(f"rocm_isolation_{name}", labels)
        return 0.0 if value is None else value

    for side in ("reserved", "shared"):
        audited = document["capacity"][side]
        printed = status[side]
        assert (printed["nodes"], printed["gpusAllocatable"], printed["gpusRequested"]) == (
            audited["nodes"],
            audited["gpusAllocatable"],
            sum(audited["gpusRequested"].values()),
        ), side
        assert gauge("pool_nodes", pool=side) == audited["nodes"]
        assert gauge("pool_gpus_allocatable", pool=side) == audited["gpusAllocatable"]
        for cls, gpus in audited["gpusRequested"].items():
            assert gauge("pool_gpus_requested", pool=side, **{"class": cls}) == gpus
        by_class = {cls: v["gpus"] for cls, v in printed["podsByClass"].items() if v["gpus"]}
        assert by_class == audited["gpusRequested"], side
    assert document["capacity"]["reserved"]["gpusRequested"] == {"inference": 1}
    assert document["capacity"]["shared"]["gpusRequested"] == {"training": 1}


def test_the_whole_reserved_device_plugin_node_takes_inference_and_no_training(split: Split) -> None:
    """A mixed cluster: the device-plugin node was reserved whole by ``pool apply --nodes`` (label and
    taint), next to the split DRA nodes; ``pool apply --nodes`` refuses a DRA node while the device
    reservation is active (exit 2, the node unchanged). A training ``amd.com/gpu: 4`` pod fits nowhere
    else (two shared devices per DRA node) and is not scheduled there (it does not tolerate the taint); an
    inference ``amd.com/gpu: 4`` pod whose author wrote no toleration or affinity is placed by the placement
    MutatingAdmissionPolicy and bound there, through the device plugin (no claim)."""
    kube = split.kube
    assert RESERVED_NODES.taint is not None
    taint = RESERVED_NODES.taint.model_dump()
    key, value = RESERVED_NODES.label
    whole = kube.get("Node", DEVICE_PLUGIN_NODE)
    assert whole["metadata"]["labels"].get(key) == value and taint in (whole["spec"].get("taints") or []), whole

    dra_node = DRA_NODES[0]
    refused = pool(split.plane, "apply", "--nodes", dra_node, exit_code=2)
    assert (
        f"error: {dra_node} publishes {DRIVER} devices, which the active device reservation splits" in refused.stderr
        and "a node is reserved whole or split, never both" in refused.stderr
        and "nothing was changed" in refused.stderr
    ), refused.stderr
    untouched = kube.get("Node", dra_node)
    assert split_label(kube, dra_node) == DEVICES.node_label_value and not untouched["spec"].get("taints"), untouched

    kube.create(new_pod("four", split.training, {DEVICES.extended_resource_name: "4"}))
    message = never_scheduled(split, split.training, "four")["four"]
    # v1.36 words it without the taint: the DRA nodes lack the devices, the device-plugin node is tainted.
    assert "1 node(s) had untolerated taint" in message and "2 cannot allocate all claims" in message, message
    kube.create(new_pod("whole-node", split.inference, {DEVICES.extended_resource_name: "4"}))
    bound = wait_until(
        lambda: kube.get("Pod", "whole-node", split.inference)["spec"].get("nodeName"),
        timeout=60,
        what="the inference pod bound",
    )
    assert bound == DEVICE_PLUGIN_NODE
    live = kube.get("Pod", "whole-node", split.inference)
    assert not live["status"].get("extendedResourceClaimStatus")
    assert_placed_for_inference(split, live)
    toleration = {"key": taint["key"], "operator": "Equal", "value": taint["value"], "effect": taint["effect"]}
    assert toleration in live["spec"]["tolerations"], live["spec"]["tolerations"]


def test_resizing_two_one_released_changes_the_next_allocations_only(split: Split) -> None:
    """The split edited live by ``pool``, 2 → 1 → released, while pods hold devices: no control-plane
    process restarts, the pods stay bound, existing allocations stay as they were (an inference claim keeps
    a device that became shared; ``pool apply`` lists it), and each next allocation follows the new split:
    after 2 → 1 a training ``amd.com/gpu: 3`` pod (impossible before) gets the freed PCI slot; the last free
    devices, reserved, are refused to training until the release, which gives them to a waiting
    ``amd.com/gpu`` pod and a waiting shared-class claim; released, the backstop admits a training claim of
    ``gpu.amd.com``. The scheduler sees each class edit through its informer: pods are polled, not slept on."""
    kube = split.kube
    first, second = DRA_NODES
    lowest, freed = PCI_ORDER[0], PCI_ORDER[1]
    pids = split.pids()
    try:
        # 2 per node: training takes the two shared devices of the first node, inference one reserved one.
        kube.create(new_pod("t1", split.training, {DEVICES.extended_resource_name: "2"}, **on_node(first)))
        pinned = [{"cel": {"expression": f'device.attributes["resource.kubernetes.io"].pciBusID == "{freed}"'}}]
        kube.create(new_claim("i1", split.inference, exactly(RESERVED_CLASS, selectors=pinned)))
        kube.create(new_claim_pod("i1", split.inference, claim_name="i1", **on_node(first)))
        t1 = allocated(split, split.training, "t1")
        i1 = allocated(split, split.inference, "i1")
        assert t1.pcis == shared_ids(2), f"t1 was allocated {shown(t1.devices)}"
        assert [str(d) for d in i1.devices] == [str(Device(first, _name_of(freed), freed))]
        before = {(split.training, "t1"): t1.devices, (split.inference, "i1"): i1.devices}

        out = reserve_devices(split, 1)
        for name in (RESERVED_CLASS, SHARED_CLASS):
            assert f"deviceclass/{name} replaced" in out, out
        assert "No pod of another class holds a device that becomes reserved." in out, out
        keeping = rf"(?m)^{first}\s+{split.inference}\s+i1\s+{_name_of(freed)}\s*$"
        assert "Inference pods holding devices that stop being reserved (they keep them):" in out, out
        assert re.search(keeping, out), out
        # t2 fits only where three devices are shared: the second node, with the PCI slot 2 → 1 freed.
        kube.create(new_pod("t2", split.training, {DEVICES.extended_resource_name: "3"}))
        t2 = allocated(split, split.training, "t2", timeout=60)
        assert t2.node == second and t2.pcis == shared_ids(1), f"t2: {shown(t2.devices)}"
        assert freed in t2.pcis
        _unchanged(split, before)
        before[(split.training, "t2")] = t2.devices
        assert split.pids() == pids
        # Free now: the lowest PCI slot of each node, reserved. Training waits for it.
        kube.create(new_pod("t3", split.training, {DEVICES.extended_resource_name: "1"}))
        kube.create(new_claim("c1", split.training, exactly(SHARED_CLASS)))
        kube.create(new_claim_pod("c1", split.training, claim_name="c1"))
        never_scheduled(split, split.training, "t3", "c1")

        release_devices(split)
        t3 = allocated(split, split.training, "t3", timeout=60)
        c1 = allocated(split, split.training, "c1", timeout=60)
        assert {d.pci for d in t3.devices + c1.devices} == {lowest} and {t3.node, c1.node} == set(DRA_NODES), (
            f"after the release t3 got {shown(t3.devices)}, c1 got {shown(c1.devices)}"
        )
        assert requested_class(extended_claim(t3)) == SHARED_CLASS
        kube.create(new_claim("whole-driver", split.training, exactly(DRIVER)))
        _unchanged(split, before)
        assert split.pids() == pids
    finally:
        reserve_devices(split, 2)


def _name_of(pci: str) -> str:
    return next(name for name, bus, _, _ in GPUS if bus == pci)


def _unchanged(split: Split, before: dict[tuple[str, str], list[Device]]) -> None:
    """The pods named in ``before`` (namespace, name) are still bound and their claims hold the same devices."""
    for (ns, name), devices in before.items():
        live = split.kube.get("Pod", name, ns)
        assert live["spec"].get("nodeName") == devices[0].node, live["spec"]
        now = [d for n in _claim_names(live) for d in claim_devices(split, split.kube.get("ResourceClaim", n, ns))]
        assert sorted(now, key=str) == sorted(devices, key=str), f"{name} held {shown(devices)}, now {shown(now)}"


def test_a_claim_made_while_released_gets_no_reserved_device_once_the_reservation_is_back(split: Split) -> None:
    """A training claim of ``gpu.amd.com`` admitted during a release (nothing is reserved then) outlives it.
    Reserved again, a pod using it is not scheduled: the scheduler's update of the claim (its finalizer,
    before the allocation is written) is an UPDATE the claims policy judges, and denies."""
    kube = split.kube
    ns = split.training
    release_devices(split)
    try:
        kube.create(new_claim("from-the-release", ns, exactly(DRIVER, count=4)))
    finally:
        reserve_devices(split, 2)
    kube.create(new_claim_pod("late", ns, claim_name="from-the-release"))
    message = never_scheduled(split, ns, "late")["late"]
    assert "add finalizer to claim" in message and CLAIMS_POLICY in message, message
    assert training_devices(split) == []


def test_a_claim_allocated_while_released_can_still_be_deleted_once_the_reservation_is_back(split: Split) -> None:
    """A training claim of ``gpu.amd.com`` allocated during a release (or before the reservation was first
    applied: a cluster already running DRA training) is deleted after the reservation is back: it must go.
    ``pool apply`` lists its pod among those holding devices that become reserved. The claims policy judges
    UPDATEs (the scheduler's finalizer on a claim it allocates is one), but not those of a claim being
    deleted: the resourceclaim controller's removal of its ``resource.kubernetes.io/delete-protection``
    finalizer must pass, or the claim stays Terminating and its namespace cannot be deleted (seen before
    the policy's ``not-being-deleted`` match condition)."""
    kube = split.kube
    ns = split.training
    restored = False
    release_devices(split)
    try:
        kube.create(new_claim("held-over", ns, exactly(DRIVER, count=4)))
        kube.create(new_claim_pod("held-over", ns, claim_name="held-over"))
        alloc = allocated(split, ns, "held-over")
        assert reserved_ids(2) <= alloc.pcis, f"released, the claim got {shown(alloc.devices)}"
        out = reserve_devices(split, 2)
        assert "Running pods of other classes that hold devices that become reserved" in out, out
        assert re.search(rf"(?m)^{alloc.node}\s+{ns}\s+held-over\s", out), out
        kube.delete("Pod", "held-over", ns, force=True)
        kube.delete("ResourceClaim", "held-over", ns)
        wait_until(
            lambda: kube.get_or_none("ResourceClaim", "held-over", ns) is None,
            timeout=30,
            what=f"the deleted claim to go ({CLAIMS_POLICY} must admit the finalizer's removal)",
        )
        restored = True
    finally:
        if not restored:
            # Released, the controller's update is admitted and the claim goes: the next test starts clean.
            release_devices(split)
            wait_until(lambda: kube.get_or_none("ResourceClaim", "held-over", ns) is None, timeout=60, what="cleanup")
            reserve_devices(split, 2)


# --- the webhook up: pod authors change nothing --------------------------------------------------------


def _steered_class(split: Split) -> str:
    """The class a training claim template of ``gpu.amd.com`` is stored with (server dry run)."""
    try:
        made = split.kube.create(new_claim_template("webhook-probe", split.training, exactly(DRIVER)), dry_run=True)
    except ApiError as err:
        return f"denied: {err.message}"
    return template_class(made)


@contextmanager
def running_webhook(split: Split, directory: Path, answer: Callable[[], str], wanted: str) -> Iterator[Webhook]:
    """The webhook as the session's cluster runs it (conftest.py): ``serve`` with the project's certificates,
    authenticated as its ServiceAccount (the manifests' RBAC), then the manifests' MutatingWebhookConfiguration,
    waited for until ``answer()`` (the class a probe is stored with) is ``wanted``. Stopped and its
    configuration deleted on leaving, so that the apiserver alone holds again."""
    plane = split.plane
    cert_dir = directory / "certs"
    cli("certs", "--out-dir", str(cert_dir), check=True)
    port = free_port()
    configuration = [
        d for d in render_manifests(cert_dir / "ca.crt", port) if d["kind"] == "MutatingWebhookConfiguration"
    ]
    running = start_webhook(plane, directory, service_account_kubeconfig(plane), cert_dir=cert_dir, port=port)
    try:
        install(plane, configuration)
        last: list[str] = []

        def steering() -> bool:
            last[:] = [answer()]
            return last[0] == wanted

        try:
            wait_until(steering, timeout=60, what="the webhook to steer claims (configured, the reservation cached)")
        except AssertionError as err:
            raise AssertionError(f"{err}; last answer: {last}\n{running.component.tail()}") from None
        yield running
    finally:
        plane.processes.stop_one(running.component)
        split.kube.delete("MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)


@pytest.fixture(scope="class")
def webhook(split: Split, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """The webhook up for one class of tests (``running_webhook``): stopped and its configuration deleted
    after them, so that every other test of the module proves the apiserver alone."""
    directory = tmp_path_factory.mktemp("webhook-devices")
    with running_webhook(split, directory, partial(_steered_class, split), SHARED_CLASS) as running:
        yield running


class TestWithTheWebhookUp:
    """The webhook running next to the backstop: claims and pods written as for a cluster without any
    reservation (``gpu.amd.com``, ``amd.com/gpu``) are pointed at the class of their namespace and get its
    devices; the objects are read back, nothing of the webhook's own (counters, logs) is needed. Last, the
    webhook stopped: one attack of each kind is still denied by the apiserver alone."""

    def test_a_training_template_of_the_chart_class_is_steered_to_the_shared_devices(
        self, split: Split, webhook: Webhook
    ) -> None:
        """A training ResourceClaimTemplate of ``gpu.amd.com`` (the backstop alone denies it) is admitted as a
        template of the shared class; its pod's claim is allocated shared devices only."""
        ns = split.training
        kube = split.kube
        kube.create(new_claim_template("chart", ns, exactly(DRIVER, count=2)))
        stored = kube.get("ResourceClaimTemplate", "chart", ns)
        assert template_class(stored) == SHARED_CLASS, stored["spec"]
        assert stored["metadata"]["annotations"][CLASS_ANNOTATION] == "training", stored["metadata"]
        kube.create(new_claim_pod("chart", ns, template="chart"))
        alloc = allocated(split, ns, "chart")
        (made,) = alloc.claims
        assert requested_class(made) == SHARED_CLASS, made["spec"]
        assert len(alloc.devices) == 2 and alloc.pcis <= shared_ids(2), f"allocated {shown(alloc.devices)}"

    def test_an_inference_template_of_the_chart_class_gets_reserved_devices_on_a_split_node(
        self, split: Split, webhook: Webhook
    ) -> None:
        """An inference ResourceClaimTemplate of ``gpu.amd.com`` is stored as a template of the reserved
        class; its pod (no affinity written) is placed by the webhook on ``rocm-isolation.io/pool In
        [inference, inference-devices]`` and bound to a split node, its claim allocated reserved devices only."""
        ns = split.inference
        kube = split.kube
        kube.create(new_claim_template("chart", ns, exactly(DRIVER, count=2)))
        stored = kube.get("ResourceClaimTemplate", "chart", ns)
        assert template_class(stored) == RESERVED_CLASS, stored["spec"]
        assert stored["metadata"]["annotations"][CLASS_ANNOTATION] == "inference", stored["metadata"]
        kube.create(new_claim_pod("chart", ns, template="chart"))
        alloc = allocated(split, ns, "chart")
        (made,) = alloc.claims
        assert requested_class(made) == RESERVED_CLASS, made["spec"]
        assert len(alloc.devices) == 2 and alloc.pcis <= reserved_ids(2), f"allocated {shown(alloc.devices)}"
        assert_placed_for_inference(split, kube.get("Pod", "chart", ns))

    def test_an_inference_amd_gpu_pod_is_steered_to_a_reserved_device(self, split: Split, webhook: Webhook) -> None:
        """An inference pod asking for ``amd.com/gpu: 1`` (the shared class's name) is stored asking for
        ``deviceclass.resource.kubernetes.io/rocm-isolation-reserved: 1``; the scheduler's claim for it is of
        the reserved class and gets a reserved device."""
        ns = split.inference
        kube = split.kube
        kube.create(new_pod("amd-gpu", ns, {DEVICES.extended_resource_name: "1"}))
        stored = kube.get("Pod", "amd-gpu", ns)
        resources = stored["spec"]["containers"][0]["resources"]
        wanted = {DEVICE_CLASS_RESOURCE + RESERVED_CLASS: "1"}
        assert resources["limits"] == wanted and resources["requests"] == wanted, resources
        alloc = allocated(split, ns, "amd-gpu")
        assert requested_class(extended_claim(alloc)) == RESERVED_CLASS
        assert len(alloc.devices) == 1 and alloc.pcis <= reserved_ids(2), f"allocated {shown(alloc.devices)}"
        assert_placed_for_inference(split, kube.get("Pod", "amd-gpu", ns))

    def test_an_inference_amd_gpu_pod_pinned_to_the_whole_reserved_nodes_keeps_the_device_plugin(
        self, split: Split, webhook: Webhook
    ) -> None:
        """A mixed cluster: an inference pod that pins itself to the whole reserved nodes (nodeSelector of the
        reserved label) keeps ``amd.com/gpu`` (the reserved class's DRA-only name could never be served on a
        device-plugin node) and is bound to the whole-reserved device-plugin node, with no claim."""
        ns = split.inference
        kube = split.kube
        kube.create(
            new_pod(
                "pinned",
                ns,
                {DEVICES.extended_resource_name: "2"},
                nodeSelector={"rocm-isolation.io/pool": "inference"},
            )
        )
        stored = kube.get("Pod", "pinned", ns)
        assert stored["spec"]["containers"][0]["resources"]["limits"] == {DEVICES.extended_resource_name: "2"}
        bound = wait_until(
            lambda: kube.get("Pod", "pinned", ns)["spec"].get("nodeName"), timeout=60, what="the pinned pod bound"
        )
        assert bound == DEVICE_PLUGIN_NODE
        assert not kube.get("Pod", "pinned", ns)["status"].get("extendedResourceClaimStatus")

    def test_a_training_claim_of_the_reserved_class_is_denied_by_the_webhook(
        self, split: Split, webhook: Webhook
    ) -> None:
        """A training ResourceClaim naming the reserved class is denied by the webhook (before the backstop
        sees it), with its reason; nothing is created."""
        with pytest.raises(ApiError) as denied:
            split.kube.create(new_claim("sneaky", split.training, exactly(RESERVED_CLASS)))
        message = denied.value.message
        assert denied.value.status == 403, message
        assert 'admission webhook "claims.rocm-isolation.io" denied the request' in message, message
        assert (
            f"DeviceClass {RESERVED_CLASS} hands out the GPUs reserved for inference, and namespace {split.training}"
            in message
        ), message
        assert split.kube.get_or_none("ResourceClaim", "sneaky", split.training) is None

    def test_the_scheduler_claim_of_a_training_amd_gpu_pod_is_left_alone(self, split: Split, webhook: Webhook) -> None:
        """A training ``amd.com/gpu`` pod keeps its resource name (the shared class owns it); the claim the
        scheduler makes for it (``resource.kubernetes.io/extended-resource-claim``) is not the webhook's: no
        ``rocm-isolation.io/class`` annotation, of the shared class, allocated shared devices only."""
        ns = split.training
        kube = split.kube
        kube.create(new_pod("amd-gpu", ns, {DEVICES.extended_resource_name: "1"}))
        stored = kube.get("Pod", "amd-gpu", ns)
        assert stored["spec"]["containers"][0]["resources"]["limits"] == {DEVICES.extended_resource_name: "1"}
        alloc = allocated(split, ns, "amd-gpu")
        made = extended_claim(alloc)
        assert CLASS_ANNOTATION not in made["metadata"]["annotations"], made["metadata"]
        assert requested_class(made) == SHARED_CLASS, made["spec"]
        assert len(alloc.devices) == 1 and alloc.pcis <= shared_ids(2), f"allocated {shown(alloc.devices)}"

    def test_with_the_webhook_stopped_each_kind_of_attack_still_fails(self, split: Split, webhook: Webhook) -> None:
        """The webhook's process stopped, its configuration still installed (an outage: failurePolicy
        Ignore): a training template of ``gpu.amd.com`` (steered a moment ago), a claim of the reserved class
        and a pod asking for the reserved class's implicit name are each denied by the backstop."""
        split.plane.processes.stop_one(webhook.component)
        assert webhook.component.process.poll() is not None and not webhook.ready()
        assert split.kube.get_or_none("MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION) is not None
        for route in ("template-gpu.amd.com", "claim-reserved-class", "pod-deviceclass-reserved"):
            assert_denied_by_the_backstop(split, route)


def test_a_newer_class_owning_amd_gpu_hands_no_reserved_device_to_training(split: Split) -> None:
    """AMD's chart class re-created after ours (the driver's chart reinstalled) is the newer class naming
    ``amd.com/gpu``, so the scheduler maps a training ``amd.com/gpu`` pod to ``gpu.amd.com``: the claim it
    makes for the pod is denied by the claims policy (it judges the scheduler's claims like any other), no
    claim exists, the pod waits. The chart's ``deviceClass.extendedResourceName: ""`` (the field dropped)
    does not give the name back on v1.36.2: the scheduler's cache forgets the name instead of falling back
    to the shared class (kubernetes/kubernetes#141103, fixed on master by #141110), and pods are refused as
    "Insufficient amd.com/gpu" until the shared class is next updated: ``pool apply --devices-per-node 2``
    again, as docs/operations.md says (the list of other classes naming the name changed, so it rewrites the
    shared class); then the next training pod gets shared devices only. Last in the module: it leaves the
    chart class without the field."""
    kube = split.kube
    ns = split.training
    resource = {DEVICES.extended_resource_name: "1"}
    kube.delete("DeviceClass", DRIVER)
    wait_until(lambda: kube.get_or_none("DeviceClass", DRIVER) is None, what="the chart class deleted")
    kube.create(AMD_CHART_CLASS)
    kube.create(new_pod("after-reinstall", ns, resource))
    message = never_scheduled(split, ns, "after-reinstall")["after-reinstall"]
    assert "create claim for extended resources" in message and CLAIMS_POLICY in message, message
    assert kube.list("ResourceClaim", ns) == []

    dropped = kube.get("DeviceClass", DRIVER)
    del dropped["spec"]["extendedResourceName"]
    kube.replace(dropped)
    kube.create(new_pod("after-the-chart-fix", ns, resource))
    message = never_scheduled(split, ns, "after-the-chart-fix")["after-the-chart-fix"]
    assert f"Insufficient {DEVICES.extended_resource_name}" in message, message

    out = reserve_devices(split, 2)
    assert f"deviceclass/{SHARED_CLASS} replaced" in out, out
    # The pods refused meanwhile are not requeued by the class events (their refusal was the resource fit's):
    # they wait for the scheduler's periodic retry of unschedulable pods (5 minutes). A new pod is placed.
    kube.create(new_pod("after-the-apply", ns, resource))
    alloc = allocated(split, ns, "after-the-apply", timeout=60)
    assert requested_class(extended_claim(alloc)) == SHARED_CLASS
    assert not alloc.pcis & reserved_ids(2), f"allocated {shown(alloc.devices)}"
