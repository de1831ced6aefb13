"""The end-to-end harness: the session's cluster and the helpers the tests use (the fixtures and
pytest hooks are in conftest.py).

The session's cluster (``e2e``):

- nodes shaped as the AMD GPU operator leaves them (node labeller labels, allocatable ``amd.com/gpu``,
  Ready, the not-ready taint gone): two MI300X nodes made reserved by the project's own
  ``pool apply`` (``inf-node-1``, ``inf-node-2``: the names the engine fixtures use), three shared
  MI300X nodes, and two MI210 nodes that the ``pool`` scenarios reserve and release;
- DRA as AMD's driver publishes it: DeviceClass ``gpu.amd.com`` and one ResourceSlice per GPU node,
  driver ``gpu.amd.com``, its pool named after the node;
- the webhook as a real ``python -m webhook serve`` subprocess on loopback, with certificates from the
  project's ``certs`` command, authenticated as the webhook's ServiceAccount (so the manifests' RBAC
  is what it gets), and installed from the project's ``manifests`` output with ``kubectl apply``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cluster_objects import (
    DRIVER,
    device_class,
    device_slice,
    gpu_device,
    new_namespace,
    new_node,
    new_pod,
    node_status,
)

from webhook.core.claims import device_class_info, device_classes, device_facts
from webhook.core.decision import ClaimFacts, NamespaceFacts, NodeFacts
from webhook.core.policy import Policy, default_policy

from .controlplane import (
    ASSETS_ENV,
    LOOPBACK,
    Component,
    ControlPlane,
    KeyPair,
    free_port,
    kube_minor,
    loopback_environment,
    loopback_only,
    map_opt_in,
)
from .kube import ApiError, Kube, Obj, wait_until

E2E_DIR = Path(__file__).parent
REPO = E2E_DIR.parent.parent
WEBHOOK_NAMESPACE = "rocm-isolation-system"
WEBHOOK_SERVICE_ACCOUNT = "rocm-isolation-webhook"
WEBHOOK_CONFIGURATION = "rocm-isolation-webhook"
# How the apiserver words a denial by the webhook, and the backstop policy's name.
WEBHOOK_DENIAL = 'admission webhook "pods.rocm-isolation.io" denied the request'
RESERVED_POLICY = "rocm-isolation-reserved-nodes"
GPUS_PER_NODE = 8

MI300X_LABELS = {
    "feature.node.kubernetes.io/amd-gpu": "true",
    "amd.com/gpu.device-id": "74a1",
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
    "amd.com/gpu.vram": "192G",
    "amd.com/gpu.cu-count": "304",
    "amd.com/gpu.driver-version": "6.10.5",
    "amd.com/compute-memory-partition": "spx_nps1",
}
MI210_LABELS = {
    "feature.node.kubernetes.io/amd-gpu": "true",
    "amd.com/gpu.device-id": "740f",
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.product-name": "Instinct_MI210",
    "amd.com/gpu.vram": "64G",
    "amd.com/gpu.cu-count": "104",
    "amd.com/gpu.driver-version": "6.10.5",
}
RESERVED_NODES = ("inf-node-1", "inf-node-2")
SHARED_NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
POOL_NODES = ("mi210-node-1", "mi210-node-2")


def cli(
    *args: str, kubeconfig: Path | None = None, timeout: float = 120, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m webhook ARGS`` as an operator runs it."""
    argv = [sys.executable, "-m", "webhook", *args]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    result = subprocess.run(
        argv, cwd=REPO, env=loopback_environment(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


@dataclass
class Webhook:
    """A running ``python -m webhook serve`` (a child of the control plane's process group)."""

    port: int
    cert_dir: Path
    policy_file: Path
    component: Component
    ca_file: Path

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def get(self, path: str) -> tuple[int, str]:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self.context())
        )
        try:
            with opener.open(f"https://{LOOPBACK}:{self.port}{path}", timeout=5) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode()

    def ready(self) -> bool:
        try:
            status, _ = self.get("/readyz")
        except OSError:
            return False
        return status == 200

    def metric(self, metric: str, /, **labels: str) -> float:
        """The sum of the samples of ``metric`` whose labels include ``labels``."""
        _, text = self.get("/metrics")
        return metric_value(text, metric, **labels)

    def log(self) -> str:
        return self.component.log.read_text(encoding="utf-8", errors="replace")


