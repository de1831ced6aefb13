"""AutoPartition on a minor without partitionable devices (issue 47): 1.34 and 1.35 as they ship
(``DRAPartitionableDevices`` off), on a control plane of their own emulating the run's minor (``--kube-minor``).

Two DRA-only nodes publish four MI300X GPUs each in AMD's driver's AutoPartition shape (test_e2e_autopartition.py:
a counters slice and one virtual device per compute+memory layout consuming its GPU's counter); AMD's classes
``gpu.amd.com`` and ``gpu.amd.com-spx``; the manifests rendered for the cluster, no webhook running. Measured here:

- the apiserver stores the slices without ``sharedCounters`` and ``consumesCounters``: the scheduler takes every
  layout for a GPU of its own;
- ``pool apply --devices-per-node 2`` splits them (the classes select by PCI bus ID and pin the whole-GPU layout's
  memory mode, nps1) and says, naming the minor and the gate, what that costs: two claims can be handed two layouts
  of one GPU (seen below: eight claims on the four shared GPUs, two per GPU);
- the split holds: training claims get shared GPUs only, and wait once those are taken while reserved layouts are
  free; inference gets reserved GPUs; a training claim of AMD's class is denied by the backstop.

On 1.36 (counters kept) test_e2e_autopartition.py proves the full reservation; 1.33 serves no DRA.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from cluster_objects import exactly, new_claim, new_claim_pod

from webhook.core.policy import default_policy
from webhook.deploy.reserved_devices import CLAIMS_POLICY

from .controlplane import kube_minor, minor_options
from .harness import DRIVER, own_plane
from .kube import ApiError
from .test_e2e_autopartition import NODES, PCI, build_autopartition
from .test_e2e_device_reservation import Split, allocated, empty_devices, never_scheduled, pool

pytestmark = [
    pytest.mark.minors("1.34", "1.35"),
    pytest.mark.skipif(
        kube_minor() in ("1.33", "1.36"),
        reason="1.34 and 1.35 only: 1.33 serves no DRA; on 1.36 test_e2e_autopartition.py proves AutoPartition in full",
    ),
]

POLICY = default_policy()
DEVICES = POLICY.spec.reserved_devices
RESERVED, SHARED = set(PCI[:2]), set(PCI[2:])  # the lowest two PCI bus IDs of each node are reserved
LOST = "no partitionable devices (DRAPartitionableDevices off)"


@pytest.fixture(scope="module")
def ap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    with own_plane(tmp_path_factory.mktemp("controlplane-minor-ap"), **minor_options()) as (plane, kube):
        yield build_autopartition(plane, kube, ("map-training", "map-inference", "map-admin"), for_the_cluster=True)


@pytest.fixture(autouse=True)
def emptied(ap: Split) -> Iterator[None]:
    yield
    empty_devices(ap)


def test_the_split_is_made_and_says_what_the_minor_drops(ap: Split) -> None:
    stored = ap.kube.list("ResourceSlice")
    assert stored and not any(s["spec"].get("sharedCounters") for s in stored), "the counters were kept"
    assert not any(d.get("consumesCounters") for s in stored for d in s["spec"].get("devices") or [])
    applied = pool(ap.plane, "apply", "--devices-per-node", "2")
    assert f"warning: Kubernetes {kube_minor()}: {LOST}" in applied.stderr, applied.stderr
    assert f"layout of {DRIVER} on {', '.join(NODES)} for a GPU of its own" in applied.stderr, applied.stderr
    assert "Memory mode: nps1, pinned" in applied.stdout, applied.stdout
    for node in NODES:
        labels = ap.kube.get("Node", node)["metadata"]["labels"]
        assert labels.get(POLICY.spec.reserved_nodes.label[0]) == DEVICES.node_label_value, labels
    status = pool(ap.plane, "status")
    assert "does not say what the reservation records" not in status.stdout + status.stderr


def test_training_gets_shared_gpus_only_two_claims_per_gpu_and_then_waits(ap: Split) -> None:
    """Eight one-device training claims of the shared class on the four shared GPUs: each GPU's two nps1 layouts
    (spx-nps1, cpx-nps1) are handed to two claims (no counter makes them exclusive), none of a reserved GPU; the
    ninth waits with the reserved GPUs' layouts free."""
    ns = ap.training
    for i in range(8):
        ap.kube.create(new_claim(f"t{i}", ns, exactly(DEVICES.shared_class_name)))
        ap.kube.create(new_claim_pod(f"t{i}", ns, claim_name=f"t{i}"))
    got = [d for i in range(8) for d in allocated(ap, ns, f"t{i}").devices]
    assert {d.pci for d in got} <= SHARED, [str(d) for d in got]
    assert all(d.name.endswith("-nps1") for d in got), [str(d) for d in got]
    per_gpu = Counter((d.node, d.pci) for d in got)
    assert sorted(per_gpu.values()) == [2] * 4, per_gpu
    ap.kube.create(new_claim("t8", ns, exactly(DEVICES.shared_class_name)))
    ap.kube.create(new_claim_pod("t8", ns, claim_name="t8"))
    never_scheduled(ap, ns, "t8")


def test_inference_gets_reserved_gpus_and_training_cannot_reach_them(ap: Split) -> None:
    ap.kube.create(new_claim("i0", ap.inference, exactly(DEVICES.reserved_class_name, count=2)))
    ap.kube.create(new_claim_pod("i0", ap.inference, claim_name="i0"))
    alloc = allocated(ap, ap.inference, "i0")
    assert {d.pci for d in alloc.devices} <= RESERVED, [str(d) for d in alloc.devices]
    with pytest.raises(ApiError) as denied:
        ap.kube.create(new_claim("aimed", ap.training, exactly(DRIVER)))
    assert denied.value.status == 403 and CLAIMS_POLICY in denied.value.message, denied.value.message


def test_release_gives_every_layout_back(ap: Split) -> None:
    released = pool(ap.plane, "release", "--devices", "--all")
    assert "After release: released" in released.stdout, released.stdout
