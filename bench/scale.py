"""``make bench-scale``: what the lending keeper of ``serve`` costs the apiserver, and itself, as the cluster grows
(issue 41, item 3), on the real control plane of ``KUBEBUILDER_ASSETS``.

One control plane (tests/e2e/controlplane.py: etcd, kube-apiserver; kube-scheduler and kube-controller-manager only
while setting up and for the reclaim at the end, so that the apiserver's figures during a window are serve's and the
apiserver's own), the product installed from its manifests, a policy with lending on (grace ``--grace``), and a
cluster grown size by size (``--sizes NODES:PODS,...``, cumulative):

- Node objects (no kubelet): MI300X labels, allocatable cpu/memory/pods, Ready, the not-ready taint removed;
- one ResourceSlice per node as AMD's DRA driver ``gpu.amd.com`` publishes it (4 GPUs: tests/e2e/harness.pci_slice),
  split 2 + 2 by ``pool apply --devices-per-node 2`` (run again at each size: the new nodes);
- non-GPU filler pods bound by ``spec.nodeName`` (round robin over the nodes, 20 namespaces, created by concurrent
  POSTs; labelled ``rocm-isolation.io/ignore: "true"`` so that creating them does not go through the webhook,
  which is down meanwhile; every reader still lists them).

At each size, in order:

1. **background**: ``--background-seconds`` of the apiserver with no ``serve`` (two scrapes of its ``/metrics``):
   what the apiserver does by itself, subtracted from the window below;
2. ``serve`` started (``--lending-seconds``, ``--audit-interval-seconds``: by default longer than the run, so
   that the background audit runs once, at startup, and never in the window), as the webhook's ServiceAccount;
   waited for until it holds the Lease, its first audit has finished and a round with a synced view is done,
   then one more round;
3. **steady window** (``--window-seconds``): two scrapes of the apiserver's ``/metrics`` (requests by verb and
   resource, response bytes of GET/LIST, watch events and their bytes), of serve's ``/metrics`` (the round
   histogram ``rocm_isolation_lending_round_seconds``), and of ``/proc`` (serve's CPU, its waited-for children's,
   its RSS; the apiserver's CPU);
4. ``serve`` stopped.

Between 1 and 2, **one audit run** as the background audit runs it (``webhook.service.auditloop.audit_command``:
``nice -n 10 python -m webhook audit -o json``, serve's kubeconfig and policy) between two scrapes: its requests,
bytes, CPU and peak RSS (``wait4``), alone. The apiserver runs with ``--authorization-mode=RBAC`` (no kubelets: the
Node authorizer's own pod informer re-watches inside the apiserver would land in the windows).

At the largest size, before step 4 (``--reclaim``, default on): the scheduler and the controller-manager again,
two of the nodes labelled for the test, the tests' kubelet stand-in (tests/e2e/kubelet.py) on two namespaces,
``--borrowers`` borrower pods (one device each, pinned to those two nodes: the shared devices first, then the lent
reserved ones), then one inference pod of one device pinned there: its creation-to-binding time (the keeper must
evict a borrower; grace ``--grace``).

Extrapolation to 5,000 nodes / 150,000 pods: ordinary least squares of each figure on the pods of the sizes
(``scale_figures.least_squares``; the nodes grow with the pods, 20-30 pods a node).

    KUBEBUILDER_ASSETS=.cache/envtest/bin python -m bench.scale [--sizes 50:1000,200:5000,500:15000,1000:30000]
        [--window-seconds 60] [--label TEXT] [--save-before] [--no-reclaim] [--no-write]

The last line printed is the figures as one JSON object; docs/benchmarks.md gets its section (replaced in place,
nothing else touched) and docs/bench-scale.png the plot, unless ``--no-write``. ``--save-before`` also keeps this
run's figures in bench/scale_before.json: later runs show them beside their own ("before the watched view").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from cluster_objects import exactly, new_claim_pod, new_claim_template

from bench import reviews, sections
from bench import scale_figures as sf
from tests.e2e.controlplane import (
    ASSETS_ENV,
    HOW_TO_GET_BINARIES,
    LOOPBACK,
    Component,
    ControlPlane,
    ProcessGroup,
    free_port,
    loopback_environment,
    loopback_only,
    missing_binaries,
)
from tests.e2e.harness import (
    DEVICE_CLASS,
    MI300X_LABELS,
    PCI_SLOTS,
    WEBHOOK_NAMESPACE,
    Webhook,
    cli,
    install,
    pci_slice,
    render_manifests,
    service_account_kubeconfig,
)
from tests.e2e.kube import ApiError, Kube, Obj, wait_until
from tests.e2e.kubelet import KubeletStandIn
from webhook.core.policy import default_policy, default_policy_text

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "bench-scale.png"
BEFORE = ROOT / "bench" / "scale_before.json"
SECTION_BEGIN = "<!-- bench-scale: written by make bench-scale (bench/scale.py) -->"
SECTION_END = "<!-- bench-scale: end -->"
TITLE = "## The lending keeper at scale (make bench-scale)"

POLICY = default_policy()
DRIVER = POLICY.spec.reserved_devices.driver
RESERVED_CLASS = POLICY.spec.reserved_devices.reserved_class_name
LENDABLE_CLASS = "rocm-isolation-lendable"
BORROW_LABEL = POLICY.spec.lending.pod_label
LENDING_LABEL = POLICY.spec.lending.namespaces.label_key
CLASS_LABEL = POLICY.spec.labels.namespace_class
RESERVED_PCI_ANNOTATION = "rocm-isolation.io/reserved-pci-bus-ids"
OPT_OUT = "rocm-isolation.io/ignore"
RECLAIM_LABEL = "bench.rocm-isolation.io/reclaim"
FILL_NAMESPACES = tuple(f"fill-{i:02d}" for i in range(20))
TRAIN, SERVE = "scale-train", "scale-serve"
DEFAULT_SIZES = "50:1000,200:5000,500:15000,1000:30000"
TARGET = sf.Size(5000, 150_000)
MIB = 1024.0 * 1024.0
TICKS = float(os.sysconf("SC_CLK_TCK"))

SERVE_METRICS = (
    "rocm_isolation_lending_round_seconds_bucket",
    "rocm_isolation_lending_round_seconds_count",
    "rocm_isolation_lending_round_seconds_sum",
    "rocm_isolation_lending_view_synced",
    "rocm_isolation_audit_leader",
    "rocm_isolation_audit_runs_total",
    "rocm_isolation_lending_borrowers_taken_back_total",
    "rocm_isolation_lending_view_bytes_total",
)
ROUND = "rocm_isolation_lending_round_seconds"
VIEW_BYTES = "rocm_isolation_lending_view_bytes_total"


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Settings:
    sizes: tuple[sf.Size, ...]
    window: float = 60.0
    background: float = 15.0
    lending_seconds: float = 5.0
    audit_interval: float = 3600.0
    grace: int = 5
    borrowers: int = 8
    threads: int = 12
    reclaim: bool = True
    admission_rate: float = 100.0  # reviews/s into serve after each window (0: none)
    admission_seconds: float = 20.0


# --- what the cluster holds ------------------------------------------------------------------------------------


def node_name(index: int) -> str:
    return f"scale-{index:04d}"


def filler_pod(index: int, node: str) -> Obj:
    """A non-GPU pod as a Deployment's would look (two containers' requests, labels, an env), bound by name."""
    app = f"svc-{index % 97:02d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"fill-{index:06d}",
            "namespace": FILL_NAMESPACES[index % len(FILL_NAMESPACES)],
            "labels": {"app": app, "pod-template-hash": f"{index % 9973:05x}", "tier": "web", OPT_OUT: "true"},
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "app",
                    "image": f"registry.example.com/{app}:1.{index % 7}",
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "env": [{"name": "APP", "value": app}, {"name": "REPLICA", "value": str(index)}],
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                },
                {
                    "name": "sidecar",
                    "image": "registry.example.com/proxy:2.1",
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                },
            ],
        },
    }


def policy_text(grace: int) -> str:
    document = yaml.safe_load(default_policy_text())
    document["spec"]["lending"] = {"enabled": True, "reclaimGraceSeconds": grace}
    return yaml.safe_dump(document, sort_keys=False)


def train_or_serve_pod(name: str, namespace: str, labels: dict[str, str]) -> Obj:
    """A pod of the claim template ``gpu``, on the nodes labelled for the reclaim."""
    return new_claim_pod(
        name,
        namespace,
        template="gpu",
        labels=labels,
        terminationGracePeriodSeconds=30,
        nodeSelector={RECLAIM_LABEL: "true"},
    )


# --- measuring -------------------------------------------------------------------------------------------------


def read_proc(pid: int) -> tuple[sf.CpuTimes, float | None, float | None]:
    """CPU times, VmRSS and VmHWM (KiB) of a live process."""
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    return sf.parse_stat(stat, TICKS), sf.parse_status_kib(status, "VmRSS"), sf.parse_status_kib(status, "VmHWM")


@dataclass
class Scrape:
    at: float
    api: sf.Samples
    serve: sf.Samples = field(default_factory=dict)
    serve_cpu: sf.CpuTimes | None = None
    apiserver_cpu: sf.CpuTimes | None = None


def flows_json(flows: sf.Traffic, verbs: tuple[str, ...] = ("LIST", "WATCH")) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for verb in verbs:
        by_resource = flows.get(verb, {})
        out[verb] = {
            r: {"requests": round(f.requests, 2), "bytes": round(f.bytes), "events": round(f.events, 2)}
            for r, f in sorted(by_resource.items())
            if f.requests or f.bytes or f.events
        }
    others = {v: sf.verb_total(flows, v) for v in flows if v not in verbs}
    out["other"] = {v: {"requests": round(f.requests, 2), "bytes": round(f.bytes)} for v, f in sorted(others.items())}
    return out


class RbacOnlyPlane(ControlPlane):
    """The e2e control plane with ``--authorization-mode=RBAC``: the Node authorizer (for kubelets, of which there
    are none) keeps informers of pods and ResourceSlices inside the apiserver whose re-watches (tens of MB at 15,000
    pods) land in whatever window is open and are no client's traffic."""

    def start(self) -> None:
        original = ProcessGroup.start

        def start(group: ProcessGroup, name: str, argv: Any, *, env: Any = None) -> Component:
            if name == "kube-apiserver":
                argv = ["--authorization-mode=RBAC" if a == "--authorization-mode=Node,RBAC" else a for a in argv]
            return original(group, name, argv, env=env)

        ProcessGroup.start = start  # type: ignore[method-assign]
        try:
            super().start()
        finally:
            ProcessGroup.start = original  # type: ignore[method-assign]


