"""An in-place upgrade of a cluster from Kubernetes 1.35 to 1.36 (issue 47; docs/operations.md, "When the cluster
moves to a newer minor"), on a control plane of its own: what the 1.35 install leaves on the 1.36 cluster, then the
documented step (re-render the manifests for the cluster and apply them; ``pool apply --devices-per-node N``).

The cluster, started once for the module, emulating 1.35 as it ships (``--emulated-version=kube=1.35`` on
kube-apiserver, kube-scheduler and kube-controller-manager; no MutatingAdmissionPolicy opt-in), set up as
test_e2e_minor_devices.py does: two DRA-only MI210 nodes publishing AMD's driver's slices, AMD's chart DeviceClass
(which names ``amd.com/gpu``), the manifests ``manifests`` renders for the cluster (the webhook is not running: no
MutatingWebhookConfiguration), training, inference and ``adminAccess`` namespaces. The upgrade is
``ControlPlane.upgrade``: the three components stopped and started again at the binaries' own 1.36 on the same etcd
(its data kept), certificates and port.

The three tests are the upgrade's three stages, in order (each stage's fixture moves the cluster on):

1. 1.35: ``pool apply --devices-per-node 2`` splits the devices without ``extendedResourceName`` (the apiserver
   drops it, AMD's chart class's too); no MutatingAdmissionPolicy is served.
2. 1.36, before re-rendering: the 1.35 objects as they were; ``pool status`` says the shared class is out of date
   and that ``amd.com/gpu`` maps to no class; an ``amd.com/gpu`` training pod waits (no node has the resource, no
   class maps it): it gets no device, reserved or shared.
3. The documented step: ``manifests`` read from the cluster renders the 1.36 manifests byte for byte (the placement
   policy v1 with them), applied; ``pool apply --devices-per-node 2`` writes ``amd.com/gpu`` into the shared class;
   ``pool status`` warns no more; the waiting pod and a new ``amd.com/gpu: 1`` pod are bound with scheduler-made
   claims of the shared class holding shared devices only, the new one placed by the placement policy.

No kubelet: pods are bound and stay ``Pending``; a device is held by a claim's allocation.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from functools import partial

import pytest
from cluster_objects import new_pod

from .controlplane import minor_options
from .harness import cli, install, own_plane, render_manifests
from .kube import ApiError, Kube, Obj, wait_until
from .test_e2e_device_reservation import (
    ADMIN_ACCESS_LABELS,
    AMD_CHART_CLASS,
    DEVICES,
    INFERENCE_LABELS,
    RESERVED_CLASS,
    RESERVED_NODES,
    SHARED_CLASS,
    Split,
    allocated,
    amd_resource_slice,
    dra_only_node,
    extended_claim,
    install_without_webhook,
    live_pci,
    make_namespaces,
    pool,
    requested_class,
    shared_ids,
    shown,
    split_label,
)

NODES = ("upgrade-dra-1", "upgrade-dra-2")
PER_NODE = 2
FROM_MINOR = "1.35"
PLACEMENT_POLICY = "rocm-isolation-placement"
WAITING = "amd-gpu-before-the-step"
AMD_GPU = DEVICES.extended_resource_name
CHART_CLASS = AMD_CHART_CLASS["metadata"]["name"]
STALE_SHARED = (
    f"deviceclass/{SHARED_CLASS} does not say what the reservation records: "
    f"pool apply --devices-per-node {PER_NODE} rewrites it"
)
UNMAPPED = (
    f"no DeviceClass names {AMD_GPU}: pods asking for it on DRA nodes get no device; pool apply --devices-per-node "
    f"{PER_NODE} makes deviceclass/{SHARED_CLASS} the newest class naming it"
)
NO_EXTENDED_RESOURCES = "no DRA extended resources"
_GATE = re.compile(r'^kubernetes_feature_enabled\{name="(?P<name>[^"]+)",stage="[^"]*"\} (?P<value>\S+)$', re.M)


@pytest.fixture(scope="module")
def on_135(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    """The 1.35 cluster, set up as test_e2e_minor_devices.py's, the manifests rendered for it installed."""
    options = minor_options(FROM_MINOR, opt_in=False)
    assert options == {"emulated_version": FROM_MINOR}, options
    with own_plane(tmp_path_factory.mktemp("controlplane-upgrade"), **options) as (plane, kube):
        for node in NODES:
            dra_only_node(kube, node)
            kube.apply(amd_resource_slice(node))
        kube.create(AMD_CHART_CLASS)
        manifests = install_without_webhook(plane, for_the_cluster=True)
        assert not [d for d in manifests if d["kind"].startswith("MutatingAdmissionPolicy")], "rendered for 1.36"
        namespaces = {
            "upgrade-training": {},
            "upgrade-inference": INFERENCE_LABELS,
            "upgrade-admin": ADMIN_ACCESS_LABELS,
        }
        make_namespaces(kube, namespaces)
        yield Split(plane, kube, *namespaces, live_pci(kube))


