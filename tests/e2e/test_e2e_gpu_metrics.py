"""The GPUs' own word (issue 48) on a real control plane of its own (v1.36.2): the incident replayed as the
background audit of a real ``serve`` sees it through a real Prometheus (Debian's package, as ``pool recommend``'s
e2e uses) scraping AMD's device metrics exporter.

The exporter is a **stand-in**: no AMD GPU is here, so each GPU node's ``/metrics`` is served by an HTTP server on
loopback (``ExporterStandIn``, one per node, one scrape target each) in exactly the exporter's text format: the
series names (``gpu_gfx_activity``, ``gpu_used_vram``, ``gpu_total_vram``, ``gpu_health``,
``gpu_junction_temperature``: no prefix, the GPU Operator's install), every mandatory label and the optional
``kfd_process_id``, with AMD's label names and their values' shapes (ROCm/device-metrics-exporter v1.5.1,
``pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go``, ``docs/configuration/metricslist.md``), labels
sorted as the Go client writes them, ``pod``/``namespace``/``container`` empty for a GPU the kubelet allocated
to no pod. The HELP texts are ours (nothing reads them). Prometheus scrapes it with ``honor_labels`` (the
operator's ServiceMonitor) every second, scrapes ``serve``'s ``/metrics`` over HTTPS, and evaluates the monitoring
pack's alert rules (the PrometheusRule ``manifests --monitoring`` renders).

The cluster: one MI300X node reserved whole by ``pool apply --nodes`` (device plugin, 4 GPUs, no slices) and one
MI210 node of AMD's DRA driver split 2 + 2 by ``pool apply --devices-per-node 2``, where a training pod already held
a GPU that the split then reserved (``pool apply`` without ``--evict``). The kubelet stand-in marks pods Running.
``serve`` runs its background audit every ``INTERVAL`` s with ``--audit-gpu-metrics`` on that Prometheus and the
policy's ``spec.gpuMetrics`` window shortened to ``WINDOW`` s; the PolicyReport CRDs are installed.

In order, on one world:
1. a quiet cluster (every GPU idle, the training pod's too): the reserved GPUs are judged, no ``reserved-gpu-*``
   finding, the GPU alert inactive;
2. (a) a reserved GPU busy with no pod attributed (``kfd_process_id`` given): found by the first audit that starts
   once the use has lasted the window (``reserved-gpu-used-unallocated``), in the ClusterPolicyReport with the
   node, the GPU and the PIDs, and the alert ``RocmIsolationReservedGpuMisused`` active in Prometheus;
3. (b) the training pod's GPU, a reserved device of the split node, busy: ``reserved-gpu-used-by-other-class``
   for that pod, in its namespace's PolicyReport, the same alert active for that rule;
4. quiet again: the findings go away at the next audit.

Without prometheus the module is skipped with a notice (``E2E_REQUIRE_PROMETHEUS=1``, set by CI, makes it fail).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_objects import chart_class, exactly, new_claim_pod, new_claim_template

from webhook.cluster.kubeapi import api_path
from webhook.core.policy import default_policy_text
from webhook.deploy import render
from webhook.ops.audit.reports import REPORT_NAME, WGPOLICY
from webhook.ops.gpus.judge import Thresholds
from webhook.ops.gpus.source import step_for

from .controlplane import ASSETS_ENV, LOOPBACK, ControlPlane, free_port, loopback_only, missing_binaries
from .harness import MI210_LABELS, MI300X_LABELS, Webhook, cli, deploy, make_namespace, make_node, metric_value
from .kube import ApiError, Kube, Obj, wait_until
from .kubelet import KubeletStandIn
from .test_e2e_device_reservation import amd_resource_slice

REQUIRE_ENV = "E2E_REQUIRE_PROMETHEUS"
PROMETHEUS = shutil.which("prometheus")
NOTICE = (
    "prometheus not found: the GPU metrics e2e test (a real Prometheus scraping the exporter stand-in) did not run. "
    "Install Debian's package (`make promtool`, or `apt-get install prometheus`; .ci/run does it when running as root)"
)
if PROMETHEUS is None and not os.environ.get(REQUIRE_ENV) and not missing_binaries(os.environ.get(ASSETS_ENV)):
    pytest.skip(NOTICE, allow_module_level=True)

WHOLE = "gm-mi300x-reserved"  # reserved whole (device plugin)
SPLIT = "gm-mi210-split"  # AMD's DRA driver, split 2 + 2
TRAIN = "gm-train"
CRDS = Path(__file__).parent / "fixtures" / "wgpolicyk8s.io-crds.yaml"
INTERVAL = 4  # serve --audit-interval-seconds
WINDOW = 8  # spec.gpuMetrics.windowSeconds
MAX_GAP = 4  # spec.gpuMetrics.maxGapSeconds: a query_range step of 2 s
LIMITS = Thresholds(window_seconds=WINDOW, max_gap_seconds=MAX_GAP, stale_seconds=30)
GPU_RULES = ("reserved-gpu-used-unallocated", "reserved-gpu-used-by-other-class")
ALERT = "RocmIsolationReservedGpuMisused"
FINDINGS = "rocm_isolation_audit_findings"
RUNS = "rocm_isolation_audit_runs_total"
# An idle GPU as the exporter reports it (VRAM in use by the driver alone), and the incident's (95-98 %, 82 °C).
IDLE = {"activity": 0.0, "vram": 285.0, "temperature": 55.0}
BUSY = {"activity": 97.0, "vram": 151000.0, "temperature": 82.0}


def policy_text() -> str:
    document = yaml.safe_load(default_policy_text())
    document["spec"]["gpuMetrics"] = {
        "windowSeconds": WINDOW,
        "maxGapSeconds": MAX_GAP,
        "staleSeconds": int(LIMITS.stale_seconds),
    }
    return yaml.safe_dump(document, sort_keys=False)


# --- the exporter stand-in ---------------------------------------------------------------------------------


@dataclass
class Gpu:
    """One GPU of a node as the exporter reports it, and what it is doing now (changed by the test)."""

    gpu_id: int
    serial: str
    card_model: str
    activity: float = IDLE["activity"]
    vram: float = IDLE["vram"]
    temperature: float = IDLE["temperature"]
    pod: tuple[str, str, str] = ("", "", "")  # namespace, pod, container: the kubelet's allocation
    pids: str | None = None  # kfd_process_id (an optional label: None, not exported)

    def set(self, state: dict[str, float], pids: str | None = None) -> None:
        self.activity, self.vram, self.temperature = state["activity"], state["vram"], state["temperature"]
        self.pids = pids


@dataclass
class ExporterStandIn:
    """A GPU node's ``rocm/device-metrics-exporter`` ``/metrics``, in its format (see the module's docstring)."""

    node: str
    gpus: list[Gpu]
    total_vram: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def labels(self, gpu: Gpu) -> dict[str, str]:
        namespace, pod, container = gpu.pod
        labels = {
            "card_model": gpu.card_model,
            "container": container,
            "deployment_mode": "baremetal",
            "gpu_compute_partition_type": "spx",
            "gpu_id": str(gpu.gpu_id),
            "gpu_memory_partition_type": "nps1",
            "gpu_partition_id": "0",
            "hostname": self.node,
            "job_id": "",
            "job_partition": "",
            "job_user": "",
            "namespace": namespace,
            "pod": pod,
            "serial_number": gpu.serial,
        }
        if gpu.pids is not None:
            labels["kfd_process_id"] = gpu.pids
        return dict(sorted(labels.items()))

    def text(self) -> str:
        fields = (
            ("gpu_gfx_activity", "Graphics engine activity in percent", lambda g: g.activity),
            ("gpu_used_vram", "Used VRAM in MB", lambda g: g.vram),
            ("gpu_total_vram", "Total VRAM in MB", lambda g: self.total_vram),
            ("gpu_health", "GPU health, 1 healthy, 0 unhealthy", lambda g: 1.0),
            ("gpu_junction_temperature", "Junction temperature in Celsius", lambda g: g.temperature),
        )
        lines = []
        with self.lock:
            for name, help_text, value in fields:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
                for gpu in self.gpus:
                    labels = ",".join(f'{k}="{v}"' for k, v in self.labels(gpu).items())
                    lines.append(f"{name}{{{labels}}} {value(gpu):g}")
        return "\n".join(lines) + "\n"

    def start(self) -> int:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = stand_in.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return int(self.server.server_address[1])

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


# --- the world ---------------------------------------------------------------------------------------------


@dataclass
class World:
    plane: ControlPlane
    kube: Kube
    webhook: Webhook
    prometheus: str  # its URL
    whole: ExporterStandIn
    split: ExporterStandIn
    trainer: str  # the training pod holding a reserved device of the split node
    started: float  # when the exporters began serving

    def findings(self, rule: str) -> tuple[float, float]:
        """(findings of ``rule``, successful audits so far), from one read of ``serve``'s /metrics."""
        _, text = self.webhook.get("/metrics")
        return metric_value(text, FINDINGS, rule=rule), metric_value(text, RUNS, result="success")

    def audits(self) -> float:
        return self.findings(GPU_RULES[0])[1]

    def query(self, path: str, **params: str) -> Any:
        url = f"{self.prometheus}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self, rule: str) -> list[str]:
        """The states (pending, firing) of the GPU alert for ``rule`` as Prometheus evaluates it now."""
        return [
            a["state"]
            for a in self.query("/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == ALERT and a["labels"].get("rule") == rule
        ]

    def report(self, namespace: str | None) -> Obj | None:
        if namespace is None:
            path = api_path(WGPOLICY.group_version, WGPOLICY.cluster_plural, name=REPORT_NAME)
        else:
            path = api_path(WGPOLICY.group_version, WGPOLICY.plural, namespace=namespace, name=REPORT_NAME)
        try:
            found: Obj = self.kube.request("GET", path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return found

    def found_within_one_interval(self, rule: str, since: float) -> float:
        """Wait until the use that began at ``since`` has lasted the window in what Prometheus answers (the window,
        a scrape, two query steps), then for the finding: it must be there by the first audit that *started* after
        that (the one running then may have started before: at most two more successful runs). Returns the
        seconds from ``since`` to the finding."""
        ripe = since + WINDOW + 1 + 2 * step_for(LIMITS) + 1
        time.sleep(max(0.0, ripe - time.time()))
        runs_then = self.audits()

        def seen() -> tuple[float, float] | None:
            count, runs = self.findings(rule)
            return (count, runs) if count > 0 else None

        count, runs = wait_until(seen, timeout=WINDOW + 6 * INTERVAL + 30, interval=0.5, what=f"{rule} found")
        assert count == 1, count
        assert runs <= runs_then + 2, (
            f"{rule} was found by audit {runs:.0f}, not by the first one started after the use lasted the window "
            f"(audit {runs_then + 1:.0f} or {runs_then + 2:.0f})"
        )
        return time.time() - since


def prometheus_config(exporters: list[int], webhook: Webhook, rules: Path) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            # What the GPU Operator's ServiceMonitor generates: honorLabels, one target per node's exporter.
            {
                "job_name": "amd-device-metrics-exporter",
                "honor_labels": True,
                "static_configs": [{"targets": [f"{LOOPBACK}:{port}" for port in exporters]}],
            },
            # The monitoring pack's ServiceMonitor of the webhook (tests/deploy/test_monitoring.py checks its TLS).
            {
                "job_name": "rocm-isolation-webhook",
                "scheme": "https",
                "tls_config": {"ca_file": str(webhook.ca_file)},
                "static_configs": [
                    {
                        "targets": [f"{LOOPBACK}:{webhook.port}"],
                        "labels": {"namespace": render.NAMESPACE, "pod": "webhook-0"},
                    }
                ],
            },
        ],
    }


