"""Issue 18 on the real control plane: every route to an AMD GPU.

Each row of the issue's table, tried by a training-namespace attacker aiming at the reserved nodes
(reserved toleration + the pool's nodeSelector, or a pod already on a reserved node), is denied with
the webhook up, and again by the ValidatingAdmissionPolicy alone (the webhook's configuration and the
placement MutatingAdmissionPolicy's binding deleted). The AMD GPU operator's privileged DaemonSet in
kube-amd-gpu still runs on every node, and a pod asking for a GPU as a DRA extended resource
(``deviceclass.resource.kubernetes.io/gpu.amd.com``) is placed by its class and gets a device from its
node's pool, allocated by the real scheduler in the claim it makes after admission.

On 1.33-1.35 as they ship (issue 47) the routes that minor has: no DRA extended resources (DRAExtendedResource off,
the apiserver drops a DeviceClass's extendedResourceName: such a name is a resource no node has, no route), so their
rows and tests are skipped there, saying so; the others (privileged containers, the AMD runtime's variables,
ephemeral containers, the GPU operator's DaemonSet) run, with the backstop alone where the webhook is out of the path
(no placement MutatingAdmissionPolicy to unbind on those minors).
"""

from __future__ import annotations

import copy
import json
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_objects import device_class, new_pod

from webhook.core.policy import default_policy
from webhook.deploy.reserved_nodes import NAMES_POLICY_NAME as NAMES_POLICY

from .controlplane import LOOPBACK, kube_minor
from .harness import (
    DRIVER,
    RESERVED_POLICY,
    WEBHOOK_CONFIGURATION,
    WEBHOOK_DENIAL,
    Cluster,
    cli,
    for_this_minor,
    metric_value,
    serves_dra,
    serves_dra_extended_resources,
)
from .kube import ApiError, Obj, wait_until

TRAINING = {"rocm-isolation.io/class": "training"}
POOL_KEY, POOL_VALUE = "rocm-isolation.io/pool", "inference"
RESERVED_TOLERATION = {"key": "rocm-isolation.io/reserved", "operator": "Exists", "effect": "NoSchedule"}
IMPLICIT_RESOURCE = f"deviceclass.resource.kubernetes.io/{DRIVER}"
# Row (b): a DeviceClass of AMD's driver, whatever it is called, that serves a resource name of its own.
EXTENDED_CLASS = "amd-gpu.example.com"
EXTENDED_RESOURCE = "example.com/amd-gpu"
OPERATOR_NAMESPACE = "kube-amd-gpu"

pytestmark = pytest.mark.minors("1.33", "1.34", "1.35")
NO_EXTENDED_RESOURCES = (
    "no DRA extended resources on this minor (DRAExtendedResource off: the apiserver drops a DeviceClass's "
    "extendedResourceName): the name is a resource no node has, no route to a GPU"
)
EXTENDED_ROWS = ("dra-extended-resource-implicit", "dra-extended-resource-class-name")
needs_extended_resources = pytest.mark.skipif(
    not serves_dra_extended_resources(),
    reason=f"Kubernetes {kube_minor()}: "
    + (NO_EXTENDED_RESOURCES if serves_dra() else "no DRA (resource.k8s.io not served): no DRA extended resources"),
)


# --- the attacker's pods --------------------------------------------------------------------------


def _container(name: str = "main", **fields: Any) -> Obj:
    return {"name": name, "image": "rocm/pytorch:latest", **fields}


def _aimed(name: str, ns: str, **spec: Any) -> Obj:
    """A pod aimed at the reserved nodes: their taint tolerated, their pool label selected."""
    spec = {"tolerations": [RESERVED_TOLERATION], "nodeSelector": {POOL_KEY: POOL_VALUE}, **spec}
    return new_pod(name, ns, labels={"app": name}, **spec)


@dataclass(frozen=True)
class Row:
    """One row of the issue's table: the pod, and the field its denial must name."""

    make: Callable[[str], Obj]
    field: str


