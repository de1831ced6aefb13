"""The pure half of ``pool``: node choice, the exact node patches, the plan and release room.

The commands themselves run against the fake Kubernetes API in tests/ops/pool/test_pool.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from webhook.core.policy import default_policy
from webhook.ops.reservation import (
    PoolNode,
    PoolPod,
    Reservation,
    SelectionError,
    build_plan,
    choose_nodes,
    parse_names,
    parse_selector,
    plan_json,
    plan_lines,
    release_patch,
    reserve_patch,
    room_after_release,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "pool" / "choice.yaml"
RES = Reservation.from_policy(default_policy())
OURS = {"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "NoSchedule"}
AMD_UNHEALTHY = {"key": "amd-gpu-unhealthy", "effect": "NoSchedule"}


def cluster(reserved: tuple[str, ...] = ()) -> tuple[list[PoolNode], list[PoolPod]]:
    data = yaml.safe_load(FIXTURE.read_text())
    nodes = []
    for n in data["nodes"]:
        labels = dict(n["labels"])
        taints: tuple[dict[str, Any], ...] = ()
        if n["name"] in reserved:
            labels["rocm-isolation.io/pool"] = "inference"
            taints = (OURS,)
        nodes.append(PoolNode(n["name"], labels, taints, "100", n["gpus"]))
    pods = [
        PoolPod(p["namespace"], p["name"], p["node"], "", p["gpus"], p["class"], p["class"] == "inference")
        for p in data["pods"]
    ]
    return nodes, pods


def chosen(selection: Any) -> list[str]:
    return [c.node.name for c in selection.chosen]


def test_the_policy_gives_the_label_and_taint() -> None:
    assert RES.label == ("rocm-isolation.io/pool", "inference")
    assert RES.taint == OURS
    assert RES.taint_text == "rocm-isolation.io/reserved=inference:NoSchedule"


def test_selector_and_count_prefer_the_fewest_non_inference_gpus_then_the_name() -> None:
    nodes, pods = cluster()
    selection = choose_nodes(nodes, pods, RES, selector={"amd.com/gpu.device-id": "74a1"}, count=2)
    # non-inference GPUs: a 8, b 2 (its inference pod does not count), c 0, d 2
    assert chosen(selection) == ["mi300-c", "mi300-b"]
    assert selection.chosen[0].reason == "0 GPUs requested by non-inference pods (fewer than mi300-d: 2)"
    assert selection.chosen[1].reason == "2 GPUs requested by non-inference pods; tied with mi300-d, chosen by name"
    assert [(c.node.name, c.reason) for c in selection.passed_over] == [
        ("mi300-d", "2 GPUs requested by non-inference pods"),
        ("mi300-a", "8 GPUs requested by non-inference pods"),
    ]


def test_a_tie_at_zero_is_broken_by_name() -> None:
    nodes, pods = cluster()
    selection = choose_nodes(nodes, pods, RES, selector={"amd.com/gpu.device-id": "740f"}, count=1)
    assert chosen(selection) == ["mi210-b"]
    assert selection.chosen[0].reason == "0 GPUs requested by non-inference pods; tied with mi210-c, chosen by name"
    # the choice does not depend on the order the API listed the nodes in
    again = choose_nodes(list(reversed(nodes)), pods, RES, selector={"amd.com/gpu.device-id": "740f"}, count=1)
    assert chosen(again) == ["mi210-b"]


def test_nodes_already_reserved_come_first_so_a_second_plan_is_the_same() -> None:
    nodes, pods = cluster(reserved=("mi300-a",))
    selection = choose_nodes(nodes, pods, RES, selector={"amd.com/gpu.device-id": "74a1"}, count=2)
    assert chosen(selection) == ["mi300-a", "mi300-c"]
    assert selection.chosen[0].reason == "already reserved"


def test_gpus_takes_nodes_in_the_same_order_until_enough_are_held() -> None:
    nodes, pods = cluster()
    selection = choose_nodes(nodes, pods, RES, selector={"amd.com/gpu.device-id": "74a1"}, gpus=12)
    assert chosen(selection) == ["mi300-c", "mi300-b"]
    assert selection.chosen[1].reason.endswith("; 16 GPUs of 12 wanted")
    exact = choose_nodes(nodes, pods, RES, selector={"amd.com/gpu.device-id": "740f"}, gpus=8)
    assert chosen(exact) == ["mi210-b", "mi210-c"]
    # without a selector every node with GPUs is a candidate
    assert chosen(choose_nodes(nodes, pods, RES, gpus=4)) == ["mi210-b"]


def test_named_nodes_are_taken_as_given() -> None:
    nodes, pods = cluster()
    selection = choose_nodes(nodes, pods, RES, names=parse_names("mi300-a,mi210-c,mi300-a"))
    assert chosen(selection) == ["mi300-a", "mi210-c"]
    assert {c.reason for c in selection.chosen} == {"named with --nodes"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"names": ["mi300-a", "nope", "gone"]}, "nodes not found: nope, gone"),
        (
            {"selector": {"amd.com/gpu.device-id": "0000"}, "count": 1},
            "no node matches --selector amd.com/gpu.device-id=0000",
        ),
        (
            {"selector": {"amd.com/gpu.device-id": "740f"}, "count": 4},
            "--count 4: --selector amd.com/gpu.device-id=740f has only 3 candidate node(s) with allocatable GPUs "
            "(1 more without allocatable GPUs)",
        ),
        (
            {"selector": {"node-role": "cpu"}},
            "--selector node-role=cpu: 1 matching node(s), none with allocatable GPUs",
        ),
        (
            {"gpus": 45},
            "--gpus 45: the 7 candidate node(s) of the cluster hold only 44 GPUs (1 more without allocatable GPUs)",
        ),
        ({"count": 0}, "--count 0: give at least 1"),
        ({"gpus": -1}, "--gpus -1: give at least 1"),
    ],
)
def test_bad_choices_are_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    nodes, pods = cluster()
    with pytest.raises(SelectionError) as err:
        choose_nodes(nodes, pods, RES, **kwargs)
    assert str(err.value) == message


def test_selector_syntax() -> None:
    assert parse_selector("a=b,c==d, e=") == {"a": "b", "c": "d", "e": ""}
    for bad in ("a", "a!=b", "=b", "a=b,,c=d", "a=1,a=2"):
        with pytest.raises(SelectionError):
            parse_selector(bad)
    with pytest.raises(SelectionError):
        parse_names("a,,b")


def node(labels: dict[str, str] | None = None, taints: tuple[dict[str, Any], ...] = ()) -> PoolNode:
    return PoolNode("n1", labels or {}, taints, "4711", 8)


def apply_merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, written out here so the test does not trust the code under test."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = apply_merge_patch(out.get(key) if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out


def test_reserve_patch_names_only_our_label_and_the_taint_list() -> None:
    n = node({"kubernetes.io/hostname": "n1", "team": "a"}, (AMD_UNHEALTHY,))
    patch = reserve_patch(n, RES)
    assert patch == {
        "metadata": {"labels": {"rocm-isolation.io/pool": "inference"}, "resourceVersion": "4711"},
        "spec": {"taints": [AMD_UNHEALTHY, OURS]},
    }
    assert patch is not None
    result = apply_merge_patch({"metadata": {"labels": dict(n.labels)}, "spec": {"taints": list(n.taints)}}, patch)
    assert result["metadata"]["labels"] == {
        "kubernetes.io/hostname": "n1",
        "team": "a",
        "rocm-isolation.io/pool": "inference",
    }


def test_a_same_key_taint_with_another_value_or_effect_is_replaced_in_place() -> None:
    other_value = {"key": "rocm-isolation.io/reserved", "value": "batch", "effect": "NoSchedule"}
    other_effect = {
        "key": "rocm-isolation.io/reserved",
        "value": "inference",
        "effect": "NoExecute",
        "timeAdded": "2026-11-30T10:00:00Z",
    }
    gpu_taint = {"key": "amd-dcm", "value": "up", "effect": "NoExecute", "timeAdded": "2026-11-30T09:00:00Z"}
    n = node({"rocm-isolation.io/pool": "inference"}, (other_value, gpu_taint, other_effect))
    assert reserve_patch(n, RES) == {
        "metadata": {"resourceVersion": "4711"},
        "spec": {"taints": [OURS, gpu_taint]},
    }


def test_nothing_to_do_is_no_patch() -> None:
    assert reserve_patch(node({"rocm-isolation.io/pool": "inference"}, (AMD_UNHEALTHY, OURS)), RES) is None
    # the value "" and a missing value are the same taint
    no_value = Reservation(RES.label, {"key": "k", "effect": "NoSchedule"})
    assert (
        reserve_patch(
            node({"rocm-isolation.io/pool": "inference"}, ({"key": "k", "value": "", "effect": "NoSchedule"},)),
            no_value,
        )
        is None
    )


def test_a_policy_without_taint_patches_the_label_only() -> None:
    label_only = Reservation(RES.label, None)
    assert reserve_patch(node({}, (OURS,)), label_only) == {
        "metadata": {"labels": {"rocm-isolation.io/pool": "inference"}, "resourceVersion": "4711"}
    }


def test_release_patch_removes_our_label_and_taint_only() -> None:
    n = node({"rocm-isolation.io/pool": "inference", "team": "a"}, (AMD_UNHEALTHY, OURS))
    assert release_patch(n, RES) == {
        "metadata": {"labels": {"rocm-isolation.io/pool": None}, "resourceVersion": "4711"},
        "spec": {"taints": [AMD_UNHEALTHY]},
    }
    # the last taint gone: the field is removed (null in a merge patch)
    alone = release_patch(node({"rocm-isolation.io/pool": "inference"}, (OURS,)), RES)
    assert alone is not None and alone["spec"] == {"taints": None}
    assert release_patch(node({"team": "a"}, (AMD_UNHEALTHY,)), RES) is None


def test_plan_lists_the_pods_the_taint_leaves_and_the_capacity_left() -> None:
    nodes, pods = cluster()
    pods.append(
        PoolPod("monitoring", "exporter-x", "mi300-b", "DaemonSet/exporter", 0, "training", False, daemonset=True)
    )
    selection = choose_nodes(nodes, pods, RES, selector={"amd.com/gpu.device-id": "74a1"}, count=2)
    plan = build_plan(selection, nodes, pods, RES)
    by_node = {n.node.name: n for n in plan.nodes}
    assert [p.name for p in by_node["mi300-b"].staying] == ["exporter-x", "train-1"]
    assert by_node["mi300-c"].staying == ()
    doc = plan_json(plan)
    assert doc["reserved"]["after"] == {"nodes": 2, "gpusAllocatable": 16, "gpusRequested": 4, "gpusFree": 12}
    # shared after: mi300-a, mi300-d, 3 mi210 (cpu-1 has no GPU) = 28; training requests on them 8+2+1
    assert doc["training"] == {"nodes": 5, "gpusAllocatable": 28, "gpusRequested": 11, "gpusFree": 17}
    assert doc["displacedGpus"] == 2  # the DaemonSet pod is not evicted
    staying = doc["nodes"][1]["podsStaying"]
    assert staying[0] == {
        "namespace": "monitoring",
        "name": "exporter-x",
        "owner": "DaemonSet/exporter",
        "gpus": 0,
        "class": "training",
        "evictable": False,
        "skipReason": "DaemonSet pod (its controller would recreate it)",
    }
    text = "\n".join(plan_lines(plan))
    assert "mi300-b   8      add     add     2 GPUs requested by non-inference pods; tied with mi300-d" in text
    assert "Left for training: 5 nodes, 28 GPUs allocatable, 11 requested by non-inference pods (17 free)." in text


def test_a_plan_of_reserved_nodes_changes_nothing() -> None:
    nodes, pods = cluster(reserved=("mi300-a", "mi300-c"))
    plan = build_plan(choose_nodes(nodes, pods, RES, names=["mi300-a", "mi300-c"]), nodes, pods, RES)
    assert not plan.changes
    assert plan_lines(plan)[-1] == "Nothing to change: every node is already reserved."


def test_release_needs_room_for_the_inference_pods_on_the_reserved_nodes_left() -> None:
    nodes, pods = cluster(reserved=("mi300-b", "mi300-c"))
    # mi300-b runs llm-0 (4 GPUs) and train-1 (2): mi300-c has 8 free
    assert room_after_release(["mi300-b"], nodes, pods, RES) == []
    pods.append(PoolPod("serving", "llm-1", "mi300-c", "", 6, "inference", True))
    # now mi300-c has 2 free: llm-0 has no room left
    assert [p.name for p in room_after_release(["mi300-b"], nodes, pods, RES)] == ["llm-0"]
    # releasing the whole pool leaves no room for any of them
    assert [p.name for p in room_after_release(["mi300-b", "mi300-c"], nodes, pods, RES)] == ["llm-1", "llm-0"]
    # a pod that fits nowhere alone, although the GPUs add up, is refused too (first fit, largest first)
    nodes2, pods2 = cluster(reserved=("mi300-a", "mi300-c", "mi300-d"))
    pods2 += [
        PoolPod("serving", "big", "mi300-a", "", 8, "inference", True),
        PoolPod("serving", "half-c", "mi300-c", "", 4, "inference", True),
    ]
    # free after releasing mi300-a: c 4, d 6 (train-2 uses 2): 10 GPUs, but no node holds 8
    assert [p.name for p in room_after_release(["mi300-a"], nodes2, pods2, RES)] == ["big"]


def test_patches_apply_as_json_patch_equivalents() -> None:
    """The merge patch and the RFC 6902 operations it stands for give the same node."""
    n = node({"a": "1"}, (AMD_UNHEALTHY,))
    doc = {"metadata": {"labels": {"a": "1"}, "resourceVersion": "4711"}, "spec": {"taints": [AMD_UNHEALTHY]}}
    patch = reserve_patch(n, RES)
    assert patch is not None
    merged = apply_merge_patch(doc, patch)
    ops = jsonpatch.JsonPatch(
        [
            {"op": "add", "path": "/metadata/labels/rocm-isolation.io~1pool", "value": "inference"},
            {"op": "add", "path": "/spec/taints/-", "value": OURS},
        ]
    )
    assert merged == ops.apply(doc)


def test_unhealthy_and_cordoned_nodes_are_taken_last() -> None:
    nodes, pods = cluster()
    nodes = [
        PoolNode(n.name, n.labels, n.taints, n.resource_version, n.gpus, unhealthy=n.name == "mi300-c")
        if n.name != "mi300-d"
        else PoolNode(n.name, n.labels, n.taints, n.resource_version, n.gpus, unschedulable=True)
        for n in nodes
    ]
    selection = choose_nodes(nodes, pods, RES, selector={"amd.com/gpu.device-id": "74a1"}, count=3)
    # mi300-c (0 busy, unhealthy) and mi300-d (2 busy, cordoned) come after mi300-a (8 busy)
    assert chosen(selection) == ["mi300-b", "mi300-a", "mi300-c"]
    assert selection.chosen[1].reason == "8 GPUs requested by non-inference pods (mi300-d is cordoned)"
    assert selection.chosen[2].reason == "0 GPUs requested by non-inference pods; tainted amd-gpu-unhealthy, taken last"
    plan = build_plan(selection, nodes, pods, RES)
    assert "mi300-c is tainted amd-gpu-unhealthy: its GPUs fail the AMD GPU operator's checks" in plan.notes
