"""Issue 36 on the real control plane (kube-apiserver, kube-scheduler and kube-controller-manager v1.36):
lending idle reserved GPUs of whole reserved nodes (``amd.com/gpu`` counted in node allocatable) to
borrowers, and taking them back by the scheduler's own preemption.

A control plane of its own (the session's runs the default policy, lending off): two reserved nodes and
one shared node of 2 GPUs each, the manifests rendered from a policy with lending on (the placement
MutatingAdmissionPolicy, the backstop, the two PriorityClasses), the webhook serving the same policy, and
a kubelet stand-in (``KubeletStandIn``): it marks bound pods Running and Ready through the status
subresource and finishes a deletion once its grace period is over (a delete with grace 0), nothing else.
Without it a PodDisruptionBudget proves nothing: the Eviction API and the disruption controller ignore
pods that are not Running and Ready (lending-facts.md §5).

The tests run in order on one world (each says what it starts from):
1. borrowers fill the idle reserved GPUs (they prefer the shared node, and take reserved GPUs when it is
   full), stored with the borrowers' PriorityClass, priority, preemption policy and capped grace period;
2. an inference Deployment scaled up preempts them despite a PodDisruptionBudget allowing no disruption,
   and binds within the borrowers' grace period + 10 s; no inference pod is ever deleted;
3. a training pod that is not a borrower is denied reserved capacity, with the webhook up and with it
   out of the path (the MAP and the backstop alone); a borrower is still placed as one by the MAP alone;
3b. a reserved node tainted ``rocm-isolation.io/no-borrowers`` takes no borrower, and an inference pod at
   once (it tolerates the taint), preempting nobody;
4. turning lending off (the policy re-rendered and applied, the webhook's policy file rewritten) leaves
   running borrowers alone and lends nothing new.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.policy import default_policy_text

from .controlplane import ASSETS_ENV, LOOPBACK, ControlPlane, kube_minor, loopback_only, minor_options
from .harness import (
    MI300X_LABELS,
    Webhook,
    cli,
    deploy,
    gpu_pod,
    install,
    make_namespace,
    make_node,
    placement_served,
    render_manifests,
)
from .kube import ApiError, Kube, Obj, wait_until
from .kubelet import KubeletStandIn

RESERVED = ("lend-inf-1", "lend-inf-2")
SHARED = ("lend-gpu-1",)
GPUS = 2
GRACE = 5  # the borrowers' reclaim grace period (lending.reclaimGraceSeconds)
BORROW = "rocm-isolation.io/borrow"
LENDING_LABEL = "rocm-isolation.io/lending"
CLASS_LABEL = "rocm-isolation.io/class"
TRAIN, SERVE = "lend-train", "lend-serve"
BORROWER_CLASS, BORROWER_VALUE = "rocm-isolation-borrower", -100
NO_BORROWERS = "rocm-isolation.io/no-borrowers"

# Whole-node lending needs no DRA and no MutatingAdmissionPolicy: it runs on every minor. Where the minor serves no
# placement policy (1.33-1.35 stock), what the MAP does with the webhook out of the path is not there (each test says
# what holds instead).
pytestmark = pytest.mark.minors("1.33", "1.34", "1.35")


def lending_policy(enabled: bool) -> str:
    document = yaml.safe_load(default_policy_text())
    document["spec"]["lending"] = {"enabled": enabled, "reclaimGraceSeconds": GRACE}
    return yaml.safe_dump(document, sort_keys=False)


# --- the world ---------------------------------------------------------------------------------------


@dataclass
class World:
    plane: ControlPlane
    kube: Kube
    webhook: Webhook
    policy_file: Path
    ca_file: Path
    webhook_port: int
    kubelet: KubeletStandIn
    # uid of every inference pod ever seen (none may ever be deleted)
    inference: set[str] = field(default_factory=set)


def render(plane: ControlPlane, policy_file: Path, ca_file: Path, port: int) -> list[Obj]:
    """``manifests --policy`` made to run against this control plane (for the minor it serves)."""
    return render_manifests(ca_file, port, policy_file, kubeconfig=plane.admin_kubeconfig)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    loopback_only()
    workdir = tmp_path_factory.mktemp("lending")
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), workdir / "controlplane", **minor_options())
    plane.start()
    try:
        kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
        for name in RESERVED + SHARED:
            make_node(kube, name, MI300X_LABELS, gpus=GPUS)
        policy_file = workdir / "policy.yaml"
        policy_file.write_text(lending_policy(True), encoding="utf-8")
        # The lending keeper of serve (webhook/service/lending_loop.py) off: these tests place the no-borrowers
        # taint by hand, which the keeper would take back; it is proven in test_e2e_lending_keeper.py.
        deployed = deploy(plane, workdir, "--lending-seconds", "0", policy_file=policy_file)
        assert [d["metadata"]["name"] for d in deployed.manifests if d["kind"] == "PriorityClass"] == [
            BORROWER_CLASS,
            "rocm-isolation-inference",
        ]
        result = cli("pool", "apply", "--nodes", ",".join(RESERVED), kubeconfig=plane.admin_kubeconfig)
        assert result.returncode == 0, result.stdout + result.stderr
        make_namespace(kube, TRAIN, {CLASS_LABEL: "training", LENDING_LABEL: "allowed"})
        make_namespace(kube, SERVE, {CLASS_LABEL: "inference"})
        # The webhook knows the reserved nodes: a training pod naming one is denied by the webhook itself.
        probe = gpu_pod("probe", TRAIN, node_name=RESERVED[0])
        wait_until(
            lambda: _denied(kube, probe, "pods.rocm-isolation.io"), what="the webhook knowing the reserved nodes"
        )
        kubelet = KubeletStandIn(kube, (TRAIN, SERVE))
        thread = threading.Thread(target=kubelet.run, daemon=True)
        thread.start()
        webhook = deployed.webhook
        try:
            yield World(plane, kube, webhook, policy_file, webhook.ca_file, webhook.port, kubelet)
        finally:
            kubelet.stop.set()
            thread.join(timeout=10)
    finally:
        plane.stop()


def _denied(kube: Kube, pod: Obj, by: str) -> str:
    """The denial message when ``by`` (the webhook or a policy's name) refused the dry-run creation."""
    try:
        kube.create(pod, dry_run=True)
    except ApiError as err:
        return err.message if by in err.message else ""
    return ""


def _deployment(name: str, namespace: str, replicas: int, labels: dict[str, str], grace: int = 30) -> Obj:
    template = gpu_pod(name, namespace, gpus=GPUS, labels=labels)
    template["spec"]["terminationGracePeriodSeconds"] = grace
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
        },
    }


