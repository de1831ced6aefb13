"""Device-level reservation by DeviceTaintRules (issue 26): a subset of the driver's nodes, or reserved GPUs in
differing PCI slots, split by tainting each chosen node's reserved devices by driver/pool/name.

The pure half (``split(..., by_taints=True)``, ``tainted_devices``, ``slots_differ``, ``rule_changes``,
``device_state``/``split_nodes`` by taints), then ``pool`` against the fake API (tests/fake_cluster.py), which
serves ``devicetaintrules`` but lists them in API discovery only when a test says so (``serve_discovery``):
the exact writes, their order, and what plan, status and ``-o json`` say.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from cluster_objects import chart_class, drm_gpus, gpu_device, namespace, node, node_slice
from dra_objects import dra_workloads
from fake_cluster import FakeCluster
from test_pool import run, stored_class, writes

from webhook.cluster import slices as slice_reader
from webhook.core.policy import default_policy
from webhook.deploy import device_classes, device_taint_rules
from webhook.deploy.device_taint_rules import TaintedDevice
from webhook.ops import capacity
from webhook.ops.devices import plan as device_plan
from webhook.ops.devices import split as device_split
from webhook.ops.pool import read as pool_read
from webhook.ops.pool import write
from webhook.ops.reservation import SelectionError

POLICY = default_policy()
POOL_LABEL = "rocm-isolation.io/pool"
SPLIT = "inference-devices"
RESERVED_CLASS, SHARED_CLASS = "rocm-isolation-reserved", "rocm-isolation-shared"
SLOTS = ("0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0")
MOVED = ("0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0", "0000:6e:00.0")  # first slot empty, a fifth one used
V1 = {"resource.k8s.io/v1": ["devicetaintrules"]}
V1BETA2 = {"resource.k8s.io/v1beta2": ["devicetaintrules"]}
DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
RULES_BETA = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
ONLY_DRIVER = "device.driver == 'gpu.amd.com'"
OURS = {"app.kubernetes.io/managed-by": "rocm-isolation-webhook"}


def rule_name(node_name: str, device: str) -> str:
    return f"rocm-isolation-reserved-{node_name}-{device}"


def gpus(node_name: str, slots: tuple[str, ...], *, partitioned: bool = False) -> dict[str, Any]:
    """A node's slice, GPUs named by DRM minors as AMD's driver does (gpu-9-137 in the lowest slot, then
    gpu-8-136, ...); ``partitioned``: the lowest GPU also publishes a partition with its PCI bus ID."""
    devices = drm_gpus(*slots)
    if partitioned:
        devices.append(gpu_device("gpu-9-137-p1", slots[0]))
    return node_slice(node_name, *devices)


def make_cluster(slots: dict[str, tuple[str, ...]], *, partitioned: str | None = None) -> FakeCluster:
    """DRA nodes publishing GPUs in ``slots`` (``partitioned``: that node's lowest GPU also has a partition),
    a device-plugin node, AMD's chart class; a training pod on dra-a's lowest GPU, one on dra-b's highest, an
    inference pod on dra-b's second."""
    fake = FakeCluster().start()
    fake.add(
        namespace("ml-training"),
        namespace("serving", {"rocm-isolation.io/class": "inference"}),
        node("plugin-1"),
        chart_class(),
        *dra_workloads(),
    )
    for name, ids in slots.items():
        fake.add(node(name, allocatable={}), gpus(name, ids, partitioned=name == partitioned))
    return fake


@pytest.fixture
def dra() -> Iterator[FakeCluster]:
    """Three DRA nodes in the same PCI slots; dra-a's lowest GPU is partitioned (two devices, one PCI bus ID)."""
    fake = make_cluster({"dra-a": SLOTS, "dra-b": SLOTS, "dra-c": SLOTS}, partitioned="dra-a")
    yield fake
    fake.stop()


@pytest.fixture
def moved() -> Iterator[FakeCluster]:
    """Two DRA nodes whose GPUs sit in different PCI slots (dra-b's start one slot later)."""
    fake = make_cluster({"dra-a": SLOTS, "dra-b": MOVED})
    yield fake
    fake.stop()


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write, "CREATION_TICK", 0.0)
    monkeypatch.setattr(write, "EVICTION_BACKOFF", (0.01, 0.02))