PRIVILEGED: dict[str, Any] = {"securityContext": {"privileged": True}}

ROWS: dict[str, Row] = {
    "dra-extended-resource-implicit": Row(
        lambda ns: _aimed("implicit", ns, containers=[_container(resources={"limits": {IMPLICIT_RESOURCE: "1"}})]),
        "spec.nodeSelector",
    ),
    "dra-extended-resource-class-name": Row(
        lambda ns: _aimed("class-name", ns, containers=[_container(resources={"limits": {EXTENDED_RESOURCE: "1"}})]),
        "spec.nodeSelector",
    ),
    "privileged-container": Row(
        lambda ns: _aimed("privileged", ns, containers=[_container(**PRIVILEGED)]),
        "spec.containers[0].securityContext.privileged",
    ),
    "privileged-init-container": Row(
        lambda ns: _aimed(
            "privileged-init", ns, initContainers=[_container("init", **PRIVILEGED)], containers=[_container()]
        ),
        "spec.initContainers[0].securityContext.privileged",
    ),
    "amd-container-runtime": Row(
        lambda ns: _aimed(
            "runtime", ns, containers=[_container(env=[{"name": "AMD_VISIBLE_DEVICES", "value": "all"}])]
        ),
        "spec.containers[0].env[0](AMD_VISIBLE_DEVICES)",
    ),
}

# The rows, those of DRA extended resources skipped on a minor without them (saying so).
ROW_PARAMS = [pytest.param(row, marks=needs_extended_resources if row in EXTENDED_ROWS else ()) for row in ROWS]


def _denial(call: Callable[[], object]) -> str:
    """The apiserver's refusal of ``call`` (an AssertionError naming what was admitted instead)."""
    try:
        admitted = call()
    except ApiError as err:
        assert err.status in (400, 403, 422), err
        return err.message
    raise AssertionError(f"admitted: {admitted}")


# --- cluster state the tests share -----------------------------------------------------------------


@pytest.fixture(scope="module")
def extended_class(cluster: Cluster) -> Iterator[str | None]:
    """A DeviceClass selecting AMD's driver by CEL, serving the extended resource example.com/amd-gpu
    (the scheduler turns such a request into a claim after admission). None on a minor without DRA extended
    resources: nothing to serve the name."""
    if not serves_dra_extended_resources():
        yield None
        return
    cluster.kube.apply(device_class(EXTENDED_CLASS, extended_resource_name=EXTENDED_RESOURCE))
    # The webhook's DeviceClass watch has the class: asked directly (not through the apiserver, whose
    # matchConditions decide whether it is asked at all), it denies row (b).
    pod = ROWS["dra-extended-resource-class-name"].make("default")
    wait_until(
        lambda: _review(cluster, pod)["allowed"] is False, timeout=30, what=f"the webhook to know {EXTENDED_CLASS}"
    )
    yield EXTENDED_CLASS
    cluster.kube.delete("DeviceClass", EXTENDED_CLASS)