def _live(kube: Kube, namespace: str, selector: str) -> list[Obj]:
    return [p for p in kube.list("Pod", namespace, selector=selector) if not p["metadata"].get("deletionTimestamp")]


def _running(kube: Kube, namespace: str, selector: str, count: int) -> list[Obj] | None:
    pods = [p for p in _live(kube, namespace, selector) if (p.get("status") or {}).get("phase") == "Running"]
    return pods if len(pods) >= count else None


def _watch_inference(world: World) -> None:
    for pod in world.kube.list("Pod", SERVE):
        world.inference.add(pod["metadata"]["uid"])


def _no_inference_pod_disrupted(world: World) -> None:
    """No inference pod was ever preempted or evicted (the operator's own scale-downs aside)."""
    taken = [name for namespace, name in world.kubelet.disrupted.values() if namespace == SERVE]
    assert taken == [], f"inference pods were preempted or evicted: {taken}"


def _no_inference_pod_deleted(world: World) -> None:
    _no_inference_pod_disrupted(world)
    _watch_inference(world)
    taken = [uid for uid, (namespace, _, _) in world.kubelet.deleted.items() if namespace == SERVE]
    assert taken == [], f"inference pods were deleted: {taken}"
    assert world.inference <= {p["metadata"]["uid"] for p in world.kube.list("Pod", SERVE)}


# --- 0. the PriorityClasses ------------------------------------------------------------------------------


def test_a_priority_class_value_cannot_be_changed_so_the_policy_carries_it(world: World) -> None:
    """The webhook and the MAP write a class's value from the policy (no RBAC to read PriorityClasses): that
    is sound because the apiserver refuses to change a PriorityClass's value (a changed value in the
    policy means deleting the class and applying the manifests again)."""
    with pytest.raises(ApiError) as refused:
        world.kube.patch("PriorityClass", BORROWER_CLASS, {"value": -50})
    assert refused.value.status == 422 and "value" in refused.value.message, refused.value.message
    assert world.kube.get("PriorityClass", BORROWER_CLASS)["value"] == BORROWER_VALUE


# --- 1. borrowers fill idle reserved GPUs ---------------------------------------------------------------


