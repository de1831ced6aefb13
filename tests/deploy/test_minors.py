"""Rendering for each Kubernetes minor (issue 47, ``webhook/deploy/minors.py``): what a stock 1.33-1.36 serves, read
from ``--kubernetes-version`` or from what a cluster's discovery and feature gates say (the discovery documents and
gates below are those the v1.36.2 apiserver serves emulating each minor: tests/e2e/test_e2e_minors.py reads them
live); the manifests leave out what the minor cannot store or evaluate and say what it lacks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from webhook.core.policy import default_policy_text
from webhook.deploy import minors, render, reserved_devices

MAP_KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
ADMISSION_V1 = frozenset(
    {
        "mutatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
        "validatingwebhookconfigurations",
    }
)
DRA_V1 = frozenset({"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"})
MAP = frozenset({"mutatingadmissionpolicies", "mutatingadmissionpolicybindings"})
# What the v1.36.2 kube-apiserver answers emulating each minor (discovery; kubernetes_feature_enabled).
DISCOVERY: dict[str, dict[str, frozenset[str] | None]] = {
    "1.33": {"admissionregistration.k8s.io/v1": ADMISSION_V1, "admissionregistration.k8s.io/v1beta1": None},
    "1.34": {"admissionregistration.k8s.io/v1": ADMISSION_V1, "resource.k8s.io/v1": DRA_V1},
    "1.35": {"admissionregistration.k8s.io/v1": ADMISSION_V1, "resource.k8s.io/v1": DRA_V1},
    "1.36": {"admissionregistration.k8s.io/v1": ADMISSION_V1 | MAP, "resource.k8s.io/v1": DRA_V1},
}
GATES: dict[str, dict[str, tuple[bool, str]]] = {
    "1.33": {"MutatingAdmissionPolicy": (False, "ALPHA"), "DRAPartitionableDevices": (False, "ALPHA")},
    "1.34": {
        "MutatingAdmissionPolicy": (False, "BETA"),
        "DRAExtendedResource": (False, "ALPHA"),
        "DRAPartitionableDevices": (False, "ALPHA"),
    },
    "1.35": {
        "MutatingAdmissionPolicy": (False, "BETA"),
        "DRADeviceTaintRules": (False, "ALPHA"),
        "DRAExtendedResource": (False, "ALPHA"),
        "DRAPartitionableDevices": (False, "ALPHA"),
    },
    "1.36": {
        "MutatingAdmissionPolicy": (True, ""),
        "DRADeviceTaintRules": (False, "BETA"),
        "DRAExtendedResource": (True, "BETA"),
        "DRAPartitionableDevices": (True, "BETA"),
    },
}


def kinds_and_names(resources: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(r["kind"], r["metadata"]["name"]) for r in resources}


@pytest.mark.parametrize("minor", minors.SUPPORTED)
def test_reading_a_stock_cluster_finds_what_its_minor_serves(minor: str) -> None:
    assert minors.from_cluster(DISCOVERY[minor], GATES[minor]) == minors.Served(
        **{**minors.for_minor(minor).__dict__, "source": "the cluster's API discovery and feature gates"}
    )


def test_without_feature_gates_discovery_gives_the_minor_and_its_stock_defaults() -> None:
    served = minors.from_cluster(DISCOVERY["1.35"], None)
    assert (served.minor, served.dra, served.extended_resources, served.placement_policy) == ("1.35", True, False, ())
    assert "feature gates unreadable" in served.source
    assert minors.from_cluster(DISCOVERY["1.33"], None).minor == "1.33"
    assert minors.from_cluster(DISCOVERY["1.36"], None).complete


def test_the_map_opt_in_keeps_its_minor_and_serves_the_beta_policy() -> None:
    """1.35 with the opt-in: the gate on, still beta; v1beta1 served (the emulating apiserver serves v1 as well)."""
    discovery = {**DISCOVERY["1.35"], "admissionregistration.k8s.io/v1beta1": MAP}
    gates = {**GATES["1.35"], "MutatingAdmissionPolicy": (True, "BETA")}
    served = minors.from_cluster(discovery, gates)
    assert (served.minor, served.placement_policy) == ("1.35", ("v1beta1",))
    assert minors.placement_policy_version(served, None) == "v1beta1"
    assert not any("MutatingAdmissionPolicy" in line for line in minors.missing(served, "v1beta1"))


@pytest.mark.parametrize(
    ("text", "minor"), [("1.35", "1.35"), ("v1.34", "1.34"), ("1.33.7", "1.33"), ("1.36", "1.36"), ("1.38", "1.36")]
)
def test_a_kubernetes_version_names_a_minor(text: str, minor: str) -> None:
    assert minors.parse_minor(text) == minor


@pytest.mark.parametrize("text", ["1.32", "2.0", "latest", "1"])
def test_a_version_outside_the_supported_minors_is_refused(text: str) -> None:
    with pytest.raises(minors.MinorError, match="--kubernetes-version"):
        minors.parse_minor(text)


def test_a_placement_policy_version_the_minor_cannot_take_is_refused_with_the_opt_in() -> None:
    with pytest.raises(minors.MinorError, match=re.escape("1.35 serves no admissionregistration.k8s.io/v1")):
        minors.for_minor("1.35", placement_policy="v1")
    with pytest.raises(minors.MinorError, match=re.escape("is for Kubernetes 1.35")):
        minors.for_minor("1.33", placement_policy="v1beta1")
    with pytest.raises(minors.MinorError, match=re.escape("no flatten()")):
        minors.for_minor("1.34", placement_policy="v1beta1")
    read = minors.from_cluster(DISCOVERY["1.35"], GATES["1.35"])
    with pytest.raises(minors.MinorError, match="MutatingAdmissionPolicy=true"):
        minors.placement_policy_version(read, "v1beta1")
    assert minors.placement_policy_version(read, "none") == "none"


@pytest.mark.parametrize("minor", minors.SUPPORTED)
def test_each_minor_renders_only_what_it_serves_and_validates_against_1_37(minor: str) -> None:
    rendered = render.render(served=minors.for_minor(minor), mutating_admission_policy=None)
    kinds = {r["kind"] for r in rendered}
    assert bool(kinds & MAP_KINDS) == (minor == "1.36")
    names = {r["metadata"]["name"] for r in rendered}
    assert bool(names & set(reserved_devices.POLICY_NAMES)) == (minor != "1.33")
    # No binding is left without its policy.
    policies = {r["metadata"]["name"] for r in rendered if r["kind"] == "ValidatingAdmissionPolicy"}
    assert {r["spec"]["policyName"] for r in rendered if r["kind"] == "ValidatingAdmissionPolicyBinding"} <= policies
    for resource in rendered:
        if not resource["apiVersion"].startswith("cert-manager.io/"):
            kubernetes_validate.validate(resource, "1.37.0", strict=True)


def test_1_36_and_the_default_render_the_same_objects() -> None:
    assert render.render(served=minors.for_minor("1.36"), mutating_admission_policy=None) == render.render()


def test_the_opt_in_renders_the_beta_policy_on_1_35_and_none_on_1_34() -> None:
    rendered = render.render(
        served=minors.for_minor("1.35", placement_policy="v1beta1"), mutating_admission_policy="v1beta1"
    )
    assert {r["apiVersion"] for r in rendered if r["kind"] in MAP_KINDS} == {"admissionregistration.k8s.io/v1beta1"}
    # 1.34 serves the beta API with the opt-in but refuses the policy (no CEL flatten()): read, it gets none.
    opted_in = {**DISCOVERY["1.34"], "admissionregistration.k8s.io/v1beta1": MAP}
    served = minors.from_cluster(opted_in, {**GATES["1.34"], "MutatingAdmissionPolicy": (True, "BETA")})
    assert served is not None and (served.minor, served.placement_policy) == ("1.34", ())
    assert "no flatten()" in minors.missing(served, "none")[0]


def test_what_each_minor_lacks_is_said_once_each() -> None:
    lines = {
        minor: minors.missing(minors.for_minor(minor), "none" if minor != "1.36" else "v1")
        for minor in minors.SUPPORTED
    }
    assert lines["1.36"] == []
    assert [line.split(":")[1].strip() for line in lines["1.33"]] == [
        "no MutatingAdmissionPolicy (alpha, off)",
        "no DRA (resource.k8s.io not served)",
    ]
    for minor in ("1.34", "1.35"):
        assert [line.split(":")[1].strip().split(" (nor")[0] for line in lines[minor]] == [
            "no MutatingAdmissionPolicy (beta, off)",
            "no DRA extended resources (DRAExtendedResource off)",
            "no partitionable devices (DRAPartitionableDevices off)",
        ]
        assert "the taint and the backstop still keep training off reserved nodes" in lines[minor][0]
    assert minors.MAP_OPT_IN_FLAGS in lines["1.35"][0]
    assert minors.NO_FLATTEN in lines["1.34"][0]


# --- the command ------------------------------------------------------------------------------------


def manifests(*args: str, kubeconfig: str = "/nonexistent/kubeconfig") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    return subprocess.run(
        [sys.executable, "-m", "webhook", "manifests", *args], capture_output=True, text=True, check=False, env=env
    )


def test_without_a_version_or_a_cluster_the_1_36_manifests_are_unchanged() -> None:
    default = manifests()
    assert default.returncode == 0 and default.stderr == ""
    assert "--kubernetes-version" not in default.stdout.splitlines()[0]
    explicit = manifests("--kubernetes-version", "1.36")
    assert explicit.stderr == ""
    assert list(yaml.safe_load_all(explicit.stdout)) == list(yaml.safe_load_all(default.stdout))


def test_an_older_minor_prints_one_note_per_missing_piece_and_renders_without_it() -> None:
    result = manifests("--kubernetes-version", "1.35")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"note: {line}" for line in minors.missing(minors.for_minor("1.35"), "none")]
    assert "--kubernetes-version 1.35 --mutating-admission-policy none" in result.stdout.splitlines()[0]
    assert not {d["kind"] for d in yaml.safe_load_all(result.stdout) if d} & MAP_KINDS


def test_a_minor_refusing_the_asked_placement_policy_exits_2() -> None:
    result = manifests("--kubernetes-version", "1.35", "--mutating-admission-policy", "v1")
    assert result.returncode == 2 and result.stdout == ""
    assert "Kubernetes 1.35 serves no admissionregistration.k8s.io/v1 MutatingAdmissionPolicy" in result.stderr


def test_an_unreadable_kubeconfig_given_exits_2_naming_the_offline_option(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\n", encoding="utf-8")
    given = manifests("--kubeconfig", str(broken))
    assert given.returncode == 2 and "--kubernetes-version MINOR" in given.stderr
    # The default kubeconfig unreadable: the 1.36 manifests, and a note saying so.
    default = manifests(kubeconfig=str(broken))
    assert default.returncode == 0
    assert "rendered for Kubernetes 1.36" in default.stderr
    assert default.stdout == manifests().stdout


def test_discovery_that_does_not_answer_tells_nothing() -> None:
    """No admissionregistration.k8s.io/v1 (every supported minor serves it): not read, not taken for 1.33."""
    assert minors.from_cluster({}, None) is None
    assert minors.from_cluster({"resource.k8s.io/v1": DRA_V1}, GATES["1.36"]) is None


def _lending_policy(tmp_path: Path, *, enabled: bool) -> str:
    """The default policy with a ``lending`` section, on or switched off (``enabled: false``)."""
    document = yaml.safe_load(default_policy_text())
    document["spec"]["lending"] = {"enabled": enabled}
    path = tmp_path / f"lending-{'on' if enabled else 'off'}.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


@pytest.mark.parametrize("minor", ["1.33", "1.34", "1.35"])
def test_lending_switched_off_but_kept_warns_where_no_placement_policy_is_rendered(tmp_path: Path, minor: str) -> None:
    """Measured on each minor (test_e2e_lending_switch.py): the section kept with lending off, a pod written at the
    borrowers' PriorityClass tolerating the reserved taint is admitted while the webhook is down, without the
    placement policy: the operator is told, with the way out."""
    result = manifests("--kubernetes-version", minor, "--policy", _lending_policy(tmp_path, enabled=False))
    assert result.returncode == 0, result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if ": lending " in line]
    assert warning.startswith(f"warning: {minor}: lending is off but the policy keeps its lending section"), warning
    assert "rocm-isolation-borrower" in warning and "remove the lending section" in warning, warning


def test_lending_notes_follow_the_placement_policy_and_the_section(tmp_path: Path) -> None:
    off = _lending_policy(tmp_path, enabled=False)
    on = _lending_policy(tmp_path, enabled=True)
    quiet = {
        "1.36": manifests("--kubernetes-version", "1.36", "--policy", off),
        "1.35 opt-in": manifests(
            "--kubernetes-version", "1.35", "--mutating-admission-policy", "v1beta1", "--policy", off
        ),
        "no section": manifests("--kubernetes-version", "1.35"),
    }
    for case, result in quiet.items():
        assert result.returncode == 0 and ": lending " not in result.stderr, (case, result.stderr)
    enabled = manifests("--kubernetes-version", "1.34", "--policy", on)
    (note,) = [line for line in enabled.stderr.splitlines() if ": lending " in line]
    assert note.startswith("note: 1.34: lending without a MutatingAdmissionPolicy"), note
    assert "it borrows nothing" in note, note