@pytest.fixture(scope="module")
def split_on_135(on_135: Split) -> tuple[Split, subprocess.CompletedProcess[str]]:
    """``pool apply --devices-per-node 2`` on 1.35, and what it answered."""
    return on_135, pool(on_135.plane, "apply", "--devices-per-node", str(PER_NODE))


@pytest.fixture(scope="module")
def upgraded(split_on_135: tuple[Split, subprocess.CompletedProcess[str]]) -> Split:
    """The same cluster after the control plane moved to 1.36 in place (nothing re-rendered or re-applied)."""
    split, _ = split_on_135
    pids = split.pids()
    split.plane.upgrade(emulated_version=None)
    assert not set(pids.values()) & set(split.pids().values()), "the components were not restarted"
    # A training pod of the time between the upgrade and the documented step.
    split.kube.create(new_pod(WAITING, split.training, {AMD_GPU: "1"}))
    return split


@pytest.fixture(scope="module")
def rerendered(upgraded: Split) -> tuple[Split, str, subprocess.CompletedProcess[str]]:
    """The documented step on the 1.36 cluster: ``manifests`` read from it (its raw output returned) and applied,
    then ``pool apply --devices-per-node 2`` (its result returned)."""
    plane = upgraded.plane
    rendered = cli(
        "manifests", "--overlay", "self-signed", "--ca-bundle", str(plane.pki.ca_file),
        kubeconfig=plane.admin_kubeconfig, check=True,
    )  # fmt: skip
    assert not [line for line in rendered.stderr.splitlines() if line.startswith("note: ")], rendered.stderr
    manifests = render_manifests(plane.pki.ca_file, 1, kubeconfig=plane.admin_kubeconfig)
    install(plane, [d for d in manifests if d["kind"] != "MutatingWebhookConfiguration"])
    return upgraded, rendered.stdout, pool(plane, "apply", "--devices-per-node", str(PER_NODE))


def feature_enabled(kube: Kube, gate: str) -> bool:
    """The kube-apiserver's own word (``kubernetes_feature_enabled`` on its /metrics)."""
    gates = {m["name"]: m["value"] for m in _GATE.finditer(kube.request("GET", "/metrics", raw=True))}
    assert gate in gates, sorted(gates)
    return gates[gate] == "1"


def placement_policies(kube: Kube) -> list[Obj] | None:
    """The MutatingAdmissionPolicies (v1) of the cluster; None where the apiserver does not serve them."""
    try:
        return kube.list("MutatingAdmissionPolicy")
    except ApiError as err:
        if err.status == 404:
            return None
        raise


def pool_status(split: Split) -> tuple[str, Obj]:
    """``pool status`` as text (stdout and stderr) and its JSON device section."""
    text = pool(split.plane, "status")
    document = json.loads(pool(split.plane, "status", "-o", "json").stdout)
    devices: Obj = document["devices"]
    return text.stdout + text.stderr, devices


def scheduler_failed(split: Split, ns: str, name: str) -> str:
    """The scheduler's FailedScheduling message for ``ns/name`` ('' until there is one)."""
    events = split.kube.list("Event", ns, fields=f"involvedObject.name={name}")
    failed = [e["message"] for e in events if e.get("reason") == "FailedScheduling"]
    return failed[-1] if failed else ""