def test_borrowers_fill_idle_reserved_gpus_after_the_shared_ones(world: World) -> None:
    """Three borrowers of 2 GPUs (a whole node each): the shared node first (their preference), then the two
    idle reserved nodes. Stored with all three priority fields of the borrowers' class and the grace period
    capped at reclaimGraceSeconds (asked 600 s), Running and Ready by the kubelet stand-in."""
    kube = world.kube
    labels = {"app": "borrower", BORROW: "true"}
    first = _deployment("borrower", TRAIN, 1, labels, grace=600)
    kube.create(first)
    [pod] = wait_until(lambda: _running(kube, TRAIN, "app=borrower", 1), what="the first borrower running")
    assert pod["spec"]["nodeName"] in SHARED, "a borrower takes shared GPUs first"
    kube.patch("Deployment", "borrower", {"spec": {"replicas": 3}}, TRAIN)
    pods = wait_until(lambda: _running(kube, TRAIN, "app=borrower", 3), timeout=90, what="3 borrowers running")
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(RESERVED + SHARED)
    for pod in pods:
        spec = pod["spec"]
        assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (
            BORROWER_CLASS,
            BORROWER_VALUE,
            "Never",
        )
        assert spec["terminationGracePeriodSeconds"] == GRACE
        assert pod["metadata"]["labels"][BORROW] == "true"
        # lendFrom idleNodes: never beside an inference pod (test 2 shows preemption still removes it).
        [anti] = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert anti["topologyKey"] == "kubernetes.io/hostname" and anti["namespaceSelector"] == {}
        assert {
            "key": "rocm-isolation.io/reserved",
            "operator": "Equal",
            "value": "inference",
            "effect": "NoSchedule",
        } in spec["tolerations"]
    # Nothing else may run on the reserved nodes: a training pod that is not a borrower stays pending.
    kube.create(gpu_pod("not-a-borrower", TRAIN, gpus=GPUS))
    time.sleep(3)
    assert not kube.get("Pod", "not-a-borrower", TRAIN)["spec"].get("nodeName")
    kube.delete("Pod", "not-a-borrower", TRAIN, force=True)


# --- 2. inference takes its capacity back ----------------------------------------------------------------


def test_an_inference_deployment_preempts_borrowers_despite_a_pdb_within_grace_plus_10_seconds(
    world: World, record_property: Any
) -> None:
    """From test 1 (three borrowers running, two on reserved nodes): a PodDisruptionBudget over the borrowers
    allowing no disruption (all Running and Ready); an inference Deployment scaled from 0 to 2 (2 GPUs each,
    reserved nodes only): the scheduler preempts the two borrowers on the reserved nodes (their
    anti-affinity to inference pods and the GPUs both give way when they are removed), and both inference
    pods bind within the grace period + 10 s of the scale-up. The borrower on the shared node stays; the
    borrowers' Deployment recreates the others, which wait (no GPU left, and never beside inference)."""
    kube = world.kube
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "borrowers", "namespace": TRAIN},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "borrower"}}},
    }
    kube.create(pdb)
    wait_until(
        lambda: (kube.get("PodDisruptionBudget", "borrowers", TRAIN).get("status") or {}).get("currentHealthy") == 3,
        what="the PDB counting 3 healthy borrowers",
    )
    assert kube.get("PodDisruptionBudget", "borrowers", TRAIN)["status"]["disruptionsAllowed"] == 0
    on_shared = [p["metadata"]["uid"] for p in _live(kube, TRAIN, "app=borrower") if p["spec"]["nodeName"] in SHARED]

    kube.create(_deployment("llm", SERVE, 0, {"app": "llm"}, grace=2))
    start = time.monotonic()
    kube.patch("Deployment", "llm", {"spec": {"replicas": 2}}, SERVE)

    def bound() -> list[Obj] | None:
        _watch_inference(world)
        pods = [p for p in _live(kube, SERVE, "app=llm") if p["spec"].get("nodeName")]
        return pods if len(pods) == 2 else None

    pods = wait_until(bound, timeout=GRACE + 30, interval=0.1, what="2 inference pods bound")
    elapsed = time.monotonic() - start
    record_property("inference_bound_seconds", round(elapsed, 2))
    print(f"\ninference Deployment 0 -> 2: both bound {elapsed:.1f} s after the scale-up (grace {GRACE} s)")
    assert elapsed <= GRACE + 10, elapsed
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(RESERVED)
    for pod in pods:
        assert pod["spec"]["priority"] == 0 and pod["spec"].get("preemptionPolicy") == "PreemptLowerPriority"
    taken = [labels for namespace, _, labels in world.kubelet.deleted.values() if namespace == TRAIN]
    assert len(taken) >= 2 and all(labels.get(BORROW) == "true" for labels in taken), taken
    assert len([1 for namespace, _ in world.kubelet.disrupted.values() if namespace == TRAIN]) >= 2, "preempted"
    # The borrower on the shared node was not touched; the recreated ones wait.
    assert on_shared[0] in {p["metadata"]["uid"] for p in _live(kube, TRAIN, "app=borrower")}
    time.sleep(2)
    waiting = [p for p in _live(kube, TRAIN, "app=borrower") if not p["spec"].get("nodeName")]
    assert len(waiting) == 2, "the recreated borrowers wait: no idle reserved node is left"
    _no_inference_pod_deleted(world)
    assert world.kubelet.errors == []


