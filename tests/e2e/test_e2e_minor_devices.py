"""Device-level reservation on the run's Kubernetes minor (issue 47), on a control plane of its own emulating it
(``--kube-minor``): two DRA-only MI210 nodes publishing AMD's driver's slices (1.34 on), AMD's chart DeviceClass, the
manifests ``manifests`` renders for what the cluster serves (no webhook unless a test starts it), then
``pool apply --devices-per-node 2``:

- 1.33 (no resource.k8s.io): refused, naming the minor, nothing written;
- 1.34/1.35 as they ship (DRAExtendedResource off): the split is made without ``extendedResourceName`` (which the
  apiserver would drop), said once; ``pool status`` and ``audit`` then find the classes as the reservation records
  them, with no warning or finding about ``amd.com/gpu``; and the split is enforced by the apiserver and the scheduler
  alone (the webhook down): every claim route to the reserved devices is denied by the backstop, training claims get
  shared devices only and wait once those are taken while reserved ones are free, a claim aiming at a reserved device
  through its own selector is never allocated, inference claims get reserved devices only, and ``amd.com/gpu`` stays
  the device plugin's (a training pod asking for it is never bound to a DRA-only node); with the webhook up, claim
  templates of AMD's class are steered to their namespace's side;
- 1.36: the shared class maps ``amd.com/gpu`` (what test_e2e_device_reservation.py proves in full, with all of the
  above).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial

import pytest
from cluster_objects import exactly, new_claim, new_claim_pod, new_claim_template, new_pod

from .controlplane import MINORS, ControlPlane, kube_minor, minor_options
from .harness import Webhook, cli, own_plane, serves_dra
from .test_e2e_device_reservation import (
    DENIED_ROUTES,
    DEVICES,
    DRIVER,
    PCI_ORDER,
    RESERVED_CLASS,
    SHARED_CLASS,
    Split,
    _steered_class,
    allocated,
    assert_denied_by_the_backstop,
    build_split,
    dra_only_node,
    empty_devices,
    install_without_webhook,
    never_scheduled,
    pool,
    reserved_ids,
    running_webhook,
    shared_ids,
    shown,
    split_label,
    template_class,
    training_devices,
)

pytestmark = pytest.mark.minors(*MINORS)

NODES = ("minor-dra-1", "minor-dra-2")
STALE_CLASS = "does not say what the reservation records"
# The minors whose split is proven here in full; 1.36's is test_e2e_device_reservation.py's.
ENFORCED_HERE = ("1.34", "1.35")
enforced_here = pytest.mark.skipif(
    kube_minor() not in ENFORCED_HERE,
    reason="1.34/1.35: 1.33 serves no DRA; on 1.36 test_e2e_device_reservation.py proves the split in full",
)


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    with own_plane(tmp_path_factory.mktemp("controlplane-minor"), **minor_options()) as (plane, kube):
        if serves_dra():
            names = ("minor-training", "minor-inference", "minor-admin")
            yield build_split(plane, kube, NODES, *names, for_the_cluster=True)
        else:
            for node in NODES:
                dra_only_node(kube, node)
            install_without_webhook(plane, for_the_cluster=True)
            yield Split(plane, kube, "default", "default", "default", {})


@pytest.fixture(autouse=True)
def emptied(split: Split) -> Iterator[None]:
    """Each test leaves every device free: its pods (the waiting ones first), claims and templates deleted."""
    yield
    if serves_dra():
        empty_devices(split)


@pytest.mark.skipif(kube_minor() != "1.33", reason="1.33 only: the minor without resource.k8s.io")
def test_on_a_minor_without_dra_the_split_is_refused_naming_it_and_nothing_is_written(split: Split) -> None:
    result = pool(split.plane, "apply", "--devices-per-node", "2", exit_code=2)
    assert "Kubernetes 1.33 serves no resource.k8s.io" in result.stderr, result.stderr
    assert "nothing was changed" in result.stderr, result.stderr
    assert all(split_label(split.kube, node) is None for node in NODES)
    # Whole nodes still reserve.
    whole = pool(split.plane, "apply", "--nodes", NODES[0])
    assert f"node/{NODES[0]} labeled and tainted" in whole.stdout, whole.stdout
    pool(split.plane, "release", "--nodes", NODES[0])


@pytest.mark.skipif(not serves_dra(), reason="DRA is served from 1.34")
def test_the_split_holds_what_the_minor_can_store_and_status_and_audit_agree(split: Split) -> None:
    applied = pool(split.plane, "apply", "--devices-per-node", "2")
    extended = kube_minor() == "1.36"
    assert ("no DRA extended resources" in applied.stderr) == (not extended), applied.stderr
    # The plan it printed says amd.com/gpu maps to the shared class only where the minor keeps the name.
    assert ("No extended resource maps to the shared class" in applied.stdout) == (not extended), applied.stdout
    assert all(split_label(split.kube, node) == DEVICES.node_label_value for node in NODES), applied.stdout
    shared = split.kube.get("DeviceClass", SHARED_CLASS)
    assert shared["spec"].get("extendedResourceName") == (DEVICES.extended_resource_name if extended else None)
    for _ in range(2):  # every run, not once
        status = pool(split.plane, "status")
        assert STALE_CLASS not in status.stdout + status.stderr, status.stdout + status.stderr
    audited = pool_audit(split.plane)
    rules = {finding["rule"] for finding in audited["findings"]}
    assert "extended-resource-not-on-shared-class" not in rules, audited["findings"]


@enforced_here
@pytest.mark.parametrize("route", [r for r in DENIED_ROUTES if r.startswith(("template-", "claim-"))])
def test_with_the_webhook_down_every_claim_route_to_the_reserved_devices_is_denied(split: Split, route: str) -> None:
    """Templates and claims of AMD's class, of the reserved class, through firstAvailable and adminAccess:
    denied by the device backstop rendered for the minor. (The pods' DRA extended resource routes have no
    GPU behind them here: the apiserver drops the classes' names, test_e2e_gpu_routes.py says why.)"""
    assert_denied_by_the_backstop(split, route)


@enforced_here
def test_training_claims_get_shared_devices_only_and_wait_once_those_are_taken(split: Split) -> None:
    ns = split.training
    for node in NODES:
        split.kube.create(new_claim(f"pair-{node}", ns, exactly(SHARED_CLASS, count=2)))
        split.kube.create(new_claim_pod(f"pair-{node}", ns, claim_name=f"pair-{node}"))
    placed = {allocated(split, ns, f"pair-{node}").node for node in NODES}
    assert placed == set(NODES)
    held = training_devices(split)
    assert len(held) == 4 and {d.pci for d in held} == shared_ids(2), f"training holds {shown(held)}"
    split.kube.create(new_claim("next", ns, exactly(SHARED_CLASS)))
    split.kube.create(new_claim_pod("next", ns, claim_name="next"))
    selector = f'device.attributes["resource.kubernetes.io"].pciBusID == "{PCI_ORDER[0]}"'
    split.kube.create(new_claim("aimed", ns, exactly(SHARED_CLASS, selectors=[{"cel": {"expression": selector}}])))
    split.kube.create(new_claim_pod("aimed", ns, claim_name="aimed"))
    never_scheduled(split, ns, "next", "aimed")
    assert len(training_devices(split)) == 4  # four reserved devices free, none handed to training


@enforced_here
def test_inference_claims_get_reserved_devices_only_and_amd_gpu_stays_the_device_plugins(split: Split) -> None:
    ns = split.inference
    split.kube.create(new_claim_template("reserved-pair", ns, exactly(RESERVED_CLASS, count=2)))
    for i in range(2):
        split.kube.create(new_claim_pod(f"llm-{i}", ns, template="reserved-pair"))
    got = [d for i in range(2) for d in allocated(split, ns, f"llm-{i}").devices]
    assert len(got) == 4 and {d.pci for d in got} == reserved_ids(2), f"inference got {shown(got)}"
    split.kube.create(new_pod("amd-gpu", split.training, {DEVICES.extended_resource_name: "1"}))
    message = never_scheduled(split, split.training, "amd-gpu")["amd-gpu"]
    assert f"Insufficient {DEVICES.extended_resource_name}" in message, message


@enforced_here
def test_with_the_webhook_up_templates_of_amds_class_are_steered_to_their_side(
    split: Split, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Pod authors change nothing: a training and an inference ResourceClaimTemplate of ``gpu.amd.com`` are stored
    as templates of the shared and of the reserved class, and their pods get devices of that side."""
    directory = tmp_path_factory.mktemp("webhook-minor-devices")
    with running_webhook(split, directory, partial(_steered_class, split), SHARED_CLASS) as webhook:
        assert isinstance(webhook, Webhook)
        for ns, wanted, ids in (
            (split.training, SHARED_CLASS, shared_ids(2)),
            (split.inference, RESERVED_CLASS, reserved_ids(2)),
        ):
            split.kube.create(new_claim_template("chart", ns, exactly(DRIVER, count=2)))
            assert template_class(split.kube.get("ResourceClaimTemplate", "chart", ns)) == wanted
            split.kube.create(new_claim_pod("chart", ns, template="chart"))
            alloc = allocated(split, ns, "chart")
            assert {d.pci for d in alloc.devices} <= ids, f"{ns} got {shown(alloc.devices)}"


@pytest.mark.skipif(not serves_dra(), reason="DRA is served from 1.34")
def test_release_gives_every_device_back(split: Split) -> None:
    released = pool(split.plane, "release", "--devices", "--all")
    assert "After release: released" in released.stdout, released.stdout
    assert all(split_label(split.kube, node) is None for node in NODES)


def pool_audit(plane: ControlPlane) -> dict[str, object]:
    result = cli("audit", "-o", "json", kubeconfig=plane.admin_kubeconfig, timeout=180)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    document: dict[str, object] = json.loads(result.stdout)
    return document
