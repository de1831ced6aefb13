"""Device-level reservation by device taints (design.md, "Reserved capacity: nodes or devices") on a real
control plane of its own (v1.36.2) configured as a 1.36 operator would for DeviceTaintRules:
``resource.k8s.io/v1beta2`` served and the ``DRADeviceTaintRules`` feature gate on in kube-apiserver,
kube-scheduler and kube-controller-manager.

What v1.36.2 allows, and so what is proven here:
- ``pool`` refuses to write DeviceTaintRules on it, saying why, and writes nothing: its kube-scheduler exits
  as soon as one rule exists and a ResourceSlice or DeviceClass event comes ("interface conversion:
  interface {} is *v1beta2.DeviceTaintRule, not *v1alpha3.DeviceTaintRule", seen on this control plane;
  kubernetes/kubernetes#139651). The scheduler is alive at the end of the module.
- What a rule does once a scheduler honours it: the scheduler's ResourceSlice tracker appends the rule's
  taint to the device's ``taints`` in its own view of the slice, and the allocator reads them there. A
  driver may publish the same taint in the slice itself (DRADeviceTaints, on by default in 1.36), which
  v1.36.2 honours; so the first node's reserved devices carry the product's taint in its slice (the only
  stand-in of this module, for the rule a later scheduler applies), and the DeviceClasses are the ones
  ``pool`` writes in taint mode (the shared class selects every device, the reserved class the reserved
  PCI bus IDs; rendered by ``webhook.deploy.device_classes``). The real allocator then decides: training
  gets every GPU of the second node and the shared ones of the first, by every route (``amd.com/gpu``,
  shared-class claims, adminAccess claims); inference claims that tolerate the taint get the reserved ones,
  others wait; the backstop denies the toleration to training; with the webhook up, inference templates
  get the reserved class and the toleration, ``amd.com/gpu`` inference pods keep ``amd.com/gpu``.

No kubelet: a device is held by a claim's allocation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_objects import exactly, new_claim, new_claim_pod, new_claim_template, new_pod

from webhook.core.claims import RESERVED_DEVICE_TAINT_KEY
from webhook.core.engine import CLASS_ANNOTATION
from webhook.deploy import device_classes, device_taint_rules
from webhook.deploy.reserved_devices import CLAIMS_POLICY, TEMPLATES_POLICY

from .controlplane import ASSETS_ENV, LOOPBACK, ControlPlane, loopback_only
from .harness import DRIVER, Webhook
from .kube import ApiError, Kube, wait_until
from .test_e2e_device_reservation import (
    DEVICES,
    PCI_BUS_ID,
    POLICY,
    RESERVED_CLASS,
    RESERVED_NODES,
    SHARED_CLASS,
    Split,
    allocated,
    amd_resource_slice,
    build_split,
    delete_claims,
    delete_pods,
    extended_claim,
    never_scheduled,
    on_node,
    pool,
    requested_class,
    reserved_ids,
    running_webhook,
    shared_ids,
    shown,
    split_label,
    template_class,
    wait_backstop,
)

FIRST, SECOND = "mi210-taints-1", "mi210-taints-2"
NODES = (FIRST, SECOND)
TAINT_RULES = "--device-taint-rules"
GATES = ("DRADeviceTaintRules",)
TOLERATION = {"key": RESERVED_DEVICE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    loopback_only()
    plane = ControlPlane(
        Path(os.environ[ASSETS_ENV]),
        tmp_path_factory.mktemp("controlplane-device-taints"),
        apiserver_args=("--runtime-config=resource.k8s.io/v1beta2=true",),
        feature_gates=GATES,
    )
    try:
        plane.start()
        kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
        yield build_split(plane, kube, NODES, "taints-training", "taints-inference", "taints-admin")
        plane.check_alive()
    finally:
        plane.stop()


@pytest.fixture(autouse=True)
def emptied(cluster: Split) -> Iterator[None]:
    """Each test starts with every device free: its pods, claims and templates deleted after it."""
    yield
    kube = cluster.kube
    delete_pods(cluster)
    delete_claims(cluster)
    wait_until(
        lambda: not any(kube.list("ResourceClaim", ns) or kube.list("Pod", ns) for ns in cluster.namespaces),
        timeout=90,
        what="every pod and claim of the test deleted",
    )


def taint_first_node(cluster: Split, per_node: int) -> None:
    """What ``pool apply --devices-per-node N --nodes FIRST`` makes a scheduler see once it honours
    DeviceTaintRules: the N lowest-PCI devices of the first node carry the product's taint (published in the
    slice: see the module docstring), the classes of taint mode (``pool``'s renderers), the first node
    labelled for inference. The backstop acts on it before the test goes on."""
    kube = cluster.kube
    reserved = {pci for pci in reserved_ids(per_node)}
    slice_obj = amd_resource_slice(FIRST)
    for device in slice_obj["spec"]["devices"]:
        if device["attributes"][PCI_BUS_ID]["string"] in reserved:
            device["taints"] = [device_taint_rules.taint(POLICY)]
    kube.apply(slice_obj)
    tainted = {(FIRST, name) for (node, name), pci in cluster.pci.items() if node == FIRST and pci in reserved}
    reservation = device_classes.reservation_for(reserved, per_node, tainted=tainted)
    for device_class in device_classes.classes(POLICY, reservation):
        kube.apply(device_class)
    kube.patch("Node", FIRST, {"metadata": {"labels": {RESERVED_NODES.label[0]: DEVICES.node_label_value}}})
    assert not kube.list("DeviceTaintRule")
    wait_backstop(cluster, active=True)


def test_pool_refuses_device_taint_rules_where_the_scheduler_would_panic(cluster: Split) -> None:
    """A subset of the nodes asked for on v1.36.2 with v1beta2 served and the gate on: ``plan`` and ``apply``
    exit 2, with or without ``--device-taint-rules``, naming the scheduler's panic and the release to
    upgrade to; no DeviceTaintRule, DeviceClass or label is written, and the scheduler is still running."""
    for args in (("plan",), ("apply",), ("apply", TAINT_RULES)):
        result = pool(cluster.plane, *args, "--devices-per-node", "2", "--nodes", FIRST, exit_code=2)
        assert "this cluster serves devicetaintrules in resource.k8s.io/v1beta2, but its kube-apiserver is v1.36.2" in (
            result.stderr
        ), result.stderr
        assert "kubernetes/kubernetes#139651" in result.stderr and "v1.36.3 or later" in result.stderr
    kube = cluster.kube
    assert not kube.list("DeviceTaintRule")
    assert kube.get_or_none("DeviceClass", RESERVED_CLASS) is None
    assert all(split_label(kube, node) is None for node in NODES)
    cluster.plane.check_alive()


def test_the_rules_pool_would_write_pass_the_apiservers_validation(cluster: Split) -> None:
    """The DeviceTaintRules ``pool`` renders for the first node's reserved devices, sent with ``dryRun=All``
    (validated and admitted, never stored: the scheduler never sees them): accepted as they are, names,
    selector and taint included, and read back unchanged but for the taint's ``timeAdded``."""
    reserved = reserved_ids(2)
    for (node, name), pci in sorted(cluster.pci.items()):
        if node != FIRST or pci not in reserved:
            continue
        rule = device_taint_rules.rule(POLICY, device_taint_rules.TaintedDevice(node, node, name, pci), "v1beta2")
        stored = cluster.kube.create(rule, dry_run=True)
        assert not device_taint_rules.spec_differs(stored, rule), stored
        assert device_taint_rules.tainted_device(stored) == device_taint_rules.TaintedDevice(node, node, name, pci)
    assert not cluster.kube.list("DeviceTaintRule")


def test_training_gets_every_untainted_gpu_by_every_route_and_never_a_tainted_one(cluster: Split) -> None:
    """Only the first node's reserved devices tainted: training gets all four GPUs of the second node and the
    two shared ones of the first, and nothing more there, whether it asks through ``amd.com/gpu``, a
    shared-class claim or an ``adminAccess`` claim (taints hold for it too); an inference claim of the
    reserved class that tolerates the taint gets the first node's reserved GPUs."""
    taint_first_node(cluster, 2)
    kube, ns = cluster.kube, cluster.training
    kube.create(new_pod("whole-second", ns, {DEVICES.extended_resource_name: "4"}, **on_node(SECOND)))
    alloc = allocated(cluster, ns, "whole-second")
    assert alloc.node == SECOND and len(alloc.pcis) == 4, f"allocated {shown(alloc.devices)}"
    kube.create(new_pod("shared-first", ns, {DEVICES.extended_resource_name: "2"}, **on_node(FIRST)))
    alloc = allocated(cluster, ns, "shared-first")
    assert alloc.pcis == shared_ids(2), f"allocated {shown(alloc.devices)}"
    assert requested_class(extended_claim(alloc)) == SHARED_CLASS
    kube.create(new_pod("one-more", ns, {DEVICES.extended_resource_name: "1"}, **on_node(FIRST)))
    kube.create(new_claim("shared-claim", ns, exactly(SHARED_CLASS)))
    kube.create(new_claim_pod("shared-claim", ns, claim_name="shared-claim", **on_node(FIRST)))
    never_scheduled(cluster, ns, "one-more", "shared-claim")
    # adminAccess may share an allocated device, never a tainted one.
    admin = cluster.admin_access
    kube.create(new_claim("admin", admin, exactly(SHARED_CLASS, count=3, adminAccess=True)))
    kube.create(new_claim_pod("admin", admin, claim_name="admin", **on_node(FIRST)))
    never_scheduled(cluster, admin, "admin")

    inference = cluster.inference
    kube.create(new_claim("serve", inference, exactly(RESERVED_CLASS, count=2, tolerations=[TOLERATION])))
    kube.create(new_claim_pod("serve", inference, claim_name="serve"))
    alloc = allocated(cluster, inference, "serve")
    assert alloc.node == FIRST and alloc.pcis == reserved_ids(2), f"allocated {shown(alloc.devices)}"


def test_an_inference_claim_without_the_toleration_gets_no_tainted_device(cluster: Split) -> None:
    """With the webhook down, an inference claim of the reserved class written without the toleration is
    not given a tainted device (it waits): taints, not the class, hold the devices."""
    taint_first_node(cluster, 2)
    kube, ns = cluster.kube, cluster.inference
    kube.create(new_claim("bare", ns, exactly(RESERVED_CLASS)))
    kube.create(new_claim_pod("bare", ns, claim_name="bare", **on_node(FIRST)))
    never_scheduled(cluster, ns, "bare")


@pytest.mark.parametrize(
    "toleration",
    [
        TOLERATION,
        {"key": RESERVED_DEVICE_TAINT_KEY, "operator": "Equal", "value": RESERVED_CLASS},
        {"operator": "Exists"},
    ],
    ids=["our-key", "our-key-equal", "wildcard"],
)
@pytest.mark.parametrize("kind", ["claim", "template"])
def test_training_may_not_tolerate_the_reserved_taint(cluster: Split, toleration: dict[str, str], kind: str) -> None:
    """Taints are not access control: a training claim or template of the shared class that tolerates the
    reserved taint (our key, or every taint) is denied by the backstop, the webhook down."""
    taint_first_node(cluster, 2)
    request = exactly(SHARED_CLASS, tolerations=[toleration])
    obj = (
        new_claim("tolerant", cluster.training, request)
        if kind == "claim"
        else new_claim_template("tolerant", cluster.training, request)
    )
    policy = CLAIMS_POLICY if kind == "claim" else TEMPLATES_POLICY
    with pytest.raises(ApiError) as denied:
        cluster.kube.create(obj)
    assert denied.value.status == 403, denied.value.message
    assert f"ValidatingAdmissionPolicy '{policy}'" in denied.value.message, denied.value.message
    assert cluster.kube.get_or_none(obj["kind"], "tolerant", cluster.training) is None


@pytest.fixture(scope="class")
def webhook(cluster: Split, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """The webhook as the session's cluster runs it, for one class of tests (see test_e2e_device_reservation)."""
    taint_first_node(cluster, 2)
    directory = tmp_path_factory.mktemp("webhook-device-taints")

    def steered() -> str:
        probe = new_claim_template("probe", cluster.inference, exactly(DRIVER))
        return template_class(cluster.kube.create(probe, dry_run=True))

    with running_webhook(cluster, directory, steered, RESERVED_CLASS) as running:
        yield running


class TestWithTheWebhookUp:
    def test_an_inference_template_gets_the_reserved_class_and_the_toleration(
        self, cluster: Split, webhook: Webhook
    ) -> None:
        """An inference template of ``gpu.amd.com`` written as for a cluster without any reservation: stored
        with the reserved class and the toleration; its pod is placed on the split node and its claim gets
        reserved devices."""
        kube, ns = cluster.kube, cluster.inference
        kube.create(new_claim_template("chart", ns, exactly(DRIVER, count=2)))
        stored = kube.get("ResourceClaimTemplate", "chart", ns)
        (request,) = stored["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["deviceClassName"] == RESERVED_CLASS, request
        assert TOLERATION in request["exactly"].get("tolerations", []), request
        assert stored["metadata"]["annotations"][CLASS_ANNOTATION] == "inference"
        kube.create(new_claim_pod("chart", ns, template="chart"))
        alloc = allocated(cluster, ns, "chart")
        assert alloc.node == FIRST and alloc.pcis == reserved_ids(2), f"allocated {shown(alloc.devices)}"

    def test_a_training_template_that_tolerates_the_taint_is_denied_by_the_webhook(
        self, cluster: Split, webhook: Webhook
    ) -> None:
        with pytest.raises(ApiError) as denied:
            cluster.kube.create(
                new_claim_template("sneaky", cluster.training, exactly(DRIVER, tolerations=[{"operator": "Exists"}]))
            )
        assert denied.value.status == 403, denied.value.message
        assert 'admission webhook "claims.rocm-isolation.io" denied the request' in denied.value.message
        assert cluster.kube.get_or_none("ResourceClaimTemplate", "sneaky", cluster.training) is None

    def test_an_inference_amd_gpu_pod_keeps_amd_gpu_and_gets_a_shared_device(
        self, cluster: Split, webhook: Webhook
    ) -> None:
        """With taints, the scheduler's claim for ``amd.com/gpu`` can never get a reserved device (it carries
        no tolerations): the webhook leaves the resource as written (steering it to the reserved class
        would leave the pod Pending) and says so in a warning; the pod is placed on the split node and
        gets a shared device there."""
        kube, ns = cluster.kube, cluster.inference
        kube.create(new_pod("amd-gpu", ns, {DEVICES.extended_resource_name: "1"}))
        stored = kube.get("Pod", "amd-gpu", ns)
        assert stored["spec"]["containers"][0]["resources"]["limits"] == {DEVICES.extended_resource_name: "1"}
        alloc = allocated(cluster, ns, "amd-gpu")
        assert alloc.node == FIRST and alloc.pcis <= shared_ids(2), f"allocated {shown(alloc.devices)}"
        assert requested_class(extended_claim(alloc)) == SHARED_CLASS