class Bench:
    def __init__(self, settings: Settings, workdir: Path) -> None:
        self.settings, self.workdir = settings, workdir
        self.nodes = 0
        self.pods = 0
        self.notes: list[str] = []
        self.serve: Webhook | None = None
        self.controllers: list[tuple[str, list[str]]] = []

    # --- setting up ---

    def start(self) -> None:
        self.plane = RbacOnlyPlane(Path(os.environ[ASSETS_ENV]), self.workdir / "controlplane")
        self.plane.start()
        kube = self.kube = Kube(LOOPBACK, self.plane.apiserver_port, self.plane.ssl_context())
        self.apiserver = next(c for c in self.plane.processes.components if c.name == "kube-apiserver")
        kube.apply(DEVICE_CLASS)
        self.policy_file = self.workdir / "policy.yaml"
        self.policy_file.write_text(policy_text(self.settings.grace), encoding="utf-8")
        self.cert_dir = self.workdir / "webhook" / "certs"
        cli("certs", "--out-dir", str(self.cert_dir), check=True)
        self.port = free_port()
        install(self.plane, render_manifests(self.cert_dir / "ca.crt", self.port, self.policy_file))
        self.sa_kubeconfig = service_account_kubeconfig(self.plane)
        namespaces = [(n, {}) for n in FILL_NAMESPACES] + [
            (TRAIN, {CLASS_LABEL: "training", LENDING_LABEL: "allowed"}),
            (SERVE, {CLASS_LABEL: "inference"}),
        ]
        for name, labels in namespaces:
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        for name, _ in namespaces:  # the controller-manager makes their default ServiceAccount
            wait_until(lambda name=name: kube.get_or_none("ServiceAccount", "default", name), what=f"{name}/default")
        # The windows measure serve and the apiserver alone: the scheduler and the controller-manager come back
        # for the reclaim at the end (their command lines kept to start them again).
        for name in ("kube-scheduler", "kube-controller-manager"):
            component = next(c for c in self.plane.processes.components if c.name == name)
            self.controllers.append((name, [str(a) for a in component.process.args]))  # type: ignore[union-attr]
            self.plane.processes.stop_one(component)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.plane.stop()

    def _node(self, index: int) -> None:
        name = node_name(index)
        kube = self.kube
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        kube.create(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {**labels, **MI300X_LABELS}}}
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "bench-scale: no kubelet, status written by the bench",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        status = {"capacity": resources, "allocatable": dict(resources), "conditions": [ready]}
        kube.patch("Node", name, {"status": status}, subresource="status")
        kube.patch("Node", name, {"spec": {"taints": None}})  # the not-ready taint admission added
        kube.create(pci_slice(name))

    def _pod(self, index: int, nodes: int) -> None:
        for attempt in range(5):
            try:
                self.kube.create(filler_pod(index, node_name(index % nodes)))
                return
            except ApiError as err:
                if err.status == 409:
                    return
                if attempt == 4 or err.status not in (429, 500, 503, 504):
                    raise
                time.sleep(0.5 * (attempt + 1))

    def grow(self, size: sf.Size) -> dict[str, float]:
        began = time.monotonic()
        with ThreadPoolExecutor(self.settings.threads) as pool:
            list(pool.map(self._node, range(self.nodes, size.nodes)))
            made_nodes = time.monotonic()
            list(pool.map(lambda i: self._pod(i, size.nodes), range(self.pods, size.pods), chunksize=64))
        done = time.monotonic()
        new_pods = size.pods - self.pods
        self.nodes, self.pods = max(self.nodes, size.nodes), max(self.pods, size.pods)
        result = cli("pool", "apply", "--devices-per-node", "2", kubeconfig=self.plane.admin_kubeconfig, timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"pool apply --devices-per-node 2: {result.stdout}\n{result.stderr}")
        pool_seconds = time.monotonic() - done
        figures = {
            "nodes_seconds": round(made_nodes - began, 1),
            "pods_seconds": round(done - made_nodes, 1),
            "pods_per_second": round(new_pods / max(done - made_nodes, 1e-9), 1),
            "pool_apply_seconds": round(pool_seconds, 1),
        }
        log(f"grown to {size.nodes} nodes, {size.pods} pods: {figures}")
        return figures

    # --- serve ---

    def start_serve(self, name: str) -> Webhook:
        s = self.settings
        argv = [
            sys.executable, "-m", "webhook", "serve",
            "--cert-dir", str(self.cert_dir),
            "--policy", str(self.policy_file),
            "--host", LOOPBACK,
            "--port", str(self.port),
            "--kubeconfig", str(self.sa_kubeconfig),
            "--lending-seconds", f"{s.lending_seconds:g}",
            "--audit-interval-seconds", f"{s.audit_interval:g}",
            "--log-summary-seconds", "0",
        ]  # fmt: skip
        env = loopback_environment()
        env["POD_NAMESPACE"] = WEBHOOK_NAMESPACE
        component = self.plane.processes.start(name, argv, env=env)
        serve = Webhook(self.port, self.cert_dir, self.policy_file, component, self.cert_dir / "ca.crt")
        deadline = time.monotonic() + 600
        while not serve.ready():
            if component.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not become ready:\n{component.tail()}")
            time.sleep(0.5)
        self.serve = serve
        return serve

    def serve_metrics(self) -> sf.Samples:
        assert self.serve is not None
        _, text = self.serve.get("/metrics")
        return sf.parse_prometheus(text, SERVE_METRICS)

    def wait_steady(self, started: float) -> dict[str, float]:
        """Until serve holds the Lease, its first audit is over and a round saw a synced view; then one more round."""
        deadline = time.monotonic() + 900
        synced_at: float | None = None
        audited_at: float | None = None
        while True:
            m = self.serve_metrics()
            leader = sum(sf.total(m, "rocm_isolation_audit_leader").values())
            audits = sum(sf.total(m, "rocm_isolation_audit_runs_total").values())
            rounds = sum(sf.total(m, f"{ROUND}_count").values())
            synced = sum(sf.total(m, "rocm_isolation_lending_view_synced").values())
            now = time.monotonic()
            if leader and rounds and synced and synced_at is None:
                synced_at = now
            if audits and audited_at is None:
                audited_at = now
            if synced_at is not None and audited_at is not None:
                break
            if now > deadline:
                raise RuntimeError(
                    f"serve not steady: leader {leader}, audits {audits}, rounds {rounds}, synced {synced}"
                )
            time.sleep(0.5)
        wait_until(
            lambda: sum(sf.total(self.serve_metrics(), f"{ROUND}_count").values()) > rounds,
            timeout=300,
            interval=0.5,
            what="one more round",
        )
        return {
            "synced_seconds": round(synced_at - started, 1),
            "first_audit_done_seconds": round(audited_at - started, 1),
        }

    def scrape(self, serve: bool = True) -> Scrape:
        at = time.monotonic()
        api = sf.parse_prometheus(self.kube.metrics(), sf.APISERVER_METRICS)
        result = Scrape(at, api)
        result.apiserver_cpu = read_proc(self.apiserver.process.pid)[0]
        if serve and self.serve is not None:
            result.serve = self.serve_metrics()
            result.serve_cpu = read_proc(self.serve.component.process.pid)[0]
        return result

    def background(self) -> tuple[sf.Traffic, float]:
        time.sleep(3)
        first = self.scrape(serve=False)
        time.sleep(self.settings.background)
        last = self.scrape(serve=False)
        seconds = last.at - first.at
        flows = sf.traffic(sf.difference(first.api, last.api), seconds)
        cpu = 0.0
        if first.apiserver_cpu and last.apiserver_cpu:
            cpu = (last.apiserver_cpu.own - first.apiserver_cpu.own) * 60.0 / seconds
        return flows, cpu

    def window(self, background: sf.Traffic) -> dict[str, Any]:
        assert self.serve is not None
        pid = self.serve.component.process.pid
        first = self.scrape()
        rss_samples: list[float] = []
        end = first.at + self.settings.window
        while time.monotonic() < end:
            time.sleep(min(5.0, max(0.0, end - time.monotonic())))
            rss = read_proc(pid)[1]
            if rss is not None:
                rss_samples.append(rss)
        last = self.scrape()
        seconds = last.at - first.at
        raw = sf.traffic(sf.difference(first.api, last.api), seconds)
        served = sf.minus(raw, background)
        serve_delta = sf.difference(first.serve, last.serve)
        buckets, count, total_sum = sf.histogram(serve_delta, ROUND)
        # serve's own count of what its view received (list pages, watch events), beside the apiserver's figures
        view_bytes = sf.total(serve_delta, VIEW_BYTES, "how")
        get_bytes = sf.verb_total(served, "GET").bytes
        _, rss, hwm = read_proc(pid)
        assert first.serve_cpu and last.serve_cpu and first.apiserver_cpu and last.apiserver_cpu
        per_minute = 60.0 / seconds
        return {
            "window_seconds": round(seconds, 1),
            "serve_bytes_per_min": round(sf.all_bytes(served)),
            "raw_bytes_per_min": round(sf.all_bytes(raw)),
            "list_requests_per_min": round(sf.verb_total(served, "LIST").requests, 1),
            "list_bytes_per_min": round(sf.verb_total(served, "LIST").bytes),
            "watch_events_per_min": round(sf.verb_total(served, "WATCH").events, 1),
            "watch_bytes_per_min": round(sf.verb_total(served, "WATCH").bytes),
            "get_requests_per_min": round(sf.verb_total(served, "GET").requests, 1),
            "view_list_bytes_per_min": round(view_bytes.get("list", 0.0) * per_minute),
            "view_watch_bytes_per_min": round(view_bytes.get("watch", 0.0) * per_minute),
            # all serve pulls: its view's lists and events (its own count) and its GETs (the Lease, the ConfigMap)
            "serve_pulled_bytes_per_min": round(sum(view_bytes.values()) * per_minute + get_bytes),
            "pod_list_requests_per_min": round(served.get("LIST", {}).get("pods", sf.Flow()).requests, 1),
            "pod_list_bytes_per_min": round(served.get("LIST", {}).get("pods", sf.Flow()).bytes),
            "by_resource": flows_json(served),
            "open_watches": sf.open_watches(last.api),
            "serve_cpu_s_per_min": round((last.serve_cpu.own - first.serve_cpu.own) * per_minute, 2),
            "serve_children_cpu_s_per_min": round((last.serve_cpu.children - first.serve_cpu.children) * per_minute, 2),
            "apiserver_cpu_s_per_min": round((last.apiserver_cpu.own - first.apiserver_cpu.own) * per_minute, 2),
            "serve_rss_mib": round((rss or 0) / 1024.0, 1),
            "serve_rss_max_in_window_mib": round(max([*rss_samples, rss or 0]) / 1024.0, 1),
            "serve_hwm_mib": round((hwm or 0) / 1024.0, 1),
            "rounds_per_min": round(count * per_minute, 2),
            "serve_bytes_per_round": round(sf.all_bytes(served) / (count * per_minute)) if count else None,
            "round_p50_s": _round3(sf.quantile(0.5, buckets)),
            "round_p99_s": _round3(sf.quantile(0.99, buckets)),
            "round_mean_s": _round3(total_sum / count if count else None),
        }

    def stop_serve(self) -> None:
        if self.serve is not None:
            self.plane.processes.stop_one(self.serve.component)
            self.serve = None

    def audit_run(self, background: sf.Traffic) -> dict[str, Any]:
        """One run of the background audit's command, alone: what it asks of the apiserver, its CPU and memory."""
        from webhook.service.auditloop import audit_command

        command = audit_command(str(self.sa_kubeconfig), str(self.policy_file))
        first = self.scrape(serve=False)
        began = time.monotonic()
        child = subprocess.Popen(
            command, cwd=ROOT, env=loopback_environment(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert child.stdout is not None
        out = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - began
        last = self.scrape(serve=False)
        window = last.at - first.at
        # totals over the run (a "minute" of the window's own length), less the background over that time
        raw = sf.traffic(sf.difference(first.api, last.api), 60.0)
        flows = sf.minus(raw, {v: {r: f.scaled(window / 60.0) for r, f in b.items()} for v, b in background.items()})
        findings = None
        with contextlib.suppress(ValueError):
            findings = len(json.loads(out).get("findings") or [])
        return {
            "exit": child.returncode,
            "findings": findings,
            "seconds": round(seconds, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024.0, 1),
            "bytes": round(sf.all_bytes(flows)),
            "list_requests": round(sf.verb_total(flows, "LIST").requests),
            "by_resource": flows_json(flows, ("LIST",)),
        }

    def warnings_in_log(self, component: Component) -> list[str]:
        lines = component.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return [line for line in lines if '"WARNING"' in line or '"ERROR"' in line or "Traceback" in line]

    # --- one size ---

    def measure(self, size: sf.Size, *, last: bool) -> dict[str, Any]:
        grown = self.grow(size)
        background, bg_cpu = self.background()
        log(f"{size}: background {sf.all_bytes(background) / MIB:.2f} MiB/min")
        # the audit alone, before serve starts (and before the reclaim adds its pods at the largest size)
        audit = self.audit_run(background)
        log(f"{size}: one audit run {audit['seconds']} s, {audit['bytes'] / MIB:.1f} MiB, {audit['cpu_s']} CPU-s")
        started = time.monotonic()
        serve = self.start_serve(f"serve-{size.nodes}")
        steady = self.wait_steady(started)
        log(f"{size}: serve steady {steady}")
        window = self.window(background)
        log(
            f"{size}: {window['serve_bytes_per_min'] / MIB:.1f} MiB/min, LIST {window['list_requests_per_min']}/min, "
            f"serve {window['serve_cpu_s_per_min']} CPU-s/min, RSS {window['serve_rss_mib']} MiB, "
            f"round p50 {window['round_p50_s']} p99 {window['round_p99_s']} s"
        )
        admission = self.admission() if self.settings.admission_rate > 0 else None
        if admission is not None:
            log(
                f"{size}: admission at {admission['rate']:g}/s while the keeper works: p50 {admission['p50_ms']} ms, "
                f"p99 {admission['p99_ms']} ms, errors {admission['errors']}"
            )
        reclaim = self.reclaim() if last and self.settings.reclaim else None
        warned = self.warnings_in_log(serve.component)
        self.stop_serve()
        return {
            "nodes": size.nodes,
            "pods": size.pods,
            **grown,
            **steady,
            **window,
            "background_bytes_per_min": round(sf.all_bytes(background)),
            "background_by_resource": flows_json(background),
            "background_apiserver_cpu_s_per_min": round(bg_cpu, 2),
            "serve_log_warnings": len(warned),
            "serve_log_warning_samples": sorted({_short(w) for w in warned})[:5],
            "audit": audit,
            **({"admission": admission} if admission is not None else {}),
            **({"reclaim": reclaim} if reclaim is not None else {}),
        }

    # --- the webhook's own latency while the keeper works ---

    def admission(self) -> dict[str, Any]:
        """Reviews at a fixed rate (bench/loadgen.py, open loop: latency from each request's scheduled time)
        into this serve while its keeper rounds run on the view: issue 41's "the webhook's own admission latency
        must not move" read across the sizes (the reviews never touch the view; what they share is the GIL)."""
        s = self.settings
        job = {
            "port": self.port,
            "ca_file": str(self.cert_dir / "ca.crt"),
            "mode": "open",
            "connections": 8,
            "duration": s.admission_seconds,
            "rate": s.admission_rate,
            "reviews": [[str(reviews.path(name)), True] for name in ("training-small", "inference-small", "non-gpu")],
        }
        out = subprocess.run(
            [sys.executable, "-m", "bench.loadgen"],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        result = json.loads(out.stdout)
        latency = result["latency_from_schedule"]
        return {
            "rate": s.admission_rate,
            "seconds": s.admission_seconds,
            "requests": result["requests"],
            "errors": result["errors"],
            "p50_ms": round(latency["p50"] * 1000, 2),
            "p99_ms": round(latency["p99"] * 1000, 2),
            "p999_ms": round(latency["p999"] * 1000, 2),
            "max_ms": round(latency["max"] * 1000, 2),
        }

    # --- the reclaim at the largest size ---

    def reclaim(self) -> dict[str, Any]:
        s = self.settings
        kube = self.kube
        assert self.serve is not None
        before = self.scrape()
        for name, argv in self.controllers:
            self.plane.processes.start(name, argv)
        nodes = [node_name(0), node_name(1)]
        for name in nodes:
            kube.patch("Node", name, {"metadata": {"labels": {RECLAIM_LABEL: "true"}}})
        for namespace in (TRAIN, SERVE):
            kube.apply(new_claim_template("gpu", namespace, exactly(DRIVER, count=None)))
        reserved_pci = set(
            (kube.get("DeviceClass", RESERVED_CLASS)["metadata"].get("annotations") or {})
            .get(RESERVED_PCI_ANNOTATION, "")
            .split(",")
        )
        reserved = {f"gpu-{i}" for i, pci in enumerate(PCI_SLOTS) if pci in reserved_pci}
        held = self.hold_reserved(nodes, reserved)
        result_held = {"reserved_devices_held_elsewhere": held}
        kubelet = KubeletStandIn(kube, (TRAIN, SERVE))
        thread = threading.Thread(target=kubelet.run, name="kubelet", daemon=True)
        thread.start()
        result: dict[str, Any] = {"nodes": nodes, "grace_s": s.grace, "borrowers": s.borrowers, **result_held}
        try:
            wait_until(lambda: kube.get_or_none("DeviceClass", LENDABLE_CLASS), timeout=120, what="the lendable class")
            holding: list[str] = []
            for i in range(s.borrowers):
                name = f"borrower-{i}"
                kube.create(train_or_serve_pod(name, TRAIN, {BORROW_LABEL: "true", "app": name}))
                try:
                    devices = wait_until(
                        lambda name=name: self._devices(TRAIN, name), timeout=180, what=f"{name} bound"
                    )
                except AssertionError as err:
                    self.notes.append(f"reclaim: {err}")
                    continue
                if set(devices) <= reserved:
                    holding.append(name)
                time.sleep(0.3)
            result["borrowers_on_reserved"] = len(holding)
            if not holding:
                self.notes.append("reclaim: no borrower held a reserved device: the inference pod takes a free one")
            time.sleep(2 * s.lending_seconds)  # lending settled: the keeper's rounds see the borrowers
            created = time.time()
            kube.create(train_or_serve_pod("llm-0", SERVE, {"app": "llm-0"}))
            bound_at: float | None = None
            deadline = created + s.grace + 120
            while time.time() < deadline:
                pod = kube.get("Pod", "llm-0", SERVE)
                if pod["spec"].get("nodeName"):
                    bound_at = time.time()
                    break
                time.sleep(0.1)
            result["inference_bind_s"] = None if bound_at is None else round(bound_at - created, 2)
            result["bound_within_s"] = s.grace + 5
            result["evicted"] = sorted(name for ns, name in kubelet.disrupted.values() if ns == TRAIN)
            result["inference_disrupted"] = sorted(name for ns, name in kubelet.disrupted.values() if ns == SERVE)
            result["kubelet_errors"] = kubelet.errors[:3]
        finally:
            kubelet.stop.set()
            thread.join(timeout=10)
        after = self.scrape()
        buckets, count, _ = sf.histogram(sf.difference(before.serve, after.serve), ROUND)
        result["rounds"] = int(count)
        result["round_p99_s"] = _round3(sf.quantile(0.99, buckets))
        result["round_max_bucket_s"] = _round3(sf.quantile(1.0, buckets))
        log(f"reclaim: {result}")
        return result

    def hold_reserved(self, spare: list[str], reserved: set[str]) -> int:
        """Every reserved device of the other nodes held by an inference replica (a claim of SERVE allocated by
        the bench, reserved for a pod bound by name), as when reclaim is needed: the keeper plans room anywhere
        (it does not read a waiting pod's node constraints), so free reserved devices elsewhere would spare the
        borrowers of the two reclaim nodes."""
        kube = self.kube
        others = [node_name(i) for i in range(self.nodes) if node_name(i) not in spare]
        jobs = [(node, device) for node in others for device in sorted(reserved)]

        def hold(job: tuple[str, str]) -> None:
            node, device = job
            name = f"hold-{node}-{device}"
            claim = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": SERVE},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
            }
            kube.create(claim)
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": SERVE, "labels": {"app": "hold", OPT_OUT: "true"}},
                "spec": {
                    "nodeName": node,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "containers": [
                        {"name": "main", "image": "rocm/vllm:latest", "resources": {"claims": [{"name": "gpu"}]}}
                    ],
                },
            }
            uid = kube.create(pod)["metadata"]["uid"]
            first = kube.get("ResourceClaim", name, SERVE)["spec"]["devices"]["requests"][0]
            alternatives = first.get("firstAvailable") or []  # the webhook's steering may offer sub-requests
            request = f"{first['name']}/{alternatives[0]['name']}" if alternatives else first["name"]
            status = {
                "allocation": {
                    "devices": {"results": [{"request": request, "driver": DRIVER, "pool": node, "device": device}]},
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                        ]
                    },
                },
                "reservedFor": [{"resource": "pods", "name": name, "uid": uid}],
            }
            kube.patch("ResourceClaim", name, {"status": status}, SERVE, subresource="status")

        began = time.monotonic()
        with ThreadPoolExecutor(self.settings.threads) as pool:
            list(pool.map(hold, jobs))
        log(
            f"reclaim: {len(jobs)} reserved devices held on {len(others)} other nodes ({time.monotonic() - began:.0f} s)"
        )
        return len(jobs)

    def _devices(self, namespace: str, name: str) -> list[str] | None:
        pod = self.kube.get_or_none("Pod", name, namespace)
        if pod is None or not pod["spec"].get("nodeName"):
            return None
        found: list[str] = []
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            claim = self.kube.get("ResourceClaim", status["resourceClaimName"], namespace)
            for r in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
                found.append(str(r["device"]))
        return found or None