# --- 3. a training pod that is not a borrower never reaches reserved capacity ----------------------------


def _tolerating(name: str, **labels: str) -> Obj:
    pod = gpu_pod(name, TRAIN, gpus=1, labels={"app": name, **labels})
    pod["spec"]["tolerations"] = [{"key": "rocm-isolation.io/reserved", "operator": "Exists"}]
    return pod


def _selecting(name: str) -> Obj:
    return gpu_pod(name, TRAIN, gpus=1, nodeSelector={"rocm-isolation.io/pool": "inference"})


@contextlib.contextmanager
def _webhook_out_of_the_path(world: World) -> Iterator[None]:
    kube = world.kube
    configuration = kube.get("MutatingWebhookConfiguration", "rocm-isolation-webhook")
    kube.delete("MutatingWebhookConfiguration", "rocm-isolation-webhook")
    try:
        probe = gpu_pod("out-of-path", SERVE)

        def not_called() -> bool:
            before = world.webhook.metric("rocm_isolation_admission_reviews_total")
            kube.create(probe, dry_run=True)
            return world.webhook.metric("rocm_isolation_admission_reviews_total") == before

        wait_until(lambda: not_called() and not_called(), timeout=30, what="the webhook out of the path")
        yield
    finally:
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
            configuration["metadata"].pop(key, None)
        kube.create(configuration)


def test_a_training_pod_that_is_not_a_borrower_is_denied_reserved_capacity_webhook_up_or_down(world: World) -> None:
    """Tolerating the reserved taint (no borrow label), or selecting the reserved nodes: denied by the
    webhook; with the webhook out of the path, by the backstop (the MAP places it as a non-borrower, and its
    priority is not the borrowers'). A borrower, webhook down, is placed as one by the MAP alone (all three
    priority fields: the Priority plugin's second check passes). A pod tolerating the no-borrowers taint is
    denied, borrower or not."""
    kube = world.kube
    assert "spec.tolerations[0] tolerates rocm-isolation.io/reserved" in _denied(
        kube, _tolerating("t1"), "pods.rocm-isolation.io"
    )
    assert _denied(kube, _selecting("s1"), "pods.rocm-isolation.io")
    no_borrowers = _tolerating("nb", **{BORROW: "true"})
    no_borrowers["spec"]["tolerations"] = [{"key": "rocm-isolation.io/no-borrowers", "operator": "Exists"}]
    assert "no borrowers" in _denied(kube, no_borrowers, "pods.rocm-isolation.io")
    with _webhook_out_of_the_path(world):
        assert "rocm-isolation-reserved-nodes" in _denied(kube, _tolerating("t2"), "rocm-isolation-reserved-nodes")
        assert _denied(kube, _selecting("s2"), "rocm-isolation-reserved-nodes")
        assert "no borrowers" in _denied(kube, no_borrowers, "rocm-isolation-reserved-nodes")
        placed = kube.create(gpu_pod("b2", TRAIN, gpus=1, labels={"app": "b2", BORROW: "true"}), dry_run=True)
        spec = placed["spec"]
        if not placement_served():
            # No MAP (1.33-1.35 stock): admitted unplaced, as any GPU pod with the webhook down; it tolerates no
            # reserved taint, so it borrows nothing (and takes no reserved GPU) until the webhook is back.
            assert "priorityClassName" not in spec and spec["priority"] == 0, kube_minor()
            assert not any(t.get("key") == "rocm-isolation.io/reserved" for t in spec.get("tolerations") or [])
            plain = kube.create(gpu_pod("p2", TRAIN, gpus=1), dry_run=True)
            assert "affinity" not in plain["spec"] and "priorityClassName" not in plain["spec"]
            return
        assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (
            BORROWER_CLASS,
            BORROWER_VALUE,
            "Never",
        )
        assert spec["terminationGracePeriodSeconds"] == GRACE
        plain = kube.create(gpu_pod("p2", TRAIN, gpus=1), dry_run=True)
        [term] = plain["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert {"key": "rocm-isolation.io/pool", "operator": "NotIn", "values": ["inference"]} in term[
            "matchExpressions"
        ]
        assert "priorityClassName" not in plain["spec"]