def steps(cluster: FakeCluster, since: int = 0) -> list[tuple[str, str]]:
    """The writes as (method, what): a rule or class by name (POST: the body's), a node by name."""
    out = []
    for r in writes(cluster)[since:]:
        name = r.body["metadata"].get("name") if r.method == "POST" and r.body else r.path.rsplit("/", 1)[-1]
        kind = "rule" if "/devicetaintrules" in r.path else "class" if "/deviceclasses" in r.path else "node"
        out.append((r.method, f"{kind}/{name}"))
    return out


def stored_rules(cluster: FakeCluster) -> dict[str, dict[str, Any]]:
    with cluster.lock:
        names = [key for key in cluster.store[("resource.k8s.io", "devicetaintrules")]]
    found = {name: cluster.get_object("devicetaintrules", name, group="resource.k8s.io") for name in names}
    return {name: obj for name, obj in found.items() if obj is not None}


def labels(cluster: FakeCluster, name: str) -> dict[str, str]:
    obj = cluster.get_object("nodes", name)
    assert obj is not None, name
    return dict(obj["metadata"].get("labels") or {})


def selector(cluster: FakeCluster, name: str) -> str:
    return str(stored_class(cluster, name)["spec"]["selectors"][0]["cel"]["expression"])


def our_rule(node_name: str, device: str, pci: str, version: str = "v1") -> dict[str, Any]:
    return device_taint_rules.rule(POLICY, TaintedDevice(node_name, node_name, device, pci), version)


DRA_A_RULES = [rule_name("dra-a", d) for d in ("gpu-8-136", "gpu-9-137", "gpu-9-137-p1")]
RESERVED_TWO = (
    "device.driver == 'gpu.amd.com' && has(device.attributes['resource.kubernetes.io'].pciBusID) && "
    "device.attributes['resource.kubernetes.io'].pciBusID in ['0000:19:00.0', '0000:3b:00.0']"
)


# --- pure ---------------------------------------------------------------------------------------------


def published(*slices: dict[str, Any]) -> dict[str, tuple[slice_reader.Device, ...]]:
    return slice_reader.published_devices(slices, "gpu.amd.com")


def test_by_taints_each_chosen_node_taints_its_own_lowest_devices_partitions_included() -> None:
    found = published(gpus("dra-a", SLOTS, partitioned=True), gpus("dra-b", MOVED))
    after, wanted = device_split.split(found, 2, ["dra-a"], by_taints=True)
    assert wanted == {"dra-a": ("0000:19:00.0", "0000:3b:00.0")}
    assert after.by_taints and after.pci_bus_ids == ("0000:19:00.0", "0000:3b:00.0")
    assert after.tainted == {("dra-a", "gpu-9-137"), ("dra-a", "gpu-9-137-p1"), ("dra-a", "gpu-8-136")}
    states = {(d.node, d.name): capacity.device_state(d, after) for devices in found.values() for d in devices}
    # dra-b's gpu-9-137 sits in slot 3b, one of the reserved PCI bus IDs: by taints it stays shared
    assert [k for k, v in states.items() if v == capacity.RESERVED] == [
        ("dra-a", "gpu-9-137"),
        ("dra-a", "gpu-9-137-p1"),
        ("dra-a", "gpu-8-136"),
    ]
    assert capacity.split_nodes(found, after) == {"dra-a"}
    # the same split by classes reserves the PCI bus IDs on every node
    classes, _ = device_split.split(found, 2, ["dra-a"])
    assert not classes.by_taints and capacity.split_nodes(found, classes) == {"dra-a", "dra-b"}
    assert device_classes.shared_selector("gpu.amd.com", after) == ONLY_DRIVER
    assert device_classes.shared_selector("gpu.amd.com", classes) != ONLY_DRIVER


def test_differing_slots_are_found_and_taints_reserve_exactly_each_nodes_own() -> None:
    found = published(gpus("dra-a", SLOTS), gpus("dra-b", MOVED))
    _, wanted = device_split.split(found, 2)
    # the union (19, 3b, 4c) gives dra-a its 4c as well; dra-b gets exactly its own
    assert device_split.slots_differ(found, wanted) == ["dra-a"]
    after, _ = device_split.split(found, 2, by_taints=True)
    devices = device_split.tainted_devices(found, wanted)
    assert [(d.node, d.device, d.pci_bus_id) for d in devices] == [
        ("dra-a", "gpu-9-137", "0000:19:00.0"),
        ("dra-a", "gpu-8-136", "0000:3b:00.0"),
        ("dra-b", "gpu-9-137", "0000:3b:00.0"),
        ("dra-b", "gpu-8-136", "0000:4c:00.0"),
    ]
    for name, own in wanted.items():
        reserved = {d.pci_bus_id for d in found[name] if capacity.device_state(d, after) == capacity.RESERVED}
        assert reserved == set(own)
    same = published(gpus("dra-a", SLOTS), gpus("dra-b", SLOTS))
    assert device_split.slots_differ(same, device_split.split(same, 2)[1]) == []