def _round3(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _short(line: str) -> str:
    with contextlib.suppress(ValueError):
        record = json.loads(line)
        return str(record.get("message", line))[:160]
    return line[:160]


# --- the figures -----------------------------------------------------------------------------------------------


FITTED = (
    ("serve_pulled_bytes_per_min", "bytes/min serve pulls (its own count)"),
    ("serve_bytes_per_min", "apiserver bytes/min from serve"),
    ("serve_bytes_per_round", "apiserver bytes per round"),
    ("serve_cpu_s_per_min", "serve CPU-s/min"),
    ("serve_rss_mib", "serve RSS MiB"),
    ("round_p99_s", "round p99 s"),
    ("audit_bytes", "one audit run, bytes"),
)


def extrapolate(rows: list[dict[str, Any]], target: sf.Size = TARGET) -> dict[str, Any]:
    """Each figure fitted on the pods of the sizes (least squares) and read at the target's pods."""
    out: dict[str, Any] = {"nodes": target.nodes, "pods": target.pods, "x": "pods", "method": "least squares"}
    for key, _ in FITTED:
        points = [
            (float(r["pods"]), float(v))
            for r in rows
            if (v := (r["audit"]["bytes"] if key == "audit_bytes" else r.get(key))) is not None
        ]
        if len(points) < 2:
            continue
        fit = sf.least_squares([p for p, _ in points], [v for _, v in points])
        out[key] = {
            "at_target": round(fit.at(target.pods), 3),
            "slope_per_1000_pods": round(fit.slope * 1000, 4),
            "intercept": round(fit.intercept, 3),
            "r2": None if fit.r2 is None else round(fit.r2, 4),
        }
    return out


def goals(rows: list[dict[str, Any]], extrapolated: dict[str, Any]) -> dict[str, Any]:
    smallest, largest = rows[0], rows[-1]
    ratio = (
        largest["serve_bytes_per_min"] / smallest["serve_bytes_per_min"] if smallest["serve_bytes_per_min"] else None
    )
    # what serve pulls by its own count (the apiserver's figures also hold its own watches' replays: see the notes)
    pulled = [r.get("serve_pulled_bytes_per_min") for r in (smallest, largest)]
    pulled_ratio = pulled[1] / pulled[0] if pulled[0] and pulled[1] is not None else None
    p99 = largest.get("round_p99_s")
    reclaim = largest.get("reclaim") or {}
    bind = reclaim.get("inference_bind_s")
    rss = (extrapolated.get("serve_rss_mib") or {}).get("at_target")
    bound = reclaim.get("bound_within_s")
    return {
        "bytes_ratio_largest_to_smallest": None if ratio is None else round(ratio, 2),
        "bytes_flat": ratio is not None and ratio <= 1.2,
        "pulled_ratio_largest_to_smallest": None if pulled_ratio is None else round(pulled_ratio, 2),
        "pulled_flat": pulled_ratio is not None and pulled_ratio <= 1.2,
        "round_p99_at_largest_s": p99,
        "round_p99_ok": p99 is not None and p99 <= 1.0,
        "reclaim_s": bind,
        "reclaim_ok": bind is not None and bound is not None and bind <= bound,
        "rss_at_target_mib": rss,
        "rss_ok": rss is not None and rss <= 1024.0,
    }


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value / 1e6:,.1f}"


