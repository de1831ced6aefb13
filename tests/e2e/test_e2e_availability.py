"""Availability under load (issue 28): two ``serve`` replicas behind a real L4 balancer while GPU pods are
created through the real apiserver, phase after phase, each judged apart: steady, a rolling update with
and without a preStop pause, SIGKILL and SIGSTOP of the busier replica, a serving-certificate rotation.

The rig (one per module, on the session's control plane):

- two ``serve`` replicas run as the Deployment runs them: the webhook's ServiceAccount kubeconfig, the
  cluster watched, ``--drain-seconds`` and ``--graceful-timeout-seconds`` read from the rendered
  Deployment; one certificate directory for all (the Secret every pod mounts). The background audit is
  off (the harness's default): its Lease failover is test_e2e_lease.py's;
- HAProxy (Debian's package) in TCP mode on loopback, standing in for the Service and kube-proxy: TLS
  passes through untouched, the health check is ``GET /readyz`` over TLS verified against the CA every
  0.5 s, two failures take a replica out, two successes bring it back; as with kube-proxy, a connection
  to a replica that no longer listens is refused (no retry, no redispatch). A replica becomes an
  endpoint once it is ready (the runtime API's ``add server``, as the EndpointSlice controller adds a
  ready pod); a terminating replica with a preStop hook loses its endpoint at once (``set server state
  maint``, as kube-proxy drops a terminating endpoint: no new connection, the established ones go on),
  and without one only the health check takes it out;
- the manifests' MutatingWebhookConfiguration with ``clientConfig.url`` pointing at HAProxy and the
  rig's CA, its hooks renamed ``*.availability.rocm-isolation.io`` so that the apiserver counts their
  failed calls apart from the session's (the session's configuration is restored at the end);
- the load: bursts of four concurrent creates (four threads), three bursts a second, as a controller
  creates pods in batches: server-side dry-run creates of GPU pods through the apiserver (its admission
  chain in full, the placement MutatingAdmissionPolicy included), inference and training namespaces in
  turn, exactly one request per create (no client retry). The bursts keep several connections from the
  apiserver to the replicas pooled and make it dial new ones.

Per phase, the load paused at its boundaries so that every create and every count belongs to one phase:
creates; failed creates; ``fail-open``, the apiserver's own count of calls to the webhook that failed
open (``apiserver_admission_webhook_fail_open_count{name="pods.availability.rocm-isolation.io"}`` from its
/metrics);
pods admitted *without the webhook's mutation* (its variable HSA_QUEUE_PRIORITY, and for inference the
topology spread: the placement policy never writes those); *un-placed* pods, admitted with no placement
at all, neither the webhook's nor the placement policy's (the class annotation; the reserved affinity and
toleration for inference, the ``NotIn`` for training); the creates' latency (p50, p99, max).

Asserted: no create fails and no pod is un-placed, in every phase; steady, through both rolling updates
and through the rotation, zero fail-open and every pod mutated by the webhook; during the crash and the
hang every pod without the webhook's mutation is one the apiserver counted as failed open, and the worst
create takes at most the shipped ``timeoutSeconds`` + 1 s. A replica that terminates exits cleanly, not
before its drain is over; without the preStop pause HAProxy's health check has taken it out before it
stops listening (that, rather than the fail-open count, is what catches a missing drain at this load:
with ``--drain-seconds 0`` the apiserver happened not to dial the dead replica in the second before the
check saw it go, and the phase failed on those assertions only). The figures of a run are printed
(``-s``) and kept in docs/reliability.md.

Without HAProxy the module is skipped with a notice saying how to get it (``apt-get install haproxy``);
``.ci/run`` installs it and sets ``E2E_REQUIRE_HAPROXY=1``, which turns that skip into a failure: in CI
the suite runs.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from .controlplane import ASSETS_ENV, LOOPBACK, ControlPlane, free_port, missing_binaries
from .harness import Cluster, Webhook, cli, gpu_pod, metric_value, start_webhook
from .kube import Obj, wait_until

REQUIRE_ENV = "E2E_REQUIRE_HAPROXY"
HAPROXY = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if os.access(p, os.X_OK)), None)
NOTICE = (
    "haproxy not found: the availability suite (two webhook replicas behind an L4 balancer) did not run. "
    "Install Debian's package (`apt-get install haproxy`; .ci/run does it when running as root)"
)

# Without the control plane's binaries conftest.py deselects the whole e2e suite and says so: no notice here.
if HAPROXY is None and not os.environ.get(REQUIRE_ENV) and not missing_binaries(os.environ.get(ASSETS_ENV)):
    pytest.skip(NOTICE, allow_module_level=True)  # one notice for the module (-ra)

SHIPPED_HOOK = "pods.rocm-isolation.io"
# The rig's configuration names its hooks apart (pods.availability.rocm-isolation.io, ...): the apiserver
# counts failed calls per hook name for the whole session, and the crash phases add to the count, which
# test_e2e_rotation.py expects to find at 0 for the session's own hook.
HOOK = "pods.availability.rocm-isolation.io"
PLACEMENT_POLICY = "rocm-isolation-placement"
POOL_KEY = "rocm-isolation.io/pool"
CLASS_ANNOTATION = "rocm-isolation.io/class"
NAMESPACE_CLASS_LABEL = "rocm-isolation.io/class"
RESERVED_TAINT_KEY = "rocm-isolation.io/reserved"
PRIORITY_VARIABLE = "HSA_QUEUE_PRIORITY"
PRIORITY = {"inference": "high", "training": "low"}

THREADS = 4
RATE = 12.0  # creates per second, all threads
# The Deployment's preStop sleep (10 s) outlasts the endpoint's removal reaching every kube-proxy; here
# the removal is one command to HAProxy, effective at once, so 3 s of it (the old replica still answering
# the apiserver's pooled connections, /readyz still 200) are enough to show the same thing.
PRESTOP_SECONDS = 3.0
SETTLE = 1.5  # load after the last event of a phase
BACKEND = "replicas"
CHECK = "check check-ssl verify required ca-file {ca} inter 500 fall 2 rise 2"

HAPROXY_CONFIG = """\
global
    maxconn 512
    nbthread 1
    stats socket {socket} mode 600 level admin
    log stderr format short local0 notice