def test_rule_changes_create_keep_replace_delete_and_refuse_a_rule_not_ours() -> None:
    keep = TaintedDevice("dra-a", "dra-a", "gpu-9-137", "0000:19:00.0")
    moved_device = TaintedDevice("dra-a", "dra-a", "gpu-8-136", "0000:3b:00.0")
    new = TaintedDevice("dra-a", "dra-a", "gpu-7-135", "0000:4c:00.0")
    stale_pci = our_rule("dra-a", "gpu-8-136", "0000:99:00.0")  # an annotation that says something else
    gone = our_rule("dra-b", "gpu-9-137", "0000:19:00.0")
    current = [our_rule("dra-a", "gpu-9-137", "0000:19:00.0"), stale_pci, gone]
    changes = device_plan.rule_changes(POLICY, [keep, moved_device, new], current, "v1")
    assert [(c.name, c.action) for c in changes] == [
        (rule_name("dra-a", "gpu-9-137"), "unchanged"),
        (rule_name("dra-a", "gpu-8-136"), "replace"),
        (rule_name("dra-a", "gpu-7-135"), "create"),
        (rule_name("dra-b", "gpu-9-137"), "delete"),
    ]
    created = changes[2].desired
    assert created is not None and created["apiVersion"] == "resource.k8s.io/v1"
    assert created["spec"] == {
        "deviceSelector": {"driver": "gpu.amd.com", "pool": "dra-a", "device": "gpu-7-135"},
        "taint": {"key": "rocm-isolation.io/reserved-device", "value": RESERVED_CLASS, "effect": "NoSchedule"},
    }
    kubernetes_validate.validate(created, "1.37.0", strict=True)
    foreign = our_rule("dra-a", "gpu-9-137", "0000:19:00.0")
    del foreign["metadata"]["labels"]
    with pytest.raises(SelectionError, match=r"devicetaintrule/rocm-isolation-reserved-dra-a-gpu-9-137 exists and is"):
        device_plan.rule_changes(POLICY, [keep], [foreign], "v1")
    # another tool's rule of another name is never deleted; nothing to taint and no API: nothing at all
    assert device_plan.rule_changes(POLICY, [], [foreign], "v1") == ()
    with pytest.raises(SelectionError, match="serves no devicetaintrules"):
        device_plan.rule_changes(POLICY, [keep], [], None)


def test_a_timestamp_set_by_the_apiserver_is_no_change() -> None:
    current = our_rule("dra-a", "gpu-9-137", "0000:19:00.0")
    current["spec"]["taint"]["timeAdded"] = "2026-12-01T09:00:00Z"
    assert not device_taint_rules.spec_differs(current, our_rule("dra-a", "gpu-9-137", "0000:19:00.0"))
    assert device_taint_rules.spec_differs(current, our_rule("dra-a", "gpu-9-137", "0000:19:00.0", "v1beta2")) is False


# --- plan ---------------------------------------------------------------------------------------------


