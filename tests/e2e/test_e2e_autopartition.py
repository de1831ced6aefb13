"""Device-level reservation on nodes whose GPUs AMD's DRA driver publishes with its ``AutoPartition`` gate
(issue 35; reference §11), on a real control plane of its own (v1.36.2):

- two DRA-only nodes, each with four MI300X GPUs published in the driver's exact shape: two ResourceSlices
  per pool (one with the ``sharedCounters`` ``gpu-<i>-mutex``, one with the devices), one virtual device per
  compute+memory layout (``gpu-<i>-spx-nps1``, ``-dpx-nps2``, ``-cpx-nps1``, ``-cpx-nps4``), consumable
  capacity ``partitions``, ``allowMultipleAllocations``, every layout consuming its GPU's counter (one
  layout per GPU at a time), in an arbitrary order (the driver lists them from a Go map);
- AMD's two DeviceClasses: ``gpu.amd.com`` (every layout) and ``gpu.amd.com-spx`` (whole GPUs only), the
  latter owning ``amd.com/gpu``;
- the policy pins the node-wide memory mode (``reservedDevices.memoryPartition: nps1``); before it, the
  default policy pins one itself (issue 42: the whole-GPU layout's nps1), an unpinned reservation is an audit
  finding, and an explicit pin (nps4) wins over the recorded one.

Proved: an ``amd.com/gpu`` pod gets a whole GPU (spx) before ``pool apply``, after it (a shared GPU for
training, a reserved one for inference: the name's own classes ``rocm-isolation-{reserved,shared}-gpu``),
after a resize and after ``release`` (AMD's class's answer again); claims of both AMD classes and of the
product classes keep what their class admits, restricted to their side (the webhook steers them), and so
do pods asking for ``gpu.amd.com-spx``'s implicit extended resource name; a training claim can never get a layout of another memory mode than the pinned one. No kubelet: the
scheduler allocates from the slices.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_objects import (
    LAYOUTS,
    autopartition_slices,
    device_class,
    exactly,
    new_claim,
    new_claim_pod,
    new_pod,
)

from webhook.core.policy import default_policy
from webhook.deploy import device_classes

from .controlplane import ControlPlane
from .harness import DRIVER, Webhook, cli, own_plane
from .kube import Kube, Obj, wait_until
from .test_e2e_device_reservation import (
    INFERENCE_LABELS,
    SHARED_CLASS,
    Split,
    _steered_class,
    allocated,
    delete_claims,
    delete_pods,
    dra_only_node,
    empty_devices,
    install_without_webhook,
    live_pci,
    make_namespaces,
    never_scheduled,
    pool,
    running_webhook,
    split_label,
)

POLICY = default_policy()
DEVICES = POLICY.spec.reserved_devices
RESERVED_CLASS = DEVICES.reserved_class_name
# amd.com/gpu's own classes (AMD's class for it admits whole GPUs only): the shared one owns the name
RESERVED_GPU_CLASS = DEVICES.reserved_extended_class_name
SHARED_GPU_CLASS = DEVICES.shared_extended_class_name
NODES = ("mi300x-ap-1", "mi300x-ap-2")
PCI = ("0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0")
SPX_CLASS = "gpu.amd.com-spx"
# AMD's chart class for whole GPUs (helm-charts-k8s templates/deviceclass.yaml under AutoPartition).
SPX_SELECTOR = (
    "device.driver == 'gpu.amd.com' && "
    '(!has(device.attributes["gpu.amd.com"].computePartition) || '
    'device.attributes["gpu.amd.com"].computePartition == "spx")'
)
MEMORY_MODE = "nps1"
POLICY_FILE = Path(__file__).parents[1] / "fixtures" / "policies" / "device-memory-partition.yaml"


def mi300x_slices(node: str, seed: int) -> list[Obj]:
    """The node's two slices, the devices in an arbitrary (seeded) order."""
    slices = autopartition_slices(node, PCI, layouts=LAYOUTS)
    random.Random(seed).shuffle(slices[1]["spec"]["devices"])
    return slices


def expressions_of(device_class: Obj) -> list[str]:
    return [s["cel"]["expression"] for s in device_class["spec"]["selectors"]]


