"""``make bench-lending``: what lending recovers, trace-driven on the real control plane (issue 37, item 3).

The end-to-end suite's control plane (kube-apiserver, kube-scheduler, kube-controller-manager v1.36 from
``KUBEBUILDER_ASSETS``: tests/e2e/controlplane.py), the product installed from its manifests, the webhook
served as ``python -m webhook serve --lending-seconds 1`` (its Lease holder keeps the no-borrowers taint), and
the tests' kubelet stand-in (tests/e2e/kubelet.py: bound pods marked Running and Ready, a deletion finished
after its grace period). One run per mode, each on a fresh control plane, same trace, same seed:

- **strict**: the policy with lending off (reservation as shipped);
- **lending**: lending on (``reclaimGraceSeconds`` = ``--grace``, ``lendFrom``, ``headroomGPUs``).

The cluster: ``--whole-nodes`` device-plugin nodes of 4 GPUs (``amd.com/gpu: 4`` in allocatable) reserved whole
by ``pool apply --nodes`` (label and taint), and ``--split-nodes`` nodes whose 4 GPUs AMD's DRA driver publishes
(ResourceSlices of ``gpu.amd.com``, no ``amd.com/gpu``), split 2 + 2 by ``pool apply --devices-per-node 2``
(run after the webhook serves the policy). Inference (namespace ``bench-serve``): two Deployments whose
replicas follow a daily curve (mean 40 % of the reserved GPUs, peak 100 %: bench/lending_trace.py), scaled
through the API: ``serve-whole`` (``amd.com/gpu: 4``, pinned to the whole reserved nodes: one node each) and
``serve-split`` (a ResourceClaimTemplate of ``gpu.amd.com``, 2 devices: a split node's reserved pair each).
Training (namespace ``bench-train``, labelled to borrow): a seeded backlog of jobs, each a pod the bench
creates, keeps count of, and deletes once its work is done (trace time): device-plugin jobs (``amd.com/gpu``,
pinned to the device-plugin nodes: only the whole reserved nodes serve them, so they run only by borrowing;
all of them borrowers) and DRA jobs (a ResourceClaimTemplate of ``gpu.amd.com``, 1-2 devices: the split nodes'
shared devices, and, once lending covers devices, their idle reserved ones; half of them borrowers). At most
``--pending`` pods of each route and kind (borrowers or not) wait at a time (queues in front of the cluster, as
Kueue would hold them).
A borrower evicted or preempted loses its work since its last checkpoint (``--checkpoint-minutes`` of trace
time) and is queued again, first, with what remains. Two pods that are not borrowers ask for ``amd.com/gpu``
on the device-plugin nodes for the whole run: probes that must never bind.

Every ``--sample-seconds`` (real) the bench reads its watch caches (pods, ResourceClaims) and counts the
reserved GPUs held by inference, by borrowers (running; terminating ones are counted apart: being taken back),
by anything else (a violation), and the GPUs of running training pods; GPU-hours are those counts times the
trace hours between samples (real seconds times the time factor). Inference pods' creation-to-binding seconds
(real, not scaled) come from the pod watch: the time the bench saw the pod created to the time it saw it bound.

    KUBEBUILDER_ASSETS=.cache/envtest/bin python -m bench.lending [--hours 24] [--time-factor 240] [--grace 5]
        [--checkpoint-minutes 30] [--seed 1] [--modes strict,lending] [--no-write]

The last line printed is the figures as one JSON object; docs/benchmarks.md gets a section of its own and
docs/bench-lending.png the plot (``--no-write``: neither).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from cluster_objects import exactly, new_claim_pod, new_claim_template

from bench import lending_model, sections
from bench import lending_trace as trace
from bench.lending_trace import DEVICE_PLUGIN, DRA, BacklogShape, DailyCurve, Progress, RunResult, Sample
from tests.e2e.controlplane import (
    ASSETS_ENV,
    HOW_TO_GET_BINARIES,
    LOOPBACK,
    ControlPlane,
    free_port,
    loopback_only,
    missing_binaries,
)
from tests.e2e.harness import (
    DEVICE_CLASS,
    MI300X_LABELS,
    PCI_SLOTS,
    cli,
    gpu_pod,
    install,
    make_node,
    pci_slice,
    render_manifests,
    service_account_kubeconfig,
    start_webhook,
    wait_reserved_nodes_known,
)
from tests.e2e.kube import ApiError, Kube, Obj, path_for, wait_until
from tests.e2e.kubelet import KubeletStandIn
from webhook.core.policy import default_policy, default_policy_text

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "bench-lending.png"
SECTION_BEGIN = "<!-- bench-lending: written by make bench-lending (bench/lending.py) -->"
SECTION_END = "<!-- bench-lending: end -->"

POLICY = default_policy()
DRIVER = POLICY.spec.reserved_devices.driver  # AMD's DRA driver, gpu.amd.com
BORROWER_CLASS = POLICY.spec.lending.borrower_priority_class.name
BORROW_LABEL = POLICY.spec.lending.pod_label
LENDING_LABEL = POLICY.spec.lending.namespaces.label_key
CLASS_LABEL = POLICY.spec.labels.namespace_class
RESERVED_LABEL_KEY, RESERVED_LABEL_VALUE = POLICY.spec.reserved_nodes.label
RESERVED_CLASS = POLICY.spec.reserved_devices.reserved_class_name
RESERVED_PCI_ANNOTATION = "rocm-isolation.io/reserved-pci-bus-ids"

TRAIN, SERVE = "bench-train", "bench-serve"
ROUTE_LABEL = "bench.rocm-isolation.io/gpus"  # on the nodes: device-plugin or dra
JOB_LABEL = "bench.rocm-isolation.io/job"
GPUS_PER_NODE = 4
RESERVED_PER_SPLIT_NODE = 2
WHOLE_REPLICA_GPUS = GPUS_PER_NODE
SPLIT_REPLICA_GPUS = RESERVED_PER_SPLIT_NODE
PROBES = 2


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Settings:
    hours: float = trace.DAY_HOURS
    time_factor: float = 240.0
    whole_nodes: int = 8
    split_nodes: int = 8
    grace: int = 5
    checkpoint_minutes: float = 30.0
    seed: int = 1
    sample_seconds: float = 1.0
    pending: int = 4
    lend_from: str = "idleNodes"
    headroom: int = 0
    mean: float = 0.4
    jobs_per_route: int = 300
    # reserved devices per split node (pool apply --devices-per-node); inference's replicas stay 2 devices each,
    # as many as split nodes at the peak: the demand is the trace's, whatever the size (bench/lending_recommend.py)
    devices_per_node: int = RESERVED_PER_SPLIT_NODE

    @property
    def reserved_gpus(self) -> int:
        return self.whole_nodes * GPUS_PER_NODE + self.split_nodes * self.devices_per_node

    @property
    def real_seconds(self) -> float:
        return self.hours * 3600.0 / self.time_factor


# --- the policy and the cluster ------------------------------------------------------------------------------


def policy_text(settings: Settings, lending: bool) -> str:
    document = yaml.safe_load(default_policy_text())
    document["spec"]["lending"] = {
        "enabled": lending,
        "reclaimGraceSeconds": settings.grace,
        "lendFrom": settings.lend_from,
        "headroomGPUs": settings.headroom,
    }
    return yaml.safe_dump(document, sort_keys=False)


def whole_node_names(settings: Settings) -> list[str]:
    return [f"whole-{i:02d}" for i in range(1, settings.whole_nodes + 1)]


def split_node_names(settings: Settings) -> list[str]:
    return [f"split-{i:02d}" for i in range(1, settings.split_nodes + 1)]


def deployment(name: str, template_spec: Obj, labels: dict[str, str]) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": SERVE},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name, **labels}}, "spec": template_spec},
        },
    }


# --- watch caches ----------------------------------------------------------------------------------------------


class Watcher:
    """A cluster-wide list + watch of one kind, kept as a dict by uid (its own connection, in a thread). Calls
    ``on_event(kind, obj, seen_at)`` for each watch event (not for the initial list)."""

    def __init__(self, kube: Kube, kind: str, on_event: Any = None) -> None:
        self.kube, self.kind, self.on_event = kube, kind, on_event
        self.objects: dict[str, Obj] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.synced = threading.Event()
        self._conn: http.client.HTTPSConnection | None = None
        self.thread = threading.Thread(target=self._run, name=f"watch-{kind}", daemon=True)

    def start(self) -> None:
        self.thread.start()
        if not self.synced.wait(60):
            raise RuntimeError(f"the {self.kind} watch did not sync")

    def close(self) -> None:
        self.stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(2)
        self.thread.join(timeout=10)

    def snapshot(self) -> list[Obj]:
        with self.lock:
            return list(self.objects.values())

    def _run(self) -> None:
        path = path_for(self.kind)
        while not self.stop.is_set():
            try:
                listed = self.kube.request("GET", path)
                with self.lock:
                    self.objects = {o["metadata"]["uid"]: o for o in listed.get("items", [])}
                self.synced.set()
                self._watch(path, listed["metadata"]["resourceVersion"])
            except Exception as err:  # a broken stream: list again
                if self.stop.is_set():
                    return
                self.errors.append(f"{type(err).__name__}: {err}")
                time.sleep(0.5)

    def _watch(self, path: str, version: str) -> None:
        while not self.stop.is_set():
            params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true", "timeoutSeconds": "1800"}
            conn = http.client.HTTPSConnection(self.kube.host, self.kube.port, context=self.kube.context, timeout=3600)
            self._conn = conn
            try:
                conn.request("GET", f"{path}?{urllib.parse.urlencode(params)}", headers={"Accept": "application/json"})
                response = conn.getresponse()
                if response.status != 200:
                    raise RuntimeError(f"watch {self.kind}: {response.status} {response.read()[:200]!r}")
                while True:
                    line = response.readline()
                    if not line:
                        break  # the server ended the watch: watch again from the last version
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        raise RuntimeError(f"watch {self.kind}: {obj.get('message')}")  # e.g. 410 Gone: list again
                    version = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    seen = time.time()
                    uid = obj["metadata"]["uid"]
                    with self.lock:
                        if kind == "DELETED":
                            self.objects.pop(uid, None)
                        else:
                            self.objects[uid] = obj
                    if self.on_event is not None:
                        self.on_event(kind, obj, seen)
            finally:
                conn.close()


def _conditions(pod: Obj) -> dict[str, Obj]:
    return {c.get("type", ""): c for c in (pod.get("status") or {}).get("conditions") or []}


def _stamp(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


@dataclass
class InferenceTimes:
    """Creation-to-binding of inference pods, from the pod watch (seen created, seen bound)."""

    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # uid -> pod name (its Deployment's name first)
    deleted_unbound: set[str] = field(default_factory=set)
    disrupted: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_event(self, kind: str, pod: Obj, seen: float) -> None:
        meta = pod["metadata"]
        if meta.get("namespace") != SERVE:
            return
        uid = meta["uid"]
        with self.lock:
            if uid not in self.created:
                # First seen by an event: ADDED right after its creation; otherwise (a watch restarted) the
                # apiserver's second-resolution timestamp.
                self.created[uid] = seen if kind == "ADDED" else (_stamp(meta.get("creationTimestamp")) or seen)
                self.names[uid] = str(meta.get("name", ""))
            if pod["spec"].get("nodeName") and uid not in self.bound:
                self.bound[uid] = seen
            target = _conditions(pod).get("DisruptionTarget")
            if target is not None and target.get("status") == "True":
                self.disrupted.add(uid)
            if kind == "DELETED" and uid not in self.bound:
                self.deleted_unbound.add(uid)

    def seconds(self, prefix: str = "") -> list[float]:
        """Of every inference pod bound, or of those of one Deployment (``prefix``: its name)."""
        with self.lock:
            return [
                max(0.0, self.bound[uid] - created)
                for uid, created in self.created.items()
                if uid in self.bound and self.names.get(uid, "").startswith(prefix)
            ]


# --- one run ---------------------------------------------------------------------------------------------------


@dataclass
class Attempt:
    progress: Progress
    pod: str
    running: bool = False
    last_hour: float | None = None


class Run:
    """One mode's control plane, cluster, trace loop and figures."""

    def __init__(self, settings: Settings, mode: str, workdir: Path) -> None:
        self.settings, self.mode, self.workdir = settings, mode, workdir
        self.lending = mode == "lending"
        self.curve = DailyCurve(settings.mean)
        self.result = RunResult(mode)
        self.whole = whole_node_names(settings)
        self.split = split_node_names(settings)
        self.reserved_devices: dict[str, set[str]] = {}
        # One queue per route and kind (borrowers or not), each with its own limit of waiting pods: a head of
        # borrowers that cannot be placed (e.g. beside inference) does not hold back jobs that could run.
        self.queues: dict[tuple[str, bool], collections.deque[Progress]] = collections.defaultdict(collections.deque)
        shape = BacklogShape(jobs_per_route=settings.jobs_per_route)
        for job in trace.make_backlog(settings.seed, shape):
            self.queues[job.route, job.borrower].append(Progress(job, settings.checkpoint_minutes / 60.0))
        self.attempts: dict[str, Attempt] = {}
        self.tries: collections.Counter[int] = collections.Counter()
        self.started_jobs: set[int] = set()
        self.times = InferenceTimes()
        self.nonborrowers_seen: set[str] = set()
        self.replicas = {"serve-whole": 0, "serve-split": 0}
        # job pods seen in the watch cache at least once (one missing afterwards was taken away)
        self._created_seen: set[str] = set()

    # --- setting up ---

    def start(self) -> None:
        s = self.settings
        self.plane = ControlPlane(Path(os.environ[ASSETS_ENV]), self.workdir / "controlplane")
        self.plane.start()
        kube = self.kube = Kube(LOOPBACK, self.plane.apiserver_port, self.plane.ssl_context())
        for name in self.whole:
            make_node(kube, name, {**MI300X_LABELS, ROUTE_LABEL: DEVICE_PLUGIN}, gpus=GPUS_PER_NODE)
        for name in self.split:
            make_node(kube, name, {**MI300X_LABELS, ROUTE_LABEL: DRA}, gpus=0)
            gone = {"amd.com/gpu": None}  # DRA only: no device plugin
            kube.patch("Node", name, {"status": {"capacity": gone, "allocatable": gone}}, subresource="status")
            kube.apply(pci_slice(name))
        kube.apply(DEVICE_CLASS)
        policy_file = self.workdir / "policy.yaml"
        policy_file.write_text(policy_text(s, self.lending), encoding="utf-8")
        cert_dir = self.workdir / "webhook" / "certs"
        cli("certs", "--out-dir", str(cert_dir), check=True)
        port = free_port()
        manifests = render_manifests(cert_dir / "ca.crt", port, policy_file)
        install(self.plane, [d for d in manifests if d["kind"] != "MutatingWebhookConfiguration"])
        self.webhook = start_webhook(
            self.plane,
            self.workdir / "webhook",
            service_account_kubeconfig(self.plane),
            "--lending-seconds", "1",
            # The keeper runs on the Lease of the background audit: a long interval, no reports.
            "--audit-interval-seconds", "3600",
            "--no-audit-reports",
            "--log-summary-seconds", "0",
            policy_file=policy_file,
            cert_dir=cert_dir,
            port=port,
        )  # fmt: skip
        install(self.plane, [d for d in manifests if d["kind"] == "MutatingWebhookConfiguration"])
        admin = self.plane.admin_kubeconfig
        for args in (("--nodes", ",".join(self.whole)), ("--devices-per-node", str(s.devices_per_node))):
            result = cli("pool", "apply", *args, kubeconfig=admin)
            if result.returncode != 0:
                raise RuntimeError(f"pool apply {' '.join(args)}: {result.stdout}\n{result.stderr}")
        reserved_class = kube.get("DeviceClass", RESERVED_CLASS)
        reserved_pci = set(
            (reserved_class["metadata"].get("annotations") or {}).get(RESERVED_PCI_ANNOTATION, "").split(",")
        )
        for node in self.split:
            self.reserved_devices[node] = {f"gpu-{i}" for i, pci in enumerate(PCI_SLOTS) if pci in reserved_pci}
            if len(self.reserved_devices[node]) != s.devices_per_node:
                raise RuntimeError(f"{node}: reserved {self.reserved_devices[node]} (class annotation {reserved_pci})")
        for name, labels in (
            (TRAIN, {CLASS_LABEL: "training", LENDING_LABEL: "allowed"}),
            (SERVE, {CLASS_LABEL: "inference"}),
        ):
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        for name in (TRAIN, SERVE):
            wait_until(functools.partial(kube.get_or_none, "ServiceAccount", "default", name), what=f"{name}/default")
        wait_reserved_nodes_known(kube, self.whole[0], TRAIN)
        for count in (1, 2):
            kube.create(new_claim_template(f"train-{count}", TRAIN, exactly(DRIVER, count)))
        kube.create(new_claim_template("serve-2", SERVE, exactly(DRIVER, SPLIT_REPLICA_GPUS)))
        whole = gpu_pod(
            "serve-whole", SERVE, gpus=WHOLE_REPLICA_GPUS, nodeSelector={RESERVED_LABEL_KEY: RESERVED_LABEL_VALUE}
        )
        whole["spec"]["terminationGracePeriodSeconds"] = 1
        kube.create(deployment("serve-whole", whole["spec"], {}))
        split = new_claim_pod("serve-split", SERVE, template="serve-2", labels={}, terminationGracePeriodSeconds=1)
        kube.create(deployment("serve-split", split["spec"], {}))
        for index in range(PROBES):
            probe = gpu_pod(
                f"probe-{index}", TRAIN, gpus=1, labels={"app": "probe"}, nodeSelector={ROUTE_LABEL: DEVICE_PLUGIN}
            )
            kube.create(probe)
        self.pods = Watcher(kube, "Pod", self.times.on_event)
        self.claims = Watcher(kube, "ResourceClaim")
        self.pods.start()
        self.claims.start()
        self.kubelet = KubeletStandIn(kube, (TRAIN, SERVE))
        self.kubelet_thread = threading.Thread(target=self.kubelet.run, name="kubelet", daemon=True)
        self.kubelet_thread.start()

    def stop(self) -> None:
        for stop in (self._stop_kubelet, self._stop_watchers, self.plane.stop):
            with contextlib.suppress(Exception):
                stop()

    def _stop_kubelet(self) -> None:
        self.kubelet.stop.set()
        self.kubelet_thread.join(timeout=10)

    def _stop_watchers(self) -> None:
        self.pods.close()
        self.claims.close()

    # --- the trace ---

    def scale(self, hour: float) -> None:
        s = self.settings
        for name, most in (("serve-whole", s.whole_nodes), ("serve-split", s.split_nodes)):
            wanted = self.curve.replicas(hour, most)
            if wanted != self.replicas[name]:
                try:
                    self.kube.patch("Deployment", name, {"spec": {"replicas": wanted}}, SERVE, subresource="scale")
                    self.replicas[name] = wanted
                except ApiError as err:
                    self.result.notes.append(f"scale {name}: {err}")

    def submit(self) -> None:
        for (route, borrower), queue in self.queues.items():
            waiting = sum(
                1
                for a in self.attempts.values()
                if not a.running and (a.progress.job.route, a.progress.job.borrower) == (route, borrower)
            )
            while queue and waiting < self.settings.pending:
                progress = queue[0]
                job = progress.job
                self.tries[job.id] += 1
                name = f"{job.name}-{self.tries[job.id]}"
                labels = {"app": "training", JOB_LABEL: str(job.id)}
                if job.borrower:
                    labels[BORROW_LABEL] = "true"
                if route == DEVICE_PLUGIN:
                    pod = gpu_pod(name, TRAIN, gpus=job.gpus, labels=labels, nodeSelector={ROUTE_LABEL: DEVICE_PLUGIN})
                    pod["spec"]["terminationGracePeriodSeconds"] = 30
                else:
                    pod = new_claim_pod(
                        name, TRAIN, template=f"train-{job.gpus}", labels=labels, terminationGracePeriodSeconds=30
                    )
                try:
                    self.kube.create(pod)
                except ApiError as err:
                    self.result.notes.append(f"create {name}: {err.status} {err.message[:200]}")
                    return
                queue.popleft()
                self.attempts[name] = Attempt(progress, name)
                waiting += 1

    def account(self, hour: float, pods: dict[str, Obj]) -> None:
        """Each job pod's work since the last sample; finished jobs deleted; interrupted ones queued again."""
        for name, attempt in list(self.attempts.items()):
            pod = pods.get(name)
            progress = attempt.progress
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                if attempt.running or pod is not None or name in self._created_seen:
                    # Evicted or preempted (the bench deletes only finished jobs, and forgets them first).
                    self.result.lost_gpu_hours += progress.interrupt()
                    self.result.interruptions += 1
                    self.queues[progress.job.route, progress.job.borrower].appendleft(progress)
                    del self.attempts[name]
                continue
            self._created_seen.add(name)
            running = (pod.get("status") or {}).get("phase") == "Running"
            if running:
                if attempt.running and attempt.last_hour is not None:
                    progress.run(hour - attempt.last_hour)
                attempt.running = True
                attempt.last_hour = hour
                self.started_jobs.add(progress.job.id)
                if progress.finished:
                    del self.attempts[name]
                    self.result.jobs_finished += 1
                    try:
                        self.kube.delete("Pod", name, TRAIN, force=True)
                    except ApiError as err:
                        self.result.notes.append(f"delete {name}: {err}")

    def sample(self, hour: float, pods_by_uid: dict[str, Obj], claims: list[Obj]) -> Sample:
        s = self.settings
        inference = borrowers = reclaiming = violations = 0
        whole = set(self.whole)

        def role(pod: Obj) -> str:
            if pod["metadata"]["namespace"] == SERVE:
                return "inference"
            if pod["spec"].get("priorityClassName") == BORROWER_CLASS:
                return "reclaiming" if pod["metadata"].get("deletionTimestamp") else "borrower"
            return "other"

        def hold(pod: Obj, gpus: int) -> None:
            nonlocal inference, borrowers, reclaiming, violations
            kind = role(pod)
            if kind == "inference":
                inference += gpus
            elif kind == "borrower":
                borrowers += gpus
            elif kind == "reclaiming":
                reclaiming += gpus
            else:
                violations += gpus
                self.nonborrowers_seen.add(pod["metadata"]["uid"])

        for pod in pods_by_uid.values():
            node = pod["spec"].get("nodeName")
            if node in whole and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
                gpus = int(limits.get("amd.com/gpu", 0))
                if gpus:
                    hold(pod, gpus)
        for claim in claims:
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            reserved = sum(1 for r in results if r.get("device") in self.reserved_devices.get(r.get("pool", ""), ()))
            if not reserved:
                continue
            owners = [o["uid"] for o in claim["metadata"].get("ownerReferences") or [] if o.get("kind") == "Pod"]
            owners += [
                r["uid"] for r in (claim.get("status") or {}).get("reservedFor") or [] if r.get("resource") == "pods"
            ]
            holder: Obj | None = next((pods_by_uid[uid] for uid in owners if uid in pods_by_uid), None)
            if holder is not None:  # else its pod is gone and the claim about to be deallocated: counted idle
                hold(holder, reserved)
        training = sum(a.progress.job.gpus for a in self.attempts.values() if a.running)
        return Sample(hour, 0.0, s.reserved_gpus, inference, borrowers, reclaiming, training, violations)

    def observe(self, hour: float) -> None:
        """After each sample: nothing here; bench/lending_recommend.py records the webhook's gauges."""

    def run_trace(self) -> None:
        s = self.settings
        samples: list[Sample] = []
        times: list[float] = []
        start = time.monotonic()
        end = start + s.real_seconds
        next_tick = start
        last_log = start
        while True:
            now = time.monotonic()
            if now >= end:
                break
            hour = (now - start) * s.time_factor / 3600.0
            self.scale(hour)
            pods_by_uid = {p["metadata"]["uid"]: p for p in self.pods.snapshot()}
            by_name = {p["metadata"]["name"]: p for p in pods_by_uid.values() if p["metadata"]["namespace"] == TRAIN}
            self.account(hour, by_name)
            self.submit()
            samples.append(self.sample(hour, pods_by_uid, self.claims.snapshot()))
            self.observe(hour)
            times.append(now)
            if now - last_log >= 30:
                last = samples[-1]
                log(
                    f"{self.mode}: {hour:5.1f} h, inference {last.inference}/{last.reserved} reserved GPUs, borrowers "
                    f"{last.borrowers} (+{last.reclaiming} taken back), training {last.training} GPUs, jobs finished "
                    f"{self.result.jobs_finished}, load {os.getloadavg()[0]:.1f}"
                )
                last_log = now
            next_tick += s.sample_seconds
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_tick = time.monotonic()
        spans = trace.spans(times, end, s.time_factor)
        self.result.samples = [
            Sample(
                x.hour, span, x.reserved, x.inference, x.borrowers, x.reclaiming, x.training, x.nonborrowers_on_reserved
            )
            for x, span in zip(samples, spans, strict=True)
        ]
        self.result.bind_seconds = self.times.seconds()
        self.result.bind_seconds_whole = self.times.seconds("serve-whole-")
        self.result.bind_seconds_split = self.times.seconds("serve-split-")
        self.result.inference_unbound = len(self.times.deleted_unbound) + sum(
            1 for p in self.pods.snapshot() if p["metadata"]["namespace"] == SERVE and not p["spec"].get("nodeName")
        )
        self.result.inference_evicted = len(
            self.times.disrupted | {uid for uid, (namespace, _) in self.kubelet.disrupted.items() if namespace == SERVE}
        )
        self.result.nonborrowers_on_reserved = len(self.nonborrowers_seen)
        self.result.jobs_started = len(self.started_jobs)
        if self.kubelet.errors:
            self.result.notes.append(f"kubelet stand-in errors: {self.kubelet.errors[:3]}")
        for watcher in (self.pods, self.claims):
            if watcher.errors:
                self.result.notes.append(f"{watcher.kind} watch restarted: {watcher.errors[:3]}")


