"""Device-level reservation on the run's Kubernetes minor (issue 47), on a control plane of its own emulating it
(``--kube-minor``): two DRA-only MI210 nodes publishing AMD's driver's slices (1.34 on), AMD's chart DeviceClass, the
manifests ``manifests`` renders for what the cluster serves, then ``pool apply --devices-per-node 2``:

- 1.33 (no resource.k8s.io): refused, naming the minor, nothing written;
- 1.34/1.35 as they ship (DRAExtendedResource off): the split is made without ``extendedResourceName`` (which the
  apiserver would drop), said once; ``pool status`` and ``audit`` then find the classes as the reservation records
  them, with no warning or finding about ``amd.com/gpu``;
- 1.36: the shared class maps ``amd.com/gpu`` (what test_e2e_device_reservation.py proves in full).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .controlplane import ASSETS_ENV, LOOPBACK, MINORS, ControlPlane, kube_minor, loopback_only, minor_options
from .harness import MI210_LABELS, install, make_node, render_manifests, serves_dra
from .kube import Kube
from .test_e2e_device_reservation import AMD_CHART_CLASS, DEVICES, SHARED_CLASS, amd_resource_slice, pool, split_label

pytestmark = pytest.mark.minors(*MINORS)

NODES = ("minor-dra-1", "minor-dra-2")
STALE_CLASS = "does not say what the reservation records"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    loopback_only()
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), tmp_path_factory.mktemp("controlplane-minor"), **minor_options())
    try:
        plane.start()
        kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
        for node in NODES:
            make_node(kube, node, MI210_LABELS, gpus=0)
            gone = {"amd.com/gpu": None}
            kube.patch("Node", node, {"status": {"capacity": gone, "allocatable": gone}}, subresource="status")
            if serves_dra():
                kube.apply(amd_resource_slice(node))
        if serves_dra():
            kube.create(AMD_CHART_CLASS)
        manifests = render_manifests(plane.pki.ca_file, 1, kubeconfig=plane.admin_kubeconfig)
        install(plane, [d for d in manifests if d["kind"] != "MutatingWebhookConfiguration"])
        yield plane
        plane.check_alive()
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def kube(plane: ControlPlane) -> Kube:
    return Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())


@pytest.mark.skipif(kube_minor() != "1.33", reason="1.33 only: the minor without resource.k8s.io")
def test_on_a_minor_without_dra_the_split_is_refused_naming_it_and_nothing_is_written(
    plane: ControlPlane, kube: Kube
) -> None:
    result = pool(plane, "apply", "--devices-per-node", "2", exit_code=2)
    assert "Kubernetes 1.33 serves no resource.k8s.io" in result.stderr, result.stderr
    assert "nothing was changed" in result.stderr, result.stderr
    assert all(split_label(kube, node) is None for node in NODES)
    # Whole nodes still reserve.
    whole = pool(plane, "apply", "--nodes", NODES[0])
    assert f"node/{NODES[0]} labeled and tainted" in whole.stdout, whole.stdout
    pool(plane, "release", "--nodes", NODES[0])


@pytest.mark.skipif(not serves_dra(), reason="DRA is served from 1.34")
def test_the_split_holds_what_the_minor_can_store_and_status_and_audit_agree(plane: ControlPlane, kube: Kube) -> None:
    applied = pool(plane, "apply", "--devices-per-node", "2")
    extended = kube_minor() == "1.36"
    assert ("no DRA extended resources" in applied.stderr) == (not extended), applied.stderr
    assert all(split_label(kube, node) == DEVICES.node_label_value for node in NODES), applied.stdout
    shared = kube.get("DeviceClass", SHARED_CLASS)
    assert shared["spec"].get("extendedResourceName") == (DEVICES.extended_resource_name if extended else None)
    for _ in range(2):  # every run, not once
        status = pool(plane, "status")
        assert STALE_CLASS not in status.stdout + status.stderr, status.stdout + status.stderr
    audited = pool_audit(plane)
    rules = {finding["rule"] for finding in audited["findings"]}
    assert "extended-resource-not-on-shared-class" not in rules, audited["findings"]
    released = pool(plane, "release", "--devices", "--all")
    assert "After release: released" in released.stdout, released.stdout


def pool_audit(plane: ControlPlane) -> dict[str, object]:
    from .harness import cli

    result = cli("audit", "-o", "json", kubeconfig=plane.admin_kubeconfig, timeout=180)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    document: dict[str, object] = json.loads(result.stdout)
    return document