def unreserved_terms(pod_obj: Obj) -> bool:
    """Every required node-affinity term of the pod keeps it off the nodes reserved whole (``rocm-isolation.io/pool
    NotIn [inference]``: the placement of the training class; the split nodes' ``inference-devices`` stays open)."""
    key, whole = RESERVED_NODES.label
    affinity = (pod_obj["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return bool(terms) and all(
        any(
            e["key"] == key and e["operator"] == "NotIn" and whole in e["values"]
            for e in t.get("matchExpressions") or []
        )
        for t in terms
    )


def test_on_135_the_split_is_made_without_amd_gpu_and_no_placement_policy_is_served(
    split_on_135: tuple[Split, subprocess.CompletedProcess[str]],
) -> None:
    split, applied = split_on_135
    kube = split.kube
    assert not feature_enabled(kube, "DRAExtendedResource")
    assert NO_EXTENDED_RESOURCES in applied.stderr, applied.stderr
    assert all(split_label(kube, node) == DEVICES.node_label_value for node in NODES), applied.stdout
    assert kube.get("DeviceClass", SHARED_CLASS)["spec"].get("extendedResourceName") is None
    # The apiserver dropped AMD's chart class's name too: on 1.35 no class maps amd.com/gpu.
    assert kube.get("DeviceClass", CHART_CLASS)["spec"].get("extendedResourceName") is None
    assert placement_policies(kube) is None
    text, devices = pool_status(split)
    assert devices["outOfDate"] == [], devices["outOfDate"]
    assert "warning:" not in text, text


def test_on_136_before_re_rendering_pool_status_says_the_shared_class_is_out_of_date_and_amd_gpu_gets_nothing(
    upgraded: Split,
) -> None:
    split = upgraded
    kube = split.kube
    assert feature_enabled(kube, "DRAExtendedResource")
    # What 1.35 wrote is as it was: the split (label and classes, no amd.com/gpu in any), no placement policy.
    assert all(split_label(kube, node) == DEVICES.node_label_value for node in NODES)
    for name in (SHARED_CLASS, RESERVED_CLASS, CHART_CLASS):
        assert kube.get("DeviceClass", name)["spec"].get("extendedResourceName") is None, name
    assert placement_policies(kube) == []
    text, devices = pool_status(split)
    assert devices["outOfDate"] == [STALE_SHARED, UNMAPPED], devices["outOfDate"]
    assert f"warning: {STALE_SHARED}\nwarning: {UNMAPPED}" in text, text
    assert f"{AMD_GPU} maps to no class (the newest DeviceClass naming it)" in text, text

    ns = split.training
    message = wait_until(
        partial(scheduler_failed, split, ns, WAITING), timeout=60, what=f"the scheduler to try {WAITING}"
    )
    assert f"Insufficient {AMD_GPU}" in message, message
    live = kube.get("Pod", WAITING, ns)
    assert not live["spec"].get("nodeName") and not (live.get("status") or {}).get("extendedResourceClaimStatus")
    assert kube.list("ResourceClaim", ns) == []


def test_the_documented_step_maps_amd_gpu_to_the_shared_class_and_training_gets_shared_devices_only(
    rerendered: tuple[Split, str, subprocess.CompletedProcess[str]],
) -> None:
    split, rendered, applied = rerendered
    kube = split.kube
    plane = split.plane
    default = cli(
        "manifests", "--overlay", "self-signed", "--ca-bundle", str(plane.pki.ca_file), "--kubernetes-version", "1.36",
        check=True,
    )  # fmt: skip
    assert rendered == default.stdout, "the cluster's rendering is not the 1.36 one"
    placement = kube.get("MutatingAdmissionPolicy", PLACEMENT_POLICY)
    assert placement["apiVersion"] == "admissionregistration.k8s.io/v1", placement["apiVersion"]

    assert NO_EXTENDED_RESOURCES not in applied.stderr, applied.stderr
    assert kube.get("DeviceClass", SHARED_CLASS)["spec"].get("extendedResourceName") == AMD_GPU
    text, devices = pool_status(split)
    assert devices["outOfDate"] == [], devices["outOfDate"]
    assert "warning:" not in text, text
    assert f"{AMD_GPU} maps to deviceclass/{SHARED_CLASS} (the newest DeviceClass naming it)" in text, text

    ns = split.training
    kube.create(new_pod("amd-gpu", ns, {AMD_GPU: "1"}))
    # Placed by the placement policy (the webhook is not running): off the nodes reserved whole. The pod of before
    # the step was admitted unplaced.
    assert unreserved_terms(kube.get("Pod", "amd-gpu", ns)), kube.get("Pod", "amd-gpu", ns)["spec"].get("affinity")
    assert not kube.get("Pod", WAITING, ns)["spec"].get("affinity")
    held: set[str] = set()
    for name in ("amd-gpu", WAITING):
        alloc = allocated(split, ns, name, timeout=60)
        made = extended_claim(alloc)
        assert requested_class(made) == SHARED_CLASS, made["spec"]
        assert len(alloc.devices) == 1 and alloc.pcis <= shared_ids(PER_NODE), f"{name}: {shown(alloc.devices)}"
        held |= {f"{d.node}/{d.name}" for d in alloc.devices}
    assert len(held) == 2, held