def run_mode(settings: Settings, mode: str, make: type[Run] | None = None) -> RunResult:
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"bench-lending-{mode}-") as directory:
        run = (make or Run)(settings, mode, Path(directory))
        try:
            log(f"{mode}: starting the control plane, the webhook and the cluster")
            run.start()
            log(
                f"{mode}: ready after {time.monotonic() - began:.0f} s; the trace: {settings.hours:g} h in {settings.real_seconds:.0f} s"
            )
            run.run_trace()
        except Exception:
            log(f"{mode}: failed\n{traceback.format_exc()}")
            plane = getattr(run, "plane", None)
            for component in list(plane.processes.components) if plane is not None else []:
                log(f"--- {component.name}\n{component.tail(15)}")
            raise
        finally:
            run.stop()
    run.result.wall_seconds = time.monotonic() - began
    return run.result


# --- the report ------------------------------------------------------------------------------------------------


def plot(strict: RunResult, lending: RunResult, settings: Settings, target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), dpi=110, sharex=True)
    for ax, result, title in ((axes[0], lending, "lending"), (axes[1], strict, "strict reservation")):
        hours = [x.hour for x in result.samples]
        layers = [
            [x.inference for x in result.samples],
            [x.borrowers for x in result.samples],
            [x.reclaiming for x in result.samples],
        ]
        ax.stackplot(
            hours,
            *layers,
            labels=["inference", "borrowers (lent)", "borrowers being taken back"],
            colors=["tab:blue", "tab:orange", "tab:red"],
            step="post",
        )
        curve = DailyCurve(settings.mean)
        ax.plot(hours, [curve.fraction(h) * settings.reserved_gpus for h in hours], "k--", lw=1, label="the curve")
        ax.axhline(settings.reserved_gpus, color="grey", lw=1)
        ax.set_ylabel("reserved GPUs")
        ax.set_ylim(0, settings.reserved_gpus * 1.08)
        ax.set_title(
            f"{title}: {settings.reserved_gpus} reserved GPUs ({settings.whole_nodes} whole nodes x 4, "
            f"{settings.split_nodes} split nodes x 2)",
            fontsize=10,
        )
        ax.legend(loc="upper left", fontsize=8)
    axes[1].set_xlabel(f"trace hour (1 real second = {settings.time_factor:g} trace seconds)")
    fig.tight_layout()
    fig.savefig(target)
    plt.close(fig)