def _review(cluster: Cluster, pod: Obj) -> Obj:
    """The webhook's AdmissionReview response to the CREATE of ``pod``, posted to its /mutate."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "e2e-gpu-routes",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "name": pod["metadata"]["name"],
            "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": pod,
            "dryRun": True,
        },
    }
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=cluster.webhook.context())
    )
    url = f"https://{LOOPBACK}:{cluster.webhook.port}/mutate"
    request = urllib.request.Request(
        url, data=json.dumps(review).encode(), headers={"Content-Type": "application/json"}
    )
    with opener.open(request, timeout=10) as reply:
        response: Obj = json.loads(reply.read())["response"]
    return response


def _policy_listing_extended_resource(workdir: Path) -> Path:
    """The default policy with example.com/amd-gpu in scope.extendedResourceNames: what an operator
    writes (and audit asks for) so that the backstop, which cannot read DeviceClasses, knows the name."""
    from webhook.core.policy import default_policy_text

    policy = yaml.safe_load(default_policy_text())
    policy["spec"]["scope"]["extendedResourceNames"] = [EXTENDED_RESOURCE]
    path = workdir / "policy-extended-resource.yaml"
    path.write_text(yaml.safe_dump(policy), encoding="utf-8")
    return path


def _manifest(docs: list[Obj], kind: str, name: str) -> Obj:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.fixture(scope="module")
def listing_manifests(cluster: Cluster) -> list[Obj]:
    """The project's manifests rendered from a policy listing example.com/amd-gpu, made to run here
    (the webhook configuration calls the session's webhook on its loopback URL)."""
    policy_file = _policy_listing_extended_resource(cluster.workdir)
    ca_file = str(cluster.webhook.ca_file)
    minor = ["--kubernetes-version", kube_minor(), *for_this_minor()]
    out = cli("manifests", "--overlay", "self-signed", "--ca-bundle", ca_file, "--policy", str(policy_file), *minor)
    assert out.returncode == 0, out.stderr
    docs = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    configuration = _manifest(docs, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
    live = _manifest(cluster.manifests, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
    for hook, running in zip(configuration["webhooks"], live["webhooks"], strict=True):
        hook["clientConfig"] = copy.deepcopy(running["clientConfig"])
    # The backstop must know the name (it cannot read DeviceClasses). The webhook's matchConditions send
    # every pod asking for any extended resource (the webhook reads the cluster's DeviceClasses): the name
    # is listed there, or covered by that test.
    assert EXTENDED_RESOURCE in yaml.safe_dump(_manifest(docs, "ValidatingAdmissionPolicy", RESERVED_POLICY))
    pod_hook = next(h for h in configuration["webhooks"] if h["name"] == "pods.rocm-isolation.io")
    conditions = yaml.safe_dump(pod_hook["matchConditions"])
    assert EXTENDED_RESOURCE in conditions or "r.contains('/')" in conditions or "r.matches('/')" in conditions
    return docs


@pytest.fixture
def backstop_only(cluster: Cluster, extended_class: str | None, listing_manifests: list[Obj]) -> Iterator[None]:
    """Only the ValidatingAdmissionPolicy is left: the webhook's configuration and the placement
    MutatingAdmissionPolicy's binding are deleted, and the backstop is the one rendered from a policy
    listing example.com/amd-gpu (the backstop cannot read DeviceClasses: it knows only the names the
    policy lists). All restored after, and the webhook is back in the path before the next test."""
    kube = cluster.kube
    configuration = _manifest(cluster.manifests, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
    placement = [d for d in cluster.manifests if d["kind"] == "MutatingAdmissionPolicyBinding"]
    original = _manifest(cluster.manifests, "ValidatingAdmissionPolicy", RESERVED_POLICY)
    kube.delete("MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
    for binding in placement:
        kube.delete("MutatingAdmissionPolicyBinding", binding["metadata"]["name"])
    kube.apply(_manifest(listing_manifests, "ValidatingAdmissionPolicy", RESERVED_POLICY))
    try:
        _wait_backstop_alone(cluster)
        yield
    finally:
        kube.apply(original)
        for binding in placement:
            kube.apply(binding)
        kube.apply(configuration)
        cluster.sync_webhook()


def _wait_backstop_alone(cluster: Cluster) -> None:
    """Until the apiserver's admission chain has caught up: a GPU pod is no longer placed (neither the
    webhook nor the placement policy is called) and the swapped backstop knows example.com/amd-gpu."""
    ns = "default"
    plain = new_pod("backstop-probe", ns, {"amd.com/gpu": "1"})
    probe = _aimed("backstop-probe", ns, containers=[_container(resources={"limits": {EXTENDED_RESOURCE: "1"}})])

    def caught_up() -> bool:
        pod = cluster.kube.create(plain, dry_run=True)
        if (pod["metadata"].get("annotations") or {}) or (pod["spec"].get("affinity") or {}):
            return False
        try:
            cluster.kube.create(probe, dry_run=True)
        except ApiError as err:
            return f"ValidatingAdmissionPolicy '{RESERVED_POLICY}'" in err.message
        return False

    wait_until(caught_up, timeout=60, what="only the backstop to be left, knowing example.com/amd-gpu")


# --- 1. every row of the table, denied -------------------------------------------------------------


# Row b: the webhook's DeviceClass watch knows example.com/amd-gpu, and its matchConditions send every pod
# asking for an extended resource (cel.webhook_match_conditions): it denies the pod although the policy
# lists no extendedResourceNames. (The backstop knows only listed names: see backstop_only.)
@pytest.mark.parametrize("row", ROW_PARAMS)
def test_each_route_is_denied_by_the_webhook(
    cluster: Cluster, namespace: Callable[..., str], extended_class: str | None, row: str
) -> None:
    ns = namespace(labels=TRAINING)
    pod = ROWS[row].make(ns)
    message = _denial(lambda: cluster.kube.create(pod, dry_run=True))
    assert WEBHOOK_DENIAL in message, message
    assert ROWS[row].field in message, message


@pytest.fixture
def webhook_configuration_listing(cluster: Cluster, listing_manifests: list[Obj]) -> Iterator[None]:
    """The webhook's configuration rendered from the policy that lists example.com/amd-gpu; the
    session's restored after."""
    original = _manifest(cluster.manifests, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
    cluster.kube.apply(_manifest(listing_manifests, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION))
    try:
        yield
    finally:
        cluster.kube.apply(original)
        cluster.sync_webhook()


@needs_extended_resources
def test_a_class_name_route_is_reported_by_audit_and_denied_once_the_policy_lists_it(
    cluster: Cluster, namespace: Callable[..., str], extended_class: str | None, request: pytest.FixtureRequest
) -> None:
    """Row (b) as the product ships it today: audit names the DeviceClass whose extendedResourceName the
    policy lacks; with the name listed (manifests --policy), the webhook denies the pod, naming it."""
    audit = cluster.cli("audit", "-o", "json")
    assert EXTENDED_CLASS in audit.stdout and EXTENDED_RESOURCE in audit.stdout, audit.stdout + audit.stderr
    request.getfixturevalue("webhook_configuration_listing")
    ns = namespace(labels=TRAINING)
    pod = ROWS["dra-extended-resource-class-name"].make(ns)

    def denied() -> str:
        try:
            cluster.kube.create(pod, dry_run=True)
        except ApiError as err:
            return err.message if WEBHOOK_DENIAL in err.message else ""
        return ""

    message = wait_until(denied, timeout=30, what="the listing webhook configuration to reach the apiserver")
    assert "spec.nodeSelector" in message, message


@pytest.mark.parametrize("row", ROW_PARAMS)
def test_each_route_is_denied_by_the_backstop_alone(
    cluster: Cluster, namespace: Callable[..., str], backstop_only: None, row: str
) -> None:
    ns = namespace(labels=TRAINING)
    pod = ROWS[row].make(ns)
    message = _denial(lambda: cluster.kube.create(pod, dry_run=True))
    assert f"ValidatingAdmissionPolicy '{RESERVED_POLICY}'" in message, message
    assert WEBHOOK_DENIAL not in message, message
    # The backstop's message is static (no messageExpression: it would cost every pod validated an
    # activation): it names its rule and the placement field that reaches the reserved nodes, not the
    # field that makes the pod a GPU pod (the webhook's denial does, test_each_route_is_denied_by_the_webhook).
    assert "[deny-node-selector]" in message, message
    assert "spec.nodeSelector selects rocm-isolation.io/pool=inference" in message, message


def _debug(cluster: Cluster, ns: str, pod: str, profile: str, container: str) -> Any:
    """``kubectl debug POD --profile=PROFILE``: adds an ephemeral container through pods/ephemeralcontainers
    (sysadmin: privileged; general: unprivileged)."""
    return cluster.kubectl(
        "debug", pod, "-n", ns, "--image=busybox", f"--profile={profile}", f"--container={container}", check=False
    )


def _on_a_reserved_node(cluster: Cluster, ns: str, how: str) -> str:
    """A CPU-only pod (no GPU route: admitted) on a reserved node: ``tolerated``, bound there by the
    scheduler through the reserved toleration and the pool's nodeSelector; ``named``, spec.nodeName set
    by its author (no scheduler, so the NoSchedule taint is never checked: the kubelet only enforces
    NoExecute)."""
    name = f"cpu-{how}"
    resources = {"requests": {"cpu": "100m"}}
    if how == "tolerated":
        pod = _aimed(name, ns, containers=[_container(resources=resources)])
    else:
        pod = new_pod(name, ns, nodeName=cluster.reserved[0], containers=[_container(resources=resources)])
    cluster.kube.create(pod)
    node = wait_until(
        lambda: cluster.kube.get("Pod", name, ns)["spec"].get("nodeName"), timeout=90, what=f"{name} bound"
    )
    assert node in cluster.reserved, node
    return name


# A pod put on a reserved node by spec.nodeName alone needs no toleration: with the webhook out of the
# path, the backstop denies the GPU debug container from the reserved node names (its params ConfigMap,
# kept by pool apply); with a toleration, from the toleration.
@pytest.mark.parametrize(
    ("admission", "how"),
    [
        ("webhook", "tolerated"),
        ("backstop", "tolerated"),
        ("webhook", "named"),
        ("backstop", "named"),
    ],
)
def test_a_privileged_ephemeral_container_on_a_reserved_node_is_denied(
    cluster: Cluster, namespace: Callable[..., str], request: pytest.FixtureRequest, admission: str, how: str
) -> None:
    ns = namespace(labels=TRAINING)
    if admission == "backstop":
        request.getfixturevalue("backstop_only")
    name = _on_a_reserved_node(cluster, ns, how)
    # An unprivileged debug container is no GPU route: admitted (the subresource itself is not refused).
    general = _debug(cluster, ns, name, "general", "look")
    assert general.returncode == 0, general.stderr
    # kubectl debug --profile=sysadmin: a privileged ephemeral container, through pods/ephemeralcontainers.
    sysadmin = _debug(cluster, ns, name, "sysadmin", "root")
    live = cluster.kube.get("Pod", name, ns)
    assert [c["name"] for c in live["spec"].get("ephemeralContainers") or []] == ["look"], sysadmin.stdout
    assert sysadmin.returncode != 0, sysadmin.stdout
    if admission == "webhook":
        assert WEBHOOK_DENIAL in sysadmin.stderr, sysadmin.stderr
        assert "spec.ephemeralContainers[1].securityContext.privileged" in sysadmin.stderr, sysadmin.stderr
        assert f"runs on the reserved node {live['spec']['nodeName']}" in sysadmin.stderr, sysadmin.stderr
    else:
        # Tolerated and on a reserved node, or named only: the backstop denies (by the toleration, or by the
        # reserved node names of the names policy's params; bound by spec.nodeName, both policies deny and
        # the apiserver names the first).
        assert any(
            f"ValidatingAdmissionPolicy '{name}'" in sysadmin.stderr for name in (RESERVED_POLICY, NAMES_POLICY)
        ), sysadmin.stderr
        if how == "named":
            assert f"ValidatingAdmissionPolicy '{NAMES_POLICY}'" in sysadmin.stderr, sysadmin.stderr
        assert WEBHOOK_DENIAL not in sysadmin.stderr, sysadmin.stderr
        assert "an added ephemeral container reaches the GPUs" in sysadmin.stderr, sysadmin.stderr
    # The same container through a strategic-merge PATCH of the subresource, AMD runtime variable instead.
    runtime = {"name": "runtime", "image": "busybox", "env": [{"name": "AMD_VISIBLE_DEVICES", "value": "0-3,5"}]}
    added = [*copy.deepcopy(live["spec"]["ephemeralContainers"]), runtime]
    message = _denial(
        lambda: cluster.kube.patch(
            "Pod",
            name,
            {"spec": {"ephemeralContainers": added}},
            ns,
            subresource="ephemeralcontainers",
            patch_type="strategic",
        )
    )
    assert (WEBHOOK_DENIAL in message) == (admission == "webhook"), message
    if admission == "webhook":
        assert "spec.ephemeralContainers[1].env[0](AMD_VISIBLE_DEVICES)" in message, message
    live = cluster.kube.get("Pod", name, ns)
    assert [c["name"] for c in live["spec"].get("ephemeralContainers") or []] == ["look"]


# --- 2. the GPU operator's DaemonSet --------------------------------------------------------------


@pytest.fixture
def operator_namespace(cluster: Cluster) -> Iterator[str]:
    ns = cluster.namespace(OPERATOR_NAMESPACE)
    yield ns
    cluster.cleanup(ns)
    wait_until(lambda: cluster.kube.get_or_none("Namespace", ns) is None, timeout=90, what=f"{ns} deleted")


def _operator_daemonset(ns: str) -> Obj:
    labels = {"app.kubernetes.io/name": "device-plugin", "daemonset-name": "default-device-plugin"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "default-device-plugin", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "tolerations": [RESERVED_TOLERATION],
                    "containers": [
                        {
                            "name": "device-plugin",
                            "image": "rocm/k8s-device-plugin:latest",
                            "securityContext": {"privileged": True},
                        }
                    ],
                },
            },
        },
    }


def test_the_gpu_operators_privileged_daemonset_runs_on_every_node(
    cluster: Cluster, namespace: Callable[..., str], operator_namespace: str
) -> None:
    ds = _operator_daemonset(operator_namespace)
    cluster.kube.create(ds)
    nodes = [n["metadata"]["name"] for n in cluster.kube.list("Node")]
    assert set(cluster.reserved) <= set(nodes)
    pods = cluster.wait_bound(operator_namespace, len(nodes))
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(nodes)
    for pod in pods:
        # Excluded by name: not placed, not annotated.
        assert "rocm-isolation.io/class" not in (pod["metadata"].get("annotations") or {}), pod["metadata"]
    # The same pod template anywhere else is a GPU pod aimed at the reserved nodes: refused.
    ns = namespace(labels=TRAINING)
    elsewhere = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin", "namespace": ns}}
    elsewhere["spec"] = copy.deepcopy(ds["spec"]["template"]["spec"])
    message = _denial(lambda: cluster.kube.create(elsewhere, dry_run=True))
    assert WEBHOOK_DENIAL in message, message


# --- 3. a DRA extended resource, placed and allocated ----------------------------------------------


def _extended_resource_claim(cluster: Cluster, ns: str, pod_name: str) -> Obj:
    """The claim the scheduler made for the pod's extended resource, once allocated."""

    def allocated() -> Obj | None:
        pod = cluster.kube.get("Pod", pod_name, ns)
        status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
        name = status.get("resourceClaimName")
        if not name or not pod["spec"].get("nodeName"):
            return None
        claim = cluster.kube.get("ResourceClaim", name, ns)
        return claim if (claim.get("status") or {}).get("allocation") else None

    claim: Obj = wait_until(allocated, timeout=90, what=f"{ns}/{pod_name} bound with an allocated claim")
    assert claim["metadata"]["name"].startswith(f"{pod_name}-extended-resources-"), claim["metadata"]
    # Made by the scheduler for this pod (after admission: the pod itself names no claim).
    assert [o["name"] for o in claim["metadata"].get("ownerReferences") or []] == [pod_name], claim["metadata"]
    return claim


def _implicit_pod(name: str, ns: str) -> Obj:
    return new_pod(name, ns, {IMPLICIT_RESOURCE: "1"}, labels={"app": name})


# How often the apiserver evaluated the placement policy (its own histogram's count).
MAP_CHECKS = "apiserver_mutating_admission_policy_check_duration_seconds_count"
PLACEMENT_POLICY = "rocm-isolation-placement"


def _placement_policy_in_path(cluster: Cluster, ns: str) -> bool:
    """Whether the apiserver runs the placement MutatingAdmissionPolicy on a new GPU pod. (The pod's
    mutations record cannot tell: the policy and the webhook write the same entries.)"""
    before = metric_value(cluster.kube.metrics(), MAP_CHECKS, policy=PLACEMENT_POLICY)
    cluster.kube.create(_implicit_pod("placement-probe", ns), dry_run=True)
    return metric_value(cluster.kube.metrics(), MAP_CHECKS, policy=PLACEMENT_POLICY) > before


@pytest.fixture
def placement_policy_unbound(cluster: Cluster, namespace: Callable[..., str]) -> Iterator[None]:
    """The placement MutatingAdmissionPolicy's binding deleted: the pod's placement is the webhook's."""
    probe = namespace("probe", labels={"rocm-isolation.io/class": "inference"})
    bindings = [d for d in cluster.manifests if d["kind"] == "MutatingAdmissionPolicyBinding"]
    for binding in bindings:
        cluster.kube.delete("MutatingAdmissionPolicyBinding", binding["metadata"]["name"])
    try:
        wait_until(
            lambda: not _placement_policy_in_path(cluster, probe),
            timeout=30,
            what="the placement policy out of the path",
        )
        yield
    finally:
        for binding in bindings:
            cluster.kube.apply(binding)
        if bindings:
            wait_until(lambda: _placement_policy_in_path(cluster, probe), timeout=30, what="the placement policy back")


@needs_extended_resources
@pytest.mark.parametrize("placer", ["webhook", "as-installed"])
@pytest.mark.parametrize("workload_class", ["inference", "training"])
def test_a_dra_extended_resource_is_placed_and_allocated_from_the_pods_node(
    cluster: Cluster, namespace: Callable[..., str], request: pytest.FixtureRequest, workload_class: str, placer: str
) -> None:
    """``as-installed``: the placement MutatingAdmissionPolicy places the pod before the webhook is called
    (which then adds the rest: spread, env); ``webhook``: that policy unbound, the webhook places it."""
    if placer == "webhook":
        request.getfixturevalue("placement_policy_unbound")
    ns = namespace(labels={"rocm-isolation.io/class": workload_class})
    created = cluster.kube.create(_implicit_pod("server", ns))
    annotations = created["metadata"]["annotations"]
    assert annotations["rocm-isolation.io/class"] == workload_class
    # The webhook saw the pod as a GPU pod of its class (its matchConditions know the implicit name).
    done = annotations["rocm-isolation.io/mutations"].split(",")
    assert "env" in done, annotations
    if placer == "webhook":
        assert "node-affinity" in done, annotations
        assert ("tolerations" in done) == (workload_class == "inference"), annotations
    terms = created["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    tolerations = created["spec"].get("tolerations") or []
    if workload_class == "inference":
        # Whole reserved nodes or split ones (device-level reservation: reservedDevices.nodeLabelValue).
        split_value = default_policy().spec.reserved_devices.node_label_value
        wanted = {"key": POOL_KEY, "operator": "In", "values": [POOL_VALUE, split_value]}
        assert any(t.get("key") == RESERVED_TOLERATION["key"] for t in tolerations), tolerations
    else:
        wanted = {"key": POOL_KEY, "operator": "NotIn", "values": [POOL_VALUE]}
        assert not any(t.get("key") == RESERVED_TOLERATION["key"] for t in tolerations), tolerations
    assert all(wanted in t["matchExpressions"] for t in terms), terms
    claim = _extended_resource_claim(cluster, ns, "server")
    node = cluster.kube.get("Pod", "server", ns)["spec"]["nodeName"]
    if workload_class == "inference":
        assert node in cluster.reserved, node
    else:
        assert node not in cluster.reserved, node
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, results
    assert results[0]["driver"] == DRIVER and results[0]["pool"] == node, results
