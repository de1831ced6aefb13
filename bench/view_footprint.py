"""``make bench-view``: what the lending keeper's view costs per GPU pod, in memory and per round (issue 41).

``make bench-scale`` measures the keeper against the real control plane with a cluster's non-GPU majority,
which the view does not keep. This measures the other side, the pods it does keep, where the apiserver
cannot go in two cores: GPU pods as the apiserver returns them (tests/fixtures/cluster/pod-training.json,
managedFields and status included), replicas of workloads of 8 pods each, on nodes with eight-GPU
ResourceSlices, projected as the view projects them (``cluster/projection.py``, replicas sharing what they
repeat), then read by a round as the keeper reads it (``ops/pool_read.read_cluster`` with its ``PodMemo``
and ``read_dra``, through ``ViewApi``):

- bytes per kept GPU pod, per node with its slice (``tracemalloc``: live Python memory, what RSS grows by);
- a round's reads, the first (every pod decided) and the next ones (unchanged pods not decided again),
  p50 of five.

Prints one JSON line per size.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from audit_cluster import EIGHT_SLOTS, split_node_slice  # noqa: E402
from cluster_objects import fixture, gpu_device, node  # noqa: E402

from webhook.cluster import projection  # noqa: E402
from webhook.cluster.kubeapi import KubeApi  # noqa: E402
from webhook.cluster.view import FrozenView  # noqa: E402
from webhook.core.policy import default_policy  # noqa: E402
from webhook.ops.pool.read import PodMemo, read_cluster, read_dra  # noqa: E402

REPLICAS = 8
NAMESPACES = 50


def gpu_pod(index: int, node_name: str) -> dict[str, Any]:
    """A GPU pod as the apiserver stores it, the replica ``index % 8`` of workload ``index // 8``."""
    pod = copy.deepcopy(fixture("pod-training.json"))
    workload = index // REPLICAS
    metadata = pod["metadata"]
    metadata.update(
        name=f"train-{workload}-{index % REPLICAS}",
        namespace=f"team-{workload % NAMESPACES}",
        uid=f"uid-{index:08d}",
        resourceVersion=str(10_000 + index),
    )
    metadata["labels"] = {**(metadata.get("labels") or {}), "app": f"train-{workload}", "pod-template-hash": "x"}
    for ref in metadata.get("ownerReferences") or []:
        ref["name"], ref["uid"] = f"train-{workload}", f"uid-rs-{workload}"
    pod["spec"]["nodeName"] = node_name
    pod["spec"]["containers"][0]["resources"] = {"limits": {"amd.com/gpu": "1"}, "requests": {"amd.com/gpu": "1"}}
    return pod


def measure(nodes: int, pods: int) -> dict[str, Any]:
    policy = default_policy()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    node_objects = [projection.node_projection(node(f"n{i}", allocatable={})) for i in range(nodes)]
    slices = []
    for i in range(nodes):
        found = split_node_slice(f"n{i}", *(gpu_device(f"gpu-{g}", pci) for g, pci in enumerate(EIGHT_SLOTS)))
        found["metadata"].update(name=f"n{i}-gpu", uid=f"uid-slice-{i}", resourceVersion="7")
        slices.append(projection.without_managed_fields(found))
    after_nodes = tracemalloc.get_traced_memory()[0]
    shared = projection.Shared()
    kept = [projection.pod_projection(gpu_pod(i, f"n{i % nodes}"), shared) for i in range(pods)]
    after_pods = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    group = "resource.k8s.io/v1"
    view = FrozenView(
        {
            "version": {"gitVersion": "v1.36.2"},
            "discovery": {
                group: ["deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"],
                "resource.k8s.io/v1beta2": [],
                "resource.k8s.io/v1beta1": [],
                "resource.k8s.io/v1alpha3": [],
            },
            "collections": {
                "/api/v1/nodes": {"resource": "nodes", "namespaced": False, "items": node_objects},
                "/api/v1/namespaces": {
                    "resource": "namespaces",
                    "namespaced": False,
                    "items": [{"metadata": {"name": f"team-{n}"}} for n in range(NAMESPACES)],
                },
                "/api/v1/pods": {"resource": "pods", "namespaced": True, "items": kept},
                f"/apis/{group}/resourceslices": {"resource": "resourceslices", "namespaced": False, "items": slices},
                f"/apis/{group}/deviceclasses": {"resource": "deviceclasses", "namespaced": False, "items": []},
                f"/apis/{group}/resourceclaims": {"resource": "resourceclaims", "namespaced": True, "items": []},
                f"/apis/{group}/resourceclaimtemplates": {
                    "resource": "resourceclaimtemplates",
                    "namespaced": True,
                    "items": [],
                },
            },
        }
    )
    gc.collect()
    gc.freeze()  # what the keeper does once its view has synced (service/lending_loop.py)
    api = view.api(KubeApi(object()))
    memo = PodMemo()
    rounds = []
    for _ in range(6):
        started = time.perf_counter()
        cluster = read_cluster(api, policy, memo)
        read_dra(api, policy, claims=True, required=False)
        rounds.append(time.perf_counter() - started)
    assert len(cluster.pods) == pods and api.passed_through == 0
    return {
        "nodes": nodes,
        "gpu_pods": pods,
        "bytes_per_node_with_slice": round((after_nodes - base) / nodes),
        "bytes_per_gpu_pod": round((after_pods - after_nodes) / pods),
        "shared_copies": len(shared),
        "first_round_s": round(rounds[0], 3),
        "next_rounds_p50_s": round(statistics.median(rounds[1:]), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000:8000,5000:40000", help="nodes:GPU pods, comma-separated")
    args = parser.parse_args()
    for size in args.sizes.split(","):
        nodes, pods = (int(n) for n in size.split(":"))
        print(json.dumps(measure(nodes, pods)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
