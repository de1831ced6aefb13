"""The capacity model: per node and side, capacity = allocated + free, each GPU counted once, on its side."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from cluster_objects import autopartition_slices
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import RandomCluster, random_clusters

from webhook.cluster.kubeapi import KubeApi, NotFound
from webhook.cluster.slices import Device, Gpu, gpu_of, published_devices
from webhook.deploy.device_classes import DeviceReservation, reservation_for
from webhook.ops.audit import command
from webhook.ops.capacity import RESERVED, SHARED, SIDES, CapacityModel, Holder, device_state, split_nodes

DRIVER = "gpu.amd.com"


def bus(i: int) -> str:
    return f"0000:{0x10 + i:02x}:00.0"


def gpus_of(node: str, count: int, partitions: int = 1) -> tuple[Device, ...]:
    """``count`` GPUs, each published as ``partitions`` devices sharing its PCI bus ID."""
    return tuple(
        Device(node, node, f"gpu-{i}-p{p}" if partitions > 1 else f"gpu-{i}", bus(i), DRIVER)
        for i in range(count)
        for p in range(partitions)
    )


def result(device: Device) -> tuple[str, str, str]:
    return (DRIVER, device.pool, device.name)


def test_a_split_node_counts_each_gpu_once_on_its_side_whatever_its_partitions() -> None:
    devices = gpus_of("d1", 4, partitions=2)
    reservation = reservation_for([bus(0), bus(1)], 2)
    model = CapacityModel.build([("d1", 0, False)], {"d1": devices}, reservation, ["d1"], DRIVER)
    node = model.nodes["d1"]
    assert (node.side(RESERVED).capacity, node.side(SHARED).capacity) == (2, 2)
    # Both partitions of GPU 0 held by one inference pod: one GPU; a partition of GPU 2 by training.
    model.add_pod(
        Holder("serve", "llm", "inference", inference=True), "d1", 0, [result(devices[0]), result(devices[1])]
    )
    model.add_pod(Holder("ml", "trainer", "training"), "d1", 0, [result(devices[4])])
    assert node.side(RESERVED).allocated_by_class("unclassified") == {"inference": 1}
    assert node.side(SHARED).allocated_by_class("unclassified") == {"training": 1}
    assert (node.side(RESERVED).free, node.side(SHARED).free) == (1, 1)
    assert model.capacity(RESERVED) == 2 and model.capacity(SHARED) == 2


def test_a_claim_two_pods_share_counts_for_the_first() -> None:
    devices = gpus_of("d1", 2)
    model = CapacityModel.build([("d1", 0, False)], {"d1": devices}, reservation_for([bus(0)], 1), ["d1"], DRIVER)
    model.add_pod(Holder("serve", "a", "inference", inference=True), "d1", 0, [result(devices[0])])
    model.add_pod(Holder("ml", "b", "training"), "d1", 0, [result(devices[0])])
    assert model.allocated_by_class(RESERVED, "-") == {"inference": 1}
    assert model.nodes["d1"].side(RESERVED).free == 0


def test_whole_nodes_count_resources_and_claims_on_their_side_and_unknown_nodes_in_the_shared_pool() -> None:
    model = CapacityModel.build([("r1", 8, True), ("s1", 4, False), ("cpu", 0, False)], {}, None, [], DRIVER)
    model.add_pod(Holder("serve", "llm", "inference", inference=True), "r1", 2)
    model.add_pod(Holder("ml", "t", "training"), "s1", 1, [(DRIVER, "s1", "gpu-0"), (DRIVER, "s1", "gpu-1")])
    model.add_pod(Holder("ml", "gone", "training"), "deleted-node", 1)
    assert [n.name for n in model.pool_nodes(RESERVED)] == ["r1"]
    assert [n.name for n in model.pool_nodes(SHARED)] == ["s1"]  # no GPUs: not in the pool
    assert model.allocated_by_class(RESERVED, "-") == {"inference": 2}
    assert model.allocated_by_class(SHARED, "-") == {"training": 4}
    assert model.free_without("r1", RESERVED, []) == 6


def test_a_dra_extended_resource_counts_the_gpus_of_the_claim_the_scheduler_made_not_the_request() -> None:
    devices = gpus_of("d1", 4)
    partitions = gpus_of("w1", 1, partitions=2)
    model = CapacityModel.build(
        [("d1", 0, False), ("w1", 1, False)],
        {"d1": devices, "w1": partitions},
        reservation_for([bus(0)], 1),
        ["d1"],
        DRIVER,
    )
    # amd.com/gpu: 1 served by DRA on the split node: the scheduler's claim is the GPU, counted on its side.
    model.add_pod(Holder("ml", "a", "training"), "d1", 1, extended_results=[result(devices[3])])
    # amd.com/gpu: 2 served by two partitions of one GPU (AMD's class before issue 35): one GPU, not two.
    model.add_pod(Holder("ml", "b", "training"), "w1", 2, extended_results=[result(d) for d in partitions])
    assert model.nodes["d1"].side(SHARED).allocated == 1
    assert model.nodes["w1"].side(SHARED).allocated == 1 and model.nodes["w1"].side(SHARED).free == 0
    # Without a claim yet (device plugin, or not allocated): the request's number.
    model.add_pod(Holder("ml", "c", "training"), "w1", 2)
    assert model.nodes["w1"].side(SHARED).allocated == 3


def test_fits_answers_would_it_fit_if_these_pods_left() -> None:
    model = CapacityModel.build([("r1", 2, True)], {}, None, [], DRIVER)
    model.add_pod(Holder("ml", "borrower", "training", borrower=True), "r1", 2)
    assert not model.fits("r1", RESERVED, 1)
    assert model.fits("r1", RESERVED, 2, leaving=[("ml", "borrower")])
    assert not model.fits("nowhere", RESERVED, 1)


def test_clear_pods_forgets_what_was_counted_but_not_the_capacity() -> None:
    devices = gpus_of("d1", 2)
    model = CapacityModel.build([], {"d1": devices}, reservation_for([bus(0)], 1), ["d1"], DRIVER)
    model.add_pod(Holder("serve", "a", "inference", inference=True), "d1", 0, [result(devices[0])])
    model.clear_pods()
    model.add_pod(Holder("serve", "a", "inference", inference=True), "d1", 0, [result(devices[0])])
    assert model.allocated(RESERVED) == 1 and model.capacity(RESERVED) == 1


# -- the property: random clusters ------------------------------------------------------------------


@dataclass(frozen=True)
class RandomPod:
    holder: Holder
    node: str
    resource_gpus: int
    results: tuple[tuple[str, str, str], ...]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[CapacityModel, list[RandomPod], dict[str, tuple[Device, ...]]]:
    """Whole reserved, whole shared and split nodes; pods holding GPUs by kubelet's count or by claims
    on devices of their own node (partitions, devices without a PCI bus ID), never more than a node has."""
    count = draw(st.integers(1, 6))
    whole: list[tuple[str, int, bool]] = []
    published: dict[str, tuple[Device, ...]] = {}
    split: list[str] = []
    for n in range(count):
        name = f"n{n}"
        kind = draw(st.sampled_from(["reserved", "shared", "split"]))
        if kind == "split":
            gpus = draw(st.integers(1, 8))
            devices = list(gpus_of(name, gpus, draw(st.integers(1, 3))))
            devices += [Device(name, name, f"bare-{i}", "", DRIVER) for i in range(draw(st.integers(0, 2)))]
            published[name] = tuple(devices)
            split.append(name)
            whole.append((name, 0, False))
        else:
            whole.append((name, draw(st.integers(0, 8)), kind == "reserved"))
    reservation = reservation_for([bus(i) for i in range(draw(st.integers(1, 4)))], 2)
    model = CapacityModel.build(whole, published, reservation, split, DRIVER)
    pods: list[RandomPod] = []
    room = {name: gpus for name, gpus, _ in whole}
    for p in range(draw(st.integers(0, 12))):
        name, _, _ = draw(st.sampled_from(whole))
        holder = Holder("ns", f"p{p}", draw(st.sampled_from(["inference", "training", ""])))
        if name in published:
            chosen = draw(st.lists(st.sampled_from(published[name]), max_size=4, unique=True))
            pods.append(RandomPod(holder, name, 0, tuple(result(d) for d in chosen)))
        else:
            gpus = draw(st.integers(0, room[name]))
            room[name] -= gpus
            pods.append(RandomPod(holder, name, gpus, ()))
    return model, pods, published


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_per_node_and_side_capacity_is_allocated_plus_free_and_each_gpu_counts_once(
    cluster: tuple[CapacityModel, list[RandomPod], dict[str, tuple[Device, ...]]],
) -> None:
    model, pods, published = cluster
    for pod in pods:
        model.add_pod(pod.holder, pod.node, pod.resource_gpus, pod.results)
    reservation: DeviceReservation | None = model.reservation
    # Brute force: the distinct GPUs held on each side of each split node; kubelet's counts elsewhere.
    held: dict[tuple[str, str], set[Gpu]] = {}
    by_key = {(d.pool, d.name): d for devices in published.values() for d in devices}
    for pod in pods:
        for _, pool, name in pod.results:
            device = by_key[(pool, name)]
            held.setdefault((pod.node, device_state(device, reservation)), set()).add(gpu_of(device))
    assert set(split_nodes(published, reservation)) == set(published)
    for name, node in model.nodes.items():
        for side_name in SIDES:
            side = node.sides.get(side_name)
            if side is None:
                continue
            assert side.capacity == side.allocated + side.free
            assert side.free >= 0, (name, side_name)
            if node.split:
                assert side.allocated == len(held.get((name, side_name), set()))
            else:
                assert side.allocated == sum(p.resource_gpus for p in pods if p.node == name)
    for side_name in SIDES:
        assert model.capacity(side_name) == sum(n.side(side_name).capacity for n in model.pool_nodes(side_name))
        assert model.allocated(side_name) == sum(model.allocated_by_class(side_name, "-").values())


# -- the property on random clusters, through the audit's own reading --------------------------------


class ClusterApi:
    """A ``KubeApi`` answering lists from a RandomCluster's objects (in memory: hypothesis runs hundreds
    of clusters; the HTTP paging of the real client is tested in tests/cluster/test_kubeapi.py)."""

    def __init__(self, cluster: RandomCluster) -> None:
        self.lists = {
            "/api/v1/nodes": cluster.nodes,
            "/api/v1/namespaces": cluster.namespaces,
            "/api/v1/pods": cluster.pods,
            "/apis/resource.k8s.io/v1/resourceclaims": cluster.claims,
            "/apis/resource.k8s.io/v1/resourceclaimtemplates": [],
            "/apis/resource.k8s.io/v1/deviceclasses": cluster.device_classes,
            "/apis/resource.k8s.io/v1/resourceslices": cluster.slices,
        }

    def list(self, path: str, **_: object) -> Iterator[dict[str, object]]:
        yield from self.lists[path]

    def get(self, path: str, **_: object) -> dict[str, object]:
        raise NotFound("not found", status=404, method="GET", path=path)

    def serving_versions(self, group: str, versions: object, resource: str) -> tuple[str, ...]:
        return ()


def model_of(cluster: RandomCluster) -> CapacityModel:
    """The audit's capacity model of the cluster: run_audit's reading and pod stream, its model kept."""
    kept: list[CapacityModel] = []
    original = command.capacity_model

    def keep(*args: object) -> CapacityModel:
        kept.append(original(*args))  # type: ignore[arg-type]
        return kept[-1]

    command.capacity_model = keep  # type: ignore[assignment]
    try:
        command.run_audit(cast(KubeApi, ClusterApi(cluster)), cluster.policy)
    finally:
        command.capacity_model = original  # type: ignore[assignment]
    return kept[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_clusters())
def test_random_clusters_read_as_the_audit_reads_them_add_up_per_node_and_side(cluster: RandomCluster) -> None:
    model = model_of(cluster)
    for name, node in model.nodes.items():
        for side_name, side in node.sides.items():
            assert side.capacity == side.allocated + side.free, (name, side_name)
            # A device is allocated at most once in these clusters: nothing is over-allocated.
            assert side.free >= 0, (name, side_name, side)
    for side_name in SIDES:
        assert model.allocated(side_name) == sum(g for _, g in model.holders(side_name))


def test_an_autopartition_node_has_its_gpus_not_its_layouts() -> None:
    """AMD's AutoPartition (issue 35): 4 GPUs x 4 layouts = 16 devices in two slices, 4 GPUs, 2 reserved; a
    layout held counts its GPU once, on the GPU's side."""
    ids = [bus(i) for i in range(4)]
    devices = published_devices(autopartition_slices("ap", ids), DRIVER)["ap"]
    assert len(devices) == 16
    model = CapacityModel.build([("ap", 0, False)], {"ap": devices}, reservation_for(ids[:2], 2), ["ap"], DRIVER)
    node = model.nodes["ap"]
    assert (node.side(RESERVED).capacity, node.side(SHARED).capacity) == (2, 2)
    by_name = {d.name: d for d in devices}
    model.add_pod(Holder("serve", "llm", "inference", inference=True), "ap", 0, [result(by_name["gpu-0-cpx-nps1"])])
    model.add_pod(Holder("ml", "a", "training"), "ap", 0, [result(by_name["gpu-3-cpx-nps1"])])
    model.add_pod(Holder("ml", "b", "training"), "ap", 0, [result(by_name["gpu-3-cpx-nps1"])])
    assert (node.side(RESERVED).free, node.side(SHARED).free) == (1, 1)
    # The GPUs as status and audit show them: 4 rows, the layout each held one is in, who holds it.
    views = model.gpu_views("ap")
    assert [(v.pci_bus_id, v.state, len(v.devices), v.text()) for v in views] == [
        (ids[0], RESERVED, 4, "gpu-0-cpx-nps1"),
        (ids[1], RESERVED, 4, "(4 devices, none allocated)"),
        (ids[2], SHARED, 4, "(4 devices, none allocated)"),
        (ids[3], SHARED, 4, "gpu-3-cpx-nps1"),
    ]
    assert model.holding()[("ap", "gpu-3-cpx-nps1")] == [("ml", "a"), ("ml", "b")]
    assert model.gpu_views("not-published") == []


def test_a_whole_gpu_view_is_its_device() -> None:
    devices = gpus_of("w", 2)
    model = CapacityModel.build([("w", 0, False)], {"w": devices}, reservation_for([bus(0)], 1), ["w"], DRIVER)
    views = model.gpu_views("w")
    assert [(v.layouts, v.text(), v.allocated) for v in views] == [(False, "gpu-0", ()), (False, "gpu-1", ())]