# --- 3b. the no-borrowers taint ------------------------------------------------------------------------


def _taint(kube: Kube, node: str, add: bool) -> None:
    current = kube.get("Node", node)["spec"].get("taints") or []
    taints = [t for t in current if t["key"] != NO_BORROWERS]
    if add:
        taints.append({"key": NO_BORROWERS, "value": "true", "effect": "NoSchedule"})
    kube.patch("Node", node, {"spec": {"taints": taints}})


def test_a_reserved_node_tainted_no_borrowers_takes_no_borrower_but_inference(world: World) -> None:
    """From test 3 (inference on both reserved nodes, a borrower on the shared node, two waiting). One
    reserved node tainted rocm-isolation.io/no-borrowers (headroom, pausing); the inference Deployment scaled
    to 0: one waiting borrower takes the untainted reserved node, the other keeps waiting beside the idle
    tainted one; an inference pod (it tolerates the taint) binds there at once, preempting nobody. Ends as
    test 4 starts: the taint removed, the inference pod gone, three borrowers running."""
    kube = world.kube
    _no_inference_pod_deleted(world)
    paused, open_node = RESERVED[1], RESERVED[0]
    _taint(kube, paused, True)
    kube.patch("Deployment", "llm", {"spec": {"replicas": 0}}, SERVE)
    wait_until(lambda: not kube.list("Pod", SERVE), timeout=30, what="the inference Deployment scaled to 0")
    pods = wait_until(lambda: _running(kube, TRAIN, "app=borrower", 2), timeout=60, what="a waiting borrower bound")
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted((open_node, *SHARED))
    time.sleep(3)
    assert len(_running(kube, TRAIN, "app=borrower", 2) or []) == 2, "no borrower on the tainted node"
    before = len(world.kubelet.disrupted)
    solo = gpu_pod("llm-solo", SERVE, gpus=GPUS, terminationGracePeriodSeconds=1)
    created = kube.create(solo)
    tolerations = created["spec"]["tolerations"]
    assert {"key": NO_BORROWERS, "operator": "Equal", "value": "true", "effect": "NoSchedule"} in tolerations
    bound = wait_until(
        lambda: kube.get("Pod", "llm-solo", SERVE)["spec"].get("nodeName"), timeout=30, what="the inference pod bound"
    )
    assert bound == paused and len(world.kubelet.disrupted) == before, (
        "bound on the idle tainted node, nobody preempted"
    )
    kube.delete("Pod", "llm-solo", SERVE)
    wait_until(lambda: not kube.list("Pod", SERVE), timeout=30, what="the inference pod gone")
    _taint(kube, paused, False)
    wait_until(lambda: _running(kube, TRAIN, "app=borrower", 3), timeout=60, what="the last borrower bound")
    _no_inference_pod_disrupted(world)


# --- 4. turning lending off ------------------------------------------------------------------------------


