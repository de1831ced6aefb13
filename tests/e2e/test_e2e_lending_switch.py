"""Issue 42 item 2 on the real control plane (kube-apiserver, kube-scheduler, kube-controller-manager v1.36.2):
switching lending on and off, both ways, in both orders of the two writes, with pods created throughout.

The two writes of a switch (docs/operations.md "Turning it on" / "Turning it off"): the policy file the
webhook polls (``--policy-poll-seconds 1``; replaced atomically, as a ConfigMap's files are) and the
in-apiserver objects rendered by ``manifests --policy`` for the new policy, applied with ``kubectl apply
--server-side`` and then pruned of what the new rendering no longer holds (what ``kubectl apply --prune`` or a
GitOps tool does). With the lending section kept (``enabled: false``), the backstop, its bindings, the
PriorityClasses and the keeper's closing RBAC are the same on and off (``core/lending.switchable``): in the
apiserver a switch changes the placement MAP (and the policies on claims), one object per admission plugin.

A control plane of its own: two reserved nodes and one shared node of 2 GPUs each; the shared node is held
by a training pod that is no borrower throughout, so a borrower has only reserved GPUs to bind to. Lending
``headroomGPUs: 2`` (one idle reserved node kept closed: where a borrower waits while lending is on). The
lending keeper runs as ``serve``'s Lease holder runs it (its view of the cluster, ``tick`` every 0.5 s, with
the webhook's own ServiceAccount and so the RBAC the manifests of each state grant), its policy reloaded from
the same file as the webhook's. A kubelet stand-in marks bound pods Running and finishes deletions.

Throughout every test a stream of creations (dry run: the whole admission chain, the placement MAP, the
webhook, the backstop ValidatingAdmissionPolicies and the Priority plugin, without filling the nodes) of the
four kinds of pods that matter: a training pod of a namespace that may borrow, a pod of that namespace
asking to borrow, an inference pod, a pod asking for no GPU; at each step real pods are created as well.
Each of the two states admits all four, so none may be denied at any moment of a switch.

The tests run in order on one world:
1. off -> on, the webhook first: nothing denied; afterwards a borrower binds to the open reserved node and
   a second one waits (the other reserved node closed by the headroom);
2. on -> off, the manifests first (pruned): nothing denied; the running borrower is left alone; the waiting
   borrower never binds to a reserved node: the keeper keeps every reserved node closed while it is pending,
   with no manual step and with the RBAC of the lending-off manifests; the taint goes once no borrower is
   pending;
3. off -> on, the manifests first: nothing denied; a new borrower waits beside the closed idle node;
4. on -> off, the webhook first: nothing denied; the waiting borrower never binds to a reserved node, the
   nodes open once it is gone; the running borrower of test 1 is still running, never disrupted.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from cluster_objects import new_pod

from webhook.cluster.cache import load_api_client
from webhook.cluster.kubeapi import KubeApi
from webhook.cluster.view import ClusterView
from webhook.core.policy import default_policy_text
from webhook.deploy import lending_access
from webhook.service.lending_loop import LendingKeeper
from webhook.service.reload import PolicyStore

from .controlplane import ASSETS_ENV, LOOPBACK, ControlPlane, loopback_only, minor_options
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
    serves_dra,
    service_account_kubeconfig,
)
from .kube import ApiError, Kube, Obj, wait_until
from .kubelet import KubeletStandIn

RESERVED = ("sw-inf-1", "sw-inf-2")
SHARED = ("sw-gpu-1",)
GPUS = 2
HEADROOM = 2  # one idle reserved node (2 GPUs) kept closed to borrowers while lending is on
WINDOW = 3.0  # seconds between the two writes of a switch
HOLD = 4.0  # seconds a pending borrower is watched not binding after a switch off (8 keeper rounds)

# A switch on a minor without the placement MAP (1.33-1.35 stock) is the webhook's policy and the backstop only.
pytestmark = pytest.mark.minors("1.33", "1.34", "1.35")
BORROW = "rocm-isolation.io/borrow"
LENDING_LABEL = "rocm-isolation.io/lending"
CLASS_LABEL = "rocm-isolation.io/class"
NO_BORROWERS = "rocm-isolation.io/no-borrowers"
BORROWER_CLASS = "rocm-isolation-borrower"
TRAIN, SERVE = "sw-train", "sw-serve"


def lending_policy(enabled: bool) -> str:
    """The default policy with a lending section, on or off (turning it off keeps the section)."""
    document = yaml.safe_load(default_policy_text())
    document["spec"]["lending"] = {"enabled": enabled, "reclaimGraceSeconds": 5, "headroomGPUs": HEADROOM}
    return yaml.safe_dump(document, sort_keys=False)


# --- the stream of creations ------------------------------------------------------------------------------


def stream_pods() -> dict[str, Obj]:
    return {
        "training": gpu_pod("stream-training", TRAIN),
        "borrower": gpu_pod("stream-borrower", TRAIN, labels={"app": "stream", BORROW: "true"}),
        "inference": gpu_pod("stream-inference", SERVE),
        "plain": new_pod("stream-plain", TRAIN, labels={"app": "stream"}),
    }


@dataclass
class Stream:
    """Creates the four kinds of pods (dry run) one after the other until stopped; every denial kept with the
    phase it happened in."""

    kube: Kube
    phase: str = "setup"
    stop: threading.Event = field(default_factory=threading.Event)
    denials: list[tuple[str, str, str]] = field(default_factory=list)  # (phase, kind, message)
    created: dict[str, int] = field(default_factory=dict)  # phase -> admitted creations
    borrowers: dict[str, set[str]] = field(default_factory=dict)  # phase -> how the asking pod was placed

    def run(self) -> None:
        pods = stream_pods()
        while not self.stop.is_set():
            for kind, pod in pods.items():
                phase = self.phase
                try:
                    placed = self.kube.create(pod, dry_run=True)
                except ApiError as err:
                    self.denials.append((phase, kind, err.message))
                    continue
                except OSError as err:  # the connection, not admission: retried
                    self.denials.append((phase, kind, f"connection: {err}"))
                    continue
                self.created[phase] = self.created.get(phase, 0) + 1
                if kind == "borrower":
                    self.borrowers.setdefault(phase, set()).add(placement(placed))
            self.stop.wait(0.05)

    def denied(self, prefix: str) -> list[tuple[str, str, str]]:
        return [d for d in self.denials if d[0].startswith(prefix)]


def placement(pod: Obj) -> str:
    """How a pod asking to borrow was placed: ``borrower`` (the borrowers' class, reserved nodes allowed),
    ``training`` (no class), ``training-after-map`` (the MAP's borrowers' class, the webhook's training
    placement: the reserved nodes excluded)."""
    spec = pod["spec"]
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        or {}
    ).get("nodeSelectorTerms") or []
    excluded = bool(terms) and all(
        any(e.get("operator") == "NotIn" and "inference" in e.get("values", []) for e in t.get("matchExpressions", []))
        for t in terms
    )
    if spec.get("priorityClassName") != BORROWER_CLASS:
        return "training"
    return "training-after-map" if excluded else "borrower"


# --- the world ---------------------------------------------------------------------------------------------


@dataclass
class World:
    plane: ControlPlane
    kube: Kube
    webhook: Webhook
    policy_file: Path
    ca_file: Path
    webhook_port: int
    kubelet: KubeletStandIn
    stream: Stream
    manifests: list[Obj]  # what was applied last
    keeper_errors: list[str] = field(default_factory=list)
    # uid -> (name, node) of every TRAIN pod ever seen bound to a reserved node
    on_reserved: dict[str, tuple[str, str]] = field(default_factory=dict)
    running: dict[str, str] = field(default_factory=dict)  # name -> uid of borrowers that must be left alone
    # uids of the pods a switch's window admitted as borrowers (a minor without the placement MAP: the webhook's
    # write is the switch), which may borrow
    window_borrowers: set[str] = field(default_factory=set)

    def sample(self) -> None:
        for pod in self.kube.list("Pod", TRAIN):
            node = pod["spec"].get("nodeName")
            if node in RESERVED:
                self.on_reserved.setdefault(pod["metadata"]["uid"], (pod["metadata"]["name"], node))


def _keeper(world: World, stop: threading.Event) -> threading.Thread:
    """The keeper as ``serve``'s Lease holder runs it: its own view with the webhook's ServiceAccount, the
    policy reloaded from the webhook's file (a PolicyStore, as serve's), a round every 0.5 s."""
    store = PolicyStore(world.policy_file)
    account = service_account_kubeconfig(world.plane)
    view = ClusterView(load_api_client(str(account)), lambda: store.policy)
    api = KubeApi.connect(str(account))
    keeper = LendingKeeper(view.api(api), lambda: store.policy, lambda: True, view=view)

    def rounds() -> None:
        try:
            while not stop.is_set():
                try:
                    store.check()
                    keeper.tick()
                    world.sample()
                except Exception as err:  # a failed round is retried, as serve's keeper does
                    world.keeper_errors.append(repr(err))
                stop.wait(0.5)
        finally:
            view.stop()
            api.close()

    thread = threading.Thread(target=rounds, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    loopback_only()
    workdir = tmp_path_factory.mktemp("lending-switch")
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), workdir / "controlplane", **minor_options())
    plane.start()
    try:
        kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
        for name in RESERVED + SHARED:
            make_node(kube, name, MI300X_LABELS, gpus=GPUS)
        policy_file = workdir / "policy.yaml"
        policy_file.write_text(lending_policy(False), encoding="utf-8")
        # serve's own keeper off: the test runs it (below) to see its errors.
        deployed = deploy(plane, workdir, "--lending-seconds", "0", policy_file=policy_file)
        result = cli("pool", "apply", "--nodes", ",".join(RESERVED), kubeconfig=plane.admin_kubeconfig)
        assert result.returncode == 0, result.stdout + result.stderr
        make_namespace(kube, TRAIN, {CLASS_LABEL: "training", LENDING_LABEL: "allowed"})
        make_namespace(kube, SERVE, {CLASS_LABEL: "inference"})
        probe = gpu_pod("probe", TRAIN, node_name=RESERVED[0])
        wait_until(lambda: _denied(kube, probe), what="the webhook knowing the reserved nodes")
        kubelet = KubeletStandIn(kube, (TRAIN, SERVE))
        stream = Stream(kube)
        webhook = deployed.webhook
        world = World(
            plane, kube, webhook, policy_file, webhook.ca_file, webhook.port, kubelet, stream, deployed.manifests
        )
        stop = threading.Event()
        threads = [
            threading.Thread(target=kubelet.run, daemon=True),
            threading.Thread(target=stream.run, daemon=True),
            _keeper(world, stop),
        ]
        for thread in threads[:2]:
            thread.start()
        # The shared node held by a training pod that is no borrower: borrowers have reserved GPUs only.
        kube.create(gpu_pod("holder", TRAIN, gpus=GPUS, terminationGracePeriodSeconds=1))
        wait_until(lambda: _running(kube, "holder"), what="the shared node held")
        assert kube.get("Pod", "holder", TRAIN)["spec"]["nodeName"] in SHARED
        try:
            yield world
        finally:
            stop.set()
            kubelet.stop.set()
            stream.stop.set()
            for thread in threads:
                thread.join(timeout=15)
    finally:
        plane.stop()


def _denied(kube: Kube, pod: Obj) -> str:
    try:
        kube.create(pod, dry_run=True)
    except ApiError as err:
        return err.message
    return ""


def _running(kube: Kube, name: str, namespace: str = TRAIN) -> Obj | None:
    pod = kube.get_or_none("Pod", name, namespace)
    return pod if pod and (pod.get("status") or {}).get("phase") == "Running" else None


def _tainted(kube: Kube) -> set[str]:
    return {
        name
        for name in RESERVED
        if any(t.get("key") == NO_BORROWERS for t in kube.get("Node", name)["spec"].get("taints") or [])
    }


# --- the two writes ---------------------------------------------------------------------------------------


def _write_policy(world: World, enabled: bool) -> None:
    """The webhook's policy file replaced (as a ConfigMap's are: a rename), and the reload seen."""
    before = world.webhook.metric("rocm_isolation_policy_reloads_total")
    staged = world.policy_file.with_suffix(".new")
    staged.write_text(lending_policy(enabled), encoding="utf-8")
    os.replace(staged, world.policy_file)
    wait_until(
        lambda: world.webhook.metric("rocm_isolation_policy_reloads_total") > before,
        timeout=20,
        what="the webhook reloading its policy",
    )


def _apply_manifests(world: World, enabled: bool) -> list[str]:
    """``manifests --policy`` for the new policy applied, then pruned of what it no longer renders (what
    ``kubectl apply --prune`` does). Returns what was pruned."""
    staged = world.policy_file.with_name("next-policy.yaml")
    staged.write_text(lending_policy(enabled), encoding="utf-8")
    manifests = render_manifests(world.ca_file, world.webhook_port, staged, kubeconfig=world.plane.admin_kubeconfig)
    install(world.plane, manifests)
    kept = {(d["kind"], d["metadata"]["name"]) for d in manifests}
    pruned = []
    for doc in reversed(world.manifests):
        key = (doc["kind"], doc["metadata"]["name"])
        if key not in kept:
            world.kube.delete(doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace"))
            pruned.append("/".join(key))
    world.manifests = manifests
    return pruned


def _lending_is(world: World, enabled: bool) -> None:
    """Both sides in the new state: a pod asking to borrow is a borrower (lending on) or nothing of one."""

    def placed() -> bool:
        try:
            pod = world.kube.create(stream_pods()["borrower"], dry_run=True)
        except ApiError:
            return False
        return placement(pod) == ("borrower" if enabled else "training")

    wait_until(placed, timeout=30, what=f"the MAP and the webhook with lending {'on' if enabled else 'off'}")


def _switch(world: World, enabled: bool, first: str, name: str) -> list[str]:
    """The two writes, ``first`` ("webhook" or "manifests") first, WINDOW seconds apart, pods created
    throughout, and a real pod of each kind in the window."""
    world.stream.phase = f"{name}: before"
    time.sleep(1)
    pruned: list[str] = []
    world.stream.phase = f"{name}: {first} switched"
    if first == "webhook":
        _write_policy(world, enabled)
    else:
        pruned = _apply_manifests(world, enabled)
    # The apiserver takes changed admission policies within about a second (each plugin refreshes its own):
    # the real pods of the window are created once the first write is in force.
    time.sleep(1.5)
    window = [
        gpu_pod(f"{name}-training", TRAIN, terminationGracePeriodSeconds=1),
        gpu_pod(f"{name}-asks", TRAIN, labels={"app": f"{name}-asks", BORROW: "true"}),
        new_pod(f"{name}-plain", TRAIN, labels={"app": f"{name}-plain"}, terminationGracePeriodSeconds=1),
    ]
    for pod in window:
        try:
            created = world.kube.create(pod)
        except ApiError as err:
            world.stream.denials.append((world.stream.phase, pod["metadata"]["name"], err.message))
            continue
        if pod["metadata"]["name"].endswith("-asks"):
            if placement_served():
                # Between the writes a pod asking to borrow borrows nothing: placed as a training pod.
                assert placement(created) != "borrower", created["spec"]
            else:
                # No placement MAP (1.33-1.35 stock): the webhook's policy alone places it, so a switch is in force
                # with the webhook's write (the manifests' write changes nothing a pod meets: the backstop and the
                # PriorityClasses are the same on and off).
                lends = enabled if first == "webhook" else not enabled
                assert (placement(created) == "borrower") == lends, created["spec"]
                if lends:
                    world.window_borrowers.add(created["metadata"]["uid"])
    time.sleep(WINDOW - 1.5)
    world.stream.phase = f"{name}: both switched"
    if first == "webhook":
        pruned = _apply_manifests(world, enabled)
    else:
        _write_policy(world, enabled)
    _lending_is(world, enabled)
    time.sleep(1)
    world.stream.phase = f"{name}: after"
    for pod in window:
        world.kube.delete("Pod", pod["metadata"]["name"], TRAIN, force=True)
    return pruned


def _assert_nothing_denied(world: World, name: str) -> None:
    stream = world.stream
    denied = stream.denied(name)
    created = {phase: count for phase, count in stream.created.items() if phase.startswith(name)}
    placed = {phase: sorted(how) for phase, how in stream.borrowers.items() if phase.startswith(name)}
    print(f"\n{name}: admitted {created}; a pod asking to borrow placed as {placed}")
    assert denied == [], denied
    assert sum(created.values()) >= 40, created


def _borrower(name: str) -> Obj:
    return gpu_pod(name, TRAIN, gpus=GPUS, labels={"app": name, BORROW: "true"})


def _holds_pending_borrower(world: World, name: str) -> None:
    """After a switch off: ``name`` (a borrower admitted while lending was on) stays pending, every reserved
    node closed to it by the keeper, for HOLD seconds (no manual step)."""
    kube = world.kube
    try:
        wait_until(lambda: _tainted(kube) == set(RESERVED), timeout=10, what="every reserved node closed")
    except AssertionError as err:
        pods = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["spec"].get("priorityClassName"),
                 p["metadata"].get("labels")) for p in kube.list("Pod", TRAIN) + kube.list("Pod", SERVE)]  # fmt: skip
        raise AssertionError(f"{err}: tainted {_tainted(kube)}, keeper {world.keeper_errors}, pods {pods}") from None
    deadline = time.monotonic() + HOLD
    while time.monotonic() < deadline:
        assert not kube.get("Pod", name, TRAIN)["spec"].get("nodeName"), f"{name} bound after the switch off"
        assert _tainted(kube) == set(RESERVED)
        time.sleep(0.25)


def _left_alone(world: World) -> None:
    for name, uid in world.running.items():
        pod = _running(world.kube, name)
        assert pod is not None and pod["metadata"]["uid"] == uid and not pod["metadata"].get("deletionTimestamp")
        assert uid not in world.kubelet.deleted and uid not in world.kubelet.disrupted


def _no_new_borrower_on_reserved(world: World) -> None:
    world.sample()
    allowed = set(world.running.values()) | world.window_borrowers
    others = {uid: where for uid, where in world.on_reserved.items() if uid not in allowed}
    # The borrower of test 1 is the only pod of the training namespace ever seen on a reserved node (and, without
    # the placement MAP, the borrowers a window admitted while the webhook lent).
    assert others == {}, others


# --- the tests --------------------------------------------------------------------------------------------


def test_1_lending_on_the_webhook_first(world: World) -> None:
    kube = world.kube
    _switch(world, True, "webhook", "t1")
    _assert_nothing_denied(world, "t1")
    # Lending on: one idle reserved node closed by the headroom, the other open; a borrower binds there.
    wait_until(lambda: len(_tainted(kube)) == 1, timeout=10, what="one idle reserved node closed (headroom)")
    [open_node] = set(RESERVED) - _tainted(kube)
    created = kube.create(_borrower("b1"))
    assert placement(created) == "borrower"
    pod = wait_until(lambda: _running(kube, "b1"), timeout=30, what="the first borrower running")
    assert pod["spec"]["nodeName"] == open_node
    world.running["b1"] = pod["metadata"]["uid"]
    assert _tainted(kube) == set(RESERVED) - {open_node}
    # A second borrower waits: the shared node is held, the other reserved node closed.
    assert placement(kube.create(_borrower("b2"))) == "borrower"
    time.sleep(2)
    assert not kube.get("Pod", "b2", TRAIN)["spec"].get("nodeName")
    assert world.keeper_errors == []


def test_2_lending_off_the_manifests_first(world: World) -> None:
    """The manifests applied with pruning first: the keeper keeps its RBAC (issue 42, lending_access)."""
    kube = world.kube
    pruned = _switch(world, False, "manifests", "t2")
    _assert_nothing_denied(world, "t2")
    # Pruned: what only lending on renders (the lent-claims policy); kept: the keeper's role, its policies,
    # the PriorityClasses and the lending backstop (the same on and off with a lending section).
    # (1.33 serves no DRA: no claims policy rendered, nothing pruned.)
    assert bool(pruned) == serves_dra(), pruned
    assert all(lending_access.CLUSTER_ROLE not in p and "PriorityClass" not in p for p in pruned), pruned
    assert kube.get("PriorityClass", BORROWER_CLASS)
    role = kube.get("ClusterRole", lending_access.CLUSTER_ROLE)
    assert [r["resources"] for r in role["rules"]] == [["nodes"], ["deviceclasses"]], role["rules"]
    # The borrower waiting from before the switch never binds to a reserved node: all closed, by the keeper.
    _holds_pending_borrower(world, "b2")
    _left_alone(world)
    # Once no borrower is pending the keeper opens the nodes again (nothing done by hand).
    kube.delete("Pod", "b2", TRAIN, force=True)
    wait_until(lambda: not _tainted(kube), timeout=10, what="the reserved nodes opened")
    _no_new_borrower_on_reserved(world)
    _left_alone(world)
    assert world.keeper_errors == []


def test_3_lending_on_the_manifests_first(world: World) -> None:
    kube = world.kube
    _switch(world, True, "manifests", "t3")
    _assert_nothing_denied(world, "t3")
    # The borrower of test 1 still holds its node; the idle one is closed by the headroom; a borrower waits.
    b1_node = kube.get("Pod", "b1", TRAIN)["spec"]["nodeName"]
    wait_until(lambda: _tainted(kube) == set(RESERVED) - {b1_node}, timeout=10, what="the idle node closed")
    assert placement(kube.create(_borrower("b3"))) == "borrower"
    time.sleep(2)
    assert not kube.get("Pod", "b3", TRAIN)["spec"].get("nodeName")
    _left_alone(world)
    assert world.keeper_errors == []


def test_4_lending_off_the_webhook_first(world: World) -> None:
    kube = world.kube
    _switch(world, False, "webhook", "t4")
    _assert_nothing_denied(world, "t4")
    _holds_pending_borrower(world, "b3")
    kube.delete("Pod", "b3", TRAIN, force=True)
    wait_until(lambda: not _tainted(kube), timeout=10, what="the reserved nodes opened")
    # Nothing asking to borrow lands on the idle reserved node now: it is placed as a training pod.
    created = kube.create(_borrower("b4"))
    assert placement(created) == "training"
    time.sleep(2)
    assert not kube.get("Pod", "b4", TRAIN)["spec"].get("nodeName")
    _no_new_borrower_on_reserved(world)
    _left_alone(world)
    assert world.kubelet.errors == []
    assert world.keeper_errors == []