def alert_rules(directory: Path) -> Path:
    """The PrometheusRule of ``manifests --monitoring``: its spec is a Prometheus rule file."""
    rendered = render.render(overlay="cert-manager", monitoring=True)
    rule = next(r for r in rendered if r["kind"] == "PrometheusRule")
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False), encoding="utf-8")
    return path


def trainer_pod(kube: Kube) -> str:
    """A training pod holding one GPU of the split node through a claim, made before the split."""
    kube.create(new_claim_template("gpu", TRAIN, exactly("gpu.amd.com")))
    body = new_claim_pod("trainer", TRAIN, template="gpu", labels={"app": "trainer"})
    kube.create(body)

    def allocated() -> bool:
        pod = kube.get("Pod", "trainer", TRAIN)
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if not pod["spec"].get("nodeName") or not statuses:
            return False
        claim = kube.get("ResourceClaim", statuses[0]["resourceClaimName"], TRAIN)
        return bool(((claim.get("status") or {}).get("allocation") or {}).get("devices"))

    wait_until(allocated, timeout=60, what="the training pod bound with its GPU")
    return "trainer"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if PROMETHEUS is None:
        pytest.fail(f"{NOTICE}; {REQUIRE_ENV} is set: in CI this test must run", pytrace=False)
    loopback_only()
    workdir = tmp_path_factory.mktemp("gpu-metrics")
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), workdir / "controlplane")
    plane.start()
    exporters: list[ExporterStandIn] = []
    kubelet: KubeletStandIn | None = None
    thread: threading.Thread | None = None
    try:
        kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
        make_node(kube, WHOLE, MI300X_LABELS, gpus=4)
        make_node(kube, SPLIT, MI210_LABELS, gpus=0)
        gone = {"amd.com/gpu": None}
        kube.patch("Node", SPLIT, {"status": {"capacity": gone, "allocatable": gone}}, subresource="status")
        kube.apply(amd_resource_slice(SPLIT))
        kube.create(chart_class(created=None))
        for crd in yaml.safe_load(CRDS.read_text(encoding="utf-8"))["items"]:
            kube.apply(crd)
        for crd in yaml.safe_load(CRDS.read_text(encoding="utf-8"))["items"]:
            name = crd["metadata"]["name"]
            wait_until(lambda n=name: kube.crd_established(n), timeout=60, what=f"CRD {name} established")
        make_namespace(kube, TRAIN)  # no label: the policy's defaultClass, training
        kubelet = KubeletStandIn(kube, (TRAIN,))
        thread = threading.Thread(target=kubelet.run, daemon=True)
        thread.start()

        # The exporters first (Prometheus's URL is given to serve before Prometheus starts: its port is chosen now).
        whole = ExporterStandIn(WHOLE, [Gpu(i, f"6924090053{i:02d}", "102-G30211-0C") for i in range(4)], 196592.0)
        split = ExporterStandIn(SPLIT, [Gpu(i, f"PHX8B2{i:02d}", "102-D67302-00") for i in range(4)], 65520.0)
        exporters = [whole, split]
        ports = [exporter.start() for exporter in exporters]
        prometheus_port = free_port()
        prometheus = f"http://{LOOPBACK}:{prometheus_port}"

        policy_file = workdir / "policy.yaml"
        policy_file.write_text(policy_text(), encoding="utf-8")
        deployed = deploy(
            plane,
            workdir,
            "--audit-interval-seconds",
            str(INTERVAL),
            "--audit-gpu-metrics",
            prometheus,
            "--lending-seconds",
            "0",
            policy_file=policy_file,
        )
        cli("pool", "apply", "--nodes", WHOLE, kubeconfig=plane.admin_kubeconfig, check=True)
        trainer = trainer_pod(kube)
        # The split reserves the two lowest PCI bus IDs, the training pod's GPU among them (the first device the
        # driver lists, its first fit, is a reserved one: test_e2e_device_reservation.GPUS); no --evict.
        cli("pool", "apply", "--devices-per-node", "2", kubeconfig=plane.admin_kubeconfig, check=True)
        # The exporter attributes the GPU by the kubelet's allocation: the trainer's GPU names it.
        split.gpus[0].pod = (TRAIN, trainer, "main")

        config = workdir / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(prometheus_config(ports, deployed.webhook, alert_rules(workdir))), encoding="utf-8"
        )
        component = plane.processes.start(
            "prometheus",
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address={LOOPBACK}:{prometheus_port}",
            ],
        )
        world = World(plane, kube, deployed.webhook, prometheus, whole, split, trainer, time.time())

        def ready() -> bool:
            try:
                return bool(world.query("/api/v1/query", query='count(up{job="amd-device-metrics-exporter"} == 1)'))
            except OSError:
                if component.process.poll() is not None:
                    raise AssertionError(f"prometheus exited:\n{component.tail()}") from None
                return False

        wait_until(ready, timeout=60, interval=0.5, what="prometheus scraping the exporter stand-ins")
        world.started = time.time()
        yield world
    finally:
        if kubelet is not None and thread is not None:
            kubelet.stop.set()
            thread.join(timeout=10)
        for exporter in exporters:
            exporter.stop()
        plane.stop()


