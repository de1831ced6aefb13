"""``serve``'s Lease holder keeping lending (webhook/service/lending_loop.py), against an API holding nodes
and pods (selectors as the apiserver reads them: equality and set-based ``in``; the calls recorded). On the
real control plane with the real scheduler: tests/e2e/test_e2e_lending.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import yaml

from webhook.cluster.kubeapi import Conflict, KubeApi, NotFound
from webhook.core.policy import Policy, default_policy, parse_policy
from webhook.service.lending_loop import LendingKeeper, Observed, taint_patch
from webhook.service.metrics import Metrics

POOL = "rocm-isolation.io/pool"
TAINT = {"key": "rocm-isolation.io/no-borrowers", "value": "true", "effect": "NoSchedule"}
RESERVED_TAINT = {"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "NoSchedule"}


def lending_policy(enabled: bool = True, headroom: int = 0) -> Policy:
    document = default_policy().document.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["lending"] = {"enabled": enabled, "headroomGPUs": headroom}
    return parse_policy(yaml.safe_dump(document))


def node(name: str, gpus: int = 4, *taints: Mapping[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {POOL: "inference"}, "resourceVersion": "1"},
        "spec": {"taints": [dict(RESERVED_TAINT), *map(dict, taints)]},
        "status": {"allocatable": {"amd.com/gpu": str(gpus)}},
    }


def pod(
    name: str,
    *,
    node_name: str = "",
    gpus: int = 1,
    borrower: bool = False,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    labels = {"rocm-isolation.io/borrow": "true"} if borrower else {"rocm-isolation.io/placed": "inference"}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": str(gpus)}}}]}
    if borrower:
        spec |= {"priorityClassName": "rocm-isolation-borrower", "priority": -100, "preemptionPolicy": "Never"}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": "ml" if borrower else "serve",
            "uid": f"uid-{name}",
            "labels": labels,
            "creationTimestamp": "2026-12-04T10:00:00Z",
        },
        "spec": spec,
        "status": {"phase": "Pending", "conditions": conditions or []},
    }


UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]


class Api:
    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.pods = pods
        self.patches: list[tuple[str, Mapping[str, Any]]] = []
        self.conflict: set[str] = set()

    def list(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
             on_restart: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:  # fmt: skip
        if path.startswith("/apis/"):  # no Dynamic Resource Allocation served
            raise NotFound("the server could not find the requested resource", status=404, path=path)
        collections = {"nodes": list(self.nodes.values()), "namespaces": NAMESPACES, "pods": self.pods}
        for item in collections[path.rsplit("/", 1)[-1]]:
            if selects(label_selector or "", item["metadata"].get("labels") or {}):
                yield item

    def get(self, path: str) -> dict[str, Any]:
        # No DeviceClass here (no device-level reservation): the device part of the round reads nothing more.
        raise NotFound("not found", status=404, method="GET", path=path)

    def serving_versions(self, group: str, versions: Any, resource: str) -> tuple[str, ...]:
        return ()

    def patch(self, path: str, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        name = path.rsplit("/", 1)[-1]
        if name in self.conflict:
            self.conflict.discard(name)
            raise Conflict("conflict", status=409, method="PATCH", path=path)
        current = self.nodes[name]
        assert body["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
        current["spec"]["taints"] = body["spec"]["taints"]
        current["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
        self.patches.append((name, body))
        return current


# The namespaces of the pods below: inference serves, training may borrow.
NAMESPACES = [
    {"metadata": {"name": "serve", "labels": {"rocm-isolation.io/class": "inference"}}},
    {
        "metadata": {
            "name": "ml",
            "labels": {"rocm-isolation.io/class": "training", "rocm-isolation.io/lending": "allowed"},
        }
    },
]


def selects(selector: str, labels: Mapping[str, str]) -> bool:
    if not selector:
        return True
    if " in (" in selector:
        key, values = selector.split(" in (")
        return labels.get(key) in values.rstrip(")").split(",")
    key, _, value = selector.partition("=")
    return labels.get(key) == value


def keeper(api: Api, policy: Policy) -> LendingKeeper:
    return LendingKeeper(cast(KubeApi, api), lambda: policy, lambda: True)


def tainted(api: Api) -> set[str]:
    return {name for name, n in api.nodes.items() if any(t["key"] == TAINT["key"] for t in n["spec"]["taints"])}


def test_headroom_closes_idle_nodes_and_opens_them_again_once_not_needed() -> None:
    api = Api([node("r0"), node("r1"), node("r2")], [pod("b0", node_name="r0", gpus=4, borrower=True)])
    observed = keeper(api, lending_policy(headroom=4)).run_once()
    assert observed.lent == 4 and observed.closed == ("r1",) and tainted(api) == {"r1"}
    # Our taint next to the reserved one, which is kept.
    assert RESERVED_TAINT in api.nodes["r1"]["spec"]["taints"]
    again = keeper(api, lending_policy(headroom=4)).run_once()
    assert again.written == ()  # nothing to write: one patch, not one per round
    keeper(api, lending_policy(headroom=0)).run_once()
    assert tainted(api) == set()


def test_every_reserved_node_is_closed_while_inference_waits_and_its_binding_time_is_measured() -> None:
    waiting = pod("llm", gpus=2, conditions=UNSCHEDULABLE)
    api = Api(
        [node("r0"), node("r1")],
        [pod("b0", node_name="r0", gpus=4, borrower=True), pod("b1", node_name="r1", gpus=4, borrower=True), waiting],
    )
    keep = keeper(api, lending_policy())
    observed = keep.run_once()
    assert (observed.waiting, set(observed.closed)) == (1, {"r0", "r1"})
    # The scheduler preempted b0 and bound the inference pod 7 s after its creation.
    api.pods[0]["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    ]
    waiting["spec"]["nodeName"] = "r0"
    waiting["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-04T10:00:07Z"}
    ]
    observed = keep.run_once()
    assert observed.bound == (7.0,) and observed.preempted == ("uid-b0",) and observed.waiting == 0
    assert keep.run_once().preempted == ()  # counted once
    metrics = Metrics()
    metrics.lending_round(observed)
    assert metrics.registry.get_sample_value("rocm_isolation_lending_inference_bind_seconds_count") == 1
    assert (
        metrics.registry.get_sample_value("rocm_isolation_lending_borrowers_taken_back_total", {"how": "preempted"})
        == 1
    )


def test_lending_off_removes_the_taint_and_a_conflict_is_retried_next_round() -> None:
    api = Api([node("r0", 4, TAINT), node("r1", 4, TAINT)], [])
    api.conflict = {"r1"}
    observed = keeper(api, lending_policy(enabled=False)).run_once()
    assert observed == Observed(written=("r0",), conflicts=("r1",))
    keeper(api, lending_policy(enabled=False)).run_once()
    assert tainted(api) == set()


def test_a_pod_labelled_to_borrow_without_the_borrowers_class_is_not_counted_as_lent() -> None:
    impostor = pod("b0", node_name="r0", gpus=4, borrower=True)
    impostor["spec"]["priorityClassName"] = "high"
    api = Api([node("r0")], [impostor])
    assert keeper(api, lending_policy()).run_once().lent == 0


def test_the_taint_patch_keeps_other_taints_and_says_nothing_when_nothing_changes() -> None:
    n = node("r0", 4, TAINT)
    assert taint_patch(n, TAINT, present=True) is None
    removed = taint_patch(n, TAINT, present=False)
    assert removed == {"metadata": {"resourceVersion": "1"}, "spec": {"taints": [RESERVED_TAINT]}}
    other_value = node("r0", 4, {**TAINT, "value": "other"})
    replaced = taint_patch(other_value, TAINT, present=True)
    assert replaced is not None and replaced["spec"]["taints"] == [RESERVED_TAINT, TAINT]


def test_a_round_exports_inference_demand_on_the_whole_reserved_nodes() -> None:
    api = Api(
        [node("r0"), node("r1"), node("r2")],
        [
            pod("b0", node_name="r0", gpus=4, borrower=True),
            pod("i0", node_name="r1", gpus=3),
            pod("llm", gpus=2, conditions=UNSCHEDULABLE),
        ],
    )
    observed = keeper(api, lending_policy()).run_once()
    metrics = Metrics()
    metrics.lending_round(observed)

    def gauge(name: str, nodes: str) -> float | None:
        return metrics.registry.get_sample_value(f"rocm_isolation_{name}", {"pool": "reserved", "nodes": nodes})

    found = {name: gauge(name, "whole") for name in ("reserved_nodes", "reserved_gpus", "reserved_gpus_inference",
                                                     "reserved_gpus_inference_waiting", "reserved_gpus_lent",
                                                     "reserved_gpus_idle", "reserved_nodes_gpus")}  # fmt: skip
    assert found == {
        "reserved_nodes": 3,
        "reserved_gpus": 12,
        "reserved_gpus_inference": 3,
        "reserved_gpus_inference_waiting": 2,
        "reserved_gpus_lent": 4,
        "reserved_gpus_idle": 5,
        "reserved_nodes_gpus": 12,
    }
    # No device-level reservation here: the split nodes' figures are zeros, not absent (max by keeps a series).
    assert gauge("reserved_gpus", "split") == 0
    # A replica that does not hold the Lease exports zeros for both kinds.
    metrics.lending_round(Observed())
    assert gauge("reserved_gpus_inference", "whole") == 0
