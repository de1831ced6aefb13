"""An in-place upgrade from Kubernetes 1.33 to 1.34, the minor where DRA arrives (issue 47; docs/operations.md, "When
the cluster moves to a newer minor"), on a control plane of its own: the manifests rendered for 1.33 (no device-level
backstop: its parameter kind, a DeviceClass, is not served there) installed; the three components moved to 1.34 in
place (``ControlPlane.upgrade``: same etcd, certificates and port); then AMD's DRA driver arrives (its slices on two
DRA-only nodes, its chart DeviceClass).

1. Before re-rendering, ``pool apply --devices-per-node 2`` makes the split and says the device-level backstop is not
   installed (which policies, what to apply): with the webhook down a training claim of AMD's class is admitted (the
   gap the warning names).
2. The documented step: ``manifests`` read from the cluster (now 1.34: DRA no longer among its notes) applied, ``pool apply`` again:
   no warning, and the same claim is denied by the backstop.

The webhook is not running (no MutatingWebhookConfiguration): what is proven is the apiserver's alone.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from cluster_objects import exactly, new_claim

from webhook.core.policy import default_policy
from webhook.deploy.reserved_devices import CLAIMS_POLICY, POLICY_NAMES

from .controlplane import minor_options
from .harness import DRIVER, cli, own_plane
from .kube import ApiError, wait_until
from .test_e2e_device_reservation import (
    AMD_CHART_CLASS,
    DEVICES,
    INFERENCE_LABELS,
    Split,
    amd_resource_slice,
    dra_only_node,
    install_without_webhook,
    make_namespaces,
    pool,
    split_label,
)

NODES = ("dra-upgrade-1", "dra-upgrade-2")
BACKSTOP_MISSING = "the device-level backstop is not installed"
POLICY = default_policy()


@pytest.fixture(scope="module")
def on_133(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    options = minor_options("1.33", opt_in=False)
    with own_plane(tmp_path_factory.mktemp("controlplane-upgrade-dra"), **options) as (plane, kube):
        for node in NODES:
            dra_only_node(kube, node)
        install_without_webhook(plane, for_the_cluster=True)
        names = ("dra-upgrade-training", "dra-upgrade-inference", "dra-upgrade-admin")
        make_namespaces(kube, dict(zip(names, ({}, INFERENCE_LABELS, {}), strict=True)))
        yield Split(plane, kube, *names, {})


@pytest.fixture(scope="module")
def upgraded(on_133: Split) -> tuple[Split, subprocess.CompletedProcess[str]]:
    """On 1.34 (nothing re-rendered), AMD's driver installed, the split made: ``pool apply``'s answer."""
    split = on_133
    assert split.kube.get_or_none("ValidatingAdmissionPolicy", CLAIMS_POLICY) is None  # not rendered for 1.33
    split.plane.upgrade(emulated_version="1.34")
    for node in NODES:
        split.kube.apply(amd_resource_slice(node))
    split.kube.create(AMD_CHART_CLASS)
    return split, pool(split.plane, "apply", "--devices-per-node", "2")


def backstop_answer(split: Split) -> str:
    try:
        split.kube.create(new_claim("probe", split.training, exactly(DRIVER)), dry_run=True)
    except ApiError as err:
        return "denied" if CLAIMS_POLICY in err.message else f"other: {err.message}"
    return "admitted"


def test_on_134_before_re_rendering_the_split_says_the_device_backstop_is_missing(
    upgraded: tuple[Split, subprocess.CompletedProcess[str]],
) -> None:
    split, applied = upgraded
    assert all(split_label(split.kube, node) == DEVICES.node_label_value for node in NODES), applied.stdout
    (said,) = [line for line in applied.stderr.splitlines() if BACKSTOP_MISSING in line]
    assert all(f"validatingadmissionpolicy/{name}" in said for name in POLICY_NAMES), said
    # The gap it names: with the webhook down, a training claim of AMD's class is admitted (it could be allocated a
    # reserved device).
    assert backstop_answer(split) == "admitted"


def test_the_documented_step_installs_the_device_backstop_and_it_denies(
    upgraded: tuple[Split, subprocess.CompletedProcess[str]],
) -> None:
    split, _ = upgraded
    plane = split.plane
    rendered = cli(
        "manifests", "--overlay", "self-signed", "--ca-bundle", str(plane.pki.ca_file),
        kubeconfig=plane.admin_kubeconfig, check=True,
    )  # fmt: skip
    assert "no DRA (resource.k8s.io not served)" not in rendered.stderr and "note: 1.34:" in rendered.stderr, (
        rendered.stderr
    )
    install_without_webhook(plane, for_the_cluster=True)
    applied = pool(plane, "apply", "--devices-per-node", "2")
    assert BACKSTOP_MISSING not in applied.stderr, applied.stderr
    wait_until(lambda: backstop_answer(split) == "denied", timeout=60, what="the device backstop to deny")