def _mb3(value: float | None) -> str:
    return "—" if value is None else f"{value / 1e6:,.3f}"


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def size_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| nodes | pods | MB/min serve pulls (its own count) | MB/min from serve (apiserver: LIST + GET + WATCH) "
        "| LIST req/min | of pods | pod LIST MB/min "
        "| WATCH events/min | WATCH MB/min | background MB/min | serve CPU-s/min | serve RSS MiB | rounds/min "
        "| MB per round | round p50 s | round p99 s | apiserver CPU-s/min | one audit run: s / CPU-s / MB / peak RSS "
        "MiB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: |",
    ]
    for r in rows:
        a = r["audit"]
        lines.append(
            f"| {r['nodes']:,} | {r['pods']:,} | {_mb3(r.get('serve_pulled_bytes_per_min'))} "
            f"| {_mb(r['serve_bytes_per_min'])} | {_num(r['list_requests_per_min'], 1)} "
            f"| {_num(r['pod_list_requests_per_min'], 1)} | {_mb(r['pod_list_bytes_per_min'])} "
            f"| {_num(r['watch_events_per_min'], 1)} | {_mb(r['watch_bytes_per_min'])} "
            f"| {_mb(r['background_bytes_per_min'])} | {_num(r['serve_cpu_s_per_min'])} | {_num(r['serve_rss_mib'], 0)} "
            f"| {_num(r['rounds_per_min'], 1)} | {_mb(r.get('serve_bytes_per_round'))} "
            f"| {_num(r['round_p50_s'], 3)} | {_num(r['round_p99_s'], 3)} "
            f"| {_num(r['apiserver_cpu_s_per_min'])} "
            f"| {_num(a['seconds'], 1)} / {_num(a['cpu_s'], 1)} / {_mb(a['bytes'])} / {_num(a['peak_rss_mib'], 0)} |"
        )
    return lines