defaults
    mode tcp
    log global
    timeout connect 500ms
    # Longer than the apiserver's idle webhook connections (90 s) and serve's keep-alive (95 s): the
    # balancer never cuts a pooled connection the two ends still count on.
    timeout client 150s
    timeout server 150s
    timeout check 500ms
    # As kube-proxy: a connection goes to the endpoint it was given, and is refused when that one is gone
    # (no retry, no redispatch to another server, which would hide a replica that stops listening early).
    retries 0

frontend webhook
    bind {host}:{port}
    default_backend {backend}

backend {backend}
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    # Servers are added at run time (``add server``): one can only name a CA file HAProxy has loaded,
    # which this disabled line does.
    server ca-loader {host}:1 disabled {check}
"""


# --- HAProxy --------------------------------------------------------------------------------------


class Balancer:
    """HAProxy in the control plane's process group, driven through its runtime API (admin socket)."""

    def __init__(self, plane: ControlPlane, directory: Path, ca_file: Path) -> None:
        assert HAPROXY is not None
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.socket = directory / "admin.sock"
        self.check = CHECK.format(ca=ca_file)
        config = directory / "haproxy.cfg"
        config.write_text(
            HAPROXY_CONFIG.format(socket=self.socket, host=LOOPBACK, port=self.port, backend=BACKEND, check=self.check),
            encoding="utf-8",
        )
        self.component = plane.processes.start("haproxy", [HAPROXY, "-db", "-f", str(config)])
        wait_until(self._answers, timeout=30, what="HAProxy's admin socket")

    def _answers(self) -> bool:
        if self.component.process.poll() is not None:
            raise RuntimeError(f"haproxy exited:\n{self.component.tail()}")
        try:
            return "pxname" in self.command("show stat")
        except OSError:
            return False

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def add(self, name: str, port: int) -> None:
        """A ready replica becomes an endpoint."""
        answer = self.command(f"add server {BACKEND}/{name} {LOOPBACK}:{port} {self.check}")
        assert "New server registered" in answer, answer
        self.command(f"enable health {BACKEND}/{name}")
        self.command(f"enable server {BACKEND}/{name}")

    def take_out(self, name: str) -> None:
        """The endpoint of a terminating pod: no new connection, the established ones go on."""
        self.command(f"set server {BACKEND}/{name} state maint")

    def delete(self, name: str) -> None:
        self.take_out(name)
        wait_until(
            lambda: self.command(f"del server {BACKEND}/{name}").strip() in ("Server deleted.", ""),
            timeout=30,
            what=f"HAProxy to delete {name} (no connection left)",
        )

    def status(self, name: str) -> str:
        """UP, DOWN, MAINT, ... (``show stat``; ``UP 1/2`` while going down)."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == BACKEND and row.get("svname") == name:
                return row["status"]
        return "absent"


# --- the load -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Create:
    phase: str
    cls: str
    latency: float
    error: str | None
    placed: bool
    mutated: bool


def required_terms(pod: Obj) -> list[Obj]:
    affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    terms: list[Obj] = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms"
    ) or []
    return terms


def _has(term: Obj, operator: str, value: str) -> bool:
    return any(
        e.get("key") == POOL_KEY and e.get("operator") == operator and value in (e.get("values") or [])
        for e in term.get("matchExpressions") or []
    )


def placed(pod: Obj, cls: str) -> bool:
    """The placement, whoever wrote it (the webhook or the placement policy)."""
    if (pod["metadata"].get("annotations") or {}).get(CLASS_ANNOTATION) != cls:
        return False
    terms = required_terms(pod)
    if not terms:
        return False
    if cls == "inference":
        tolerated = any(t.get("key") == RESERVED_TAINT_KEY for t in pod["spec"].get("tolerations") or [])
        return tolerated and all(_has(t, "In", "inference") for t in terms)
    return all(_has(t, "NotIn", "inference") for t in terms)


def mutated_by_the_webhook(pod: Obj, cls: str) -> bool:
    """What only the webhook writes: the class's variable, and the inference class's topology spread."""
    env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c.get("env") or []}
    if env.get(PRIORITY_VARIABLE) != PRIORITY[cls]:
        return False
    return cls != "inference" or bool(pod["spec"].get("topologySpreadConstraints"))


@dataclass
class Figures:
    phase: str
    seconds: float
    creates: int
    failed: int
    fail_open: float
    rejected: float
    unmutated: int
    unplaced: int
    p50: float
    p99: float
    max: float
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def row(self) -> str:
        return (
            f"| {self.phase} | {self.creates} | {self.failed} | {self.fail_open:g} | {self.unmutated} | "
            f"{self.unplaced} | {self.p50 * 1000:.0f} / {self.p99 * 1000:.0f} / {self.max * 1000:.0f} ms |"
        )


TABLE_HEADER = (
    "| phase | creates | failed | fail-open (apiserver counter) | without the webhook's mutation | un-placed "
    "| p50 / p99 / max |\n|---|---|---|---|---|---|---|"
)


def _apiserver_counts(cluster: Cluster) -> tuple[float, float]:
    text = cluster.kube.metrics()
    return (
        metric_value(text, "apiserver_admission_webhook_fail_open_count", name=HOOK),
        metric_value(text, "apiserver_admission_webhook_rejection_count", name=HOOK),
    )


class Load:
    """Threads creating GPU pods (server-side dry-run) at a steady rate while a phase runs; paused
    between phases (no create in flight) so that the apiserver's counters are read at the boundary."""

    def __init__(self, cluster: Cluster, namespaces: dict[str, str]) -> None:
        self.cluster = cluster
        self.namespaces = namespaces  # class -> namespace
        self.creates: list[Create] = []
        self.phase = ""
        self._cond = threading.Condition()
        self._running = False
        self._stopped = False
        self._in_flight = 0
        self._resumed_at = 0.0
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(THREADS)]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int) -> None:
        context = self.cluster.plane.ssl_context()
        conn: http.client.HTTPSConnection | None = None
        interval = THREADS / RATE
        serial = 0
        next_at = 0.0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._running or self._stopped)
                if self._stopped:
                    return
                phase = self.phase
                # All threads on one grid: bursts of THREADS concurrent creates (as a ReplicaSet controller
                # creates pods in batches), which keeps several connections from the apiserver to the
                # replicas pooled and has it dial new ones. No catching up after a slow create.
                next_at = max(next_at, self._resumed_at)
                self._in_flight += 1
            try:
                now = time.monotonic()
                if next_at > now:
                    time.sleep(next_at - now)
                next_at = max(next_at + interval, time.monotonic())
                serial += 1
                cls = ("inference", "training")[(serial + index) % 2]
                if conn is None:
                    conn = http.client.HTTPSConnection(
                        LOOPBACK, self.cluster.plane.apiserver_port, context=context, timeout=30
                    )
                conn, record = self._create(conn, phase, cls, f"availability-{index}-{serial}")
                with self._cond:
                    self.creates.append(record)
            finally:
                with self._cond:
                    self._in_flight -= 1
                    self._cond.notify_all()

    def _create(
        self, conn: http.client.HTTPSConnection, phase: str, cls: str, name: str
    ) -> tuple[http.client.HTTPSConnection | None, Create]:
        namespace = self.namespaces[cls]
        body = json.dumps(gpu_pod(name, namespace)).encode()
        path = f"/api/v1/namespaces/{namespace}/pods?dryRun=All"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        started = time.perf_counter()
        try:
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            return None, Create(phase, cls, time.perf_counter() - started, f"{type(err).__name__}: {err}", False, False)
        latency = time.perf_counter() - started
        if response.status != 201:
            return conn, Create(phase, cls, latency, f"{response.status}: {payload[:300]!r}", False, False)
        pod = json.loads(payload)
        return conn, Create(phase, cls, latency, None, placed(pod, cls), mutated_by_the_webhook(pod, cls))

    def _pause(self) -> None:
        with self._cond:
            self._running = False
            if not self._cond.wait_for(lambda: self._in_flight == 0, timeout=60):
                raise AssertionError("creates still in flight after 60 s")

    def run(self, phase: str, action: Callable[[Figures], None]) -> Figures:
        """The load running while ``action`` does the phase's events; the phase's figures. ``action``
        may add notes to the figures (what it observed)."""
        fail_open, rejected = _apiserver_counts(self.cluster)
        figures = Figures(phase, 0.0, 0, 0, 0.0, 0.0, 0, 0, 0.0, 0.0, 0.0)
        with self._cond:
            self.phase = phase
            self._resumed_at = time.monotonic()
            self._running = True
            self._cond.notify_all()
        started = time.monotonic()
        try:
            action(figures)
        finally:
            self._pause()
        figures.seconds = time.monotonic() - started
        fail_open_after, rejected_after = _apiserver_counts(self.cluster)
        figures.fail_open = fail_open_after - fail_open
        figures.rejected = rejected_after - rejected
        with self._cond:
            mine = [c for c in self.creates if c.phase == phase]
        latencies = sorted(c.latency for c in mine)
        figures.creates = len(mine)
        figures.failed = sum(1 for c in mine if c.error is not None)
        figures.errors = [c.error for c in mine if c.error is not None][:5]
        admitted = [c for c in mine if c.error is None]
        figures.unmutated = sum(1 for c in admitted if not c.mutated)
        figures.unplaced = sum(1 for c in admitted if not c.placed)
        if latencies:
            figures.p50 = statistics.median(latencies)
            figures.p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
            figures.max = latencies[-1]
        return figures

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._stopped = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=60)


