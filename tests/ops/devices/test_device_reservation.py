"""The pure half of device-level reservation: the devices the driver publishes, the split of every node,
the DeviceClasses and who maps ``amd.com/gpu``, who holds which device, and the plan.

The commands themselves run against the fake Kubernetes API in tests/ops/pool/test_pool.py.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cluster_objects import (
    autopartition_slices,
    chart_class,
    device_class,
    gpu_device,
    held_claim,
    node_gpus,
    node_slice,
)

from webhook.cluster import slices as slice_reader
from webhook.core.policy import default_policy, parse_policy
from webhook.deploy import device_classes
from webhook.deploy.device_classes import RELEASED_RESERVATION, DeviceReservation
from webhook.ops import capacity
from webhook.ops.devices import ownership as device_ownership
from webhook.ops.devices import plan as device_plan
from webhook.ops.devices import split as device_split
from webhook.ops.devices import status as device_status
from webhook.ops.reservation import PoolNode, PoolPod, Reservation, SelectionError

FIXTURE = yaml.safe_load((Path(__file__).parents[2] / "fixtures" / "pool" / "device-slices.yaml").read_text())
POLICY = default_policy()
RES = Reservation.from_policy(POLICY)
OURS = {"app.kubernetes.io/managed-by": "rocm-isolation-webhook"}
OUR_TAINT = {"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "NoSchedule"}


def published(*slices: dict[str, Any]) -> dict[str, tuple[slice_reader.Device, ...]]:
    return slice_reader.published_devices(slices, "gpu.amd.com")


def two_nodes() -> dict[str, tuple[slice_reader.Device, ...]]:
    """mi300-a's GPUs sit in slots 19, 3b, 4c, 5d; mi300-b's in 4c, 8e, 9a, c1."""
    return published(
        node_gpus("mi300-a", "0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0"),
        node_gpus("mi300-b", "0000:4c:00.0", "0000:8e:00.0", "0000:9a:00.0", "0000:c1:00.0"),
    )


def pool_node(name: str, *, labels: dict[str, str] | None = None, taints: tuple[Any, ...] = ()) -> PoolNode:
    return PoolNode(name, labels or {}, taints, "1", 0)


def plan_for(
    found: dict[str, tuple[slice_reader.Device, ...]],
    n: int,
    classes: list[dict[str, Any]] | None = None,
    held: list[device_plan.Hold] | None = None,
) -> device_plan.DevicePlan:
    after, wanted = device_split.split(found, n)
    return device_plan.build_device_plan(
        POLICY, found, after, wanted, device_ownership.class_infos(classes or []), held or []
    )


# --- the devices the driver publishes -----------------------------------------------------------------


def test_each_node_publishes_its_newest_generation_in_pci_order() -> None:
    found = slice_reader.published_devices(FIXTURE["slices"], "gpu.amd.com")
    assert {node: [[d.name, d.pci_bus_id] for d in devices] for node, devices in found.items()} == FIXTURE["expected"]
    assert {d.pool for d in found["mi300-a"]} == {"mi300-a"}


def test_a_list_that_starts_over_forgets_what_it_read() -> None:
    devices = slice_reader.PublishedDevices(frozenset({"gpu.amd.com"}))
    devices.add(node_gpus("gone", "0000:19:00.0"))
    devices.clear()
    devices.add(node_gpus("kept", "0000:19:00.0"))
    assert list(devices.per_node()) == ["kept"]


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        (["0000:c1:00.0", "0000:9a:00.0", "0000:1b:00.0"], ("0000:1b:00.0", "0000:9a:00.0", "0000:c1:00.0")),
        # domain first, then bus, device, function, as numbers
        (
            ["0001:01:00.0", "0000:ff:00.0", "0000:1b:00.1", "0000:1b:00.0"],
            ("0000:1b:00.0", "0000:1b:00.1", "0000:ff:00.0", "0001:01:00.0"),
        ),
        # an ID that does not parse sorts last
        (["weird", "0000:03:00.0"], ("0000:03:00.0", "weird")),
    ],
)
def test_gpus_are_counted_by_pci_bus_id_lowest_first(ids: list[str], expected: tuple[str, ...]) -> None:
    devices = [slice_reader.Device("n", "n", f"d{i}", pci) for i, pci in enumerate(ids)]
    assert slice_reader.gpu_ids(devices) == expected


# --- the split ------------------------------------------------------------------------------------------


def test_each_node_wants_its_lowest_pci_bus_ids_and_the_classes_select_the_union() -> None:
    after, wanted = device_split.split(two_nodes(), 2)
    assert wanted == {"mi300-a": ("0000:19:00.0", "0000:3b:00.0"), "mi300-b": ("0000:4c:00.0", "0000:8e:00.0")}
    assert after == DeviceReservation(2, ("0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:8e:00.0"))


def test_cel_cannot_see_the_node_and_the_plan_says_what_that_does() -> None:
    plan = plan_for(two_nodes(), 2)
    counts = {n.node: (n.gpus, n.reserved_after, n.shared_after) for n in plan.nodes}
    # mi300-b reserves slot 4c, which is mi300-a's third GPU: mi300-a gets three reserved GPUs
    assert counts == {"mi300-a": (4, 3, 1), "mi300-b": (4, 2, 2)}
    [note] = [n for n in plan.notes if n.startswith("CEL")]
    assert note == (
        "CEL cannot see the node: mi300-a gets 3 reserved GPUs, not 2: the classes select the same PCI bus IDs on "
        "every node, and 0000:4c:00.0 (gpu-7-135, reserved on mi300-b) is in the reserved set"
    )
    lines = device_plan.plan_lines(plan, POLICY)
    assert ["mi300-a", "4", "3", "1", "-"] in [line.split() for line in lines]
    assert any(line.split() == ["mi300-a", "gpu-7-135", "0000:4c:00.0", "unreserved", "reserved"] for line in lines)


@pytest.mark.parametrize(
    ("slots", "n", "reserved", "note"),
    [
        # fewer GPUs than asked: all of them
        (["0000:19:00.0"], 2, 1, "small has 1 GPU with a PCI bus ID, fewer than 2: all of them are reserved"),
        # exactly as many: nothing stays shared
        (["0000:19:00.0", "0000:3b:00.0"], 2, 2, "small keeps no shared GPU: other classes get none of its devices"),
        # more: no note about it
        (["0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0"], 2, 2, None),
    ],
)
def test_a_node_with_few_gpus(slots: list[str], n: int, reserved: int, note: str | None) -> None:
    plan = plan_for(published(node_gpus("small", *slots)), n)
    assert plan.nodes[0].reserved_after == reserved
    about = [text for text in plan.notes if text.startswith("small")]
    assert about == ([note] if note else [])


def test_a_device_without_a_pci_bus_id_is_never_reserved_and_the_plan_says_so() -> None:
    found = published(node_slice("mi210-x", gpu_device("gpu-1"), gpu_device("gpu-0", "0000:03:00.0")))
    plan = plan_for(found, 2)
    assert plan.after.pci_bus_ids == ("0000:03:00.0",)
    assert [capacity.device_state(d, plan.after) for d in plan.nodes[0].devices] == ["reserved", "shared"]
    assert (
        "mi210-x: gpu-1 publishes no resource.kubernetes.io/pciBusID: never reserved (the classes select PCI bus "
        "IDs), always shared"
    ) in plan.notes


def test_partitions_count_as_their_gpu() -> None:
    found = slice_reader.published_devices(FIXTURE["slices"], "gpu.amd.com")
    plan = plan_for({"part": found["part"]}, 1)
    assert plan.after.pci_bus_ids == ("0000:19:00.0",)
    node = plan.nodes[0]
    assert (node.gpus, node.reserved_after, node.shared_after) == (2, 1, 1)
    assert [capacity.device_state(d, plan.after) for d in node.devices] == ["reserved", "reserved", "shared"]


# --- which nodes ----------------------------------------------------------------------------------------


NODES = [
    pool_node("mi300-a", labels={"rack": "r1"}),
    pool_node("mi300-b", labels={"rack": "r2"}),
    pool_node("plugin-1", labels={"rack": "r1"}),
    pool_node("cpu-1", labels={"rack": "r1"}),
]
PLUGIN = {"plugin-1": 8, "mi300-a": 0, "mi300-b": 0, "cpu-1": 0}


def choose(nodes: list[PoolNode] = NODES, **kwargs: Any) -> tuple[str, ...]:
    return device_split.choose_device_nodes(nodes, two_nodes(), PLUGIN, RES, "gpu.amd.com", **kwargs)


def test_by_default_every_node_of_the_driver_is_split_and_device_plugin_nodes_are_left_alone() -> None:
    assert choose() == ("mi300-a", "mi300-b")
    assert choose(names=["mi300-b", "mi300-a"]) == ("mi300-a", "mi300-b")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"names": ["mi300-zz"]}, "node not found: mi300-zz"),
        ({"selector": {"rack": "r9"}}, "no node with GPUs matches --selector rack=r9"),
        (
            {"names": ["mi300-a", "plugin-1", "mi300-b"]},
            "node plugin-1 serves GPUs through the device plugin (amd.com/* allocatable) and publishes no gpu.amd.com "
            "devices: device-level reservation needs AMD's DRA driver, because the device plugin cannot choose "
            "devices per pod (kubelet's GetPreferredAllocation carries no pod). Move the node to the DRA driver "
            '(docs/operations.md, "Device-level reservation"), or reserve it whole (pool apply --nodes NAME)',
        ),
        ({"names": ["mi300-a", "mi300-b", "cpu-1"]}, "cpu-1: no gpu.amd.com devices in its ResourceSlices"),
    ],
)
def test_nodes_that_cannot_be_split_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SelectionError) as err:
        choose(**kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [({"names": ["mi300-a"]}, "--nodes mi300-a"), ({"selector": {"rack": "r2"}}, "--selector rack=r2")],
)
def test_some_nodes_of_the_driver_only_is_a_subset_cel_cannot_express(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(device_split.SubsetError) as err:
        choose(**kwargs)
    assert err.value.option == option
    assert set(err.value.every) - set(err.value.chosen) in ({"mi300-b"}, {"mi300-a"})


@pytest.mark.parametrize(
    ("versions", "server", "opted_in", "served"),
    [
        (
            ("v1beta2",),
            (1, 36, 4),
            False,
            "this cluster serves devicetaintrules in resource.k8s.io/v1beta2: if the DRADeviceTaintRules feature gate "
            "is on in kube-apiserver, kube-scheduler and kube-controller-manager (the API cannot show the "
            "scheduler's;",
        ),
        (
            ("v1beta2",),
            (1, 36, 2),
            True,
            "its kube-apiserver is v1.36.2, and the kube-scheduler of v1.36.0 to v1.36.2 panics as soon as a "
            "DeviceTaintRule exists and a ResourceSlice or DeviceClass changes (kubernetes/kubernetes#139651; seen on "
            "v1.36.2): upgrade the control plane to v1.36.3 or later",
        ),
        (("v1beta2",), None, True, "but the kube-apiserver's version could not be read (GET /version)"),
        ((), (1, 36, 4), True, "this cluster serves no devicetaintrules (API discovery of resource.k8s.io)"),
        (None, (1, 36, 4), True, "whether this cluster serves devicetaintrules could not be read"),
    ],
)
def test_the_subset_message_says_why_device_taint_rules_cannot_be_used(
    versions: tuple[str, ...] | None, server: tuple[int, int, int] | None, opted_in: bool, served: str
) -> None:
    why_not = device_split.taint_rules_unusable(versions, server, opted_in=opted_in)
    assert why_not is not None and served in why_not
    err = device_split.SubsetError("--nodes mi300-a", ["mi300-a"], ["mi300-a", "mi300-b"], "gpu.amd.com")
    message = device_split.subset_message(err, why_not)
    assert message.startswith(
        "--nodes mi300-a: device-level reservation splits every node that publishes gpu.amd.com devices, not some: "
        "mi300-b also publishes them. The DeviceClasses select devices with CEL, which sees a device's driver, "
        "attributes and capacity but not its node"
    )
    assert "DeviceTaintRules" in message and "DRADeviceTaintRules feature gate, v1 in 1.37" in message
    assert served in message


@pytest.mark.parametrize(
    ("versions", "server", "opted_in"),
    [(("v1",), (1, 37, 0), False), (("v1", "v1beta2"), None, False), (("v1beta2",), (1, 36, 3), True)],
)
def test_device_taint_rules_are_used_when_v1_is_served_or_v1beta2_is_opted_into_on_a_fixed_scheduler(
    versions: tuple[str, ...], server: tuple[int, int, int] | None, opted_in: bool
) -> None:
    assert device_split.taint_rules_unusable(versions, server, opted_in=opted_in) is None


@pytest.mark.parametrize(
    "node",
    [
        pool_node("mi300-b", labels={"rocm-isolation.io/pool": "inference"}),
        pool_node("mi300-b", taints=(OUR_TAINT,)),
    ],
)
def test_a_node_reserved_whole_is_not_also_split(node: PoolNode) -> None:
    with pytest.raises(SelectionError) as err:
        choose([NODES[0], node])
    assert str(err.value).startswith("mi300-b is reserved whole (label rocm-isolation.io/pool=inference or taint")
    assert str(err.value).endswith("Release it first: pool release --nodes mi300-b")


def test_a_split_node_labelled_with_another_value_is_not_reserved_whole() -> None:
    # another value of the pool key (split nodes may carry one) does not make it a whole reserved node
    assert choose([NODES[0], pool_node("mi300-b", labels={"rocm-isolation.io/pool": "inference-devices"})])


def test_no_node_of_the_driver() -> None:
    with pytest.raises(SelectionError, match=r"no node publishes gpu\.amd\.com devices in its ResourceSlices"):
        device_split.choose_device_nodes([pool_node("cpu-1")], {}, {}, RES, "gpu.amd.com")


# --- the classes and amd.com/gpu ------------------------------------------------------------------------


def ours(name: str, created: str, **kwargs: Any) -> dict[str, Any]:
    return device_class(name, created=created, labels=dict(OURS), **kwargs)


@pytest.mark.parametrize(
    ("classes", "winner"),
    [
        # the newest wins
        (
            [("gpu.amd.com", "2026-11-01T00:00:00Z"), ("rocm-isolation-shared", "2026-12-01T00:00:00Z")],
            "rocm-isolation-shared",
        ),
        ([("gpu.amd.com", "2026-12-02T00:00:00Z"), ("rocm-isolation-shared", "2026-12-01T00:00:00Z")], "gpu.amd.com"),
        # the same second: the lower name
        ([("rocm-isolation-shared", "2026-12-01T00:00:00Z"), ("gpu.amd.com", "2026-12-01T00:00:00Z")], "gpu.amd.com"),
        ([("zzz", "2026-12-01T00:00:00Z"), ("rocm-isolation-shared", "2026-12-01T00:00:00Z")], "rocm-isolation-shared"),
    ],
)
def test_the_scheduler_maps_the_name_to_the_newest_class_then_the_lower_name(
    classes: list[tuple[str, str]], winner: str
) -> None:
    infos = [
        device_ownership.class_info(device_class(n, created=c, extended_resource_name="amd.com/gpu"))
        for n, c in classes
    ]
    found = device_ownership.winner(infos)
    assert found is not None and found.name == winner


@pytest.mark.parametrize(
    ("chart_created", "shared_created", "recreate", "owner_now"),
    [
        (None, "2026-12-01T00:00:00Z", False, "rocm-isolation-shared"),
        ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", False, "rocm-isolation-shared"),
        ("2026-12-02T00:00:00Z", "2026-12-01T00:00:00Z", True, "gpu.amd.com"),
        ("2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z", True, "gpu.amd.com"),  # tie: gpu.amd.com is lower
        ("2026-12-02T00:00:00Z", None, False, "gpu.amd.com"),  # ours is created: then the newest
    ],
)
def test_apply_recreates_the_shared_class_only_when_another_class_wins(
    chart_created: str | None, shared_created: str | None, recreate: bool, owner_now: str
) -> None:
    classes = []
    if chart_created:
        classes.append(device_class("gpu.amd.com", created=chart_created, extended_resource_name="amd.com/gpu"))
    if shared_created:
        classes.append(ours("rocm-isolation-shared", shared_created, extended_resource_name="amd.com/gpu"))
    owner = device_ownership.ownership(POLICY, device_ownership.class_infos(classes))
    assert owner.recreate is recreate
    assert owner.owner_now is not None and owner.owner_now.name == owner_now
    plan = plan_for(two_nodes(), 2, classes)
    assert plan.classes[1].action == ("recreate" if recreate else "create" if shared_created is None else "replace")


def test_the_shared_class_records_the_other_classes_naming_its_extended_resource() -> None:
    chart = device_class("gpu.amd.com", created="2026-11-01T00:00:00Z", extended_resource_name="amd.com/gpu")
    other = device_class("other", created="2026-10-01T00:00:00Z", extended_resource_name="amd.com/gpu")
    reservation = DeviceReservation(2, ("0000:19:00.0", "0000:3b:00.0"))
    owner = device_ownership.ownership(POLICY, device_ownership.class_infos([chart, other]))
    reserved, shared = device_ownership.desired_classes(POLICY, reservation, owner)
    assert reserved == device_classes.reserved_class(POLICY, reservation)
    # the newest other class (AMD's) is the one whose selectors ours keeps (issue 35)
    expected = device_classes.shared_class(
        POLICY, reservation, device_classes.Inherited("gpu.amd.com", ("device.driver == 'gpu.amd.com'",))
    )
    assert expected["metadata"]["annotations"][device_classes.INHERITED_FROM_ANNOTATION] == "gpu.amd.com"
    expected["metadata"]["annotations"][device_ownership.ALSO_NAMED_BY_ANNOTATION] = "gpu.amd.com,other"
    assert shared == expected
    for obj in (reserved, shared):
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_a_class_that_stopped_naming_the_resource_makes_the_shared_class_be_rewritten() -> None:
    """In v1.36 that drops the scheduler's mapping of amd.com/gpu: an update of ours maps it again."""
    reservation = DeviceReservation(2, ("0000:19:00.0",))
    chart = device_class("gpu.amd.com", created="2026-11-01T00:00:00Z", extended_resource_name="amd.com/gpu")
    before = device_ownership.ownership(POLICY, device_ownership.class_infos([chart]))
    _, shared = device_ownership.desired_classes(POLICY, reservation, before)
    stored = copy.deepcopy(shared)
    stored["metadata"].update(resourceVersion="7", uid="u", creationTimestamp="2026-12-01T00:00:00Z")
    reserved = copy.deepcopy(device_classes.reserved_class(POLICY, reservation))
    reserved["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z"
    same = device_ownership.class_infos([chart, stored, reserved])
    status = device_status.device_status(POLICY, {}, same, [])
    assert status.out_of_date == ()
    del chart["spec"]["extendedResourceName"]  # the chart's deviceClass.extendedResourceName: ""
    changed = device_ownership.class_infos([chart, stored, reserved])
    status = device_status.device_status(POLICY, {}, changed, [])
    assert status.out_of_date == (
        "deviceclass/rocm-isolation-shared does not say what the reservation records: pool apply "
        "--devices-per-node 2 rewrites it",
    )
    body = device_ownership.replace_body(
        stored, device_ownership.desired_classes(POLICY, reservation, device_ownership.ownership(POLICY, changed))[1]
    )
    assert body is not None and body["metadata"]["annotations"][device_ownership.ALSO_NAMED_BY_ANNOTATION] == ""


def test_replace_body_changes_only_our_fields_and_keeps_the_read_resource_version() -> None:
    reservation = DeviceReservation(1, ("0000:19:00.0",))
    desired = device_classes.reserved_class(POLICY, reservation)
    current = copy.deepcopy(device_classes.reserved_class(POLICY, RELEASED_RESERVATION))
    current["metadata"].update(
        resourceVersion="41",
        uid="uid-1",
        creationTimestamp="2026-12-01T00:00:00Z",
        managedFields=[{"manager": "rocm-isolation-webhook", "operation": "Update"}],
    )
    current["metadata"]["labels"]["team"] = "platform"
    current["spec"]["config"] = [{"opaque": {"driver": "gpu.amd.com", "parameters": {}}}]
    body = device_ownership.replace_body(current, desired)
    assert body is not None
    assert body["metadata"]["resourceVersion"] == "41" and body["metadata"]["uid"] == "uid-1"
    assert "managedFields" not in body["metadata"]
    assert body["metadata"]["labels"] == {**desired["metadata"]["labels"], "team": "platform"}
    assert body["spec"] == {**desired["spec"], "config": current["spec"]["config"]}
    assert device_ownership.replace_body({**body, "metadata": {**body["metadata"]}}, desired) is None


def test_a_class_of_our_name_that_is_not_ours_is_never_edited() -> None:
    foreign = device_class("rocm-isolation-reserved", created="2026-11-01T00:00:00Z")
    with pytest.raises(SelectionError) as err:
        plan_for(two_nodes(), 2, [foreign])
    assert str(err.value).startswith(
        "deviceclass/rocm-isolation-reserved exists and is not managed by rocm-isolation-webhook (label "
        "app.kubernetes.io/managed-by=rocm-isolation-webhook): pool never edits a class that is not its own"
    )


# --- who holds which device -----------------------------------------------------------------------------


def pod(name: str, class_name: str, namespace: str = "ml") -> PoolPod:
    return PoolPod(namespace, name, "mi300-a", f"ReplicaSet/{name}", 1, class_name, class_name == "inference")


def test_a_pod_holds_the_devices_its_claims_were_allocated_and_claims_of_pods_gone_are_noted() -> None:
    found = two_nodes()
    claims = [
        held_claim("train", "ml", "mi300-a", ["gpu-9-137", "gpu-6-134"], pods=["train"]),
        # one claim shared by two pods: both hold it
        held_claim("shared", "ml", "mi300-a", ["gpu-8-136"], pods=["train", "llm"]),
        # reserved for a pod that is not running (or another pod of that name: uid)
        held_claim("orphan", "ml", "mi300-b", ["gpu-9-137"], pods=["done"]),
    ]
    claims[0]["status"]["reservedFor"].append({"resource": "pods", "name": "llm", "uid": "uid-of-an-older-llm"})
    pods = [pod("train", "training"), pod("llm", "inference")]
    uids = {("ml", "train"): "uid-pod-ml-train", ("ml", "llm"): "uid-pod-ml-llm"}
    # What the capacity model read of each pod's claims (cluster/inventory.Snapshot.claim_results): another
    # driver's device and a device no slice publishes any more are not the driver's devices held here.
    model = capacity.CapacityModel.build([], found, None, [], "gpu.amd.com")

    def on_a(*names: str) -> list[tuple[str, str, str]]:
        return [("gpu.amd.com", "mi300-a", name) for name in names]

    model.add_pod(capacity.Holder("ml", "train", "training"), "mi300-a", 0, on_a("gpu-9-137", "gpu-6-134", "gpu-8-136"))
    other = [("nic.example.com", "mi300-a", "gpu-9-137"), ("gpu.amd.com", "mi300-a", "gpu-0-0")]
    model.add_pod(capacity.Holder("ml", "llm", "inference", True), "mi300-a", 0, [*on_a("gpu-8-136"), *other])
    held = device_plan.holds(model, pods)
    assert [(h.pod.name, [d.name for d in h.devices]) for h in held] == [
        ("llm", ["gpu-8-136"]),
        ("train", ["gpu-9-137", "gpu-8-136", "gpu-6-134"]),
    ]
    assert device_plan.claims_of_pods_gone(claims, "gpu.amd.com", pods, uids) == [
        "resourceclaim/train -n ml is reserved for pod llm, which is not among the running pods read (finished or "
        "deleted meanwhile)",
        "resourceclaim/orphan -n ml is reserved for pod done, which is not among the running pods read (finished "
        "or deleted meanwhile)",
    ]


def test_the_plan_lists_other_classes_on_devices_that_become_reserved_and_inference_on_a_shrink() -> None:
    found = two_nodes()
    reserved_now = DeviceReservation(3, ("0000:19:00.0", "0000:3b:00.0", "0000:5d:00.0"))
    classes = [
        ours("rocm-isolation-reserved", "2026-12-01T00:00:00Z"),
        ours("rocm-isolation-shared", "2026-12-01T00:00:00Z", extended_resource_name="amd.com/gpu"),
    ]
    classes[0].update(device_classes.reserved_class(POLICY, reserved_now))
    classes[0]["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z"
    held = [
        device_plan.Hold(pod("train", "training"), (found["mi300-a"][0],)),  # 19: reserved after
        device_plan.Hold(pod("bench", ""), (found["mi300-a"][1],)),  # 3b: out of the policy's scope
        device_plan.Hold(pod("llm", "inference"), (found["mi300-a"][3],)),  # 5d: reserved now, shared after
        device_plan.Hold(pod("llm-2", "inference"), (found["mi300-a"][0],)),  # 19: stays reserved
        device_plan.Hold(pod("etl", "training"), (found["mi300-b"][3],)),  # c1: shared
    ]
    plan = plan_for(found, 2, classes, held)
    assert plan.before == reserved_now
    assert [h.pod.name for h in plan.evicting] == ["train", "bench"]
    assert [h.pod.name for h in plan.keeping] == ["llm"]
    lines = device_plan.plan_lines(plan, POLICY)
    assert "Now: 3 devices per node, PCI bus IDs 0000:19:00.0, 0000:3b:00.0, 0000:5d:00.0." in lines
    [bench] = [line for line in lines if " bench " in line]
    assert bench.endswith("no: outside the policy's scope (excluded namespace)")
    assert "Inference pods holding devices that stop being reserved (they keep them):" in lines
    doc = device_plan.plan_json(plan)
    assert [p["name"] for p in doc["podsHoldingReserved"]] == ["train", "bench"]
    assert doc["classes"][0]["action"] == "replace" and doc["changes"] is True


def test_a_release_plan_widens_both_classes_and_deletes_nothing() -> None:
    found = two_nodes()
    reserved_now = DeviceReservation(2, ("0000:19:00.0",))
    reserved = device_classes.reserved_class(POLICY, reserved_now)
    reserved["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z"
    shared = ours("rocm-isolation-shared", "2026-12-01T00:00:00Z", extended_resource_name="amd.com/gpu")
    chart = device_class("gpu.amd.com", created="2026-12-05T00:00:00Z", extended_resource_name="amd.com/gpu")
    plan = device_plan.build_device_plan(
        POLICY,
        found,
        RELEASED_RESERVATION,
        {},
        device_ownership.class_infos([reserved, shared, chart]),
        [],
        ensure_owner=False,
    )
    assert [c.action for c in plan.classes] == ["replace", "replace"]
    assert [c.desired["spec"]["selectors"][0]["cel"]["expression"] for c in plan.classes] == [
        "device.driver == 'gpu.amd.com'",
        "device.driver == 'gpu.amd.com'",
    ]
    lines = device_plan.plan_lines(plan, POLICY)
    assert "After release: released (both classes select every device)." in lines
    assert (
        "  deviceclass/rocm-isolation-shared is not the newest; a release deletes nothing: pool apply "
        "--devices-per-node N re-creates it"
    ) in lines


# --- the split nodes' label ---------------------------------------------------------------------------

SPLIT = ("rocm-isolation.io/pool", "inference-devices")


@pytest.mark.parametrize(
    ("labels", "release", "action", "patch"),
    [
        ({}, False, "add", {"rocm-isolation.io/pool": "inference-devices"}),
        ({"rocm-isolation.io/pool": "inference-devices"}, False, "keep", None),
        ({"rocm-isolation.io/pool": "batch"}, False, "replace", {"rocm-isolation.io/pool": "inference-devices"}),
        ({"rocm-isolation.io/pool": "inference-devices"}, True, "remove", {"rocm-isolation.io/pool": None}),
        # a release never removes the whole-node value
        ({"rocm-isolation.io/pool": "inference"}, True, "none", None),
        ({}, True, "none", None),
    ],
)
def test_split_nodes_get_the_label_inference_is_placed_on(
    labels: dict[str, str], release: bool, action: str, patch: dict[str, Any] | None
) -> None:
    node = PoolNode("mi300-a", {"team": "ml", **labels}, (), "42", 0)
    assert device_split.split_label(POLICY) == SPLIT
    assert device_split.label_action(node, SPLIT, release=release) == action
    made = (device_split.unsplit_label_patch if release else device_split.split_label_patch)(node, SPLIT)
    assert made == (None if patch is None else {"metadata": {"labels": patch, "resourceVersion": "42"}})


def test_the_plan_says_which_nodes_get_the_label_and_status_warns_when_one_lacks_it() -> None:
    found = two_nodes()
    nodes = {
        "mi300-a": pool_node("mi300-a", labels={"rocm-isolation.io/pool": "inference-devices"}),
        "mi300-b": pool_node("mi300-b"),
    }
    after, wanted = device_split.split(found, 2)
    plan = device_plan.build_device_plan(POLICY, found, after, wanted, {}, [], nodes=nodes)
    assert [(n.node, n.label) for n in plan.nodes] == [("mi300-a", "keep"), ("mi300-b", "add")]
    assert (
        "Split nodes are labelled rocm-isolation.io/pool=inference-devices" in device_plan.plan_lines(plan, POLICY)[3]
    )
    classes = device_ownership.class_infos(c.desired for c in plan.classes)
    status = device_status.device_status(POLICY, found, classes, [], nodes)
    assert status.out_of_date == (
        "node/mi300-b lacks the label rocm-isolation.io/pool=inference-devices: inference is not placed there; "
        "pool apply --devices-per-node 2 labels it",
    )


def test_a_split_node_is_not_a_whole_reserved_one() -> None:
    split = pool_node("a", labels={"rocm-isolation.io/pool": "inference-devices"})
    assert device_split.split_labelled(split, RES, "inference-devices")
    assert not device_split.split_labelled(
        pool_node("b", labels={"rocm-isolation.io/pool": "inference"}), RES, "inference-devices"
    )
    tainted = pool_node("c", labels={"rocm-isolation.io/pool": "inference-devices"}, taints=(OUR_TAINT,))
    assert not device_split.split_labelled(tainted, RES, "inference-devices")


# --- GPUs, not devices (issue 35) ---------------------------------------------------------------------

COUNTING = yaml.safe_load((Path(__file__).parents[2] / "fixtures" / "pool" / "gpu-counting.yaml").read_text())


@pytest.mark.parametrize("case", COUNTING, ids=[c["case"] for c in COUNTING])
def test_gpus_are_counted_by_pci_bus_id_whatever_the_devices(case: dict[str, Any]) -> None:
    devices = [gpu_device(name, pci, attributes={"type": {"string": kind}}) for name, kind, pci in case["devices"]]
    found = published(node_slice("n", *devices))
    after, _ = device_split.split(found, 1)
    assert after.pci_bus_ids == tuple(case["reserved"])
    plan = device_plan.build_device_plan(POLICY, found, after, {"n": after.pci_bus_ids}, {}, [])
    assert [(n.gpus, n.reserved_after, n.shared_after) for n in plan.nodes] == [(case["gpus"], 1, case["gpus"] - 1)]


def autopartition_status(held: list[tuple[str, str, str]]) -> device_status.DeviceStatus:
    """Node ap: 4 MI300X under AutoPartition (16 virtual devices), 2 reserved; ``held``: (claim, device, pod
    class) allocations."""
    found = published(*autopartition_slices("ap", AP_PCI))
    reservation = DeviceReservation(2, AP_PCI[:2])
    classes = device_ownership.class_infos(device_classes.classes(POLICY, reservation))
    pods = [PoolPod("ml", c, "ap", f"ReplicaSet/{c}", 1, k, k == "inference") for c, _, k in held]
    # What the capacity model reads of each pod's claim (its allocation), as pool status does.
    model = capacity.CapacityModel.build([], found, reservation, ["ap"], "gpu.amd.com")
    for (c, d, _), pod_ in zip(held, pods, strict=True):
        model.add_pod(capacity.Holder("ml", c, pod_.class_name, pod_.inference), "ap", 0, [("gpu.amd.com", "ap", d)])
    return device_status.device_status(POLICY, found, classes, device_plan.holds(model, pods))


AP_PCI = ("0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0")


def test_status_shows_gpus_and_the_layout_each_allocated_one_is_in() -> None:
    status = autopartition_status([("llm", "gpu-0-spx-nps1", "inference"), ("train", "gpu-3-cpx-nps1", "training")])
    (node,) = device_status.status_json(status)["nodes"]
    assert (node["gpus"], node["reserved"], node["shared"]) == (4, 2, 2)
    assert [(g["pciBusId"], g["state"], g["devices"], g["allocated"]) for g in node["gpuList"]] == [
        ("0000:05:00.0", "reserved", 4, ["gpu-0-spx-nps1"]),
        ("0000:26:00.0", "reserved", 4, []),
        ("0000:46:00.0", "shared", 4, []),
        ("0000:65:00.0", "shared", 4, ["gpu-3-cpx-nps1"]),
    ]
    assert node["gpuList"][3]["pods"] == [{"namespace": "ml", "name": "train", "class": "training"}]
    lines = device_status.status_lines(status)
    rows = [line.split() for line in lines if line.startswith("ap ")]
    assert [row[1:4] for row in rows[:4]] == [
        ["gpu-0-spx-nps1", "0000:05:00.0", "reserved"],
        ["(4", "devices,", "none"],
        ["(4", "devices,", "none"],
        ["gpu-3-cpx-nps1", "0000:65:00.0", "shared"],
    ]
    assert rows[4][:3] == ["ap", "2", "2"], lines


def test_the_plan_shows_gpus_not_their_layouts() -> None:
    """pool plan --devices-per-node 2 on an AutoPartition node (16 virtual devices): 4 GPUs, 2 reserved, and one
    row per GPU, whatever the order the driver publishes its layouts in."""
    slices = autopartition_slices("ap", AP_PCI)
    slices[1]["spec"]["devices"].reverse()  # Go map order: arbitrary
    found = published(*slices)
    after, wanted = device_split.split(found, 2)
    assert after.pci_bus_ids == AP_PCI[:2]
    plan = device_plan.build_device_plan(POLICY, found, after, wanted, {}, [])
    assert [(n.gpus, n.reserved_after, n.shared_after) for n in plan.nodes] == [(4, 2, 2)]
    rows = [line.split() for line in device_plan.plan_lines(plan, POLICY) if line.startswith("ap ")]
    assert rows == [
        ["ap", "4", "2", "2", "-"],  # no Node read: no label to judge
        ["ap", "(4", "devices)", "0000:05:00.0", "unreserved", "reserved"],
        ["ap", "(4", "devices)", "0000:26:00.0", "unreserved", "reserved"],
        ["ap", "(4", "devices)", "0000:46:00.0", "unreserved", "shared"],
        ["ap", "(4", "devices)", "0000:65:00.0", "unreserved", "shared"],
    ]


MEMORY_POLICY = (Path(__file__).parents[2] / "fixtures" / "policies" / "device-memory-partition.yaml").read_text()
MEMORY_PIN = (
    "!has(device.attributes['gpu.amd.com'].memoryPartition) || device.attributes['gpu.amd.com'].memoryPartition "
    "== 'nps1'"
)


@pytest.mark.parametrize(("reservation", "pinned"), [(DeviceReservation(2, ("0000:05:00.0",)), True),
                                                     (RELEASED_RESERVATION, False)])  # fmt: skip
def test_a_pinned_memory_mode_is_selected_by_both_classes_while_reserved(
    reservation: DeviceReservation, pinned: bool
) -> None:
    policy = parse_policy(MEMORY_POLICY)
    for obj in device_classes.classes(policy, reservation):
        expressions = [s["cel"]["expression"] for s in obj["spec"]["selectors"]]
        assert (MEMORY_PIN in expressions) is pinned, expressions
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


@pytest.mark.parametrize("value", ["NPS1", "nps 4", "x" * 17])
def test_a_memory_mode_must_be_a_mode_name(value: str) -> None:
    with pytest.raises(Exception, match="memoryPartition"):
        parse_policy(MEMORY_POLICY.replace("memoryPartition: nps1", f"memoryPartition: {value!r}"))


SPX = (
    "device.driver == 'gpu.amd.com' && (!has(device.attributes[\"gpu.amd.com\"].computePartition) || "
    'device.attributes["gpu.amd.com"].computePartition == "spx")'
)


def _expressions(obj: dict[str, Any]) -> list[str]:
    return [s["cel"]["expression"] for s in obj["spec"]["selectors"]]


def _read_back(rendered: list[dict[str, Any]], created: str = "2026-12-01T00:00:00Z") -> list[dict[str, Any]]:
    stored = copy.deepcopy(rendered)
    for obj in stored:
        obj["metadata"]["creationTimestamp"] = created
    return stored


@pytest.mark.parametrize(
    ("reservation", "own"),
    [
        (DeviceReservation(2, ("0000:05:00.0", "0000:26:00.0")), "!(has("),
        (RELEASED_RESERVATION, "device.driver == 'gpu.amd.com'"),
    ],
)
def test_amd_gpu_gets_classes_of_its_own_that_keep_what_amds_spx_class_admitted(
    reservation: DeviceReservation, own: str
) -> None:
    """AMD's chart under AutoPartition: gpu.amd.com (every layout, no extended resource) and gpu.amd.com-spx
    (whole GPUs, amd.com/gpu). amd.com/gpu moves to a class of ours with spx's selector AND the shared side,
    kept once released; the reserved side gets its twin; the reserved and shared classes keep every layout."""
    devices = POLICY.spec.reserved_devices
    chart = device_class("gpu.amd.com", created="2026-11-01T00:00:00Z")
    spx = device_class("gpu.amd.com-spx", SPX, "amd.com/gpu", created="2026-11-01T00:00:00Z")
    owner = device_ownership.ownership(POLICY, device_ownership.class_infos([chart, spx]))
    assert owner.extended and owner.shared_class == devices.shared_extended_class_name
    rendered = device_ownership.desired_classes(POLICY, reservation, owner)
    by_name = {obj["metadata"]["name"]: obj for obj in rendered}
    # written in this order: reserved side first, the owner of amd.com/gpu last
    assert list(by_name) == [
        devices.reserved_class_name,
        devices.reserved_extended_class_name,
        devices.shared_class_name,
        devices.shared_extended_class_name,
    ]
    reserved, reserved_gpu, shared, shared_gpu = rendered
    assert SPX not in _expressions(reserved) and SPX not in _expressions(shared)
    assert "extendedResourceName" not in shared["spec"] and "extendedResourceName" not in reserved_gpu["spec"]
    assert shared_gpu["spec"]["extendedResourceName"] == "amd.com/gpu"
    expressions = _expressions(shared_gpu)
    assert len(expressions) == 2 and own in expressions[0] and expressions[1] == SPX, expressions
    assert _expressions(reserved_gpu) == [*_expressions(reserved), SPX]
    for obj in (reserved_gpu, shared_gpu):
        assert obj["metadata"]["annotations"][device_classes.INHERITED_FROM_ANNOTATION] == "gpu.amd.com-spx"
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    # written and read back, the next apply (or release) changes nothing: the inherited class is read again
    stored = _read_back(rendered)
    again = device_ownership.ownership(POLICY, device_ownership.class_infos([chart, spx, *stored]))
    assert again.extended and not again.recreate and again.owner_now is not None
    assert again.owner_now.name == devices.shared_extended_class_name
    for current, desired in zip(stored, device_ownership.desired_classes(POLICY, reservation, again), strict=True):
        assert device_ownership.replace_body(current, desired) is None, desired["metadata"]["name"]


def test_amd_gpu_moves_from_the_shared_class_to_its_own_when_amds_class_narrows_it() -> None:
    """A reservation applied before AutoPartition (the shared class owns amd.com/gpu with AMD's plain class's
    selector), then AMD's chart moves the name to gpu.amd.com-spx: the next apply writes the shared class
    without the name, then creates the name's own class (the newest: it maps the name)."""
    devices = POLICY.spec.reserved_devices
    reservation = DeviceReservation(2, ("0000:05:00.0", "0000:26:00.0"))
    chart = device_class("gpu.amd.com", created="2026-11-01T00:00:00Z")
    before = device_ownership.ownership(POLICY, device_ownership.class_infos([chart]))
    assert not before.extended and before.shared_class == devices.shared_class_name
    stored = _read_back(device_ownership.desired_classes(POLICY, reservation, before))
    assert [obj["metadata"]["name"] for obj in stored] == [devices.reserved_class_name, devices.shared_class_name]
    spx = device_class("gpu.amd.com-spx", SPX, "amd.com/gpu", created="2026-12-02T00:00:00Z")
    infos = device_ownership.class_infos([chart, spx, *stored])
    owner = device_ownership.ownership(POLICY, infos)
    assert owner.extended and owner.moving_from == (devices.shared_class_name,)
    assert owner.owner_now is not None and owner.owner_now.name == "gpu.amd.com-spx"
    changes = device_ownership.class_changes(device_ownership.desired_classes(POLICY, reservation, owner), infos, owner)
    assert [(c.name, c.action) for c in changes] == [
        (devices.reserved_class_name, "unchanged"),
        (devices.reserved_extended_class_name, "create"),
        (devices.shared_class_name, "replace"),
        (devices.shared_extended_class_name, "create"),
    ]
    assert "extendedResourceName" not in changes[2].desired["spec"]
    # the shared class no longer owns the name: the record of the other classes naming it goes with it, once
    body = device_ownership.replace_body(stored[1], changes[2].desired)
    assert body is not None and "extendedResourceName" not in body["spec"]
    assert device_ownership.ALSO_NAMED_BY_ANNOTATION in stored[1]["metadata"]["annotations"]
    assert device_ownership.ALSO_NAMED_BY_ANNOTATION not in body["metadata"]["annotations"]
    assert device_ownership.replace_body(body, changes[2].desired) is None
    lines = device_ownership.ownership_lines(owner, recreate_planned=False, creating=True)
    assert any("names amd.com/gpu today: apply writes it without the name first" in line for line in lines), lines


def upgraded_classes(spx_created: str) -> list[dict[str, Any]]:
    """A reservation applied before the extended resource had classes of its own (the shared class names
    amd.com/gpu with every layout of the shared GPUs, created 2026-12-01), and AMD's gpu.amd.com-spx."""
    reservation = DeviceReservation(2, ("0000:05:00.0", "0000:26:00.0"))
    chart = device_class("gpu.amd.com", created="2026-11-01T00:00:00Z")
    before = device_ownership.ownership(POLICY, device_ownership.class_infos([chart]))
    stored = _read_back(device_ownership.desired_classes(POLICY, reservation, before))
    return [chart, device_class("gpu.amd.com-spx", SPX, "amd.com/gpu", created=spx_created), *stored]


@pytest.mark.parametrize(
    ("spx_created", "effect"),
    [
        # AMD's class older: the name still maps to our shared class: shared GPUs only, any layout
        (
            "2026-11-01T00:00:00Z",
            "amd.com/gpu maps to deviceclass/rocm-isolation-shared (the newest DeviceClass naming it, created "
            "2026-12-01T00:00:00Z), not to deviceclass/rocm-isolation-shared-gpu: pods asking for amd.com/gpu on DRA "
            "nodes get shared GPUs only (never reserved ones), but in any layout deviceclass/rocm-isolation-shared "
            "selects (a partition too), not only what deviceclass/gpu.amd.com-spx admits",
        ),
        # AMD's class newer (the chart switched after the apply): it admits every whole GPU, reserved ones too
        (
            "2026-12-02T00:00:00Z",
            "amd.com/gpu maps to deviceclass/gpu.amd.com-spx (the newest DeviceClass naming it, created "
            "2026-12-02T00:00:00Z), not to deviceclass/rocm-isolation-shared-gpu: pods asking for amd.com/gpu on "
            "DRA nodes can get GPUs reserved for inference",
        ),
    ],
)
def test_until_the_name_moves_status_says_what_amd_gpu_pods_get(spx_created: str, effect: str) -> None:
    infos = device_ownership.class_infos(upgraded_classes(spx_created))
    owner = device_ownership.ownership(POLICY, infos)
    assert owner.extended and owner.moving_from == ("rocm-isolation-shared",)
    assert device_ownership.mapped_elsewhere(POLICY, owner) == effect
    status = device_status.device_status(POLICY, {}, infos, [])
    again = (
        "pool apply --devices-per-node 2 writes deviceclass/rocm-isolation-shared without the name, then makes "
        "deviceclass/rocm-isolation-shared-gpu the newest class naming it"
    )
    assert f"{effect}; {again}" in status.out_of_date, status.out_of_date


def test_a_shared_class_that_keeps_the_narrowing_selectors_keeps_what_they_admit() -> None:
    classes = upgraded_classes("2026-11-01T00:00:00Z")
    classes[-1]["spec"]["selectors"].append({"cel": {"expression": SPX}})
    owner = device_ownership.ownership(POLICY, device_ownership.class_infos(classes))
    found = device_ownership.mapped_elsewhere(POLICY, owner)
    assert found is not None and found.endswith(
        "get shared GPUs only (never reserved ones), as deviceclass/gpu.amd.com-spx admits them"
    )


def test_amds_plain_class_gives_amd_gpu_no_class_of_its_own() -> None:
    """Whole-GPU drivers: AMD's class selects every device of the driver: the shared class owns the name."""
    owner = device_ownership.ownership(POLICY, device_ownership.class_infos([chart_class()]))
    assert not owner.extended and owner.shared_class == POLICY.spec.reserved_devices.shared_class_name
    rendered = device_ownership.desired_classes(POLICY, DeviceReservation(1, ("0000:05:00.0",)), owner)
    assert len(rendered) == 2 and rendered[1]["spec"]["extendedResourceName"] == "amd.com/gpu"


@pytest.mark.parametrize(
    ("selectors", "narrows"),
    [
        ((), False),
        (("device.driver == 'gpu.amd.com'",), False),
        (('device.driver == "gpu.amd.com"',), False),
        ((SPX,), True),
        (("device.driver == 'gpu.amd.com'", "device.attributes['gpu.amd.com'].type == 'amdgpu'"), True),
    ],
)
def test_a_class_narrows_the_name_when_it_selects_less_than_the_driver(
    selectors: tuple[str, ...], narrows: bool
) -> None:
    inherited = device_classes.Inherited("theirs", selectors)
    assert device_classes.narrows("gpu.amd.com", inherited) is narrows
    assert device_classes.narrows("gpu.amd.com", None) is False
