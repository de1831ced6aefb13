"""What each Kubernetes minor serves that the product's manifests and ``pool`` writes depend on (issue 47).

A stock cluster of 1.33, 1.34 or 1.35 lacks parts that 1.36 has on by default (measured on the v1.36.2 binaries
emulating each minor, KEP-4330 ``--emulated-version``; docs/operations.md's support matrix):

| | 1.33 | 1.34 | 1.35 | 1.36 |
|---|---|---|---|---|
| MutatingAdmissionPolicy (placement in the apiserver) | alpha, off | beta, off | beta, off | v1, on |
| ``resource.k8s.io/v1`` (DRA) | none | v1 | v1 | v1 |
| DRAExtendedResource (DeviceClass ``extendedResourceName``) | absent | alpha, off | alpha, off | beta, on |
| DRAPartitionableDevices (AMD AutoPartition's shared counters) | alpha, off | alpha, off | alpha, off | beta, on |

``Served`` is that row of one cluster: from ``--kubernetes-version`` (the stock defaults of that minor, plus the
documented MutatingAdmissionPolicy opt-in on 1.35), or read from the cluster (``cluster/discovery.py``: API
discovery and the apiserver's ``kubernetes_feature_enabled``; ``/version`` says v1.36 under emulation, those two
tell the truth). ``render`` leaves out what the minor cannot store or evaluate, and ``missing`` says, one line per
missing piece, what the minor lacks and what holds instead. DeviceTaintRules are read from discovery where they are
written (``pool``, ``ops/device_split.taint_rules_unusable``): no minor serves them stock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SUPPORTED = ("1.33", "1.34", "1.35", "1.36")
DEFAULT = "1.36"
# The MutatingAdmissionPolicy opt-in of 1.35 (docs/operations.md): beta API and gate turned on. 1.34 serves the beta
# API too, but its CEL environment has no lists.flatten(), which the placement policy uses: the apiserver refuses it
# (measured on v1.36.2 emulating 1.34), so 1.34 gets no placement policy.
MAP_OPT_IN_MINORS = ("1.35",)
NO_FLATTEN = (
    "1.34's CEL environment has no flatten() (the lists library), which the placement policy's JSONPatch uses: the "
    "apiserver refuses the policy"
)
MAP_OPT_IN_FLAGS = (
    "--feature-gates=MutatingAdmissionPolicy=true --runtime-config=admissionregistration.k8s.io/v1beta1=true"
)
MAP_GROUP = "admissionregistration.k8s.io"
MAP_RESOURCE = "mutatingadmissionpolicies"
DRA_GROUP_VERSION = "resource.k8s.io/v1"
DRA_RESOURCE = "deviceclasses"
EXTENDED_RESOURCE_GATE = "DRAExtendedResource"
PARTITIONABLE_GATE = "DRAPartitionableDevices"
# The discovery documents ``from_cluster`` reads.
DISCOVERED = (f"{MAP_GROUP}/v1", f"{MAP_GROUP}/v1beta1", DRA_GROUP_VERSION)


class MinorError(ValueError):
    """A Kubernetes version this product does not render for, or an option the minor cannot take."""


@dataclass(frozen=True)
class Served:
    """What one cluster serves of what the product uses."""

    minor: str  # "1.35": given, or the newest minor whose stock APIs match discovery
    placement_policy: tuple[str, ...]  # MutatingAdmissionPolicy versions served, newest first ((): none)
    dra: bool  # resource.k8s.io/v1 DeviceClasses, ResourceClaims (DynamicResourceAllocation)
    extended_resources: bool  # DRAExtendedResource: the apiserver keeps a DeviceClass's extendedResourceName
    partitionable_devices: bool  # DRAPartitionableDevices: slices' shared counters (AMD AutoPartition)
    source: str  # how it was learnt, for the messages

    @property
    def complete(self) -> bool:
        """Everything the 1.36 manifests use is there (rendering changes nothing)."""
        return "v1" in self.placement_policy and self.dra and self.extended_resources and self.partitionable_devices


def parse_minor(text: str) -> str:
    """``1.35``, ``v1.35``, ``1.35.2`` -> ``1.35``; refused outside ``SUPPORTED`` (1.37 and later: 1.36's manifests)."""
    parts = text.strip().lstrip("v").split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        raise MinorError(f"--kubernetes-version {text!r}: give a Kubernetes minor such as 1.35") from None
    if major == 1 and minor > 36:
        return DEFAULT  # 1.37+ serves all 1.36 uses (MAP v1, DRA v1, extended resources, partitionable devices)
    found = f"{major}.{minor}"
    if found not in SUPPORTED:
        raise MinorError(
            f"--kubernetes-version {text}: Kubernetes {found} is not supported (from {SUPPORTED[0]} on: DRA, "
            "ValidatingAdmissionPolicy v1 and the apiserver's matchLabelKeys merge)"
        )
    return found


def for_minor(minor: str, *, placement_policy: str | None = None) -> Served:
    """A stock cluster of ``minor`` (``parse_minor``); ``placement_policy='v1beta1'`` on 1.35: the documented
    MutatingAdmissionPolicy opt-in is on."""
    number = int(minor.split(".")[1])
    served: tuple[str, ...] = ("v1",) if number >= 36 else ()
    if placement_policy == "v1beta1":
        if minor not in MAP_OPT_IN_MINORS:
            why = {34: NO_FLATTEN, 33: "it has MutatingAdmissionPolicy as alpha only"}.get(number, "it serves v1")
            raise MinorError(
                f"--mutating-admission-policy v1beta1 is for Kubernetes 1.35 (with {MAP_OPT_IN_FLAGS}); "
                f"on {minor} {why}"
            )
        served = ("v1beta1",)
    elif placement_policy == "v1" and number < 36:
        raise MinorError(
            f"--mutating-admission-policy v1: Kubernetes {minor} serves no admissionregistration.k8s.io/v1 "
            f"MutatingAdmissionPolicy (v1 from 1.36; 1.35: v1beta1 with {MAP_OPT_IN_FLAGS})"
        )
    return Served(
        minor=minor,
        placement_policy=served,
        dra=number >= 34,
        extended_resources=number >= 36,
        partitionable_devices=number >= 36,
        source=f"--kubernetes-version {minor}",
    )


def from_cluster(
    discovery: Mapping[str, frozenset[str] | None], gates: Mapping[str, tuple[bool, str]] | None
) -> Served | None:
    """What a cluster serves from its API discovery (``DISCOVERED``: group/version -> resources, None when not
    served) and its apiserver's feature gates (``kubernetes_feature_enabled``: name -> (on, stage); None when they
    could not be read: the stock defaults of the minor discovery points to). None when discovery does not answer
    for admissionregistration.k8s.io/v1, which every supported minor serves (ValidatingAdmissionPolicy GA in 1.30):
    nothing is known."""
    if discovery.get(f"{MAP_GROUP}/v1") is None:
        return None
    placement = tuple(v for v in ("v1", "v1beta1") if MAP_RESOURCE in (discovery.get(f"{MAP_GROUP}/{v}") or ()))
    dra = DRA_RESOURCE in (discovery.get(DRA_GROUP_VERSION) or ())
    minor = _minor(placement, dra, gates)
    if minor == "1.34":
        placement = ()  # served with the opt-in, but 1.34 refuses the policy (NO_FLATTEN)
    stock = for_minor(minor)
    if gates is None:
        extended, partitionable = stock.extended_resources, stock.partitionable_devices
        source = "the cluster's API discovery (feature gates unreadable: the stock defaults of that minor)"
    else:
        extended = dra and gates.get(EXTENDED_RESOURCE_GATE, (False, ""))[0]
        partitionable = dra and gates.get(PARTITIONABLE_GATE, (False, ""))[0]
        source = "the cluster's API discovery and feature gates"
    return Served(minor, placement, dra, extended, partitionable, source)


def _minor(placement: tuple[str, ...], dra: bool, gates: Mapping[str, tuple[bool, str]] | None) -> str:
    """The minor, for the messages: by the MutatingAdmissionPolicy gate's stage (GA from 1.36, beta in 1.34 and
    1.35, alpha in 1.33: turning a gate on does not change its stage), 1.35 adding the DRADeviceTaintRules gate;
    by discovery alone when the gates are unreadable."""
    stage = gates.get("MutatingAdmissionPolicy") if gates is not None else None
    if stage is not None:
        if stage[1] == "":
            return "1.36"
        if stage[1] == "BETA":
            return "1.35" if "DRADeviceTaintRules" in (gates or {}) else "1.34"
        return "1.33"
    if "v1" in placement:
        return "1.36"
    return "1.35" if dra else "1.33"


def placement_policy_version(served: Served, requested: str | None) -> str:
    """The MutatingAdmissionPolicy version to render: ``requested`` (``--mutating-admission-policy``) when the
    cluster can take it, else the newest it serves, ``none`` when it serves none."""
    if requested is None:
        return served.placement_policy[0] if served.placement_policy else "none"
    if requested != "none" and requested not in served.placement_policy:
        opt_in = f" (turn it on with {MAP_OPT_IN_FLAGS})" if requested == "v1beta1" else ""
        raise MinorError(
            f"--mutating-admission-policy {requested}: {_who(served)} serves no "
            f"{MAP_GROUP}/{requested} MutatingAdmissionPolicy{opt_in}"
        )
    return requested


def _who(served: Served) -> str:
    return f"Kubernetes {served.minor}" if served.source.startswith("--") else f"this cluster ({served.minor})"


def missing(served: Served, placement_policy: str) -> list[str]:
    """One line per piece the minor lacks: what it is, and what holds instead."""
    lines = []
    minor = served.minor
    if placement_policy == "none" and not served.placement_policy:
        why = "beta, off" if minor in ("1.34", "1.35") else ("alpha, off" if minor == "1.33" else "not served")
        opt_in = (
            f"; 1.35 can opt in: {MAP_OPT_IN_FLAGS}, then --mutating-admission-policy v1beta1"
            if minor in MAP_OPT_IN_MINORS
            else (f" (nor with the opt-in: {NO_FLATTEN})" if minor == "1.34" else "")
        )
        lines.append(
            f"{minor}: no MutatingAdmissionPolicy ({why}): with the webhook down, GPU pods are admitted unplaced; "
            f"the taint and the backstop still keep training off reserved nodes{opt_in}"
        )
    if not served.dra:
        lines.append(
            f"{minor}: no DRA (resource.k8s.io not served): the device-level backstop policies are left out (no "
            "claim can exist); GPU pods reach GPUs through amd.com/ resources, privileged containers and the runtime's "
            "variables, which the webhook and the node backstop cover; no device-level reservation, no lending of "
            "devices (whole nodes lend)"
        )
    else:
        if not served.extended_resources:
            lines.append(
                f"{minor}: no DRA extended resources ({EXTENDED_RESOURCE_GATE} off): the apiserver drops a "
                "DeviceClass's extendedResourceName; amd.com/gpu stays the device plugin's, and pool apply "
                "--devices-per-node writes the DeviceClasses without it (claims reach the shared class)"
            )
        if not served.partitionable_devices:
            lines.append(
                f"{minor}: no partitionable devices ({PARTITIONABLE_GATE} off): the apiserver drops AMD "
                "AutoPartition's shared counters; pool apply --devices-per-node still splits by PCI bus ID, but two "
                "claims of one side can be handed two layouts of one GPU"
            )
    return lines


def lending_without_placement(
    served: Served, placement_policy: str, *, switchable: bool, enabled: bool, borrower_priority_class: str
) -> tuple[str, str] | None:
    """What lending loses on a minor rendered without the placement policy (1.33, 1.34, 1.35 as they ship): ("note",
    line) with lending on, ("warning", line) with it switched off; None with a placement policy or without a
    ``lending`` section. Measured on each minor
    (tests/e2e/test_e2e_lending_switch.py): with lending switched off while the section is kept, the lending backstop
    still admits a pod that is written at the borrowers' PriorityClass and tolerates the reserved taint, and only the
    placement policy (absent here) keeps such a pod off the reserved nodes while the webhook is down."""
    if placement_policy != "none" or not switchable:
        return None
    minor = served.minor
    if enabled:
        return (
            "note",
            f"{minor}: lending without a MutatingAdmissionPolicy: with the webhook down a pod asking to borrow is "
            "admitted unplaced (it tolerates no reserved taint: it borrows nothing), and a switch of lending is in "
            "force once the webhook has written its policy",
        )
    return (
        "warning",
        f"{minor}: lending is off but the policy keeps its lending section (enabled: false): without a "
        f"MutatingAdmissionPolicy, while the webhook is down a pod written at the borrowers' PriorityClass "
        f"({borrower_priority_class}) that tolerates the reserved taint is admitted onto the reserved nodes (below "
        "every inference pod, which preempts it); to close it, remove the lending section and apply the manifests "
        "again (the strict backstop)",
    )