# --- the tests, in order -----------------------------------------------------------------------------------


def test_a_quiet_cluster_gives_no_gpu_finding(world: World) -> None:
    # A full window of idle history, then an audit that started after it.
    time.sleep(max(0.0, world.started + WINDOW + 2 * step_for(LIMITS) + 2 - time.time()))
    runs = world.audits()
    wait_until(lambda: world.audits() >= runs + 2, timeout=6 * INTERVAL + 30, what="two more background audits")
    _, text = world.webhook.get("/metrics")
    assert metric_value(text, "rocm_isolation_audit_gpu_metrics_read") == 1, "the exporter's series were not read"
    # Judged: the whole node's four GPUs and the trainer's (pinned to its reserved device by its pod).
    for gpu in world.whole.gpus:
        assert f'gpu="gpu_id {gpu.gpu_id} (serial {gpu.serial})"' in text, text
    assert f'gpu="gpu_id 0 (serial {world.split.gpus[0].serial})"' in text
    for rule in (*GPU_RULES, "reserved-gpu-unhealthy", "reserved-gpu-hot", "reserved-gpu-inference-load-high"):
        assert metric_value(text, FINDINGS, rule=rule) == 0, rule
    # The apiserver's side of the same pod is a finding of its own, whatever the GPU does.
    assert metric_value(text, FINDINGS, rule="reserved-device-held-by-other-class") == 1
    for rule in GPU_RULES:
        assert world.alerts(rule) == []