MODEL_SIZES = (16, 64, 256, 1000)


def model_rows(settings: Settings, log_to: Any = None) -> list[dict[str, Any]]:
    """The pure model (bench/lending_model.py) of the same policy and trace at growing sizes: as the bench runs it
    (devices of split nodes not lent), and with the split nodes' reserved devices lent too (what the reclaim of
    devices adds), at the bench's size and at 1,000 nodes."""
    rows = []
    for nodes, lend_devices in [*((n, False) for n in MODEL_SIZES), (MODEL_SIZES[0], True), (MODEL_SIZES[-1], True)]:
        model = lending_model.ModelSettings(
            nodes=nodes,
            hours=settings.hours,
            grace_hours=settings.grace * settings.time_factor / 3600.0,
            checkpoint_hours=settings.checkpoint_minutes / 60.0,
            seed=settings.seed,
            pending=settings.pending,
            lend_devices=lend_devices,
            mean=settings.mean,
        )
        row = lending_model.compare(model) | {"lend_devices": lend_devices}
        if log_to is not None:
            log_to(f"model: {json.dumps(row)}")
        rows.append(row)
    return rows


def model_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| nodes | reserved GPUs | devices lent | idle reserved GPU-h (strict) | borrowed GPU-h | ratio | training GPU-h "
        "strict / lending | replicas that waited | borrowers evicted | per reclaim | lost GPU-h | lost per reserved GPU "
        "| lost per borrowed GPU-h | hours closed to borrowers |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']:,} | {r['reserved_gpus']:,} | {'yes' if r['lend_devices'] else 'no'} | "
            f"{r['idle_reserved_gpu_hours']:,.0f} | {r['borrowed_gpu_hours']:,.0f} | {r['borrowed_ratio']:.2f} | "
            f"{r['training_gpu_hours_strict']:,.0f} / {r['training_gpu_hours_lending']:,.0f} | "
            f"{r['inference_replicas_that_waited']} | {r['borrowers_evicted']:,} | {r['evicted_per_reclaim']:.2f} | "
            f"{r['lost_gpu_hours']:,.1f} | {r['lost_per_reserved_gpu']:.3f} | {r['lost_per_borrowed_gpu_hour']:.4f} | "
            f"{r['closed_to_borrowers_hours']:.1f} |"
        )
    return lines


