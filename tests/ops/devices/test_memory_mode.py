"""The node-wide memory mode of AMD's AutoPartition layouts and the device reservation (issue 42): which mode
``pool`` pins or why it refuses (webhook/ops/devices/memory_mode.py), what the reserved class records, what ``plan``
and ``status`` say; ``pool plan|apply`` against the fake API. The real control plane:
tests/e2e/test_e2e_autopartition.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_objects import (
    autopartition_slices,
    claim_pod,
    device_class,
    gpu_device,
    held_claim,
    namespace,
    node,
    node_slice,
)
from fake_cluster import FakeCluster

from webhook import cli
from webhook.cluster import slices as slice_reader
from webhook.core.policy import Policy, default_policy, parse_policy
from webhook.deploy import device_classes
from webhook.deploy.device_classes import RELEASED_RESERVATION, DeviceReservation
from webhook.ops import capacity
from webhook.ops.devices import memory_mode
from webhook.ops.devices import ownership as device_ownership
from webhook.ops.devices import plan as device_plan
from webhook.ops.devices import split as device_split
from webhook.ops.devices import status as device_status
from webhook.ops.pool import write

POLICY = default_policy()
DEVICES = POLICY.spec.reserved_devices
AP_PCI = ("0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0")
SPX = (
    "device.driver == 'gpu.amd.com' && (!has(device.attributes[\"gpu.amd.com\"].computePartition) || "
    'device.attributes["gpu.amd.com"].computePartition == "spx")'
)


def pinned_policy(mode: str) -> Policy:
    document = POLICY.document.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["reservedDevices"] = {"memoryPartition": mode}
    return parse_policy(yaml.safe_dump(document))


def ap_nodes(*names: str, layouts: Any = None) -> dict[str, tuple[slice_reader.Device, ...]]:
    slices = [
        s for name in names for s in autopartition_slices(name, AP_PCI, **({"layouts": layouts} if layouts else {}))
    ]
    return slice_reader.published_devices(slices, "gpu.amd.com")


def devices_named(found: dict[str, tuple[slice_reader.Device, ...]], node_name: str, *names: str) -> list[Any]:
    by_name = {d.name: d for d in found[node_name]}
    return [by_name[name] for name in names]


# --- what a device publishes ---------------------------------------------------------------------------


def test_a_layout_carries_its_compute_and_memory_mode_qualified_or_not() -> None:
    found = ap_nodes("ap")
    layouts = {d.name: (d.compute_partition, d.memory_partition) for d in found["ap"] if d.name.startswith("gpu-0-")}
    assert layouts == {
        "gpu-0-spx-nps1": ("spx", "nps1"),
        "gpu-0-dpx-nps2": ("dpx", "nps2"),
        "gpu-0-cpx-nps1": ("cpx", "nps1"),
        "gpu-0-cpx-nps4": ("cpx", "nps4"),
    }
    # the domain-qualified spelling of the attribute (gpu.amd.com/memoryPartition) reads the same
    qualified = gpu_device("g", "0000:19:00.0", attributes={"gpu.amd.com/memoryPartition": {"string": "nps2"}})
    (device,) = slice_reader.published_devices([node_slice("n", qualified)], "gpu.amd.com")["n"]
    assert (device.compute_partition, device.memory_partition) == ("", "nps2")
    assert memory_mode.mixed_nodes(ap_nodes("ap")) == {"ap": ("nps1", "nps2", "nps4")}


# --- the mode pool pins -------------------------------------------------------------------------------


def test_the_default_pins_the_mode_of_the_whole_gpu_layout() -> None:
    pin = memory_mode.choose(POLICY, ap_nodes("a", "b"), None, [], 2)
    assert (pin.mode, pin.source) == ("nps1", memory_mode.WHOLE_GPU_SOURCE)
    assert "spx-nps1" in pin.why and "gpu.amd.com-spx" in pin.why
    assert set(pin.mixed) == {"a", "b"}


def test_the_policy_pin_wins_over_everything() -> None:
    found = ap_nodes("ap")
    held = devices_named(found, "ap", "gpu-0-cpx-nps1")
    pin = memory_mode.choose(
        pinned_policy("nps4"), found, DeviceReservation(2, AP_PCI[:2], memory_partition="nps1"), held, 2
    )
    assert (pin.mode, pin.source) == ("nps4", memory_mode.POLICY_SOURCE)


def test_the_mode_inference_runs_in_is_kept() -> None:
    """An inference pod holds gpu-0-cpx-nps4: ap is in nps4 until it ends; pinning nps1 would leave inference
    nothing new on that node (every nps1 layout tainted), so nps4 is pinned."""
    found = ap_nodes("ap")
    pin = memory_mode.choose(POLICY, found, None, devices_named(found, "ap", "gpu-0-cpx-nps4"), 2)
    assert (pin.mode, pin.source) == ("nps4", memory_mode.INFERENCE_SOURCE)


def test_a_recorded_pin_stays_on_a_re_apply() -> None:
    found = ap_nodes("ap")
    recorded = DeviceReservation(2, AP_PCI[:2], memory_partition="nps2")
    pin = memory_mode.choose(POLICY, found, recorded, devices_named(found, "ap", "gpu-0-cpx-nps4"), 1)
    assert (pin.mode, pin.source) == ("nps2", memory_mode.RECORDED_SOURCE)
    # a released reservation records nothing: the mode is chosen again
    assert memory_mode.choose(POLICY, found, RELEASED_RESERVATION, [], 1).source == memory_mode.WHOLE_GPU_SOURCE


def test_nothing_to_pin_on_whole_gpus_or_one_mode() -> None:
    whole = slice_reader.published_devices([node_slice("n", gpu_device("g", "0000:19:00.0"))], "gpu.amd.com")
    assert memory_mode.choose(POLICY, whole, None, [], 1) == memory_mode.Pin("", "", "", {})
    one_mode = ap_nodes("ap", layouts=(("spx", "nps1"), ("cpx", "nps1")))
    assert memory_mode.choose(POLICY, one_mode, None, [], 1).mode == ""


@pytest.mark.parametrize(
    ("layouts", "held", "why"),
    [
        # inference holds layouts of two modes (on two GPUs of one node): no one mode is right
        (None, ("gpu-0-cpx-nps1", "gpu-1-cpx-nps4"), "inference's pods hold layouts of several modes (nps1, nps4)"),
        # no whole-GPU layout to take the mode from
        ((("dpx", "nps2"), ("cpx", "nps4")), (), "no device is published as a whole GPU (spx)"),
    ],
)
def test_pool_refuses_when_no_one_mode_can_be_chosen(layouts: Any, held: tuple[str, ...], why: str) -> None:
    found = ap_nodes("ap", layouts=layouts)
    with pytest.raises(memory_mode.PinError) as err:
        memory_mode.choose(POLICY, found, None, devices_named(found, "ap", *held), 2)
    message = str(err.value)
    assert why in message
    assert "Set reservedDevices.memoryPartition in the policy" in message
    assert message.endswith("then run: rocm-isolation-webhook pool apply --devices-per-node 2")


def test_pods_holding_another_mode_are_named() -> None:
    found = ap_nodes("ap")
    holds = [
        ("ml/train", devices_named(found, "ap", "gpu-3-cpx-nps4")),
        ("serve/llm", devices_named(found, "ap", "gpu-0-spx-nps1")),
    ]
    assert [(n, p, [d.name for d in ds]) for n, p, ds in memory_mode.other_mode_holders("nps1", holds)] == [
        ("ap", "ml/train", ["gpu-3-cpx-nps4"])
    ]
    # Nothing pinned (no node publishes several modes, the policy names none): no pod holds "another" mode
    # (pool plan printed a note for every device carrying a memoryPartition, with an empty mode in it).
    assert memory_mode.other_mode_holders("", holds) == []


# --- what the classes record --------------------------------------------------------------------------


def test_the_reserved_class_records_the_pin_and_every_class_selects_it() -> None:
    reservation = DeviceReservation(2, AP_PCI[:2], memory_partition="nps1")
    rendered = device_classes.classes(POLICY, reservation)
    pin = device_classes.memory_selector("gpu.amd.com", "nps1")
    assert all(pin in [s["cel"]["expression"] for s in c["spec"]["selectors"]] for c in rendered)
    reserved = rendered[0]
    assert reserved["metadata"]["annotations"][device_classes.MEMORY_PARTITION_ANNOTATION] == "nps1"
    assert device_classes.reservation_of(reserved) == reservation
    # the lending keeper renders the lendable class from the recorded reservation: pinned too
    lendable = device_classes.lendable_class(POLICY, device_classes.reservation_of(reserved) or reservation, open_=True)
    assert pin in [s["cel"]["expression"] for s in lendable["spec"]["selectors"]]


def test_an_unpinned_class_has_no_annotation_and_the_policy_pin_wins() -> None:
    reservation = DeviceReservation(2, AP_PCI[:2])
    reserved = device_classes.reserved_class(POLICY, reservation)
    assert device_classes.MEMORY_PARTITION_ANNOTATION not in reserved["metadata"]["annotations"]
    assert len(reserved["spec"]["selectors"]) == 1
    recorded = DeviceReservation(2, AP_PCI[:2], memory_partition="nps1")
    assert device_classes.pinned_memory_partition(pinned_policy("nps4"), recorded) == "nps4"
    assert device_classes.pinned_memory_partition(POLICY, recorded) == "nps1"
    assert device_classes.pinned_memory_partition(pinned_policy("nps4"), RELEASED_RESERVATION) == ""


# --- plan and status ------------------------------------------------------------------------------------


def test_the_plan_says_which_mode_is_pinned_and_why() -> None:
    found = ap_nodes("ap")
    after, wanted = device_split.split(found, 2)
    pin = memory_mode.choose(POLICY, found, None, [], 2)
    plan = device_plan.build_device_plan(
        POLICY, found, replace(after, memory_partition=pin.mode), wanted, {}, [], memory=pin
    )
    lines = device_plan.plan_lines(plan, POLICY)
    (line,) = [line for line in lines if line.startswith("Memory mode:")]
    assert line.startswith(
        "Memory mode: nps1, pinned on every node of gpu.amd.com (1 node publishes several: nps1, nps2, nps4)"
    )
    doc = device_plan.plan_json(plan)
    assert doc["memoryPartition"] == {
        "mode": "nps1",
        "source": "whole-gpu-layout",
        "mixedNodes": {"ap": ["nps1", "nps2", "nps4"]},
    }
    assert doc["after"]["memoryPartition"] == "nps1"
    reserved = next(c for c in doc["classes"] if c["name"] == DEVICES.reserved_class_name)
    assert reserved["object"]["metadata"]["annotations"][device_classes.MEMORY_PARTITION_ANNOTATION] == "nps1"


def _status(policy: Policy, reservation: DeviceReservation) -> device_status.DeviceStatus:
    found = ap_nodes("ap")
    # the classes as pool apply writes them (what status compares them with)
    owner = device_ownership.ownership(policy, {})
    classes = device_ownership.class_infos(device_ownership.desired_classes(policy, reservation, owner))
    model = capacity.CapacityModel.build([], found, reservation, ["ap"], "gpu.amd.com")
    return device_status.device_status(policy, found, classes, device_plan.holds(model, []))


def test_status_reports_an_unpinned_reservation_on_nodes_with_several_modes() -> None:
    status = _status(POLICY, DeviceReservation(2, AP_PCI[:2]))
    doc = device_status.status_json(status)
    assert doc["memoryPartition"] == {"pinned": None, "unpinnedNodes": {"ap": ["nps1", "nps2", "nps4"]}}
    (warning,) = [w for w in status.out_of_date if "memory modes" in w]
    assert warning.startswith("node ap publishes gpu.amd.com devices in memory modes nps1, nps2, nps4")
    assert "pool apply --devices-per-node 2 pins one" in warning and "reservedDevices.memoryPartition" in warning
    assert f"warning: {warning}" in device_status.status_lines(status)


@pytest.mark.parametrize(
    ("policy", "reservation"),
    [
        (POLICY, DeviceReservation(2, AP_PCI[:2], memory_partition="nps1")),  # recorded by pool apply
        (pinned_policy("nps1"), DeviceReservation(2, AP_PCI[:2])),  # the policy's (classes written by it)
    ],
)
def test_status_is_quiet_once_a_mode_is_pinned(policy: Policy, reservation: DeviceReservation) -> None:
    status = _status(policy, reservation)
    assert status.out_of_date == ()
    assert device_status.status_json(status)["memoryPartition"] == {"pinned": "nps1", "unpinnedNodes": {}}
    assert "  memory mode nps1 pinned: both classes select only devices of it" in device_status.status_lines(status)


# --- pool plan | apply against the fake API -----------------------------------------------------------


@pytest.fixture
def ap_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    """Two AutoPartition nodes (4 MI300X each, four layouts), AMD's two classes (gpu.amd.com-spx owns
    amd.com/gpu), an inference namespace and a training one; no reservation yet."""
    monkeypatch.setattr(write, "CREATION_TICK", 0.0)
    fake = FakeCluster().start()
    fake.add(
        namespace("ml"),
        namespace("serve", {"rocm-isolation.io/class": "inference"}),
        node("ap-1", allocatable={}),
        node("ap-2", allocatable={}),
        *autopartition_slices("ap-1", AP_PCI),
        *autopartition_slices("ap-2", AP_PCI),
        device_class("gpu.amd.com", created="2026-11-01T00:00:00Z"),
        device_class("gpu.amd.com-spx", SPX, "amd.com/gpu", created="2026-11-01T00:00:00Z"),
    )
    yield fake
    fake.stop()


def run_pool(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    code = cli.main(["pool", *argv, "--kubeconfig", str(kubeconfig)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_pool_apply_pins_the_whole_gpu_mode_by_default(
    ap_cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_pool(ap_cluster, tmp_path, capsys, "plan", "--devices-per-node", "2")
    assert code == 0 and "Memory mode: nps1, pinned on every node of gpu.amd.com (2 nodes publish several" in out
    code, out, _ = run_pool(ap_cluster, tmp_path, capsys, "apply", "--devices-per-node", "2", "-o", "json")
    assert code == 0, out
    assert json.loads(out)["plan"]["devices"]["memoryPartition"]["mode"] == "nps1"
    pin = device_classes.memory_selector("gpu.amd.com", "nps1")
    for name in (DEVICES.reserved_class_name, DEVICES.shared_class_name, DEVICES.shared_extended_class_name):
        stored = ap_cluster.get_object("deviceclasses", name, group="resource.k8s.io")
        assert stored is not None and pin in [s["cel"]["expression"] for s in stored["spec"]["selectors"]], name
    reserved = ap_cluster.get_object("deviceclasses", DEVICES.reserved_class_name, group="resource.k8s.io")
    assert reserved is not None
    assert reserved["metadata"]["annotations"][device_classes.MEMORY_PARTITION_ANNOTATION] == "nps1"
    # status: pinned, no warning; a second apply changes nothing
    code, out, _ = run_pool(ap_cluster, tmp_path, capsys, "status")
    assert "memory mode nps1 pinned" in out and "memory modes" not in out
    code, out, _ = run_pool(ap_cluster, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 0 and "Nothing changed" in out, out


def test_pool_refuses_when_inference_runs_in_two_modes(
    ap_cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ap_cluster.add(
        held_claim("a-gpu", "serve", "ap-1", ["gpu-0-cpx-nps1"], pods=["llm-a"], device_class="gpu.amd.com"),
        held_claim("b-gpu", "serve", "ap-2", ["gpu-0-cpx-nps4"], pods=["llm-b"], device_class="gpu.amd.com"),
        claim_pod("llm-a", "serve", "ap-1", "a-gpu", inference=True),
        claim_pod("llm-b", "serve", "ap-2", "b-gpu", inference=True),
    )
    for action in ("plan", "apply"):
        code, out, err = run_pool(ap_cluster, tmp_path, capsys, action, "--devices-per-node", "2")
        assert code == 2, out + err
        assert "inference's pods hold layouts of several modes (nps1, nps4)" in err
        assert "Set reservedDevices.memoryPartition in the policy" in err
        assert "rocm-isolation-webhook pool apply --devices-per-node 2; nothing was changed" in err
    assert ap_cluster.get_object("deviceclasses", DEVICES.reserved_class_name, group="resource.k8s.io") is None


def test_pods_of_another_mode_than_the_pinned_one_are_a_note(
    ap_cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ap_cluster.add(
        held_claim("t-gpu", "ml", "ap-2", ["gpu-3-cpx-nps4"], pods=["train"], device_class="gpu.amd.com"),
        claim_pod("train", "ml", "ap-2", "t-gpu"),
    )
    code, out, _ = run_pool(ap_cluster, tmp_path, capsys, "plan", "--devices-per-node", "2")
    assert code == 0
    assert (
        "note: ap-2: ml/train holds gpu-3-cpx-nps4 (memory mode nps4): until it ends, ap-2 stays in that mode and "
        "the driver keeps its nps1 layouts tainted, for both sides"
    ) in out