def selector(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


def attribute(name: str, value: str) -> str:
    return f'device.attributes["gpu.amd.com"].{name} == "{value}"'


def build_autopartition(
    plane: ControlPlane, kube: Kube, names: tuple[str, str, str], *, for_the_cluster: bool
) -> Split:
    """On a started control plane: ``NODES`` DRA-only, each publishing four MI300X GPUs in AutoPartition's shape;
    AMD's two classes; the manifests without the webhook (rendered for the cluster: ``for_the_cluster``); the
    training, inference and admin namespaces (no label, inference, no label)."""
    for seed, node in enumerate(NODES):
        dra_only_node(kube, node)
        for resource_slice in mi300x_slices(node, seed):
            kube.apply(resource_slice)
    kube.create(device_class(DRIVER, f"device.driver == '{DRIVER}'", None))
    kube.create(device_class(SPX_CLASS, SPX_SELECTOR, "amd.com/gpu"))
    install_without_webhook(plane, for_the_cluster=for_the_cluster)
    training, inference, admin = names
    make_namespaces(kube, {training: {}, inference: INFERENCE_LABELS, admin: {}})
    return Split(plane, kube, *names, live_pci(kube))


@pytest.fixture(scope="module")
def ap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    with own_plane(tmp_path_factory.mktemp("controlplane-autopartition")) as (plane, kube):
        yield build_autopartition(plane, kube, ("ap-training", "ap-inference", "ap-admin"), for_the_cluster=False)


@pytest.fixture(autouse=True)
def emptied(ap: Split) -> Iterator[None]:
    yield
    empty_devices(ap)


def apool(split: Split, *args: str) -> str:
    return pool(split.plane, *args, "--policy", str(POLICY_FILE)).stdout


def gpu_pods(split: Split, ns: str, count: int, prefix: str = "p") -> list[str]:
    names = [f"{prefix}{i}" for i in range(count)]
    for name in names:
        split.kube.create(new_pod(name, ns, {"amd.com/gpu": "1"}))
    return names


def layouts_of(split: Split, ns: str, names: list[str]) -> list[tuple[str, str, str]]:
    """(node, PCI bus ID, layout) of each pod's one device."""
    found = []
    for name in names:
        alloc = allocated(split, ns, name)
        (device,) = alloc.devices
        found.append((device.node, device.pci, device.name.split("-", 2)[2]))
    return found


def claim_layout(split: Split, ns: str, name: str, request: dict[str, Any]) -> tuple[str, str, str]:
    split.kube.create(new_claim(name, ns, request))
    split.kube.create(new_claim_pod(name, ns, claim_name=name))
    ((node, pci, layout),) = layouts_of(split, ns, [name])
    return node, pci, layout


# --- before the reservation: AMD's classes alone -------------------------------------------------------


def test_before_apply_amd_gpu_pods_get_whole_gpus(ap: Split) -> None:
    got = layouts_of(ap, ap.training, gpu_pods(ap, ap.training, 3))
    assert all(layout == "spx-nps1" for _, _, layout in got), got


# --- the node-wide memory mode (issue 42): the default policy pins one, an explicit pin wins ------------

PINNED_BY_DEFAULT = "nps1"  # the mode of the whole-GPU layout (spx-nps1), the one gpu.amd.com-spx admits
UNPINNED_RULE = "reserved-device-memory-mode-unpinned"
OUR_CLASSES = (RESERVED_CLASS, RESERVED_GPU_CLASS, SHARED_CLASS, SHARED_GPU_CLASS)


def memory_pin(mode: str) -> str:
    return device_classes.memory_selector(DRIVER, mode)


def audit_findings(split: Split, *policy: str) -> tuple[int, list[dict[str, Any]]]:
    result = cli("audit", "-o", "json", *policy, kubeconfig=split.plane.admin_kubeconfig)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.returncode, json.loads(result.stdout)["findings"]


def unpin(split: Split) -> None:
    """Our classes as a reservation written before issue 42 left them: no memory mode selector, none recorded."""
    for name in OUR_CLASSES:
        obj = split.kube.get("DeviceClass", name)
        obj["spec"]["selectors"] = [
            s for s in obj["spec"]["selectors"] if "memoryPartition" not in s["cel"]["expression"]
        ]
        obj["metadata"]["annotations"].pop(device_classes.MEMORY_PARTITION_ANNOTATION, None)
        split.kube.replace(obj)


def test_the_default_policy_pins_the_whole_gpu_mode_and_audit_reports_an_unpinned_one(ap: Split) -> None:
    """The default policy (no reservedDevices.memoryPartition) on AutoPartition nodes: plan and apply pin nps1
    (both sides' classes select only nps1 layouts, recorded in the reserved class), so a claim for an nps4
    layout stays pending on either side. A reservation without a pin (as written before issue 42) is a finding
    of the audit and a warning of pool status, and on it the nps4 claim IS allocated (the exposure: on a real
    node the driver would then taint every nps1 layout, inference's too); the next apply pins again."""
    plan = pool(ap.plane, "plan", "--devices-per-node", "2").stdout
    assert (
        f"Memory mode: {PINNED_BY_DEFAULT}, pinned on every node of {DRIVER} (2 nodes publish several: nps1, nps2, "
        "nps4), from the mode of the whole-GPU layout (spx-nps1)"
    ) in plan, plan
    out = pool(ap.plane, "apply", "--devices-per-node", "2").stdout
    assert "After apply: 2 devices per node, PCI bus IDs 0000:05:00.0, 0000:26:00.0 (" in out, out
    for name in OUR_CLASSES:
        assert memory_pin(PINNED_BY_DEFAULT) in expressions_of(ap.kube.get("DeviceClass", name)), name
    annotations = ap.kube.get("DeviceClass", RESERVED_CLASS)["metadata"]["annotations"]
    assert annotations[device_classes.MEMORY_PARTITION_ANNOTATION] == PINNED_BY_DEFAULT
    nps4 = exactly(SHARED_CLASS, selectors=[selector(attribute("memoryPartition", "nps4"))])
    ap.kube.create(new_claim("nps4", ap.training, nps4))
    ap.kube.create(new_claim_pod("nps4", ap.training, claim_name="nps4"))
    never_scheduled(ap, ap.training, "nps4")
    _, pci, layout = claim_layout(
        ap, ap.inference, "cpx", exactly(RESERVED_CLASS, selectors=[selector(attribute("computePartition", "cpx"))])
    )
    assert pci in PCI[:2] and layout == "cpx-nps1", (pci, layout)
    code, findings = audit_findings(ap)
    assert not [f for f in findings if f["rule"] == UNPINNED_RULE], findings
    status = json.loads(pool(ap.plane, "status", "--output", "json").stdout)["devices"]
    assert status["memoryPartition"] == {"pinned": PINNED_BY_DEFAULT, "unpinnedNodes": {}}, status
    delete_pods(ap)
    delete_claims(ap)
    wait_until(lambda: not any(ap.kube.list("ResourceClaim", ns) for ns in ap.namespaces), timeout=60, what="claims")

    unpin(ap)
    code, findings = audit_findings(ap)
    unpinned = sorted(f["name"] for f in findings if f["rule"] == UNPINNED_RULE)
    assert code == 1 and unpinned == list(NODES), findings
    message = next(f["message"] for f in findings if f["rule"] == UNPINNED_RULE)
    assert "memory modes nps1, nps2, nps4" in message and "reservedDevices.memoryPartition" in message, message
    assert "rocm-isolation-webhook pool apply --devices-per-node 2 pins one" in message, message
    status = json.loads(pool(ap.plane, "status", "--output", "json").stdout)["devices"]
    assert status["memoryPartition"]["unpinnedNodes"] == {n: ["nps1", "nps2", "nps4"] for n in NODES}, status
    assert "pool apply --devices-per-node 2 pins one" in pool(ap.plane, "status").stdout
    _, pci, layout = claim_layout(ap, ap.training, "open", nps4)
    assert pci in PCI[2:] and layout == "cpx-nps4", (pci, layout)  # what the pin keeps from happening
    delete_pods(ap)
    delete_claims(ap)
    wait_until(lambda: not any(ap.kube.list("ResourceClaim", ns) for ns in ap.namespaces), timeout=60, what="claims")

    out = pool(ap.plane, "apply", "--devices-per-node", "2").stdout
    assert f"Memory mode: {PINNED_BY_DEFAULT}, pinned" in out, out
    assert all(memory_pin(PINNED_BY_DEFAULT) in expressions_of(ap.kube.get("DeviceClass", n)) for n in OUR_CLASSES)
    _, findings = audit_findings(ap)
    assert not [f for f in findings if f["rule"] == UNPINNED_RULE], findings


def test_an_explicit_pin_wins_over_the_recorded_one(ap: Split, tmp_path: Path) -> None:
    """reservedDevices.memoryPartition: nps4 over the nps1 the default pinned: the classes are rewritten, a claim
    for any layout of the shared class gets cpx-nps4, and amd.com/gpu (whole GPUs: spx-nps1 only) gets nothing.
    The module's own policy (nps1) then pins nps1 again (the fixture ``applied``)."""
    policy = tmp_path / "nps4.yaml"
    policy.write_text(POLICY_FILE.read_text().replace("memoryPartition: nps1", "memoryPartition: nps4"))
    out = pool(ap.plane, "apply", "--devices-per-node", "2", "--policy", str(policy)).stdout
    assert (
        "Memory mode: nps4, pinned on every node of gpu.amd.com" in out
        and "from reservedDevices.memoryPartition" in out
    )
    for name in OUR_CLASSES:
        found = expressions_of(ap.kube.get("DeviceClass", name))
        assert memory_pin("nps4") in found and memory_pin("nps1") not in found, (name, found)
    annotations = ap.kube.get("DeviceClass", RESERVED_CLASS)["metadata"]["annotations"]
    assert annotations[device_classes.MEMORY_PARTITION_ANNOTATION] == "nps4"
    _, pci, layout = claim_layout(ap, ap.training, "any", exactly(SHARED_CLASS))
    assert pci in PCI[2:] and layout == "cpx-nps4", (pci, layout)
    ap.kube.create(new_pod("whole", ap.training, {"amd.com/gpu": "1"}))
    never_scheduled(ap, ap.training, "whole")
    _, findings = audit_findings(ap, "--policy", str(policy))
    assert not [f for f in findings if f["rule"] == UNPINNED_RULE], findings


# --- the reservation (the webhook steers claims) ------------------------------------------------------


@pytest.fixture(scope="module")
def applied(ap: Split, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    out = apool(ap, "apply", "--devices-per-node", "2")
    assert "After apply: 2 devices per node, PCI bus IDs 0000:05:00.0, 0000:26:00.0 (" in out, out
    assert all(split_label(ap.kube, node) == DEVICES.node_label_value for node in NODES), out
    shared = ap.kube.get("DeviceClass", SHARED_CLASS)
    assert SPX_SELECTOR not in expressions_of(shared) and "extendedResourceName" not in shared["spec"], shared
    for name in (RESERVED_GPU_CLASS, SHARED_GPU_CLASS):
        own = ap.kube.get("DeviceClass", name)
        assert SPX_SELECTOR in expressions_of(own), own
        assert own["metadata"]["annotations"]["rocm-isolation.io/extended-resource-inherited-from"] == SPX_CLASS
    assert ap.kube.get("DeviceClass", SHARED_GPU_CLASS)["spec"]["extendedResourceName"] == "amd.com/gpu"
    status = apool(ap, "status")
    assert f"{DEVICES.extended_resource_name} maps to deviceclass/{SHARED_GPU_CLASS}" in status, status
    directory = tmp_path_factory.mktemp("webhook-autopartition")
    with running_webhook(ap, directory, lambda: _steered_class(ap), SHARED_CLASS) as running:
        yield running


def test_after_apply_amd_gpu_pods_get_whole_shared_gpus_never_a_partition(ap: Split, applied: Webhook) -> None:
    got = layouts_of(ap, ap.training, gpu_pods(ap, ap.training, 4))
    assert all(layout == "spx-nps1" and pci in PCI[2:] for _, pci, layout in got), got
    assert len({(node, pci) for node, pci, _ in got}) == 4, got
    # every shared GPU is in use as a whole one: a fifth waits (no partition of a reserved GPU, no layout)
    ap.kube.create(new_pod("p4", ap.training, {"amd.com/gpu": "1"}))
    never_scheduled(ap, ap.training, "p4")


CLAIMS = {
    # (namespace role, request) -> (the PCI bus IDs of its side, the layouts it may get)
    "training-spx-class": ("training", exactly(SPX_CLASS), PCI[2:], {"spx-nps1"}),
    "training-chart-class-cpx": (
        "training",
        exactly(DRIVER, selectors=[selector(attribute("computePartition", "cpx"))]),
        PCI[2:],
        {"cpx-nps1"},  # cpx-nps4 is another memory mode than the pinned one
    ),
    # the shared class keeps every layout of its side (of the pinned memory mode), as gpu.amd.com does
    "training-shared-class-cpx": (
        "training",
        exactly(SHARED_CLASS, selectors=[selector(attribute("computePartition", "cpx"))]),
        PCI[2:],
        {"cpx-nps1"},
    ),
    # amd.com/gpu's class: whole GPUs only, as gpu.amd.com-spx
    "training-shared-gpu-class": ("training", exactly(SHARED_GPU_CLASS), PCI[2:], {"spx-nps1"}),
    "training-shared-gpu-class-cpx": (
        "training",
        exactly(SHARED_GPU_CLASS, selectors=[selector(attribute("computePartition", "cpx"))]),
        PCI[2:],
        set(),
    ),
    "inference-spx-class": ("inference", exactly(SPX_CLASS), PCI[:2], {"spx-nps1"}),
    "inference-chart-class-dpx": (
        "inference",
        exactly(DRIVER, selectors=[selector(attribute("computePartition", "dpx"))]),
        PCI[:2],
        set(),  # dpx-nps2 only: another memory mode than the pinned one: never allocated
    ),
    "inference-reserved-class-cpx": (
        "inference",
        exactly(RESERVED_CLASS, selectors=[selector(attribute("computePartition", "cpx"))]),
        PCI[:2],
        {"cpx-nps1"},
    ),
    "inference-reserved-gpu-class": ("inference", exactly(RESERVED_GPU_CLASS), PCI[:2], {"spx-nps1"}),
}


@pytest.mark.parametrize("case", list(CLAIMS))
def test_claims_keep_what_their_class_admits_on_their_side(ap: Split, applied: Webhook, case: str) -> None:
    role, request, side, layouts = CLAIMS[case]
    ns = ap.training if role == "training" else ap.inference
    name = case.replace("_", "-")
    if not layouts:
        ap.kube.create(new_claim(name, ns, request))
        ap.kube.create(new_claim_pod(name, ns, claim_name=name))
        never_scheduled(ap, ns, name)
        return
    _, pci, layout = claim_layout(ap, ns, name, request)
    assert pci in side and layout in layouts, (case, pci, layout)


def test_a_training_claim_never_gets_another_memory_mode(ap: Split, applied: Webhook) -> None:
    """The node-wide memory mode: training asks for nps4 (which would taint inference's nps1 layouts)."""
    request = exactly(DRIVER, selectors=[selector(attribute("memoryPartition", "nps4"))])
    ap.kube.create(new_claim("nps4", ap.training, request))
    ap.kube.create(new_claim_pod("nps4", ap.training, claim_name="nps4"))
    never_scheduled(ap, ap.training, "nps4")


def test_status_counts_gpus_not_virtual_devices(ap: Split, applied: Webhook) -> None:
    ((node, pci, layout),) = layouts_of(ap, ap.training, gpu_pods(ap, ap.training, 1))
    status = yaml.safe_load(apool(ap, "status", "--output", "json"))
    nodes = {n["name"]: n for n in status["devices"]["nodes"]} if "devices" in status else None
    assert nodes is not None, status
    for name in NODES:
        assert (nodes[name]["gpus"], nodes[name]["reserved"], nodes[name]["shared"]) == (4, 2, 2), nodes[name]
        assert len(nodes[name]["devices"]) == 16
    gpus = {g["pciBusId"]: g for g in nodes[node]["gpuList"]}
    assert gpus[pci]["allocated"] == [f"gpu-{PCI.index(pci)}-{layout}"], gpus
    text = apool(ap, "status")
    assert f"gpu-{PCI.index(pci)}-{layout}" in text and "(4 devices, none allocated)" in text, text
    # the audit: the same GPUs, the layout the allocated one is in and who holds it
    result = cli("audit", "-o", "json", "--policy", str(POLICY_FILE), kubeconfig=ap.plane.admin_kubeconfig)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    devices = json.loads(result.stdout)["capacity"]["devices"]
    assert (devices["reservedDevices"], devices["sharedDevices"]) == (4, 4), devices
    audited = {n["name"]: {g["pciBusId"]: g for g in n["gpuList"]} for n in devices["nodes"]}
    assert [len(audited[name]) for name in NODES] == [4, 4], audited
    held = audited[node][pci]
    assert (held["state"], held["devices"], held["allocated"]) == ("shared", 4, [f"gpu-{PCI.index(pci)}-{layout}"])
    assert [p["name"] for p in held["pods"]] == ["p0"], held
    table = cli("audit", "--policy", str(POLICY_FILE), kubeconfig=ap.plane.admin_kubeconfig).stdout
    assert f"gpu-{PCI.index(pci)}-{layout} (of 4 devices)" in table, table


def test_an_inference_amd_gpu_pod_gets_a_whole_reserved_gpu(ap: Split, applied: Webhook) -> None:
    """The webhook rewrites it to the implicit name of amd.com/gpu's reserved-side class: a whole reserved GPU
    (what gpu.amd.com-spx promises), never a partition; a fifth waits."""
    names = gpu_pods(ap, ap.inference, 4)
    pod = ap.kube.get("Pod", names[0], ap.inference)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {
        f"deviceclass.resource.kubernetes.io/{RESERVED_GPU_CLASS}": "1"
    }, pod["spec"]["containers"][0]["resources"]
    got = layouts_of(ap, ap.inference, names)
    assert all(pci in PCI[:2] and layout == "spx-nps1" for _, pci, layout in got), got
    assert len({(node, pci) for node, pci, _ in got}) == 4, got
    ap.kube.create(new_pod("i4", ap.inference, {"amd.com/gpu": "1"}))
    never_scheduled(ap, ap.inference, "i4")


@pytest.mark.parametrize(("role", "own"), [("training", SHARED_GPU_CLASS), ("inference", RESERVED_GPU_CLASS)])
def test_the_implicit_name_of_amds_spx_class_gets_a_whole_gpu_of_its_side(
    ap: Split, applied: Webhook, role: str, own: str
) -> None:
    """deviceclass.resource.kubernetes.io/gpu.amd.com-spx: the webhook rewrites it to the side's class of
    amd.com/gpu (whose selectors are spx's AND the side's), not to the side's class of every layout."""
    ns = ap.training if role == "training" else ap.inference
    ap.kube.create(new_pod("spx", ns, {f"deviceclass.resource.kubernetes.io/{SPX_CLASS}": "1"}))
    pod = ap.kube.get("Pod", "spx", ns)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {f"deviceclass.resource.kubernetes.io/{own}": "1"}
    ((_, pci, layout),) = layouts_of(ap, ns, ["spx"])
    assert layout == "spx-nps1" and pci in (PCI[2:] if role == "training" else PCI[:2]), (pci, layout)


def test_resize_then_release(ap: Split, applied: Webhook) -> None:
    out = apool(ap, "apply", "--devices-per-node", "1")
    assert "After apply: 1 device per node, PCI bus IDs 0000:05:00.0 (" in out, out
    names = gpu_pods(ap, ap.training, 6, "r")
    got = layouts_of(ap, ap.training, names)
    assert all(layout == "spx-nps1" and pci in PCI[1:] for _, pci, layout in got), got
    delete_pods(ap)
    delete_claims(ap)
    wait_until(lambda: not ap.kube.list("ResourceClaim", ap.training), timeout=60, what="claims deleted")
    out = apool(ap, "release", "--devices", "--all")
    assert "After release: released" in out, out
    # amd.com/gpu admits again exactly what AMD's gpu.amd.com-spx admitted: every whole GPU, nothing else
    for name in (RESERVED_GPU_CLASS, SHARED_GPU_CLASS):
        assert expressions_of(ap.kube.get("DeviceClass", name)) == [f"device.driver == '{DRIVER}'", SPX_SELECTOR]
    assert ap.kube.get("DeviceClass", SHARED_GPU_CLASS)["spec"]["extendedResourceName"] == "amd.com/gpu"
    assert expressions_of(ap.kube.get("DeviceClass", SHARED_CLASS)) == [f"device.driver == '{DRIVER}'"]
    got = layouts_of(ap, ap.training, gpu_pods(ap, ap.training, 8, "x"))
    assert all(layout == "spx-nps1" for _, _, layout in got), got
    assert len({(node, pci) for node, pci, _ in got}) == 8, got