def test_a_reserved_gpu_busy_with_no_pod_is_found_within_one_interval_and_alerts(world: World) -> None:
    gpu = world.whole.gpus[1]
    began = time.time()
    with world.whole.lock:
        gpu.set(BUSY, pids="48213,48214")
    seconds = world.found_within_one_interval("reserved-gpu-used-unallocated", began)
    print(f"reserved-gpu-used-unallocated found {seconds:.1f} s after the use began (window {WINDOW} s)")

    def reported() -> Obj | None:
        report = world.report(None)
        results = [r for r in (report or {}).get("results", []) if r["rule"] == "reserved-gpu-used-unallocated"]
        return results[0] if results else None

    result = wait_until(reported, timeout=30, what="the finding in the ClusterPolicyReport")
    assert result["resources"][0] == {"apiVersion": "v1", "kind": "Node", "name": WHOLE}
    message = result["message"]
    assert f"serial {gpu.serial}" in message and "PIDs 48213, 48214" in message, message
    assert "no pod allocated it" in message, message
    states = wait_until(
        lambda: world.alerts("reserved-gpu-used-unallocated"), timeout=30, what=f"{ALERT} active in Prometheus"
    )
    assert set(states) <= {"pending", "firing"}, states
    # The other GPUs of the node stayed idle: no more findings than the one GPU.
    assert world.findings("reserved-gpu-used-unallocated")[0] == 1
    with world.whole.lock:
        gpu.set(IDLE)


