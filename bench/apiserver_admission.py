"""Admission latency as the apiserver itself reports it, with and without the placement policy.

On a real control plane (the end-to-end suite's: tests/e2e/controlplane.py and harness.py, v1.36 from
``KUBEBUILDER_ASSETS``) with the product installed from its manifests, N GPU pods are created by
server-side dry-run in a training and an inference namespace, in three configurations:

- ``map+webhook``: everything installed (the MutatingAdmissionPolicy places, the webhook adds the rest);
- ``webhook``: the MutatingAdmissionPolicyBinding deleted (placement by the webhook alone);
- ``map``: the MutatingWebhookConfiguration deleted (what a webhook outage amounts to).

The figures are the apiserver's own histograms (``/metrics``), scraped before and after each
configuration's pods and subtracted: the mutating admission step (``type="admit"``, which holds the
MAP and every mutating webhook), the validating step, each admission plugin
(``apiserver_admission_controller_admission_duration_seconds``), the webhook's call
(``apiserver_admission_webhook_admission_duration_seconds``) and the placement policy's own
evaluation (``apiserver_mutating_admission_policy_check_duration_seconds``). Mean = sum / count; p99
interpolated in the buckets as Prometheus' ``histogram_quantile`` does (so it is only as fine as the
bucket bounds: 5 ms, 10 ms, 25 ms... for the step histograms).

    KUBEBUILDER_ASSETS=.cache/envtest/bin python -m bench.apiserver_admission [--pods 200] [--json]

No timing is asserted anywhere: the numbers depend on the machine (docs/benchmarks.md says which).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.controlplane import ASSETS_ENV, HOW_TO_GET_BINARIES, LOOPBACK, ControlPlane, free_port, missing_binaries
from tests.e2e.harness import (
    MI300X_LABELS,
    RESERVED_NODES,
    SHARED_NODES,
    WEBHOOK_CONFIGURATION,
    cli,
    gpu_pod,
    install,
    make_node,
    render_manifests,
    service_account_kubeconfig,
    start_webhook,
    wait_reserved_nodes_known,
)
from tests.e2e.kube import Kube, Obj, wait_until
from webhook.deploy import mutating_policy

CLASS_LABEL = "rocm-isolation.io/class"
NAMESPACES = {"training": "bench-training", "inference": "bench-inference"}
CONFIGURATIONS = ("map+webhook", "webhook", "map")

STEP = "apiserver_admission_step_admission_duration_seconds"
PLUGIN = "apiserver_admission_controller_admission_duration_seconds"
WEBHOOK = "apiserver_admission_webhook_admission_duration_seconds"
MAP_CHECK = "apiserver_mutating_admission_policy_check_duration_seconds"
_CREATED = {"operation": "CREATE", "rejected": "false"}
# (row name, metric, the labels a sample must carry). None of them has a resource label: they count
# every CREATE, and nothing else is created while the pods are (no kubelet, no running pods).
SERIES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("mutating step (all admit plugins)", STEP, {"type": "admit", **_CREATED}),
    ("validating step (all validate plugins)", STEP, {"type": "validate", **_CREATED}),
    ("plugin MutatingAdmissionPolicy", PLUGIN, {"name": "MutatingAdmissionPolicy", **_CREATED}),
    ("plugin MutatingAdmissionWebhook", PLUGIN, {"name": "MutatingAdmissionWebhook", **_CREATED}),
    ("plugin ValidatingAdmissionPolicy", PLUGIN, {"name": "ValidatingAdmissionPolicy", **_CREATED}),
    ("webhook call pods.rocm-isolation.io", WEBHOOK, {"name": "pods.rocm-isolation.io", **_CREATED}),
    ("MAP evaluation rocm-isolation-placement", MAP_CHECK, {"policy": mutating_policy.POLICY_NAME}),
)


# --- histograms -----------------------------------------------------------------------------------


@dataclass
class Histogram:
    """One histogram summed over the label sets that match: cumulative buckets, sum, count."""

    buckets: dict[float, float]
    total: float
    count: float

    def __sub__(self, other: Histogram) -> Histogram:
        return Histogram(
            {le: n - other.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.total - other.total,
            self.count - other.count,
        )

    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus' histogram_quantile: linear within the bucket the rank falls in."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le in sorted(self.buckets):
            cumulative = self.buckets[le]
            if cumulative >= rank:
                if math.isinf(le):
                    return lower  # the highest finite bound, as Prometheus does
                width = cumulative - below
                return lower + (le - lower) * ((rank - below) / width if width else 1.0)
            lower, below = le, cumulative
        return lower


def histograms(text: str) -> dict[str, list[tuple[dict[str, str], str, float]]]:
    """Metric family -> its samples (labels, sample name, value) for the histograms of SERIES."""
    wanted = {metric for _, metric, _ in SERIES}
    out: dict[str, list[tuple[dict[str, str], str, float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in wanted:
            out[family.name] = [(dict(s.labels), s.name, s.value) for s in family.samples]
    return out


def select(samples: Iterable[tuple[dict[str, str], str, float]], labels: dict[str, str]) -> Histogram:
    buckets: dict[float, float] = {}
    total = count = 0.0
    for sample_labels, name, value in samples:
        if any(sample_labels.get(key) != want for key, want in labels.items()):
            continue
        if name.endswith("_bucket"):
            le = float(sample_labels["le"])
            buckets[le] = buckets.get(le, 0.0) + value
        elif name.endswith("_sum"):
            total += value
        elif name.endswith("_count"):
            count += value
    return Histogram(buckets, total, count)


def scrape(kube: Kube) -> dict[str, Histogram]:
    text = kube.request("GET", "/metrics", raw=True)
    families = histograms(text)
    return {row: select(families.get(metric, []), labels) for row, metric, labels in SERIES}


# --- the cluster ----------------------------------------------------------------------------------


@dataclass
class Bench:
    plane: ControlPlane
    kube: Kube
    manifests: list[Obj]

    def document(self, kind: str) -> Obj:
        return next(d for d in self.manifests if d["kind"] == kind)

    def count(self, row: str) -> float:
        return scrape(self.kube)[row].count

    def probe(self) -> None:
        self.kube.create(gpu_pod("probe", NAMESPACES["inference"]), dry_run=True)

    def stops_counting(self, row: str) -> Callable[[], bool]:
        """True once a probe pod no longer moves ``row``'s count (the apiserver's informer has caught up)."""

        def check() -> bool:
            before = self.count(row)
            self.probe()
            self.probe()
            return self.count(row) == before

        return check

    def counts_again(self, row: str) -> Callable[[], bool]:
        def check() -> bool:
            before = self.count(row)
            self.probe()
            return self.count(row) > before

        return check

    @contextmanager
    def configuration(self, name: str) -> Iterator[None]:
        if name == "map+webhook":
            yield
            return
        if name == "webhook":
            kind, row = "MutatingAdmissionPolicyBinding", "MAP evaluation rocm-isolation-placement"
            self.kube.delete(kind, mutating_policy.POLICY_NAME)
        else:
            kind, row = "MutatingWebhookConfiguration", "webhook call pods.rocm-isolation.io"
            self.kube.delete(kind, WEBHOOK_CONFIGURATION)
        wait_until(self.stops_counting(row), timeout=60, what=f"the apiserver to drop the {kind}")
        try:
            yield
        finally:
            self.kube.apply(self.document(kind))
            wait_until(self.counts_again(row), timeout=60, what=f"the apiserver to call the {kind} again")


def start(workdir: Path) -> Bench:
    """The end-to-end suite's session set-up (tests/e2e/conftest.py), reduced to what admission needs:
    nodes (the webhook knows the reserved ones), the manifests, the webhook, ``pool apply``."""
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ.pop(variable, None)
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = f"{LOOPBACK},localhost"
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), workdir / "controlplane")
    plane.start()
    kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
    for name in RESERVED_NODES + SHARED_NODES:
        make_node(kube, name, MI300X_LABELS)
    cert_dir = workdir / "webhook" / "certs"
    cli("certs", "--out-dir", str(cert_dir), check=True)
    port = free_port()
    manifests = render_manifests(cert_dir / "ca.crt", port)
    install(plane, [doc for doc in manifests if doc["kind"] != "MutatingWebhookConfiguration"])
    start_webhook(plane, workdir / "webhook", service_account_kubeconfig(plane), cert_dir=cert_dir, port=port)
    install(plane, [doc for doc in manifests if doc["kind"] == "MutatingWebhookConfiguration"])
    result = cli("pool", "apply", "--nodes", ",".join(RESERVED_NODES), kubeconfig=plane.admin_kubeconfig)
    if result.returncode != 0:
        raise RuntimeError(result.stdout + result.stderr)
    wait_reserved_nodes_known(kube, RESERVED_NODES[0])
    for class_name, namespace in NAMESPACES.items():
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": {CLASS_LABEL: class_name}},
            }
        )
        # The controller-manager creates the default ServiceAccount; pod admission needs it.
        wait_until(_default_account(kube, namespace), timeout=60, what=f"{namespace}/default")
    return Bench(plane, kube, manifests)


def _default_account(kube: Kube, namespace: str) -> Callable[[], bool]:
    return lambda: any(sa["metadata"]["name"] == "default" for sa in kube.list("ServiceAccount", namespace))


def measure(bench: Bench, pods: int) -> dict[str, Any]:
    """Every configuration's pods, alternating training and inference; the histogram deltas."""
    results: dict[str, Any] = {}
    for name in CONFIGURATIONS:
        with bench.configuration(name):
            for _ in range(10):  # warm-up, not counted
                bench.probe()
            before = scrape(bench.kube)
            started = time.perf_counter()
            for i in range(pods):
                for namespace in NAMESPACES.values():
                    bench.kube.create(gpu_pod(f"pod-{i}", namespace), dry_run=True)
            elapsed = time.perf_counter() - started
            after = scrape(bench.kube)
        created = len(NAMESPACES) * pods
        rows = {}
        for row in after:
            delta = after[row] - before[row]
            rows[row] = {
                # Observations per pod: the mutating plugins run twice (the reinvocation pass), the MAP's
                # check once per mutation and pass.
                "per_pod": delta.count / created,
                "ms_per_pod": delta.total / created * 1e3,
                "mean_ms": delta.mean() * 1e3,
                "p99_ms": delta.quantile(0.99) * 1e3,
            }
        results[name] = {"pods": created, "client_ms_per_pod": elapsed / created * 1e3, "series": rows}
    return results


def table(results: dict[str, Any]) -> str:
    """Per configuration: ms per pod (observations per pod) and the p99 of one observation."""
    lines = [
        "| series | " + " | ".join(f"{name}: ms/pod (obs/pod), p99 ms" for name in results) + " |",
        "| --- |" + " ---: |" * len(results),
    ]
    for row, _, _ in SERIES:
        cells = []
        for name in results:
            f = results[name]["series"][row]
            cells.append("—" if not f["per_pod"] else f"{f['ms_per_pod']:.2f} ({f['per_pod']:g}), {f['p99_ms']:.1f}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    client = " | ".join(f"{results[name]['client_ms_per_pod']:.1f}" for name in results)
    lines.append(f"| client round trip per pod (dry-run create) | {client} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=200, help="pods per namespace and configuration")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON, not a table")
    args = parser.parse_args(argv)
    missing = missing_binaries(os.environ.get(ASSETS_ENV))
    if missing:
        print(f"bench.apiserver_admission needs {ASSETS_ENV} ({', '.join(missing)} missing): {HOW_TO_GET_BINARIES}")
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-apiserver-") as directory:
        bench = start(Path(directory))
        try:
            results = measure(bench, args.pods)
        finally:
            bench.plane.stop()
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
