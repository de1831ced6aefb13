"""Issue 37 on the real control plane (kube-apiserver, kube-scheduler, kube-controller-manager v1.36.2): the
reserved devices of split nodes lent to borrowers and taken back, where the scheduler cannot preempt (no
DRA preemption up to 1.37: lending-facts.md §2).

A control plane of its own: two MI210 nodes of AMD's DRA driver (4 GPUs each, no device plugin), split
2 + 2 by ``pool apply --devices-per-node 2``; the manifests rendered from a policy with lending on (grace
5 s), the webhook serving it (claims of borrower pods steered to ``firstAvailable: [shared, lendable]``);
the lending keeper's rounds (``LendingKeeper.run_once``, what ``serve``'s Lease holder runs) in a thread of
the test with the webhook's own ServiceAccount (its RBAC and the policies holding it), every second, so
that the failover test can stop it and run two keepers by hand; the kubelet stand-in (tests/e2e/kubelet.py)
marks bound pods Running and Ready (a PodDisruptionBudget then counts them) and finishes deletions after
their grace period.

The tests run in order on one world:
1. borrowers take the shared devices, then the lent reserved ones; a training pod that is not a borrower
   waits (shared devices taken) and never gets a reserved device; a claim naming the lendable class made by
   a pod author gets shared devices only (webhook) and is denied with the webhook out of the path (backstop);
2. an inference pod waiting for a reserved device is bound within the grace period + 5 s: the keeper evicts
   a borrower (the youngest of the fewest), skipping those a PodDisruptionBudget protects; no inference pod
   is ever evicted, no non-borrower ever holds a reserved device;
3. failover mid-reclaim: a keeper that loses the Lease after one eviction of two, then a new one (no memory
   of the first): it evicts the one missing victim, no more, and the inference pod binds; the webhook down
   meanwhile changes nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cluster_objects import chart_class, exactly, new_claim, new_claim_pod, new_claim_template

from webhook.cluster.cache import load_api_client
from webhook.cluster.kubeapi import KubeApi
from webhook.cluster.view import ClusterView, NotSynced, ViewApi
from webhook.core.policy import Policy, load_policy
from webhook.ops.lending.demand import Demand
from webhook.service.device_lending import DeviceLending
from webhook.service.lending_loop import LendingKeeper, Observed

from .controlplane import ASSETS_ENV, LOOPBACK, ControlPlane, loopback_only, minor_options
from .harness import (
    MI210_LABELS,
    Webhook,
    cli,
    deploy,
    make_namespace,
    make_node,
    service_account_kubeconfig,
    start_webhook,
)
from .kube import ApiError, Kube, Obj, wait_until
from .kubelet import KubeletStandIn
from .test_e2e_device_reservation import amd_resource_slice
from .test_e2e_lending import GRACE, lending_policy  # grace 5 s

NODES = ("lend-dra-1", "lend-dra-2")

# Lending reserved devices needs DRA (1.34 on; 1.33 refuses the split itself: test_e2e_minor_devices.py).
pytestmark = pytest.mark.minors("1.34", "1.35")


def new_view(plane: ControlPlane, policy: Policy) -> ClusterView:
    """The Lease holder's view of the cluster, with the webhook's service account (its RBAC)."""
    return ClusterView(load_api_client(str(service_account_kubeconfig(plane))), lambda: policy)


TRAIN, SERVE = "dlend-train", "dlend-serve"
LENDABLE, SHARED, RESERVED = "rocm-isolation-lendable", "rocm-isolation-shared", "rocm-isolation-reserved"
BORROW = {"rocm-isolation.io/borrow": "true"}
# The reserved PCI bus IDs: the two lowest of each node (the same slots on both: test_e2e_device_reservation.GPUS).
RESERVED_PCI = ("0000:29:00.0", "0000:2c:00.0")


@dataclass
class World:
    plane: ControlPlane
    kube: Kube
    webhook: Webhook
    kubelet: KubeletStandIn
    api: KubeApi  # the webhook's ServiceAccount
    policy_file: Path
    workdir: Path
    cert_dir: Path
    port: int
    pci: dict[tuple[str, str], str]  # (node, device) -> PCI bus ID
    keeper_stop: threading.Event = field(default_factory=threading.Event)
    keeper_errors: list[str] = field(default_factory=list)
    keeper: threading.Thread | None = None
    view: ClusterView | None = None
    view_api: ViewApi | None = None
    # every (namespace, name, device) seen allocated: nobody but inference and borrowers on reserved ones
    holders: set[tuple[str, str, str]] = field(default_factory=set)
    observed: Observed | None = None  # the keeper's last round

    def start_keeper(self) -> None:
        """The keeper as ``serve``'s Lease holder runs it: on a watched view of the cluster, a round a second."""
        self.keeper_stop = threading.Event()
        policy = load_policy(self.policy_file)
        view = new_view(self.plane, policy)
        self.view_api = view.api(self.api)
        keeper = LendingKeeper(self.view_api, lambda: policy, lambda: True, view=view)
        self.view = view

        def rounds() -> None:
            try:
                while not self.keeper_stop.is_set():
                    try:
                        self.observed = keeper.tick()
                        self.sample()
                    except Exception as err:  # a failed round is retried, as serve's keeper does
                        self.keeper_errors.append(repr(err))
                    self.keeper_stop.wait(1.0)
            finally:
                view.stop()

        self.keeper = threading.Thread(target=rounds, daemon=True)
        self.keeper.start()

    def stop_keeper(self) -> None:
        self.keeper_stop.set()
        if self.keeper is not None:
            self.keeper.join(timeout=30)

    def sample(self) -> None:
        """Who holds which reserved device now."""
        for claim in self.kube.list("ResourceClaim"):
            for result in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
                pci = self.pci.get((result["pool"], result["device"]))
                if pci not in RESERVED_PCI:
                    continue
                for user in (claim.get("status") or {}).get("reservedFor") or []:
                    self.holders.add((claim["metadata"]["namespace"], user["name"], pci))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    loopback_only()
    workdir = tmp_path_factory.mktemp("device-lending")
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), workdir / "controlplane", **minor_options())
    plane.start()
    try:
        kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
        for node in NODES:
            make_node(kube, node, MI210_LABELS, gpus=0)
            gone = {"amd.com/gpu": None}
            kube.patch("Node", node, {"status": {"capacity": gone, "allocatable": gone}}, subresource="status")
            kube.apply(amd_resource_slice(node))
        kube.create(chart_class(created=None))
        policy_file = workdir / "policy.yaml"
        policy_file.write_text(lending_policy(True), encoding="utf-8")
        deployed = deploy(plane, workdir, "--lending-seconds", "0", policy_file=policy_file)
        out = cli("pool", "apply", "--devices-per-node", "2", kubeconfig=plane.admin_kubeconfig)
        assert out.returncode == 0, out.stdout + out.stderr
        make_namespace(kube, TRAIN, {"rocm-isolation.io/lending": "allowed"})
        make_namespace(kube, SERVE, {"rocm-isolation.io/class": "inference"})
        for ns in (TRAIN, SERVE):
            kube.create(new_claim_template("gpu", ns, exactly("gpu.amd.com")))
        pci = {
            (s["spec"]["pool"]["name"], d["name"]): d["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
            for s in kube.list("ResourceSlice")
            for d in s["spec"]["devices"]
        }
        assert {p for p in pci.values()} >= set(RESERVED_PCI), pci
        kubelet = KubeletStandIn(kube, (TRAIN, SERVE))
        thread = threading.Thread(target=kubelet.run, daemon=True)
        thread.start()
        api = KubeApi.connect(str(deployed.kubeconfig))
        webhook = deployed.webhook
        world = World(plane, kube, webhook, kubelet, api, policy_file, workdir, webhook.cert_dir, webhook.port, pci)
        world.start_keeper()
        try:
            yield world
        finally:
            world.stop_keeper()
            kubelet.stop.set()
            thread.join(timeout=10)
            api.close()
    finally:
        plane.stop()


def pod(name: str, namespace: str, labels: dict[str, str] | None = None) -> Obj:
    body = new_claim_pod(name, namespace, template="gpu", labels=labels or {"app": name})
    body["spec"]["terminationGracePeriodSeconds"] = 30
    return body


def devices_of(world: World, namespace: str, name: str) -> list[str] | None:
    """The PCI bus IDs a bound pod's claim was allocated, None while it is not bound."""
    live = world.kube.get_or_none("Pod", name, namespace)
    if live is None or not live["spec"].get("nodeName"):
        return None
    found: list[str] = []
    for status in (live.get("status") or {}).get("resourceClaimStatuses") or []:
        claim = world.kube.get("ResourceClaim", status["resourceClaimName"], namespace)
        for result in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
            found.append(world.pci[(result["pool"], result["device"])])
    return found or None


def bound(world: World, namespace: str, name: str, timeout: float = 60) -> list[str]:
    try:
        found: list[str] = wait_until(
            lambda: devices_of(world, namespace, name), timeout=timeout, what=f"{namespace}/{name} bound"
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\n{diagnosis(world, namespace, name)}") from None
    return found


def diagnosis(world: World, namespace: str, name: str) -> str:
    """What a test failing to see a pod bound shows: the pod's conditions, its claims, the lendable class."""
    live = world.kube.get_or_none("Pod", name, namespace) or {}
    lines = [f"pod status: {(live.get('status') or {}).get('conditions')}"]
    for status in (live.get("status") or {}).get("resourceClaimStatuses") or []:
        claim = world.kube.get_or_none("ResourceClaim", status["resourceClaimName"], namespace) or {}
        lines.append(f"claim {status['resourceClaimName']}: {claim.get('spec')} {claim.get('status')}")
    lendable = world.kube.get_or_none("DeviceClass", LENDABLE) or {}
    lines.append(f"lendable: {lendable.get('metadata', {}).get('annotations')} {lendable.get('spec')}")
    lines.append(f"keeper errors: {world.keeper_errors[-3:]}")
    lines.append(f"keeper's view: {world.view.status() if world.view is not None else None}")
    return "\n".join(lines)


def no_nonborrower_on_reserved(world: World) -> None:
    world.sample()
    for namespace, name, pci in world.holders:
        if namespace == SERVE:
            continue
        live = world.kube.get_or_none("Pod", name, namespace)
        assert live is None or live["spec"].get("priorityClassName") == "rocm-isolation-borrower", (name, pci)


def no_inference_disrupted(world: World) -> None:
    taken = [name for namespace, name in world.kubelet.disrupted.values() if namespace == SERVE]
    assert taken == [], f"inference pods were evicted: {taken}"
    gone = [name for namespace, name, _ in world.kubelet.deleted.values() if namespace == SERVE]
    assert gone == [], f"inference pods were deleted: {gone}"


# --- 1. lending ---------------------------------------------------------------------------------------


def test_borrowers_take_shared_devices_then_lent_reserved_ones(world: World) -> None:
    try:
        wait_until(lambda: world.kube.get_or_none("DeviceClass", LENDABLE), timeout=30, what="the lendable class")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{diagnosis(world, SERVE, 'none')}") from None
    got: dict[str, list[str]] = {}
    for i in range(8):
        name = f"borrower-{i}"
        world.kube.create(pod(name, TRAIN, {**BORROW, "app": name}))
        got[name] = bound(world, TRAIN, name)
        time.sleep(0.3)  # creation order: the youngest is the last
    reserved = [n for n, pcis in got.items() if set(pcis) <= set(RESERVED_PCI)]
    assert len(reserved) == 4, got
    # The demand the keeper exports (issue 43): the split nodes' 4 reserved devices all lent, none idle or wanted.
    lent = Demand(nodes=2, node_gpus=8, reserved=4, inference=0, waiting=0, lent=4, idle=0)
    wait_until(lambda: world.observed is not None and world.observed.devices.demand == lent, timeout=10,
               what=f"the keeper's demand {lent} (last: {world.observed and world.observed.devices.demand})")  # fmt: skip
    stored = world.kube.get("Pod", "borrower-0", TRAIN)
    assert stored["spec"]["priorityClassName"] == "rocm-isolation-borrower"
    claim = world.kube.get("ResourceClaim", stored["status"]["resourceClaimStatuses"][0]["resourceClaimName"], TRAIN)
    classes = [s["deviceClassName"] for s in claim["spec"]["devices"]["requests"][0]["firstAvailable"]]
    assert classes == [SHARED, LENDABLE], claim["spec"]


def test_the_keeper_reads_its_view_not_the_apiserver(world: World) -> None:
    """Issue 41 on the real control plane: rounds (one a second here) send the apiserver no read at all,
    and the view listed each collection once (then only watched)."""
    assert world.view is not None and world.view_api is not None
    wait_until(lambda: world.view is not None and world.view.synced, timeout=30, what="the keeper's view synced")
    api = world.view_api
    sent, passed = dict(api.sent), api.passed_through
    lists = {r.resource: r.lists for r in world.view.reflectors}
    time.sleep(5)  # five rounds
    assert api.sent.get("GET", 0) == sent.get("GET", 0) == 0, (sent, api.sent)
    assert api.passed_through == passed == 0
    assert set(api.sent) <= {"GET", "PATCH", "POST"}, api.sent  # writes: the class, evictions
    status = world.view.status()["collections"]
    assert {"nodes", "pods", "resourceslices", "resourceclaims", "deviceclasses"} <= set(status)
    assert all(item["synced"] for item in status.values()), status
    listed = {r.resource: r.lists for r in world.view.reflectors}
    assert listed == lists and set(listed.values()) == {1}, listed
    assert world.keeper_errors == [], world.keeper_errors


def test_a_training_pod_that_is_no_borrower_never_gets_a_reserved_device(world: World) -> None:
    world.kube.create(pod("not-a-borrower", TRAIN, {"rocm-isolation.io/borrow": "false", "app": "nb"}))
    time.sleep(4)
    assert devices_of(world, TRAIN, "not-a-borrower") is None
    live = world.kube.get("Pod", "not-a-borrower", TRAIN)
    claim = world.kube.get("ResourceClaim", live["status"]["resourceClaimStatuses"][0]["resourceClaimName"], TRAIN)
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == SHARED
    # A claim of its own naming the lendable class: pointed at the shared class by the webhook ...
    made = world.kube.create(
        new_claim("mine", TRAIN, {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": LENDABLE}]})
    )
    assert made["spec"]["devices"]["requests"][0]["firstAvailable"][0]["deviceClassName"] == SHARED
    # ... and denied by the backstop alone (the webhook's configuration out of the path).
    hook = world.kube.get("MutatingWebhookConfiguration", "rocm-isolation-webhook")
    world.kube.delete("MutatingWebhookConfiguration", "rocm-isolation-webhook")
    try:
        body = new_claim(
            "mine-2", TRAIN, {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": LENDABLE}]}
        )

        def denied() -> str:
            try:
                world.kube.create(body, dry_run=True)
            except ApiError as err:
                return err.message
            return ""

        message = wait_until(denied, timeout=30, what="the backstop denying the lendable class")
        assert "reserved for inference" in message, message
    finally:
        hook["metadata"] = {"name": hook["metadata"]["name"], "labels": hook["metadata"].get("labels", {})}
        world.kube.create(hook)
    world.kube.delete("Pod", "not-a-borrower", TRAIN, force=True)
    no_nonborrower_on_reserved(world)


def test_a_pod_naming_a_borrowers_claim_is_refused_by_the_webhook_and_by_the_backstop(world: World) -> None:
    """Issue 42: a borrower's claim (made by the resourceclaim controller, holding a lent reserved device)
    serves its own pod only. A pod that is not a borrower naming it by ``resourceClaimName`` is denied by the
    webhook at its CREATE; with the webhook out of the path the pod is admitted (a pod's policy cannot read
    the claim it names) but the scheduler cannot reserve the claim for it (``rocm-isolation-lent-claim-
    consumers`` denies the status update): it stays pending and never gets the device, and the borrower keeps
    its claim and its device."""
    lender = next(
        f"borrower-{i}" for i in range(8) if set(devices_of(world, TRAIN, f"borrower-{i}") or []) <= set(RESERVED_PCI)
    )
    lent = devices_of(world, TRAIN, lender)
    claim_name = world.kube.get("Pod", lender, TRAIN)["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    sharer = new_claim_pod(
        "sharer", TRAIN, claim_name=claim_name, labels={"app": "sharer", "rocm-isolation.io/borrow": "false"}
    )
    with pytest.raises(ApiError) as denied:
        world.kube.create(sharer)
    message = denied.value.message
    assert f"names ResourceClaim {claim_name}, which was made for a borrower" in message, message
    assert "resourceClaimTemplateName" in message, message
    hook = world.kube.get("MutatingWebhookConfiguration", "rocm-isolation-webhook")
    world.kube.delete("MutatingWebhookConfiguration", "rocm-isolation-webhook")
    try:
        # The webhook out of the path: the pod is admitted (nothing in a pod tells whose claim it names) ...
        wait_until(lambda: _created_or_none(world, sharer), timeout=30, what="the pod admitted without the webhook")
    finally:
        hook["metadata"] = {"name": hook["metadata"]["name"], "labels": hook["metadata"].get("labels", {})}
        world.kube.create(hook)

    def refused() -> str | None:
        live = world.kube.get("Pod", "sharer", TRAIN)
        assert not live["spec"].get("nodeName"), "bound with a borrower's claim"
        scheduled = {c["type"]: c for c in (live.get("status") or {}).get("conditions") or []}.get("PodScheduled")
        said = (scheduled or {}).get("message") or ""
        return said if "rocm-isolation-lent-claim-consumers" in said else None

    # ... and the scheduler cannot reserve the claim for it: the backstop denies the status update.
    said = wait_until(refused, timeout=30, what="the scheduler refused the claim's reservation")
    assert "was made for a borrower" in said, said
    time.sleep(2)
    assert not world.kube.get("Pod", "sharer", TRAIN)["spec"].get("nodeName")
    users = world.kube.get("ResourceClaim", claim_name, TRAIN)["status"]["reservedFor"]
    assert [u["name"] for u in users] == [lender], users
    # The borrower's own claim keeps working: still bound, same lent device.
    assert devices_of(world, TRAIN, lender) == lent
    world.kube.delete("Pod", "sharer", TRAIN, force=True)
    no_nonborrower_on_reserved(world)


def _created_or_none(world: World, body: Obj) -> Obj | None:
    try:
        created: Obj = world.kube.create(body)
    except ApiError:
        return None
    return created


# --- 2. reclaim ---------------------------------------------------------------------------------------


def test_an_inference_pod_gets_a_lent_device_back_within_grace_plus_5s_around_a_pdb(world: World) -> None:
    # The youngest borrowers holding reserved devices are protected by a budget allowing no disruption.
    holding = sorted(
        (n for n in (f"borrower-{i}" for i in range(8)) if set(devices_of(world, TRAIN, n) or []) <= set(RESERVED_PCI)),
        key=lambda n: world.kube.get("Pod", n, TRAIN)["metadata"]["creationTimestamp"],
    )
    protected = holding[-2:]
    for name in protected:
        world.kube.patch("Pod", name, {"metadata": {"labels": {"kept": "yes"}}}, TRAIN)
    world.kube.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "kept", "namespace": TRAIN},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"kept": "yes"}}},
        }
    )
    wait_until(
        lambda: (world.kube.get("PodDisruptionBudget", "kept", TRAIN).get("status") or {}).get("currentHealthy") == 2,
        timeout=30,
        what="the budget counting its pods",
    )
    created = time.time()
    world.kube.create(pod("llm-0", SERVE))
    got = bound(world, SERVE, "llm-0", timeout=GRACE + 30)
    waited = time.time() - created
    assert set(got) <= set(RESERVED_PCI), got
    assert waited <= GRACE + 5, f"bound {waited:.1f}s after its creation"
    evicted = {name for namespace, name in world.kubelet.disrupted.values() if namespace == TRAIN}
    assert len(evicted) == 1 and not evicted & set(protected), (evicted, protected)
    no_inference_disrupted(world)
    no_nonborrower_on_reserved(world)