def admission_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The webhook's own latency per size while its keeper works (issue 41: it must not move)."""
    measured = [r for r in rows if r.get("admission")]
    if not measured:
        return []
    first = measured[0]["admission"]
    lines = [
        f"The webhook's own latency while its keeper works: after each window, {first['rate']:g} reviews/s for "
        f"{first['seconds']:g} s (`bench/loadgen.py`, open loop over 8 TLS keep-alive connections, latency from each "
        "request's scheduled time; a small training, a small inference and a non-GPU pod in turn), rounds going on:",
        "",
        "| nodes | pods | reviews | errors | p50 ms | p99 ms | p99.9 ms | max ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in measured:
        a = r["admission"]
        lines.append(
            f"| {r['nodes']:,} | {r['pods']:,} | {a['requests']:,} | {a['errors']} | {_num(a['p50_ms'], 2)} "
            f"| {_num(a['p99_ms'], 2)} | {_num(a['p999_ms'], 2)} | {_num(a.get('max_ms'), 2)} |"
        )
    return [*lines, ""]


def resource_table(row: dict[str, Any]) -> list[str]:
    lines = ["| verb | resource | requests/min | MB/min | watch events/min |", "| --- | --- | ---: | ---: | ---: |"]
    for verb in ("LIST", "WATCH"):
        for resource_name, f in (row["by_resource"].get(verb) or {}).items():
            lines.append(
                f"| {verb} | {resource_name or '(none)'} | {_num(f['requests'], 1)} | {_mb(f['bytes'])} "
                f"| {_num(f['events'], 1)} |"
            )
    for verb, f in (row["by_resource"].get("other") or {}).items():
        lines.append(f"| {verb} | (all) | {_num(f['requests'], 1)} | {_mb(f['bytes'])} | |")
    return lines


def section(figures: dict[str, Any], meta: dict[str, Any], before: dict[str, Any] | None) -> str:
    rows = figures["sizes"]
    g = figures["goals"]
    x = figures["extrapolated"]
    reclaim = rows[-1].get("reclaim") or {}

    def met(ok: bool) -> str:
        return "**met**" if ok else "**NOT met**"

    fits = []
    for key, label in FITTED:
        fit = x.get(key)
        if fit:
            fits.append(
                f"| {label} | {_num(fit['slope_per_1000_pods'], 3)} | {_num(fit['intercept'], 2)} "
                f"| {_num(fit['r2'], 3)} | {_num(fit['at_target'], 2)} |"
            )
    s = meta["settings"]
    lines = [
        SECTION_BEGIN,
        TITLE,
        "",
        f"Generated by `make bench-scale` (`python -m bench.scale`), commit `{meta['commit']}` "
        f"(**{meta['label']}**), {meta['date']}; {meta['cpus']} CPUs, Python {platform.python_version()}, load "
        f"average {meta['load_start']:.2f} at the start, {meta['load_end']:.2f} at the end; {meta['minutes']:.1f} min "
        "in all.",
        "",
        "**Real control plane** (etcd, kube-apiserver v1.36 of `KUBEBUILDER_ASSETS` with `--authorization-mode=RBAC`: "
        "no Node authorizer, whose informers re-watch pods inside the apiserver; kube-scheduler and "
        "kube-controller-manager only for setting up and for the reclaim, so that a window's apiserver figures are "
        "serve's and the apiserver's own). Per size, cumulative: Node objects (no kubelet: Ready, allocatable "
        "written), one AMD `gpu.amd.com` ResourceSlice of 4 MI300X GPUs per node split 2 + 2 by `pool apply "
        "--devices-per-node 2`, non-GPU filler pods bound by `spec.nodeName` (Pending: no kubelet). `serve` as the "
        f"webhook's ServiceAccount, lending on (grace {s['grace']} s), `--lending-seconds {s['lending_seconds']:g}`, "
        f"`--audit-interval-seconds {s['audit_interval']:g}` (the background audit runs once, at startup, never in "
        "a window; one run of its command is measured alone before `serve` starts). Each size: "
        f"{s['background']:g} s of background (no `serve`), one audit run, then `serve` started and waited for (Lease, first audit "
        f"done, a synced round, one more round), then a **{s['window']:g} s steady window**. Bytes: the "
        "apiserver's `apiserver_response_sizes_sum` (GET, LIST) and `apiserver_watch_events_sizes_sum` (WATCH), "
        "differences of two scrapes, less the background rate; CPU and RSS from `/proc`; rounds from serve's "
        "`rocm_isolation_lending_round_seconds` (quantiles interpolated in its buckets, as `histogram_quantile`). "
        "LIST requests are pages (serve lists 500 items a page). A round starts `--lending-seconds` after the "
        "previous one ends: once rounds take longer than that, rounds/min fall and bytes/min stop growing with the "
        "cluster while bytes per round keep growing (the keeper is saturated, and reclaims wait for its rounds).",
        "",
        *size_table(rows),
        "",
        *admission_lines(rows),
        f"By verb and resource at {rows[-1]['nodes']:,} nodes / {rows[-1]['pods']:,} pods (per minute, background "
        "subtracted; WATCH requests count watches that ended in the window):",
        "",
        *resource_table(rows[-1]),
        "",
        f"**Extrapolated to {x['nodes']:,} nodes / {x['pods']:,} pods**: each figure fitted by ordinary least squares "
        "on the pods of the measured sizes (y = intercept + slope * pods; the nodes grow with the pods) and read at "
        f"{x['pods']:,} pods:",
        "",
        "| figure | slope per 1,000 pods | intercept | r² | at target |",
        "| --- | ---: | ---: | ---: | ---: |",
        *fits,
        "",
        "Goals (issue 41):",
        "",
        f"- bytes/min serve pulls from the apiserver by its own count (its view's list pages and watch events, "
        f"`rocm_isolation_lending_view_bytes_total`, and its GETs), largest size ÷ smallest: "
        f"{_num(g.get('pulled_ratio_largest_to_smallest'))} (≤ 1.2): {met(bool(g.get('pulled_flat')))}",
        f"- the same from the apiserver's metrics (serve's share: the window less the background; it also holds "
        f"the apiserver's own watches' replays, which land in a window by chance), largest ÷ smallest: "
        f"{_num(g['bytes_ratio_largest_to_smallest'])} (≤ 1.2): {met(g['bytes_flat'])}",
        f"- round p99 at the largest size: {_num(g['round_p99_at_largest_s'], 3)} s (≤ 1 s): {met(g['round_p99_ok'])}",
        f"- reclaim at the largest size: inference pod bound {_num(g['reclaim_s'])} s after its creation "
        f"(≤ grace + 5 = {reclaim.get('bound_within_s', '—')} s): {met(g['reclaim_ok'])}; "
        f"{reclaim.get('borrowers_on_reserved', '—')} of {reclaim.get('borrowers', '—')} borrowers held reserved "
        f"devices on {len(reclaim.get('nodes', []))} nodes, evicted: {', '.join(reclaim.get('evicted', [])) or 'none'}; "
        f"rounds during the reclaim: p99 {_num(reclaim.get('round_p99_s'), 3)} s",
        f"- serve RSS extrapolated to {x['pods']:,} pods: {_num(g['rss_at_target_mib'], 0)} MiB (≤ 1 GiB): "
        f"{met(g['rss_ok'])}",
        *(f"- {note}" for note in meta.get("notes", [])),
        "",
    ]
    if before is not None and before.get("commit") != meta["commit"]:
        lines += [
            f"**Before the watched view** (commit `{before['commit']}`, {before['date']}, `bench/scale_before.json`):",
            "",
            *size_table(before["figures"]["sizes"]),
            "",
        ]
    lines += [
        *([f"![the keeper at scale]({PLOT.name})", ""] if meta.get("plotted") else []),
        "The last line `make bench-scale` printed (without the per-resource detail):",
        "",
        "```json",
        json.dumps(summary_json(figures)),
        "```",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def summary_json(figures: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "nodes", "pods", "serve_pulled_bytes_per_min", "serve_bytes_per_min", "list_requests_per_min", "pod_list_bytes_per_min",
        "watch_bytes_per_min", "serve_cpu_s_per_min", "serve_rss_mib", "round_p50_s", "round_p99_s",
    )  # fmt: skip
    return {
        "label": figures["label"],
        "sizes": [
            {**{k: r.get(k) for k in keep}, "admission_p99_ms": (r.get("admission") or {}).get("p99_ms")}
            for r in figures["sizes"]
        ],
        "goals": figures["goals"],
        "reclaim_s": figures["goals"]["reclaim_s"],
    }


def plot(rows: list[dict[str, Any]], extrapolated: dict[str, Any], target: Path, before: dict[str, Any] | None) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pods = [r["pods"] for r in rows]
    panels = (
        ("serve_bytes_per_min", "apiserver MB/min from serve", 1e-6),
        ("serve_rss_mib", "serve RSS (MiB)", 1.0),
        ("round_p99_s", "round p99 (s)", 1.0),
    )
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (key, label, factor) in zip(axes, panels, strict=True):
        ys = [(r.get(key) or 0) * factor for r in rows]
        ax.plot(pods, ys, "o-", label="measured")
        fit = extrapolated.get(key)
        if fit:
            low, high = min(pods), extrapolated["pods"]
            xs = [low * (high / low) ** (i / 40) for i in range(41)]  # straight on linear axes, not on the log one
            ax.plot(
                xs, [(fit["intercept"] + fit["slope_per_1000_pods"] * x / 1000) * factor for x in xs], "k--", lw=1,
                label="least squares",
            )  # fmt: skip
        if before is not None:
            prior = before["figures"]["sizes"]
            ax.plot([r["pods"] for r in prior], [(r.get(key) or 0) * factor for r in prior], "x:", label="before")
        ax.set_xlabel("pods")
        ax.set_title(label, fontsize=10)
        ax.set_xscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(target)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"NODES:PODS,... growing (default {DEFAULT_SIZES})")
    parser.add_argument("--window-seconds", type=float, default=60.0, help="the steady window per size")
    parser.add_argument("--background-seconds", type=float, default=15.0, help="the apiserver alone, per size")
    parser.add_argument("--lending-seconds", type=float, default=5.0, help="serve --lending-seconds")
    parser.add_argument(
        "--audit-interval-seconds",
        type=float,
        default=3600.0,
        help="serve --audit-interval-seconds (longer than a run)",
    )
    parser.add_argument("--grace", type=int, default=5, help="lending.reclaimGraceSeconds")
    parser.add_argument("--borrowers", type=int, default=8, help="borrower pods on the two reclaim nodes")
    parser.add_argument("--threads", type=int, default=12, help="concurrent POSTs creating the cluster")
    parser.add_argument("--reclaim", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--admission-rate", type=float, default=100.0, help="reviews/s into serve after each window (0: none)"
    )
    parser.add_argument("--admission-seconds", type=float, default=20.0, help="how long, per size")
    parser.add_argument("--label", default="", help="what this run measures, e.g. 'before the watched view'")
    parser.add_argument("--save-before", action="store_true", help="keep the figures in bench/scale_before.json")
    parser.add_argument("--no-write", action="store_true", help="print only: neither docs/benchmarks.md nor the plot")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) after the run")
    args = parser.parse_args(argv)
    try:
        sizes = sf.parse_sizes(args.sizes)
    except ValueError as err:
        parser.error(f"--sizes: {err}")
    settings = Settings(
        sizes=tuple(sizes),
        window=args.window_seconds,
        background=args.background_seconds,
        lending_seconds=args.lending_seconds,
        audit_interval=args.audit_interval_seconds,
        grace=args.grace,
        borrowers=args.borrowers,
        threads=args.threads,
        reclaim=args.reclaim,
        admission_rate=args.admission_rate,
        admission_seconds=args.admission_seconds,
    )
    missing = missing_binaries(os.environ.get(ASSETS_ENV))
    if missing:
        print(f"bench.scale needs {ASSETS_ENV} ({', '.join(missing)} missing): {HOW_TO_GET_BINARIES}")
        return 2
    loopback_only()
    warnings.filterwarnings("ignore", "Attribute's length must be", UserWarning)
    # 30,000 pods' worth of connections and files in the apiserver and etcd
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    began = time.monotonic()
    load_start = os.getloadavg()[0]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    label = args.label or f"commit {commit}"
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    bench = Bench(settings, workdir)
    rows: list[dict[str, Any]] = []
    try:
        bench.start()
        log(f"control plane up ({workdir})")
        for index, size in enumerate(sizes):
            rows.append(bench.measure(size, last=index == len(sizes) - 1))
            log(f"{size}: {json.dumps({k: v for k, v in rows[-1].items() if k != 'by_resource'})}")
    finally:
        bench.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    minutes = (time.monotonic() - began) / 60.0
    extrapolated = extrapolate(rows)
    figures: dict[str, Any] = {
        "label": label,
        "commit": commit,
        "settings": {k: v for k, v in asdict(settings).items() if k != "sizes"},
        "sizes": rows,
        "extrapolated": extrapolated,
        "goals": goals(rows, extrapolated),
        "minutes": round(minutes, 1),
        "notes": bench.notes,
    }
    meta: dict[str, Any] = {
        "commit": commit,
        "label": label,
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "cpus": os.cpu_count(),
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "minutes": minutes,
        "notes": bench.notes,
        "settings": figures["settings"],
    }
    if args.save_before:
        BEFORE.write_text(
            json.dumps({"commit": commit, "date": meta["date"], "figures": figures}, indent=1) + "\n", encoding="utf-8"
        )
    before = json.loads(BEFORE.read_text(encoding="utf-8")) if BEFORE.exists() else None
    if not args.no_write:
        meta["plotted"] = plot(rows, extrapolated, PLOT, before if before and before.get("commit") != commit else None)
        DOC.write_text(
            sections.replace_section(
                DOC.read_text(encoding="utf-8"), SECTION_BEGIN, SECTION_END, section(figures, meta, before)
            ),
            encoding="utf-8",
        )
        log(f"written: {DOC.relative_to(ROOT)}{', ' + str(PLOT.relative_to(ROOT)) if meta['plotted'] else ''}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