def test_plan_of_a_subset_taints_that_nodes_lowest_devices_only_and_writes_nothing(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    code, out, err = run(dra, tmp_path, capsys, "plan", "--devices-per-node", "2", "--nodes", "dra-a")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[2].startswith("After apply: 2 devices per chosen node, 3 devices tainted by DeviceTaintRules")
    assert "DeviceTaintRules (resource.k8s.io/v1) taint the reserved devices rocm-isolation.io/reserved-device:" in out
    assert [line.split() for line in lines if line.split()[:1] in (["dra-a"], ["dra-b"], ["dra-c"])][:3] == [
        ["dra-a", "4", "2", "2", "add"],
        ["dra-b", "4", "0", "4", "none"],
        ["dra-c", "4", "0", "4", "none"],
    ]
    for name in DRA_A_RULES:
        assert f"devicetaintrule/{name} (dra-a " in out and out.count(f"devicetaintrule/{name} ") == 1
    assert "create (before the classes)" in out
    assert "note: DeviceTaintRules hold the split: only dra-a of the driver's nodes are split" in out
    assert writes(dra) == []

    code, out, _ = run(dra, tmp_path, capsys, "plan", "--devices-per-node", "2", "--nodes", "dra-a", "-o", "json")
    assert code == 0
    doc = json.loads(out)["devices"]
    assert doc["after"] == {
        "active": True,
        "mode": "taints",
        "devicesPerNode": 2,
        "pciBusIds": ["0000:19:00.0", "0000:3b:00.0"],
        "taintedDevices": [
            {"pool": "dra-a", "device": "gpu-8-136"},
            {"pool": "dra-a", "device": "gpu-9-137"},
            {"pool": "dra-a", "device": "gpu-9-137-p1"},
        ],
        "memoryPartition": None,
    }
    assert doc["taintRuleVersion"] == "v1"
    assert sorted((r["name"], r["action"], r["node"], r["pciBusId"]) for r in doc["taintRules"]) == [
        (DRA_A_RULES[0], "create", "dra-a", "0000:3b:00.0"),
        (DRA_A_RULES[1], "create", "dra-a", "0000:19:00.0"),
        (DRA_A_RULES[2], "create", "dra-a", "0000:19:00.0"),
    ]
    classes = {c["name"]: c["object"] for c in doc["classes"]}
    assert classes[SHARED_CLASS]["spec"]["selectors"] == [{"cel": {"expression": ONLY_DRIVER}}]
    assert classes[RESERVED_CLASS]["spec"]["selectors"] == [{"cel": {"expression": RESERVED_TWO}}]
    assert classes[RESERVED_CLASS]["metadata"]["annotations"]["rocm-isolation.io/device-reservation-mode"] == "taints"
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert (nodes["dra-a"]["reserved"], nodes["dra-a"]["label"]) == (2, "add")
    assert (nodes["dra-b"]["reserved"], nodes["dra-b"]["shared"], nodes["dra-b"]["label"]) == (0, 4, "none")
    assert {d["name"]: d["after"] for d in nodes["dra-b"]["devices"]} == dict.fromkeys(
        ["gpu-9-137", "gpu-8-136", "gpu-7-135", "gpu-6-134"], "shared"
    )
    assert {d["name"]: d["after"] for d in nodes["dra-a"]["devices"]}["gpu-9-137-p1"] == "reserved"
    # train-a holds dra-a's lowest GPU; the inference pod's device on dra-b is not reserved any more: it keeps it
    assert [p["name"] for p in doc["podsHoldingReserved"]] == ["train-a"]
    assert writes(dra) == []


def test_v1beta2_needs_the_flag_that_says_the_schedulers_gate_is_on(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a 1.36 control plane whose scheduler honours v1beta2 rules (where pool reads the apiserver's version)
    monkeypatch.setattr(pool_read, "server_version", lambda api: (1, 36, 4), raising=False)
    dra.serve_discovery(V1BETA2)
    code, out, err = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a")
    assert code == 2 and out == ""
    assert "this cluster serves devicetaintrules in resource.k8s.io/v1beta2" in err
    assert "DRADeviceTaintRules feature gate" in err and "add --device-taint-rules" in err
    assert writes(dra) == []

    code, out, err = run(
        dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a", "--device-taint-rules"
    )
    assert code == 0, err
    rule_writes = [r for r in writes(dra) if "/devicetaintrules" in r.path]
    assert [r.path for r in rule_writes] == [RULES_BETA] * 3
    assert {r.body["apiVersion"] for r in rule_writes} == {"resource.k8s.io/v1beta2"}
    assert sorted(stored_rules(dra)) == sorted(DRA_A_RULES)
    assert "DeviceTaintRules (resource.k8s.io/v1beta2)" in out
    # read back in v1beta2 the next time: nothing to change
    before = len(writes(dra))
    code, out, _ = run(
        dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a", "--device-taint-rules"
    )
    assert code == 0 and len(writes(dra)) == before


def test_differing_slots_are_tainted_when_usable_and_the_union_with_a_note_otherwise(
    moved: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(moved, tmp_path, capsys, "plan", "--devices-per-node", "2", "-o", "json")
    assert code == 0
    doc = json.loads(out)["devices"]
    assert doc["after"]["mode"] == "classes" and doc["taintRules"] == []
    assert doc["after"]["pciBusIds"] == ["0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0"]
    assert [(n["name"], n["reserved"]) for n in doc["nodes"]] == [("dra-a", 3), ("dra-b", 2)]
    assert any(note.startswith("CEL cannot see the node: dra-a gets 3 reserved GPUs, not 2") for note in doc["notes"])

    moved.serve_discovery(V1BETA2)
    code, out, _ = run(moved, tmp_path, capsys, "plan", "--devices-per-node", "2")
    assert code == 0
    [note] = [line for line in out.splitlines() if line.startswith("note:") and "v1beta2" in line]
    assert "--device-taint-rules" in note

    moved.serve_discovery(V1)
    code, out, _ = run(moved, tmp_path, capsys, "plan", "--devices-per-node", "2", "-o", "json")
    doc = json.loads(out)["devices"]
    assert doc["after"]["mode"] == "taints"
    assert [(n["name"], n["reserved"], n["shared"], n["label"]) for n in doc["nodes"]] == [
        ("dra-a", 2, 2, "add"),
        ("dra-b", 2, 2, "add"),
    ]
    assert sorted((r["node"], r["device"], r["pciBusId"]) for r in doc["taintRules"]) == [
        ("dra-a", "gpu-8-136", "0000:3b:00.0"),
        ("dra-a", "gpu-9-137", "0000:19:00.0"),
        ("dra-b", "gpu-8-136", "0000:4c:00.0"),
        ("dra-b", "gpu-9-137", "0000:3b:00.0"),
    ]
    assert any("the reserved GPUs of dra-a sit in other PCI slots" in note for note in doc["notes"])
    assert writes(moved) == []


# --- apply --------------------------------------------------------------------------------------------


def test_apply_posts_the_rules_before_the_classes_and_is_idempotent(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    code, out, err = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a")
    assert code == 0, err
    done = steps(dra)
    assert sorted(done[:3]) == [("POST", f"rule/{name}") for name in DRA_A_RULES]
    assert done[3:] == [("POST", f"class/{RESERVED_CLASS}"), ("POST", f"class/{SHARED_CLASS}"), ("PATCH", "node/dra-a")]
    assert all(r.path == RULES for r in writes(dra)[:3])
    rules = stored_rules(dra)
    assert sorted(rules) == sorted(DRA_A_RULES)
    for name, obj in rules.items():
        assert obj["metadata"]["labels"] == OURS
        assert obj["metadata"]["annotations"]["rocm-isolation.io/node"] == "dra-a"
        assert obj["spec"]["deviceSelector"]["pool"] == "dra-a"
        assert name == rule_name("dra-a", obj["spec"]["deviceSelector"]["device"])
        kubernetes_validate.validate(
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", **obj}, "1.37.0", strict=True
        )
    assert selector(dra, SHARED_CLASS) == ONLY_DRIVER and selector(dra, RESERVED_CLASS) == RESERVED_TWO
    assert labels(dra, "dra-a")[POOL_LABEL] == SPLIT
    assert POOL_LABEL not in labels(dra, "dra-b") and POOL_LABEL not in labels(dra, "dra-c")
    assert f"devicetaintrule/{DRA_A_RULES[0]} created" in out

    before = len(writes(dra))
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a")
    assert code == 0
    assert len(writes(dra)) == before
    assert out.rstrip().endswith("Nothing changed: the classes, the rules and the nodes already said this.")


def test_a_rule_of_our_name_that_is_not_ours_is_refused_and_nothing_is_written(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    foreign = our_rule("dra-a", "gpu-9-137", "0000:19:00.0")
    foreign["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "someone-else"}
    dra.add(foreign)
    for action in ("plan", "apply"):
        code, out, err = run(dra, tmp_path, capsys, action, "--devices-per-node", "2", "--nodes", "dra-a")
        assert code == 2, out
        assert err.startswith(
            f"error: devicetaintrule/{rule_name('dra-a', 'gpu-9-137')} exists and is not managed by "
            "rocm-isolation-webhook"
        )
    assert writes(dra) == []
    assert stored_rules(dra)[rule_name("dra-a", "gpu-9-137")]["metadata"]["labels"] == foreign["metadata"]["labels"]


def test_a_rule_that_cannot_be_written_leaves_the_classes_and_nodes_alone(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    dra.forbid("devicetaintrules", "create")
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a", "--evict")
    assert code == 1
    assert {method for method, what in steps(dra)} == {"POST"}
    assert all(what.startswith("rule/") for _, what in steps(dra))
    assert dra.get_object("deviceclasses", RESERVED_CLASS, group="resource.k8s.io") is None
    assert POOL_LABEL not in labels(dra, "dra-a")
    assert dra.get_object("pods", "train-a", "ml-training") is not None
    assert "The DeviceClasses were not written: a DeviceTaintRule was not." in out

    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a", "-o", "json")
    assert code == 1
    doc = json.loads(out)
    assert doc["deviceClasses"] == [] and doc["nodes"] == []
    assert {r["result"] for r in doc["deviceTaintRules"]} == {"failed"}


def test_a_shrink_deletes_the_rules_of_devices_no_longer_reserved_after_the_classes(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a")[0] == 0
    before = len(writes(dra))
    code, out, err = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "1", "--nodes", "dra-a")
    assert code == 0, err
    assert steps(dra, before) == [
        ("PUT", f"class/{RESERVED_CLASS}"),
        ("PUT", f"class/{SHARED_CLASS}"),
        ("DELETE", f"rule/{rule_name('dra-a', 'gpu-8-136')}"),
    ]
    assert sorted(stored_rules(dra)) == [rule_name("dra-a", "gpu-9-137"), rule_name("dra-a", "gpu-9-137-p1")]
    assert selector(dra, RESERVED_CLASS).endswith("in ['0000:19:00.0']")
    assert selector(dra, SHARED_CLASS) == ONLY_DRIVER
    assert f"devicetaintrule/{rule_name('dra-a', 'gpu-8-136')} deleted" in out


def test_back_to_classes_narrows_the_shared_class_before_the_rules_are_deleted(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a")[0] == 0
    before = len(writes(dra))
    # every node, the same slots: the classes can hold the split alone
    code, _, err = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 0, err
    done = steps(dra, before)
    assert done[:2] == [("PUT", f"class/{RESERVED_CLASS}"), ("PUT", f"class/{SHARED_CLASS}")]
    assert sorted(done[2:5]) == [("DELETE", f"rule/{name}") for name in DRA_A_RULES]
    assert sorted(done[5:]) == [("PATCH", "node/dra-b"), ("PATCH", "node/dra-c")]
    assert stored_rules(dra) == {}
    assert "!(has(" in selector(dra, SHARED_CLASS)
    reservation = device_classes.reservation_of(stored_class(dra, RESERVED_CLASS))
    assert reservation is not None and not reservation.by_taints and reservation.devices_per_node == 2
    assert all(labels(dra, n)[POOL_LABEL] == SPLIT for n in ("dra-a", "dra-b", "dra-c"))


def test_stale_rules_left_in_class_mode_are_planned_and_deleted(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")[0] == 0
    stale = our_rule("dra-b", "gpu-7-135", "0000:4c:00.0")
    dra.add(stale)
    code, out, _ = run(dra, tmp_path, capsys, "status")
    assert "warning: DeviceTaintRules of ours are left from a split by taints: pool apply --devices-per-node 2" in out
    code, out, _ = run(dra, tmp_path, capsys, "plan", "--devices-per-node", "2")
    assert code == 0
    assert f"devicetaintrule/{rule_name('dra-b', 'gpu-7-135')} (dra-b gpu-7-135 0000:4c:00.0): delete (after" in out
    before = len(writes(dra))
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 0
    assert steps(dra, before) == [("DELETE", f"rule/{rule_name('dra-b', 'gpu-7-135')}")]
    assert stored_rules(dra) == {}


# --- release ------------------------------------------------------------------------------------------


def test_release_all_widens_the_classes_then_deletes_the_rules_then_unlabels(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a")[0] == 0
    before = len(writes(dra))
    code, out, err = run(dra, tmp_path, capsys, "release", "--devices", "--all")
    assert code == 0, err
    done = steps(dra, before)
    assert done[:2] == [("PUT", f"class/{RESERVED_CLASS}"), ("PUT", f"class/{SHARED_CLASS}")]
    assert sorted(done[2:5]) == [("DELETE", f"rule/{name}") for name in DRA_A_RULES]
    assert done[5:] == [("PATCH", "node/dra-a")]
    assert stored_rules(dra) == {}
    assert selector(dra, RESERVED_CLASS) == ONLY_DRIVER and selector(dra, SHARED_CLASS) == ONLY_DRIVER
    assert device_classes.reservation_of(stored_class(dra, RESERVED_CLASS)) == device_classes.RELEASED_RESERVATION
    assert POOL_LABEL not in labels(dra, "dra-a")
    code, out, _ = run(dra, tmp_path, capsys, "release", "--devices", "--all")
    assert code == 0 and out.rstrip().endswith("Nothing changed: the device reservation was already released.")


def test_release_of_some_split_nodes_keeps_the_others_split(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a,dra-b")[0] == 0
    assert len(stored_rules(dra)) == 5
    before = len(writes(dra))
    code, _, err = run(dra, tmp_path, capsys, "release", "--devices", "--nodes", "dra-a")
    assert code == 0, err
    done = steps(dra, before)
    assert sorted(done[:3]) == [("DELETE", f"rule/{name}") for name in DRA_A_RULES]
    assert done[3:] == [("PATCH", "node/dra-a")]
    assert sorted(stored_rules(dra)) == [rule_name("dra-b", "gpu-8-136"), rule_name("dra-b", "gpu-9-137")]
    assert POOL_LABEL not in labels(dra, "dra-a") and labels(dra, "dra-b")[POOL_LABEL] == SPLIT
    reservation = device_classes.reservation_of(stored_class(dra, RESERVED_CLASS))
    assert reservation is not None and reservation.active and reservation.by_taints
    assert selector(dra, SHARED_CLASS) == ONLY_DRIVER


# --- status and whole nodes ---------------------------------------------------------------------------


def test_status_reads_the_device_states_from_the_rules_and_warns_of_a_rule_for_no_device(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a")[0] == 0
    code, out, _ = run(dra, tmp_path, capsys, "status", "-o", "json")
    assert code == 0
    devices = json.loads(out)["devices"]
    assert devices["reservation"]["mode"] == "taints"
    assert len(devices["reservation"]["taintedDevices"]) == 3
    states = {n["name"]: {d["name"]: d["state"] for d in n["devices"]} for n in devices["nodes"]}
    assert states["dra-a"] == {
        "gpu-9-137": "reserved",
        "gpu-9-137-p1": "reserved",
        "gpu-8-136": "reserved",
        "gpu-7-135": "shared",
        "gpu-6-134": "shared",
    }
    # dra-b's gpu-8-136 is in a reserved PCI slot, but no rule taints it: shared
    assert set(states["dra-b"].values()) == {"shared"} and set(states["dra-c"].values()) == {"shared"}
    assert [p["name"] for p in devices["nonInferenceOnReserved"]] == ["train-a"]
    assert devices["outOfDate"] == []
    # a rule for a device no slice publishes (renamed after a reboot)
    dra.add(our_rule("dra-a", "gpu-99-199", "0000:3b:00.0"))
    code, out, _ = run(dra, tmp_path, capsys, "status")
    assert (
        "warning: a DeviceTaintRule taints gpu-99-199 of pool dra-a, which no ResourceSlice publishes (a device "
        "renamed after a reboot, or a node gone): pool apply --devices-per-node 2 --nodes dra-a derives the rules"
    ) in out


def test_whole_node_apply_is_refused_on_a_node_split_by_taints_not_on_an_unsplit_one(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.serve_discovery(V1)
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a")[0] == 0
    before = len(writes(dra))
    code, _, err = run(dra, tmp_path, capsys, "apply", "--nodes", "dra-a")
    assert code == 2
    assert err.startswith("error: dra-a publishes gpu.amd.com devices, which the active device reservation splits")
    assert "pool release --devices --all, or --nodes dra-a" in err
    assert len(writes(dra)) == before
    code, _, err = run(dra, tmp_path, capsys, "apply", "--nodes", "dra-c")
    assert code == 0, err
    assert steps(dra, before) == [("PATCH", "node/dra-c")]
    assert labels(dra, "dra-c")[POOL_LABEL] == "inference"
    # and the device reservation, next time, leaves the whole node alone or refuses to split it
    code, _, err = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a,dra-c")
    assert code == 2 and "dra-c is reserved whole" in err