# --- 3. failover -----------------------------------------------------------------------------------------


def test_a_new_lease_holder_finishes_a_reclaim_in_flight_without_evicting_twice(world: World) -> None:
    world.stop_keeper()
    world.kube.delete("PodDisruptionBudget", "kept", TRAIN)
    before = {uid for uid, (namespace, _) in world.kubelet.disrupted.items() if namespace == TRAIN}
    inference = new_claim_pod("llm-1", SERVE, template="gpu2", labels={"app": "llm-1"})
    world.kube.create(new_claim_template("gpu2", SERVE, exactly("gpu.amd.com", count=2)))
    world.kube.create(inference)
    policy = load_policy(world.policy_file)

    def unschedulable() -> list[dict[str, Any]] | None:
        live = world.kube.get("Pod", "llm-1", SERVE)
        conditions = {c["type"]: c for c in (live.get("status") or {}).get("conditions") or []}
        scheduled = conditions.get("PodScheduled")
        ready = scheduled is not None and scheduled.get("reason") == "Unschedulable"
        return [live] if ready and (live.get("status") or {}).get("resourceClaimStatuses") else None

    waiting = wait_until(unschedulable, timeout=30, what="llm-1 unschedulable")
    # The first holder evicts one victim, then loses the Lease.
    calls = iter([True, False, False, False])
    first = DeviceLending(world.api, lambda: next(calls, False)).run(policy, waiting)
    assert len(first.evicted) == 1, first
    # The webhook goes down meanwhile: taking devices back does not need it.
    world.plane.processes.stop_one(world.webhook.component)
    # The new holder reads only its own view, and decides nothing before the view has synced.
    view = new_view(world.plane, policy)
    try:
        second = DeviceLending(view.api(world.api), lambda: True)
        with pytest.raises(NotSynced):
            second.run(policy, waiting)
        view.start()
        wait_until(lambda: view.synced, timeout=30, what="the new holder's view synced")
        again = second.run(policy, wait_until(unschedulable, timeout=10, what="llm-1 still waiting"))
        assert len(again.evicted) == 1 and again.evicted != first.evicted, (first, again)
        third = second.run(policy, wait_until(unschedulable, timeout=10, what="llm-1 still waiting"))
        assert third.evicted == (), third  # both victims are leaving: nothing more
        bound(world, SERVE, "llm-1", timeout=GRACE + 30)
    finally:
        view.stop()
        world.webhook = start_webhook(
            world.plane, world.workdir / "webhook", service_account_kubeconfig(world.plane), "--lending-seconds", "0",
            policy_file=world.policy_file, cert_dir=world.cert_dir, port=world.port,
        )  # fmt: skip
    taken = {uid for uid, (namespace, _) in world.kubelet.disrupted.items() if namespace == TRAIN} - before
    assert len(taken) == 2, taken
    no_inference_disrupted(world)
    no_nonborrower_on_reserved(world)
    assert world.keeper_errors == [], world.keeper_errors