def section(
    figures: dict[str, Any], settings: Settings, meta: dict[str, Any], model: list[dict[str, Any]] | None = None
) -> str:
    s, lend = figures["strict"], figures["lending"]
    rows = [
        ("reserved GPU-hours (all)", "reserved_gpu_hours"),
        ("held by inference", "inference_gpu_hours"),
        ("idle reserved", "idle_reserved_gpu_hours"),
        ("borrowed (lent to running borrowers)", "borrowed_gpu_hours"),
        ("held by borrowers being taken back (grace)", "reclaiming_gpu_hours"),
        ("training GPU-hours (running, any capacity)", "training_gpu_hours"),
        ("training jobs finished", "jobs_finished"),
        ("training jobs started", "jobs_started"),
        ("borrowers evicted or preempted", "interruptions"),
        ("GPU-hours of work lost to them", "lost_gpu_hours"),
        ("inference pods bound", "inference_pods_bound"),
        ("inference creation-to-binding p50 s (real)", "inference_bind_p50_s"),
        ("p99 s", "inference_bind_p99_s"),
        ("max s", "inference_bind_max_s"),
        ("inference pods evicted or preempted", "inference_evicted"),
        ("non-borrowers seen on reserved capacity", "nonborrowers_on_reserved"),
        ("wall time of the run, s", "wall_seconds"),
    ]

    def cell(value: Any) -> str:
        return (
            "—"
            if value is None
            else (f"{value:,}" if isinstance(value, int) else f"{value:,.2f}".rstrip("0").rstrip("."))
        )

    ratio = figures["borrowed_ratio"]
    goal = "met" if ratio is not None and ratio >= 0.8 else "NOT met"
    bound = settings.grace + 5
    whole_share = settings.whole_nodes * GPUS_PER_NODE / settings.reserved_gpus
    p99 = figures["inference_bind_p99_s"]
    lines = [
        SECTION_BEGIN,
        "## Lending on a daily trace (issue 37, `make bench-lending`)",
        "",
        f"Generated by `make bench-lending` (`python -m bench.lending`), commit `{meta['commit']}`, {meta['date']}; "
        f"{meta['cpus']} CPUs, Python {platform.python_version()}, load average {meta['load_start']:.2f} at the start, "
        f"{meta['load_end']:.2f} at the end; {meta['minutes']:.1f} min for both runs.",
        "",
        "**Real control plane** (kube-apiserver, kube-scheduler, kube-controller-manager v1.36.2 of "
        "`KUBEBUILDER_ASSETS`; the webhook as `serve --lending-seconds 1`; the tests' kubelet stand-in), one fresh "
        "control plane per run, same trace and seed (every figure below comes from it; nothing is modelled): "
        f"{settings.whole_nodes} device-plugin nodes of 4 GPUs reserved whole and {settings.split_nodes} DRA nodes "
        f"(AMD's `gpu.amd.com` ResourceSlices) split 2 + 2 by `pool apply --devices-per-node 2`: "
        f"{settings.reserved_gpus} reserved GPUs, {settings.split_nodes * 2} shared. "
        f"**{settings.hours:g} trace hours in {settings.real_seconds:.0f} s: time factor {settings.time_factor:g}** "
        f"(1 real second = {settings.time_factor / 60:g} trace minutes); samples every {settings.sample_seconds:g} s "
        "real; GPU-hours are trace hours. Inference: two Deployments following a daily curve (mean "
        f"{settings.mean * 100:g} % of the reserved GPUs, peak 100 % at 14:00): 4-GPU replicas on the whole nodes, "
        "2-device replicas (a claim template) on the split nodes' reserved devices. Training: a backlog "
        f"(seed {settings.seed}) of device-plugin jobs (1-4 GPUs, all borrowers: only the reserved whole nodes serve "
        "`amd.com/gpu`) and DRA jobs (1-2 devices, half borrowers), 1-8 h of work each, at most "
        f"{settings.pending} waiting per route and kind (borrowers or not); a borrower taken back loses its work since its last checkpoint "
        f"(every {settings.checkpoint_minutes:g} trace minutes) and is queued again. Lending: grace "
        f"{settings.grace} s (real), `lendFrom: {settings.lend_from}`, headroom {settings.headroom}.",
        "",
        "| | strict | lending |",
        "| --- | ---: | ---: |",
        *(f"| {label} | {cell(s[key])} | {cell(lend[key])} |" for label, key in rows),
        "",
        f"- **Borrowed / idle under strict: {cell(ratio)}** (goal ≥ 0.8: **{goal}**): "
        f"{cell(figures['borrowed_gpu_hours'])} GPU-hours lent against {cell(figures['idle_reserved_gpu_hours'])} "
        "idle reserved GPU-hours under strict.",
        f"- The whole nodes hold {whole_share:.0%} of the reserved GPUs (taken back by the scheduler's preemption), "
        "the split nodes' reserved devices the rest (lent through the lendable DeviceClass, taken back by the "
        "keeper's evictions: the scheduler cannot preempt for DRA devices).",
        f"- Creation-to-binding under lending, whole nodes: p99 {cell(lend['inference_bind_p99_whole_s'])} s; "
        f"split nodes: p99 {cell(lend['inference_bind_p99_split_s'])} s ({lend['inference_pods_bound']} inference "
        "pods bound in all: with so few, each p99 is its maximum).",
        f"- Inference creation-to-binding under lending: p99 {cell(p99)} s, max {cell(figures['inference_bind_max_s'])} s "
        f"(bound: grace + 5 = {bound} s: **{'met' if p99 is not None and p99 <= bound else 'NOT met'}**); "
        f"inference pods evicted {figures['inference_evicted']}, non-borrowers on reserved capacity "
        f"{figures['nonborrowers_on_reserved']} (both sides, every sample).",
        *(f"- {note}" for note in meta.get("notes", [])),
        "",
        f"![reserved GPUs over the trace]({PLOT.name})",
        "",
        *(
            [
                "**Model, not the control plane** (`bench/lending_model.py`, `python -m bench.lending_model`): the same "
                "policy, trace, seed, grace (in trace time: "
                f"{settings.grace * settings.time_factor / 60:g} trace minutes) and checkpoints, stepped every trace minute "
                "at growing sizes (half the nodes whole, half split; the backlog scaled with them). It leaves out "
                "scheduling latency, PodDisruptionBudgets, the keeper's 1 s round and the kubelet: its waits are 0 or "
                "the grace period, and its first row is there to compare with the measured one above. Rows with "
                "devices lent: borrowers also take the split nodes' idle reserved devices and are evicted for "
                "inference (the reclaim of devices, not in this commit's product).",
                "",
                *model_table(model),
                "",
            ]
            if model
            else []
        ),
        "The last line `make bench-lending` printed:",
        "",
        "```json",
        json.dumps({k: v for k, v in figures.items() if k not in ("strict", "lending")}),
        "```",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    sections.write_section(DOC, SECTION_BEGIN, SECTION_END, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    d = Settings()
    parser.add_argument("--hours", type=float, default=d.hours, help="trace hours (default: a day)")
    parser.add_argument("--time-factor", type=float, default=d.time_factor, help="trace seconds per real second")
    parser.add_argument("--whole-nodes", type=int, default=d.whole_nodes)
    parser.add_argument("--split-nodes", type=int, default=d.split_nodes)
    parser.add_argument("--grace", type=int, default=d.grace, help="lending.reclaimGraceSeconds (real seconds)")
    parser.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=d.checkpoint_minutes,
        help="trace minutes between a job's checkpoints (0: continuous)",
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--sample-seconds", type=float, default=d.sample_seconds)
    parser.add_argument(
        "--pending", type=int, default=d.pending, help="training pods waiting at most, per route and kind"
    )
    parser.add_argument("--lend-from", choices=("idleNodes", "idleGPUs"), default=d.lend_from)
    parser.add_argument("--headroom", type=int, default=d.headroom, help="lending.headroomGPUs")
    parser.add_argument("--modes", default="strict,lending", help="strict, lending or both (the figures need both)")
    parser.add_argument(
        "--model",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the runs, the pure model of the same policy at 16 to 1,000 nodes (default: on)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only: neither docs/benchmarks.md nor the plot")
    args = parser.parse_args(argv)
    settings = Settings(
        hours=args.hours,
        time_factor=args.time_factor,
        whole_nodes=args.whole_nodes,
        split_nodes=args.split_nodes,
        grace=args.grace,
        checkpoint_minutes=args.checkpoint_minutes,
        seed=args.seed,
        sample_seconds=args.sample_seconds,
        pending=args.pending,
        lend_from=args.lend_from,
        headroom=args.headroom,
    )
    missing = missing_binaries(os.environ.get(ASSETS_ENV))
    if missing:
        print(f"bench.lending needs {ASSETS_ENV} ({', '.join(missing)} missing): {HOW_TO_GET_BINARIES}")
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if not modes or not set(modes) <= {"strict", "lending"}:
        parser.error("--modes: strict, lending or both")
    loopback_only()
    # The webhook ServiceAccount's username is longer than RFC 5280's CN bound (tests/e2e/controlplane.Pki).
    warnings.filterwarnings("ignore", "Attribute's length must be", UserWarning)
    began = time.monotonic()
    load_start = os.getloadavg()[0]
    # the commit that runs (a commit made meanwhile is not what ran)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    results = {mode: run_mode(settings, mode) for mode in modes}
    for mode, result in results.items():
        log(f"{mode}: {json.dumps(result.figures())}")
        for note in result.notes[:10]:
            log(f"{mode}: note: {note}")
    if len(results) < 2:
        print(json.dumps({mode: r.figures() for mode, r in results.items()}))
        return 0
    strict, lending = results["strict"], results["lending"]
    minutes = (time.monotonic() - began) / 60.0
    figures = trace.summary(
        strict,
        lending,
        grace_s=settings.grace,
        time_factor=settings.time_factor,
        checkpoint_minutes=settings.checkpoint_minutes,
        lend_from=settings.lend_from,
        seed=settings.seed,
        trace_hours=settings.hours,
        run_minutes=round(minutes, 1),
    )
    model = model_rows(settings, log) if args.model else None
    if not args.no_write:
        meta: dict[str, Any] = {
            "commit": commit,
            "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "cpus": os.cpu_count(),
            "load_start": load_start,
            "load_end": os.getloadavg()[0],
            "minutes": minutes,
            "notes": [],
        }
        plot(strict, lending, settings, PLOT)
        write_section(section(figures, settings, meta, model))
        log(f"written: {DOC.relative_to(ROOT)}, {PLOT.relative_to(ROOT)}")
    print(
        json.dumps(
            {k: v for k, v in figures.items() if k not in ("strict", "lending")}
            | {"strict": figures["strict"], "lending": figures["lending"]}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