def metric_value(text: str, metric: str, /, **labels: str) -> float:
    """The sum of the samples of ``metric`` whose labels include ``labels`` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(metric):
            continue
        head, _, value = line.rpartition(" ")
        name, _, label_text = head.partition("{")
        if name != metric:
            continue
        if all(f'{key}="{wanted}"' in label_text for key, wanted in labels.items()):
            total += float(value)
    return total


@dataclass
class Cluster:
    plane: ControlPlane
    kube: Kube
    webhook: Webhook
    webhook_kubeconfig: Path
    workdir: Path
    manifests: list[Obj]
    reserved: tuple[str, ...] = RESERVED_NODES
    shared: tuple[str, ...] = SHARED_NODES
    pool_nodes: tuple[str, ...] = POOL_NODES
    _namespaces: list[str] = field(default_factory=list)

    @property
    def kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig

    def cli(self, *args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        return cli(*args, kubeconfig=self.kubeconfig, timeout=timeout, check=check)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.plane.binary("kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            env=loopback_environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.returncode}\n{result.stdout}\n{result.stderr}")
        return result

    def start_webhook(
        self, name: str, *extra: str, policy_file: Path | None = None, cert_dir: Path | None = None
    ) -> Webhook:
        return start_webhook(
            self.plane,
            self.workdir / name,
            self.webhook_kubeconfig,
            *extra,
            policy_file=policy_file,
            cert_dir=cert_dir,
        )

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """A namespace for one test (force-cleaned at the end of the session or by ``cleanup``)."""
        make_namespace(self.kube, name, labels)
        self._namespaces.append(name)
        return name

    def cleanup(self, namespace: str) -> None:
        """Pods bound to a node without a kubelet never finish a graceful delete: force them, then
        delete the namespace (not waited for)."""
        for kind in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
            for obj in self.kube.list(kind, namespace):
                self.kube.delete(kind, obj["metadata"]["name"], namespace)
        for pod in self.kube.list("Pod", namespace):
            self.kube.delete("Pod", pod["metadata"]["name"], namespace, force=True)
        self.kube.delete("Namespace", namespace)

    def pods(self, namespace: str, selector: str | None = None) -> list[Obj]:
        return self.kube.list("Pod", namespace, selector=selector)

    def wait_bound(self, namespace: str, count: int, selector: str | None = None, timeout: float = 90) -> list[Obj]:
        """``count`` pods of the namespace with ``spec.nodeName`` set (bound by the scheduler)."""

        def bound() -> list[Obj] | None:
            pods = [p for p in self.pods(namespace, selector) if not p["metadata"].get("deletionTimestamp")]
            done = [p for p in pods if p["spec"].get("nodeName")]
            return done if len(pods) >= count and len(done) >= count else None

        result: list[Obj] = wait_until(bound, timeout=timeout, what=f"{count} pods bound in {namespace}")
        return result

    def events(self, namespace: str) -> list[Obj]:
        return self.kube.list("Event", namespace)

    def webhook_reviews(self) -> float:
        return self.webhook.metric("rocm_isolation_admission_reviews_total")

    @contextlib.contextmanager
    def without_webhook_configuration(self) -> Iterator[None]:
        """The MutatingWebhookConfiguration deleted (what an outage of the webhook looks like to the
        apiserver with failurePolicy Ignore, or an operator's emergency disable), restored after."""
        configuration = next(d for d in self.manifests if d["kind"] == "MutatingWebhookConfiguration")
        self.kube.delete("MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
        try:
            probe = gpu_pod("out-of-path-probe", "default")

            def not_called() -> bool:
                before = self.webhook_reviews()
                self.kube.create(probe, dry_run=True)
                return self.webhook_reviews() == before

            # The apiserver's configuration informer needs a moment to drop the webhook.
            wait_until(
                lambda: not_called() and not_called(), timeout=30, what="the apiserver to stop calling the webhook"
            )
            yield
        finally:
            self.kube.apply(configuration)
            self.sync_webhook()

    def sync_webhook(self, webhook: Webhook | None = None) -> None:
        """Wait until the webhook's cluster cache knows the reserved nodes: a training pod naming a
        reserved node is denied by the webhook itself (not only by the policy)."""
        wait_reserved_nodes_known(self.kube, self.reserved[0])


def wait_reserved_nodes_known(kube: Kube, reserved_node: str, namespace: str = "default") -> None:
    probe = gpu_pod("sync-probe", namespace, node_name=reserved_node)

    last: list[str] = []

    def denied_by_webhook() -> bool:
        try:
            kube.create(probe, dry_run=True)
        except ApiError as err:
            last[:] = [err.message]
            return (
                "pods.rocm-isolation.io" in err.message
                and f"spec.nodeName is {reserved_node}, a reserved node" in err.message
            )
        last[:] = ["admitted"]
        return False

    try:
        wait_until(denied_by_webhook, timeout=60, what="the webhook to know the reserved nodes")
    except AssertionError as err:
        raise AssertionError(f"{err}; last answer: {last}") from None


def gpu_pod(
    name: str,
    namespace: str,
    *,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
    node_name: str | None = None,
    **spec: Any,
) -> Obj:
    """A pod asking for ``gpus`` ``amd.com/gpu`` (labelled ``app: <name>`` unless ``labels``)."""
    if node_name:
        spec["nodeName"] = node_name
    return new_pod(name, namespace, {"amd.com/gpu": str(gpus)}, labels=labels or {"app": name}, **spec)


def start_webhook(
    plane: ControlPlane,
    directory: Path,
    kubeconfig: Path,
    *extra: str,
    policy_file: Path | None = None,
    cert_dir: Path | None = None,
    port: int | None = None,
) -> Webhook:
    directory.mkdir(parents=True, exist_ok=True)
    if cert_dir is None:
        cert_dir = directory / "certs"
        # The project's own command; its certificate carries the SAN IP:127.0.0.1 the apiserver dials.
        cli("certs", "--out-dir", str(cert_dir), check=True)
    if policy_file is None:
        policy_file = directory / "policy.yaml"
        from webhook.core.policy import default_policy_text

        policy_file.write_text(default_policy_text(), encoding="utf-8")
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "webhook",
        "serve",
        "--cert-dir",
        str(cert_dir),
        "--policy",
        str(policy_file),
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--kubeconfig",
        str(kubeconfig),
        "--cert-poll-seconds",
        "1",
        "--policy-poll-seconds",
        "1",
        *extra,
    ]
    if "--audit-interval-seconds" not in extra:
        argv += ["--audit-interval-seconds", "0"]
    env = loopback_environment()
    env["POD_NAMESPACE"] = WEBHOOK_NAMESPACE
    component = plane.processes.start(f"webhook-{directory.name}", argv, env=env)
    webhook = Webhook(port, cert_dir, policy_file, component, cert_dir / "ca.crt")
    deadline = time.monotonic() + 60
    while not webhook.ready():
        if component.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the webhook did not become ready:\n{component.tail()}")
        time.sleep(0.2)
    return webhook


# --- the cluster ----------------------------------------------------------------------------------


def make_node(kube: Kube, name: str, labels: dict[str, str], *, gpus: int = GPUS_PER_NODE) -> None:
    """A Node as the AMD GPU operator leaves it. No kubelet: the suite writes its status (capacity,
    allocatable, Ready) and removes the not-ready taint that admission adds at creation."""
    kube.apply(new_node(name, labels))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kube.patch("Node", name, {"status": node_status(gpus, now)}, subresource="status")
    node = kube.get("Node", name)
    taints = [t for t in node["spec"].get("taints") or [] if t["key"] != "node.kubernetes.io/not-ready"]
    kube.patch("Node", name, {"spec": {"taints": taints or None}})


def resource_slice(node: str, product: str, device_id: str) -> Obj:
    """What AMD's DRA driver publishes for a node: pool = the node's name, one device per GPU."""
    devices = [
        gpu_device(
            f"gpu-{index}-{128 + index}",
            device_id=f"0x{device_id}",
            attributes={
                "productName": {"string": product},
                "cardIndex": {"int": index},
                "renderIndex": {"int": 128 + index},
                "driverVersion": {"version": "6.10.5"},
            },
            capacity={"memory": {"value": "192Gi"}, "computeUnits": {"value": "304"}},
        )
        for index in range(GPUS_PER_NODE)
    ]
    return device_slice(node, devices, driver=DRIVER)


# The PCI bus IDs of a 4-GPU MI300X node's GPUs, in PCI order: `pool apply --devices-per-node 2` reserves the two
# lowest. The benchmarks' split nodes publish them (pci_slice).
PCI_SLOTS = ("0000:03:00.0", "0000:23:00.0", "0000:43:00.0", "0000:63:00.0")


def pci_slice(node: str, pci_slots: Sequence[str] = PCI_SLOTS) -> Obj:
    """What AMD's DRA driver publishes for an MI300X node with each GPU's PCI bus ID (device-level reservation
    reserves by them): pool = the node, devices ``gpu-0``, ``gpu-1``, ... in PCI order."""
    devices = [
        gpu_device(
            f"gpu-{index}",
            pci,
            attributes={"productName": {"string": "AMD_Instinct_MI300X_OAM"}, "driverVersion": {"version": "6.10.5"}},
        )
        for index, pci in enumerate(pci_slots)
    ]
    return device_slice(node, devices, driver=DRIVER)


DEVICE_CLASS: Obj = device_class(DRIVER)
# A DeviceClass of another driver (a NIC): claims of it are no GPU route.
NIC_DEVICE_CLASS: Obj = device_class("nic.example.com", "device.driver == 'nic.example.com'")


def make_namespace(kube: Kube, name: str, labels: dict[str, str] | None = None) -> None:
    """A namespace, once it has its default ServiceAccount (the controller-manager creates it; pod creation
    needs it)."""
    kube.apply(new_namespace(name, labels))
    wait_until(
        lambda: kube.get_or_none("ServiceAccount", "default", name), what=f"the default ServiceAccount of {name}"
    )


def serves_dra() -> bool:
    """The run's minor serves resource.k8s.io/v1 (1.34 on)."""
    return int(kube_minor().split(".")[1]) >= 34


def serves_dra_extended_resources() -> bool:
    """The run's minor keeps a DeviceClass's extendedResourceName (DRAExtendedResource on: 1.36): a pod can reach a GPU
    by an extended resource the scheduler turns into a claim. Before, the apiserver drops the field, and such a name is
    a resource no node has (the pod stays pending: no route)."""
    return kube_minor() == "1.36"


def placement_served() -> bool:
    """A MutatingAdmissionPolicy places pods in the apiserver: 1.36, or 1.35 with the opt-in (1.34 refuses the
    policy: ``deploy/minors.NO_FLATTEN``)."""
    return kube_minor() == "1.36" or (map_opt_in() and kube_minor() == "1.35")


def for_this_minor() -> list[str]:
    """``manifests`` options for the run's minor: as the operator of a stock cluster of it runs them (none: read from
    the cluster); with the MutatingAdmissionPolicy opt-in, its v1beta1 policy (the emulating apiserver also serves v1,
    ``controlplane.minor_options``, which a real 1.34/1.35 does not)."""
    return ["--mutating-admission-policy", "v1beta1"] if map_opt_in() else []


def render_manifests(
    ca_file: Path, webhook_port: int, policy_file: Path | None = None, *, kubeconfig: Path | None = None
) -> list[Obj]:
    """The project's ``manifests`` output (``--policy`` when given), made to run against this control plane;
    ``kubeconfig``: rendered for what that cluster serves (the minor it emulates), else for 1.36."""
    policy = ["--policy", str(policy_file)] if policy_file is not None else []
    result = cli(
        "manifests",
        "--overlay",
        "self-signed",
        "--ca-bundle",
        str(ca_file),
        *policy,
        # Without a kubeconfig, 1.36 by name: manifests would otherwise read $KUBECONFIG or ~/.kube/config, whatever
        # cluster the machine running the suite points at.
        *(for_this_minor() if kubeconfig is not None else ["--kubernetes-version", "1.36"]),
        kubeconfig=kubeconfig,
        check=True,
    )
    out: list[Obj] = []
    for doc in yaml.safe_load_all(result.stdout):
        if not doc:
            continue
        if doc["kind"] == "Deployment":
            # The webhook runs as a host process (below): there is no kubelet to run its pod.
            continue
        if doc["kind"] == "MutatingWebhookConfiguration":
            for hook in doc["webhooks"]:
                # envtest has no Service network (no kube-proxy, and Endpoints refuse loopback
                # addresses), so the apiserver cannot reach clientConfig.service: it calls the same
                # /mutate on the loopback URL, with the caBundle the manifests carry.
                service = hook["clientConfig"].pop("service")
                hook["clientConfig"]["url"] = f"https://{LOOPBACK}:{webhook_port}{service.get('path', '/mutate')}"
        out.append(doc)
    return out


def install(plane: ControlPlane, manifests: Sequence[Obj]) -> None:
    """What an operator runs: the rendered manifests through ``kubectl apply`` (server-side), with the
    kubectl of KUBEBUILDER_ASSETS and the admin's kubeconfig."""
    result = subprocess.run(
        [
            plane.binary("kubectl"),
            "--kubeconfig",
            str(plane.admin_kubeconfig),
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=rocm-isolation-e2e",
            "-f",
            "-",
        ],
        input=yaml.safe_dump_all(manifests),
        env=loopback_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl apply of the manifests failed:\n{result.stdout}\n{result.stderr}")


@dataclass(frozen=True)
class Deployed:
    """What ``deploy`` installed and started."""

    webhook: Webhook  # its port, certificates and CA (``ca_file``: the manifests' caBundle)
    kubeconfig: Path  # the webhook's: its ServiceAccount
    manifests: list[Obj]  # as rendered and applied (the Deployment left out: the webhook runs on the host)


def deploy(plane: ControlPlane, workdir: Path, *extra: str, policy_file: Path | None = None) -> Deployed:
    """The manifests (``manifests --policy policy_file``; the default policy when None) and the webhook serving
    the same policy with the ServiceAccount's kubeconfig (``extra``: more ``serve`` options), in
    ``workdir/webhook``. The webhook configuration names the port before the server starts, and the server needs
    the RBAC first: everything else is applied, the webhook started, then the MutatingWebhookConfiguration."""
    kubeconfig = service_account_kubeconfig(plane)
    cert_dir = workdir / "webhook" / "certs"
    cli("certs", "--out-dir", str(cert_dir), check=True)
    port = free_port()
    manifests = render_manifests(cert_dir / "ca.crt", port, policy_file, kubeconfig=plane.admin_kubeconfig)
    install(plane, [doc for doc in manifests if doc["kind"] != "MutatingWebhookConfiguration"])
    webhook = start_webhook(
        plane, workdir / "webhook", kubeconfig, *extra, policy_file=policy_file, cert_dir=cert_dir, port=port
    )
    install(plane, [doc for doc in manifests if doc["kind"] == "MutatingWebhookConfiguration"])
    return Deployed(webhook, kubeconfig, manifests)


def service_account_kubeconfig(plane: ControlPlane) -> Path:
    """A kubeconfig that authenticates as the webhook's ServiceAccount (username
    system:serviceaccount:NS:NAME, which RBAC's ServiceAccount subjects match): the webhook gets the
    manifests' RBAC and nothing more."""
    user = f"system:serviceaccount:{WEBHOOK_NAMESPACE}:{WEBHOOK_SERVICE_ACCOUNT}"
    pair: KeyPair = plane.pki.issue(
        "webhook-sa",
        common_name=user,
        organizations=["system:serviceaccounts", f"system:serviceaccounts:{WEBHOOK_NAMESPACE}"],
    )
    return plane.kubeconfig(user, pair)


# --- comparing pods -------------------------------------------------------------------------------

OPT_OUT = "rocm-isolation.io/ignore"
TOKEN_VOLUME = re.compile(r"kube-api-access-[a-z0-9]{5}")
VOLATILE_METADATA = ("uid", "creationTimestamp", "resourceVersion", "generation", "managedFields")


def normalised(pod: Obj, *, drop_opt_out: bool = False) -> Obj:
    """Without what differs between two creations of the same pod: uid, timestamps, and the random
    suffix of the ServiceAccount token volume (kube-api-access-XXXXX)."""
    pod = json.loads(TOKEN_VOLUME.sub("kube-api-access", json.dumps(pod)))
    meta = pod["metadata"]
    for key in VOLATILE_METADATA:
        meta.pop(key, None)
    if drop_opt_out:
        labels = meta.get("labels") or {}
        labels.pop(OPT_OUT, None)
        if not labels:
            meta.pop("labels", None)
    return pod


def unmerged(pod: Obj) -> Obj:
    """``pod`` without what kube-apiserver adds after admission (v1.34+, MatchLabelKeysInPodTopologySpread
    SelectorMerge): each ``matchLabelKeys`` key as ``key In [the pod's value]`` in the constraint's
    labelSelector. The stored form is refused on create ("exists in both matchLabelKeys and
    labelSelector"), so a pod read back must be un-merged before it is sent again."""
    pod = copy.deepcopy(pod)
    labels = pod["metadata"].get("labels") or {}
    for constraint in pod["spec"].get("topologySpreadConstraints") or []:
        keys = set(constraint.get("matchLabelKeys") or [])
        selector = constraint.get("labelSelector") or {}
        expressions = [
            e
            for e in selector.get("matchExpressions") or []
            if not (e["key"] in keys and e["operator"] == "In" and e.get("values") == [labels.get(e["key"])])
        ]
        if expressions:
            selector["matchExpressions"] = expressions
        else:
            selector.pop("matchExpressions", None)
    return pod


def live_facts(cluster: Cluster, namespace: str, policy: Policy | None = None) -> dict[str, Any]:
    """The facts the webhook's cache holds, read from the apiserver (no claims or classes where the minor serves no
    resource.k8s.io: 1.33)."""
    labels = cluster.kube.get("Namespace", namespace)["metadata"].get("labels") or {}
    dra = serves_dra()
    claims = {
        c["metadata"]["name"]: device_classes(c, "ResourceClaim")
        for c in (cluster.kube.list("ResourceClaim", namespace) if dra else [])
    }
    templates = {
        t["metadata"]["name"]: device_classes(t, "ResourceClaimTemplate")
        for t in (cluster.kube.list("ResourceClaimTemplate", namespace) if dra else [])
    }
    reserved = {n["metadata"]["name"] for n in cluster.kube.list("Node", selector="rocm-isolation.io/pool=inference")}
    assert reserved == set(RESERVED_NODES)
    policy = policy or default_policy()
    classes = {d["metadata"]["name"]: device_class_info(d) for d in (cluster.kube.list("DeviceClass") if dra else [])}
    return {
        "devices": device_facts(classes, policy.spec.scope.gpu_drivers),
        "namespace": NamespaceFacts(namespace, labels),
        "nodes": NodeFacts(frozenset(reserved)),
        "policy": policy,
        "claims": ClaimFacts(claims=claims, templates=templates),
    }


@contextlib.contextmanager
def own_plane(directory: Path, **options: Any) -> Iterator[tuple[ControlPlane, Kube]]:
    """A control plane of a module's own (``ControlPlane`` options: e.g. ``minor_options()``) in ``directory``, started,
    with an admin client; checked alive after the module and stopped."""
    loopback_only()
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), directory, **options)
    try:
        plane.start()
        yield plane, Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
        plane.check_alive()
    finally:
        plane.stop()