# --- 4. pool with borrowers present ----------------------------------------------------------------------


def lendable_selectors(world: World) -> str:
    return str(world.kube.get("DeviceClass", LENDABLE)["spec"]["selectors"])


def test_pool_resize_and_release_with_borrowers_present(world: World) -> None:
    world.start_keeper()
    reserved_before = str(world.kube.get("DeviceClass", RESERVED)["spec"]["selectors"])
    out = cli("pool", "apply", "--devices-per-node", "1", kubeconfig=world.plane.admin_kubeconfig)
    assert out.returncode == 0, out.stdout + out.stderr
    reserved_now = str(world.kube.get("DeviceClass", RESERVED)["spec"]["selectors"])
    assert reserved_now != reserved_before
    # Within a round the lendable class lends the new reserved slot, or nothing (inference waiting, headroom).
    wait_until(
        lambda: lendable_selectors(world) in (reserved_now, str([{"cel": {"expression": "false"}}])),
        timeout=30,
        what="the lendable class following the resize",
    )
    assert RESERVED_PCI[1] not in lendable_selectors(world)
    running = {p["metadata"]["name"] for p in world.kube.list("Pod", TRAIN) if p["spec"].get("nodeName")}
    out = cli("pool", "release", "--devices", "--all", kubeconfig=world.plane.admin_kubeconfig)
    assert out.returncode == 0, out.stdout + out.stderr
    wait_until(
        lambda: (
            world.kube.get("DeviceClass", LENDABLE)["metadata"]["annotations"]["rocm-isolation.io/lending"] == "closed"
        ),
        timeout=30,
        what="the lendable class closed once released",
    )
    assert lendable_selectors(world) == str([{"cel": {"expression": "false"}}])
    # Running borrowers keep their devices: neither command evicted anybody.
    still = {p["metadata"]["name"] for p in world.kube.list("Pod", TRAIN) if p["spec"].get("nodeName")}
    assert running <= still, running - still
    assert world.keeper_errors == [], world.keeper_errors
