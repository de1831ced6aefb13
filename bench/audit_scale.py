"""``make bench-audit``: ``audit`` on a cluster of 5,000 nodes and 150,000 pods (the fake API).

Three processes, so that each measure is its own:

- the fake Kubernetes API (tests/fake_cluster.py, a real HTTP server paging like kube-apiserver),
  holding the objects built from the recorded fixtures (tests/fixtures/cluster/: a Node and a Pod
  as the apiserver returns them, managedFields and status included);
- the audit: ``rocm-isolation-webhook audit -o json`` run in a child process through the CLI entry
  point, which reports its own wall time and peak RSS (``ru_maxrss``);
- this driver, which writes the section "Audit at scale" of docs/benchmarks.md.

The cluster: 10% of the nodes reserved (labelled and tainted), 30 pods per node, 15,000 of them
finished (filtered out by the apiserver's field selector), a mix of GPU and CPU pods in 200
namespaces (20 of them inference), pods pending, and a few hundred findings.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench import sections

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fake_cluster import RESOURCES, FakeCluster, fixture  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
MARKER = "<!-- audit-scale: written by make bench-audit (bench/audit_scale.py) -->"
# Where the section ends: the sections after it (written by hand or by other benches) are kept.
END_MARKER = "<!-- /audit-scale -->"
NODES = 5_000
PODS = 150_000
BUDGET_SECONDS = 30.0
BUDGET_RSS_MIB = 500.0


def _resource(plural: str) -> Any:
    return next(r for r in RESOURCES if r.plural == plural and r.group == "")


def populate(cluster: FakeCluster, nodes: int, pods: int) -> dict[str, int]:
    """Store the objects, serialized once per object from the recorded templates."""
    node_template = fixture("node-reserved.json")
    pod_template = fixture("pod-training.json")
    for key in ("kind", "apiVersion"):
        node_template.pop(key)
        pod_template.pop(key)
    node_resource, pod_resource, ns_resource = _resource("nodes"), _resource("pods"), _resource("namespaces")
    reserved_every = 10
    for i in range(nodes):
        name = f"gpu-node-{i:05d}"
        reserved = i % reserved_every == 0
        obj = dict(node_template)
        labels = {k: v for k, v in node_template["metadata"]["labels"].items() if k != "rocm-isolation.io/pool"}
        labels["kubernetes.io/hostname"] = name
        if reserved:
            labels["rocm-isolation.io/pool"] = "inference"
        obj["metadata"] = {**node_template["metadata"], "name": name, "uid": f"node-{i}", "labels": labels}
        spec = dict(node_template["spec"])
        if not reserved:
            spec.pop("taints")
        obj["spec"] = spec
        cluster.add_encoded(
            node_resource, name, orjson.dumps(obj), labels, {"metadata.name": name, "metadata.namespace": ""}
        )
    namespaces = [f"team-{i:03d}" for i in range(200)]
    inference = set(namespaces[:20])
    for name in namespaces:
        labels = {"kubernetes.io/metadata.name": name}
        if name in inference:
            labels["rocm-isolation.io/class"] = "inference"
        body = {
            "metadata": {"name": name, "uid": f"ns-{name}", "labels": labels},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }
        cluster.add_encoded(
            ns_resource,
            name,
            orjson.dumps(body),
            labels,
            {"metadata.name": name, "metadata.namespace": "", "status.phase": "Active"},
        )

    inference_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "rocm-isolation.io/pool", "operator": "In", "values": ["inference"]}]}
                ]
            }
        }
    }
    inference_toleration = {
        "key": "rocm-isolation.io/reserved",
        "operator": "Equal",
        "value": "inference",
        "effect": "NoSchedule",
    }
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "llm"}},
            "matchLabelKeys": ["pod-template-hash"],
        }
    ]
    counts = {"finished": 0, "pending": 0, "gpu": 0, "misplaced": 0}
    for i in range(pods):
        namespace = namespaces[i % len(namespaces)]
        is_inference = namespace in inference
        node_index = i % nodes
        gpu = i % 5 < 2  # 40% GPU pods
        finished = i % 10 == 9
        pending = gpu and i % 150 == 0
        # A few hundred findings: training pods bound to reserved nodes.
        misplaced = gpu and not is_inference and i % 997 == 0
        if is_inference:
            # Inference pods on reserved nodes (every 10th node is reserved).
            node_index = (node_index // reserved_every) * reserved_every
        elif node_index % reserved_every == 0 and not misplaced:
            node_index += 1
        node_name = f"gpu-node-{node_index:05d}"
        name = f"pod-{i:06d}"
        obj = dict(pod_template)
        metadata = dict(pod_template["metadata"])
        metadata.update(name=name, namespace=namespace, uid=f"pod-{i}", generateName=None)
        metadata.pop("generateName")
        spec = dict(pod_template["spec"])
        container = dict(spec["containers"][0])
        if gpu:
            counts["gpu"] += 1
        else:
            container["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
            container.pop("env")
        if is_inference:
            metadata["labels"] = {"app": "llm", "pod-template-hash": "5f6d7c8b9"}
            metadata["annotations"] = {"rocm-isolation.io/class": "inference"}
            spec["affinity"] = inference_affinity
            spec["tolerations"] = [*spec["tolerations"], inference_toleration]
            spec["topologySpreadConstraints"] = spread
            if gpu:
                container["env"] = [{"name": "HSA_QUEUE_PRIORITY", "value": "high"}]
        if misplaced:
            spec.pop("affinity")
            counts["misplaced"] += 1
        spec["containers"] = [container]
        status = dict(pod_template["status"])
        phase = "Succeeded" if finished else "Running"
        if pending and not finished:
            spec.pop("nodeName")
            status = {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            }
            phase = "Pending"
            node_name = ""
            counts["pending"] += 1
        else:
            spec["nodeName"] = node_name
            status["phase"] = phase
        counts["finished"] += finished
        obj.update(metadata=metadata, spec=spec, status=status)
        fields = {
            "metadata.name": name,
            "metadata.namespace": namespace,
            "spec.nodeName": node_name,
            "status.phase": phase,
            "spec.schedulerName": "default-scheduler",
            "spec.serviceAccountName": "default",
            "status.nominatedNodeName": "",
        }
        cluster.add_encoded(pod_resource, f"{namespace}/{name}", orjson.dumps(obj), metadata["labels"], fields)
    return counts


def serve(nodes: int, pods: int) -> None:
    cluster = FakeCluster()
    counts = populate(cluster, nodes, pods)
    cluster.start()
    size = sum(len(s.body) for s in cluster.store[("", "pods")].values())
    print(json.dumps({"url": cluster.url, "pod_bytes": size, **counts}), flush=True)
    sys.stdin.read()  # until the driver closes the pipe
    cluster.stop()


def audit_child(kubeconfig: str) -> None:
    from webhook import cli

    out = io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(out):
        code = cli.main(["audit", "--kubeconfig", kubeconfig, "-o", "json"])
    seconds = time.perf_counter() - start
    report = json.loads(out.getvalue()) if out.getvalue() else {}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "exit": code,
                "seconds": seconds,
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
                "rss_mib": usage.ru_maxrss / 1024,
                "findings": len(report.get("findings", [])),
                "capacity": report.get("capacity"),
            }
        )
    )


def section(result: dict[str, Any], server: dict[str, Any], nodes: int, pods: int) -> str:
    time_ok = result["seconds"] < BUDGET_SECONDS
    rss_ok = result["rss_mib"] < BUDGET_RSS_MIB
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()
    capacity = result["capacity"]
    return "\n".join(
        [
            MARKER,
            "## Audit at scale",
            "",
            f"Generated by `make bench-audit` (`python -m bench.audit_scale`), commit `{commit}`, "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"load average {load[0]:.2f} before the audit started (other work on the machine stretches the "
            "wall time, not the CPU time).",
            "",
            f"`rocm-isolation-webhook audit -o json` against the fake API (tests/fake_cluster.py, a real HTTP server "
            f"in its own process, paging like kube-apiserver) holding {nodes:,} nodes and {pods:,} pods "
            f"({server['pod_bytes'] / 2**20:,.0f} MiB of pod JSON as the apiserver returns it, managedFields and "
            f"status included); {server['finished']:,} finished pods are filtered out by the field selector, "
            f"{server['gpu']:,} are GPU pods, {server['pending']:,} pending. Pages of 500. The audit runs in a child "
            "process through the CLI and measures itself.",
            "",
            "| requirement | measured | |",
            "| --- | --- | --- |",
            f"| wall time < {BUDGET_SECONDS:.0f} s | {result['seconds']:.1f} s (the audit process's CPU time: "
            f"{result['cpu_seconds']:.1f} s) | **{'met' if time_ok else 'NOT met'}** |",
            f"| peak RSS < {BUDGET_RSS_MIB:.0f} MiB | {result['rss_mib']:.0f} MiB (`ru_maxrss` of the audit process) "
            f"| **{'met' if rss_ok else 'NOT met'}** |",
            "",
            f"Exit code {result['exit']}, {result['findings']:,} findings; reserved pool: "
            f"{capacity['reserved']['nodes']:,} nodes, {capacity['reserved']['gpusAllocatable']:,} GPUs; shared: "
            f"{capacity['shared']['nodes']:,} nodes, {capacity['shared']['gpusAllocatable']:,} GPUs.",
            END_MARKER,
            "",
        ]
    )


def _legacy_end(current: str) -> str:
    """``current`` with the end marker put after a section written before the marker existed (up to issue 42):
    such a section ends at the next level-2 heading after its own (or at the end of the file)."""
    begin = current.find(MARKER)
    if begin < 0 or END_MARKER in current[begin:]:
        return current
    heading = current.find("\n## ", begin)  # its own heading
    following = current.find("\n## ", heading + 1) if heading >= 0 else -1
    end = following + 1 if following >= 0 else len(current)
    rest = current[end:]
    return current[:end].rstrip("\n") + "\n" + END_MARKER + "\n" + ("\n" + rest if rest else "")


def write_section(text: str, doc: Path = DOC) -> None:
    """Replace the section in ``doc`` (between its markers), or append it; every other section stays as it is
    (bench/sections.py, the one writer of the benches' sections). Up to issue 42 everything after the marker was
    cut, deleting the sections other benches had written."""
    current = _legacy_end(doc.read_text(encoding="utf-8"))
    doc.write_text(sections.replace_section(current, MARKER, END_MARKER, text), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--audit", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--pods", type=int, default=PODS)
    parser.add_argument("--no-write", action="store_true", help="print the section, do not write docs/benchmarks.md")
    args = parser.parse_args()
    if args.serve:
        serve(args.nodes, args.pods)
        return 0
    if args.audit:
        audit_child(args.audit)
        return 0
    print(f"building {args.nodes:,} nodes and {args.pods:,} pods in the fake API...", file=sys.stderr)
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.audit_scale", "--serve", "--nodes", str(args.nodes), "--pods", str(args.pods)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        info = json.loads(server.stdout.readline())
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = Path(tmp) / "kubeconfig"
            kubeconfig.write_text(
                json.dumps(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [{"name": "fake", "cluster": {"server": info["url"]}}],
                        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                        "current-context": "fake",
                    }
                )
            )
            print("auditing...", file=sys.stderr)
            child = subprocess.run(
                [sys.executable, "-m", "bench.audit_scale", "--audit", str(kubeconfig)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
        if child.returncode != 0:
            print(child.stderr, file=sys.stderr)
            return 1
        result = json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=60)
    text = section(result, info, args.nodes, args.pods)
    print(text)
    if not args.no_write:
        write_section(text)
    return 0 if result["seconds"] < BUDGET_SECONDS and result["rss_mib"] < BUDGET_RSS_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