def test_a_training_pods_gpu_on_a_reserved_device_busy_is_found_within_one_interval_and_alerts(
    world: World,
) -> None:
    gpu = world.split.gpus[0]
    began = time.time()
    with world.split.lock:
        gpu.set(BUSY)
    seconds = world.found_within_one_interval("reserved-gpu-used-by-other-class", began)
    print(f"reserved-gpu-used-by-other-class found {seconds:.1f} s after the use began (window {WINDOW} s)")

    def reported() -> Obj | None:
        report = world.report(TRAIN)
        results = [r for r in (report or {}).get("results", []) if r["rule"] == "reserved-gpu-used-by-other-class"]
        return results[0] if results else None

    result = wait_until(reported, timeout=30, what="the finding in the training namespace's PolicyReport")
    assert result["resources"][0]["name"] == world.trainer and result["resources"][0]["kind"] == "Pod"
    assert f"pod {TRAIN}/{world.trainer} (class training)" in result["message"], result["message"]
    assert f"node {SPLIT}" in result["message"] and "PCI 0000:" in result["message"], result["message"]
    states = wait_until(
        lambda: world.alerts("reserved-gpu-used-by-other-class"), timeout=30, what=f"{ALERT} active in Prometheus"
    )
    assert set(states) <= {"pending", "firing"}, states
    with world.split.lock:
        gpu.set(IDLE)


def test_quiet_again_the_findings_go_at_the_next_audit(world: World) -> None:
    for exporter in (world.whole, world.split):
        with exporter.lock:
            for gpu in exporter.gpus:
                gpu.set(IDLE)
    time.sleep(3)  # scraped idle, and a query step past it
    runs = world.audits()

    def cleared() -> bool:
        return all(world.findings(rule)[0] == 0 for rule in GPU_RULES)

    wait_until(cleared, timeout=6 * INTERVAL + 30, interval=0.5, what="the GPU findings gone")
    assert world.audits() <= runs + 2