# --- the replicas ---------------------------------------------------------------------------------


def shipped_deployment() -> Obj:
    """The webhook's Deployment as ``manifests`` renders it (the session's manifests leave it out)."""
    rendered = cli("manifests", check=True).stdout
    deployment: Obj = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    return deployment


def deployment_flag(deployment: Obj, flag: str) -> float:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for arg in container["args"]:
        name, _, value = str(arg).partition("=")
        if name == flag:
            return float(value)
    raise AssertionError(f"the Deployment does not pass {flag}: {container['args']}")


def served_serial(port: int, ca_file: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection((LOOPBACK, port), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname=LOOPBACK) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@dataclass
class Replica:
    name: str  # its server's name in HAProxy
    webhook: Webhook

    @property
    def process(self) -> Any:
        return self.webhook.component.process

    def reviews(self) -> float:
        return self.webhook.metric("rocm_isolation_admission_reviews_total")


@dataclass(frozen=True)
class Termination:
    name: str
    down_after: float | None  # SIGTERM -> HAProxy's health check saw it DOWN (None: taken out by hand before)
    exit_after: float  # SIGTERM -> the process gone
    returncode: int


class Rig:
    def __init__(self, cluster: Cluster, directory: Path, drain: float, graceful: float) -> None:
        self.cluster = cluster
        self.plane = cluster.plane
        self.directory = directory
        self.drain = drain
        self.graceful = graceful
        self.cert_dir = directory / "certs"
        cli("certs", "--out-dir", str(self.cert_dir), check=True)
        self.ca_file = self.cert_dir / "ca.crt"
        self.balancer = Balancer(self.plane, directory / "haproxy", self.ca_file)
        self.replicas: list[Replica] = []
        self._serial = 0
        self.figures: list[Figures] = []
        self.load: Load | None = None

    def start_replica(self) -> Replica:
        """A new replica; once ready (start_webhook waits for /readyz), an endpoint."""
        self._serial += 1
        name = f"r{self._serial}"
        webhook = start_webhook(
            self.plane,
            self.directory / f"replica-{name}",
            self.cluster.webhook_kubeconfig,
            "--drain-seconds",
            f"{self.drain:g}",
            "--graceful-timeout-seconds",
            f"{self.graceful:g}",
            cert_dir=self.cert_dir,
        )
        replica = Replica(name, webhook)
        self.balancer.add(name, webhook.port)
        wait_until(lambda: self.balancer.status(name) == "UP", timeout=30, what=f"HAProxy to send to {name}")
        self.replicas.append(replica)
        return replica

    def phase(self, name: str, action: Callable[[Figures], None]) -> Figures:
        """One phase under load; its figures, printed and kept for the table."""
        self.assert_two_up()
        assert self.load is not None
        figures = self.load.run(name, action)
        for replica in self.replicas:
            internal = replica.webhook.metric("rocm_isolation_errors_total", kind="internal")
            if internal:
                figures.notes.append(f"{replica.name}: {internal:g} internal errors")
        self.figures.append(figures)
        print(f"\n{figures.row()}")
        return figures

    def assert_two_up(self) -> None:
        assert len(self.replicas) == 2, [r.name for r in self.replicas]
        for replica in self.replicas:
            assert replica.process.poll() is None, replica.webhook.component.tail()
            assert self.balancer.status(replica.name) == "UP", (replica.name, self.balancer.status(replica.name))

    def forget(self, replica: Replica) -> None:
        """A replica whose process is gone: out of HAProxy and of the process group."""
        if replica in self.replicas:
            self.replicas.remove(replica)
        self.balancer.delete(replica.name)
        self.plane.processes.stop_one(replica.webhook.component)

    def busier(self, window: float = 2.0) -> Replica:
        before = {r.name: r.reviews() for r in self.replicas}
        time.sleep(window)
        return max(self.replicas, key=lambda r: r.reviews() - before[r.name])

    def terminate(self, replica: Replica, prestop: float) -> Termination:
        """What the kubelet does to a deleted pod: the preStop hook (its endpoint gone at once, then the
        pause), SIGTERM, then waiting for the process to exit (drain, then uvicorn's shutdown)."""
        if prestop > 0:
            self.balancer.take_out(replica.name)
            time.sleep(prestop)
        replica.process.send_signal(signal.SIGTERM)
        sigterm = time.monotonic()
        down_after: float | None = None
        deadline = sigterm + self.drain + self.graceful + 10
        while replica.process.poll() is None:
            if down_after is None and self.balancer.status(replica.name).startswith("DOWN"):
                down_after = time.monotonic() - sigterm
            if time.monotonic() > deadline:
                raise AssertionError(f"{replica.name} still running after SIGTERM:\n{replica.webhook.component.tail()}")
            time.sleep(0.05)
        exit_after = time.monotonic() - sigterm
        returncode = int(replica.process.returncode)
        self.forget(replica)
        return Termination(replica.name, down_after, exit_after, returncode)

    def roll(self, prestop: float) -> list[Termination]:
        """Every replica replaced as the Deployment's RollingUpdate does it (maxSurge 1, maxUnavailable 0):
        a new replica, once ready, takes an old one's place; the old one terminates while the next new
        one starts."""
        old = list(self.replicas)
        with ThreadPoolExecutor(max_workers=len(old)) as pool:
            futures = []
            for replica in old:
                self.start_replica()
                self.replicas.remove(replica)
                futures.append(pool.submit(self.terminate, replica, prestop))
            return [f.result() for f in futures]

    def stop_all(self) -> None:
        for replica in list(self.replicas):
            process = replica.process
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                # The first SIGTERM starts the drain, the second ends it.
                process.send_signal(signal.SIGTERM)
                time.sleep(0.2)
                process.send_signal(signal.SIGTERM)
            self.plane.processes.stop_one(replica.webhook.component)
            self.replicas.remove(replica)
        self.plane.processes.stop_one(self.balancer.component)


def _configuration(cluster: Cluster) -> Obj:
    configuration: Obj = next(d for d in cluster.manifests if d["kind"] == "MutatingWebhookConfiguration")
    return configuration


def _pointed_at(configuration: Obj, url: str, ca_file: Path) -> Obj:
    moved = copy.deepcopy(configuration)
    for hook in moved["webhooks"]:
        hook["name"] = hook["name"].replace(".rocm-isolation.io", ".availability.rocm-isolation.io")
        hook["clientConfig"]["url"] = url
        hook["clientConfig"]["caBundle"] = base64.b64encode(ca_file.read_bytes()).decode()
    return moved


def _called(cluster: Cluster, counter: Callable[[], float], probe: Obj) -> bool:
    before = counter()
    cluster.kube.create(probe, dry_run=True)
    return counter() > before


@pytest.fixture(scope="module")
def rig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    if HAPROXY is None:
        pytest.fail(f"{NOTICE}; {REQUIRE_ENV} is set: in CI the availability suite must run", pytrace=False)
    kube = cluster.kube
    # Pods admitted while the webhook fails open are placed by this policy alone (the manifests ship it).
    assert kube.get_or_none("MutatingAdmissionPolicy", PLACEMENT_POLICY) is not None
    assert kube.get_or_none("MutatingAdmissionPolicyBinding", PLACEMENT_POLICY) is not None
    deployment = shipped_deployment()
    drain = deployment_flag(deployment, "--drain-seconds")
    graceful = deployment_flag(deployment, "--graceful-timeout-seconds")
    assert drain > 0, "the Deployment ships no drain"
    rig = Rig(cluster, tmp_path_factory.mktemp("availability"), drain, graceful)
    namespaces: dict[str, str] = {}
    load: Load | None = None
    original = _configuration(cluster)
    try:
        for _ in range(2):
            rig.start_replica()
        for cls in ("inference", "training"):
            namespaces[cls] = cluster.namespace(f"availability-{cls}", {NAMESPACE_CLASS_LABEL: cls})
        moved = _pointed_at(original, f"https://{LOOPBACK}:{rig.balancer.port}/mutate", rig.ca_file)
        live = kube.apply(moved)
        assert [h["name"] for h in live["webhooks"]] == [h["name"] for h in moved["webhooks"]], live["webhooks"]
        probe = gpu_pod("availability-probe", namespaces["training"])

        def through_the_balancer() -> float:
            return sum(r.reviews() for r in rig.replicas)

        wait_until(
            lambda: all(_called(cluster, through_the_balancer, probe) for _ in range(3)),
            timeout=60,
            what="the apiserver to call the webhook through HAProxy",
        )
        load = rig.load = Load(cluster, namespaces)
        yield rig
    finally:
        if load is not None:
            load.stop()
        restored = kube.apply(original)
        try:
            assert [h["name"] for h in restored["webhooks"]] == [h["name"] for h in original["webhooks"]]
            session = cluster.webhook
            probe = gpu_pod("availability-restored", "default")

            def session_reviews() -> float:
                return session.metric("rocm_isolation_admission_reviews_total")

            wait_until(
                lambda: all(_called(cluster, session_reviews, probe) for _ in range(3)),
                timeout=60,
                what="the apiserver to call the session's webhook again",
            )
            cluster.sync_webhook()
        finally:
            rig.stop_all()
            for name in namespaces.values():
                cluster.cleanup(name)
            if rig.figures:
                print("\n" + TABLE_HEADER)
                for figures in rig.figures:
                    print(figures.row())
                for figures in rig.figures:
                    for note in figures.notes:
                        print(f"{figures.phase}: {note}")


# --- the phases -----------------------------------------------------------------------------------


def shipped_timeout(cluster: Cluster) -> float:
    """The webhook's ``timeoutSeconds`` in the rendered manifests."""
    hook = next(h for h in _configuration(cluster)["webhooks"] if h["name"] == SHIPPED_HOOK)
    return float(hook["timeoutSeconds"])


def judge(figures: Figures, *, fault: bool = False, timeout: float | None = None) -> None:
    problems = []
    if figures.creates < figures.seconds * RATE / 3:
        problems.append(f"only {figures.creates} creates in {figures.seconds:.1f} s: the load did not run")
    if figures.failed:
        problems.append(f"{figures.failed} creates failed")
    if figures.unplaced:
        problems.append(f"{figures.unplaced} GPU pods admitted without any placement")
    if figures.rejected:
        problems.append(
            f"the apiserver counted {figures.rejected:g} rejections by a failed call (failurePolicy Ignore)"
        )
    if any("internal errors" in note for note in figures.notes):
        problems.append("a replica answered with internal errors")
    if fault:
        assert timeout is not None
        if figures.unmutated > figures.fail_open:
            problems.append(
                f"{figures.unmutated} pods without the webhook's mutation, but the apiserver counted "
                f"{figures.fail_open:g} calls failed open"
            )
        if figures.max > timeout + 1:
            problems.append(f"the worst create took {figures.max:.2f} s (timeoutSeconds {timeout:g} + 1 s)")
    else:
        if figures.fail_open:
            problems.append(f"the apiserver counted {figures.fail_open:g} calls failed open")
        if figures.unmutated:
            problems.append(f"{figures.unmutated} pods admitted without the webhook's mutation")
    assert not problems, f"{figures.row()}\n{problems}\nerrors: {figures.errors}\nnotes: {figures.notes}"


def test_steady(rig: Rig) -> None:
    judge(rig.phase("steady", lambda figures: time.sleep(5)))


def _roll(rig: Rig, name: str, prestop: float) -> list[Termination]:
    terminations: list[Termination] = []

    def action(figures: Figures) -> None:
        terminations.extend(rig.roll(prestop))
        figures.notes += [
            f"{t.name}: exit {t.returncode} {t.exit_after:.1f} s after SIGTERM"
            + ("" if t.down_after is None else f", out of HAProxy after {t.down_after:.1f} s (health check)")
            for t in terminations
        ]
        time.sleep(SETTLE)

    judge(rig.phase(name, action))
    for termination in terminations:
        # A clean exit: 0, or the SIGTERM that uvicorn raises again once its shutdown is done.
        assert termination.returncode in (0, -signal.SIGTERM), termination
        # Reviews are served for the whole drain: the process does not go before it ends.
        assert termination.exit_after >= rig.drain, termination
    return terminations


def test_rolling_update_with_a_prestop_pause(rig: Rig) -> None:
    _roll(rig, f"rolling update, preStop pause {PRESTOP_SECONDS:g} s", PRESTOP_SECONDS)


def test_rolling_update_without_a_prestop_pause_the_drain_alone_holds(rig: Rig) -> None:
    """No preStop, no endpoint removed by hand: only HAProxy's health check takes the old replica out,
    which it does because /readyz fails at SIGTERM while reviews are still served for the drain."""
    for termination in _roll(rig, "rolling update, no preStop pause", 0.0):
        assert termination.down_after is not None, termination
        assert termination.down_after < min(rig.drain, termination.exit_after), termination


def test_sigkill_of_the_busier_replica(rig: Rig, cluster: Cluster) -> None:
    timeout = shipped_timeout(cluster)

    def action(figures: Figures) -> None:
        victim = rig.busier()
        victim.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.process.wait(timeout=10)
        wait_until(lambda: rig.balancer.status(victim.name).startswith("DOWN"), timeout=10, what="HAProxy to see it")
        figures.notes.append(f"{victim.name} SIGKILLed, DOWN in HAProxy after {time.monotonic() - killed:.1f} s")
        time.sleep(max(0.0, killed + 3 - time.monotonic()))
        rig.forget(victim)
        replacement = rig.start_replica()
        figures.notes.append(f"{replacement.name} ready {time.monotonic() - killed:.1f} s after the kill")
        time.sleep(SETTLE)

    judge(rig.phase("SIGKILL of the busier replica", action), fault=True, timeout=timeout)


def test_sigstop_of_the_busier_replica_longer_than_the_timeout(rig: Rig, cluster: Cluster) -> None:
    timeout = shipped_timeout(cluster)

    def action(figures: Figures) -> None:
        victim = rig.busier()
        victim.process.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait_until(
                lambda: rig.balancer.status(victim.name).startswith("DOWN"), timeout=10, what="HAProxy to see it"
            )
            figures.notes.append(f"{victim.name} SIGSTOPped, DOWN in HAProxy after {time.monotonic() - stopped:.1f} s")
            time.sleep(max(0.0, stopped + 2 * timeout - time.monotonic()))
        finally:
            victim.process.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        wait_until(lambda: rig.balancer.status(victim.name) == "UP", timeout=30, what="HAProxy to send to it again")
        figures.notes.append(
            f"SIGCONT after {resumed - stopped:.1f} s, UP again {time.monotonic() - resumed:.1f} s later"
        )
        time.sleep(SETTLE)

    judge(rig.phase(f"SIGSTOP of the busier replica for {2 * timeout:g} s", action), fault=True, timeout=timeout)


def test_serving_certificate_rotation(rig: Rig) -> None:
    """tls.crt and tls.key rewritten in the directory every replica reads (the project's ``certs`` command,
    same CA, as cert-manager renews the Secret): each replica serves the new pair, on new connections."""

    def action(figures: Figures) -> None:
        time.sleep(SETTLE)
        old = {r.name: served_serial(r.webhook.port, rig.ca_file) for r in rig.replicas}
        reloads = {r.name: r.webhook.metric("rocm_isolation_certificate_reloads_total") for r in rig.replicas}
        cli("certs", "--out-dir", str(rig.cert_dir), check=True)
        written = time.monotonic()
        for replica in rig.replicas:
            wait_until(
                lambda r=replica: (
                    r.webhook.metric("rocm_isolation_certificate_reloads_total") > reloads[r.name]
                    and served_serial(r.webhook.port, rig.ca_file) != old[r.name]
                ),
                timeout=30,
                what=f"{replica.name} to serve the new certificate",
            )
        figures.notes.append(f"both replicas serve the new certificate {time.monotonic() - written:.1f} s after")
        assert served_serial(rig.balancer.port, rig.ca_file) not in old.values()
        time.sleep(2 * SETTLE)

    judge(rig.phase("serving-certificate rotation", action))