def test_turning_lending_off_leaves_running_borrowers_alone_and_lends_nothing_new(world: World) -> None:
    """From test 3b (three borrowers running, on both reserved nodes and the shared one). Lending turned
    off (the webhook's policy file rewritten, the manifests re-rendered and applied): the three running
    borrowers keep running (nothing deletes them, their status updates are admitted). One of them, on a
    reserved node, deleted by hand: its replacement, asking to borrow, is placed as a training pod (NotIn
    the reserved nodes, no PriorityClass) and stays pending beside the idle reserved node. The webhook out of
    the path, a pod at the borrowers' PriorityClass tolerating the reserved taint is placed as a training pod
    by the MAP (the backstop stays the lending one while the policy keeps its lending section), one below
    that priority is denied by the backstop."""
    kube = world.kube
    _no_inference_pod_disrupted(world)
    kube.patch("Deployment", "llm", {"spec": {"replicas": 0}}, SERVE)
    wait_until(lambda: not kube.list("Pod", SERVE), timeout=30, what="the inference Deployment scaled to 0")
    running = wait_until(lambda: _running(kube, TRAIN, "app=borrower", 3), timeout=60, what="3 borrowers again")
    assert sorted(p["spec"]["nodeName"] for p in running) == sorted(RESERVED + SHARED)

    world.policy_file.write_text(lending_policy(False), encoding="utf-8")
    manifests = render(world.plane, world.policy_file, world.ca_file, world.webhook_port)
    # The lending section kept (enabled: false): the PriorityClasses stay rendered, as the backstop split
    # (core/lending.switchable); the switch changes the placement policy.
    assert [d["metadata"]["name"] for d in manifests if d["kind"] == "PriorityClass"] == [
        BORROWER_CLASS,
        "rocm-isolation-inference",
    ]
    install(world.plane, manifests)

    def lending_off() -> bool:
        probe = gpu_pod("probe", TRAIN, gpus=1, labels={"app": "probe", BORROW: "true"})
        try:
            placed = kube.create(probe, dry_run=True)
        except ApiError:
            # While one of the two has the new policy and the other the old (the MAP placed a borrower, the
            # webhook no longer lends: its toleration denied), a borrower's creation fails; it is retried.
            return False
        return "priorityClassName" not in placed["spec"]

    wait_until(lending_off, timeout=30, what="the webhook and the MAP with lending off")
    victim = next(p for p in running if p["spec"]["nodeName"] in RESERVED)
    kube.delete("Pod", victim["metadata"]["name"], TRAIN)
    kept = {p["metadata"]["uid"] for p in running} - {victim["metadata"]["uid"]}

    def replacement() -> Obj | None:
        fresh = [p for p in _live(kube, TRAIN, "app=borrower") if p["metadata"]["uid"] not in kept]
        return fresh[0] if fresh and kube.get_or_none("Pod", victim["metadata"]["name"], TRAIN) is None else None

    new = wait_until(replacement, timeout=GRACE + 30, what="the deleted borrower replaced")
    assert new["metadata"]["labels"][BORROW] == "true"
    assert "priorityClassName" not in new["spec"] and new["spec"]["priority"] == 0
    time.sleep(GRACE + 5)
    new = kube.get("Pod", new["metadata"]["name"], TRAIN)
    assert new["spec"].get("nodeName") not in RESERVED, "nothing new is lent: the idle reserved node stays idle"
    still = {p["metadata"]["uid"] for p in _live(kube, TRAIN, "app=borrower") if p["status"].get("phase") == "Running"}
    on_reserved = {p["metadata"]["uid"] for p in running if p["spec"]["nodeName"] in RESERVED} & kept
    assert on_reserved and on_reserved <= still, "the running borrower on the other reserved node is left alone"
    if new["spec"].get("nodeName"):
        # The replacement (priority 0, PreemptLowerPriority: an ordinary training pod now) took the shared
        # node from the borrower there: borrowers are below every other pod, on shared nodes too.
        assert new["spec"]["nodeName"] in SHARED
        assert kept - on_reserved - still, "the shared node's borrower was the victim"
        print(f"\nthe replacement preempted the borrower on {new['spec']['nodeName']} (borrowers rank below it)")
    with _webhook_out_of_the_path(world):
        # The lending section kept: the backstop is the one of lending on (core/lending.switchable), so a pod
        # at the borrowers' PriorityClass tolerating the reserved taint (what the lending-on MAP writes, until
        # the apiserver takes the switch) is admitted; the lending-off MAP places it as a training pod, the
        # reserved nodes excluded in every term. A pod below that priority is denied its toleration.
        lent = _tolerating("late", **{BORROW: "true"})
        lent["spec"]["priorityClassName"] = BORROWER_CLASS
        placed = kube.create(lent, dry_run=True)
        if placement_served():
            terms = placed["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            for term in terms["nodeSelectorTerms"]:
                assert {"key": "rocm-isolation.io/pool", "operator": "NotIn", "values": ["inference"]} in term[
                    "matchExpressions"
                ]
        else:
            # No MAP (1.33-1.35 stock; measured): admitted as written, so with the webhook down a pod written as a
            # borrower can still borrow after lending is switched off while the lending section is kept (at the
            # borrowers' priority: preempted by any inference pod). docs/operations.md's support matrix says so,
            # and how to close it (remove the lending section: the strict backstop).
            assert "affinity" not in placed["spec"], kube_minor()
            assert placed["spec"]["priority"] == BORROWER_VALUE
        assert _denied(kube, _tolerating("late-2", **{BORROW: "true"}), "rocm-isolation-reserved-nodes")
    _no_inference_pod_disrupted(world)
    assert world.kubelet.errors == []
