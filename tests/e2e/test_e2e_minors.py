"""Every Kubernetes minor a user runs (issue 47): the session's control plane emulating the run's minor
(``--kube-minor`` / E2E_KUBE_MINOR, ``--emulated-version=kube=1.3x`` on all three components), as it ships or with
the MutatingAdmissionPolicy opt-in (``--map-opt-in``):

- the README's install (``manifests --overlay self-signed --ca-bundle ...`` piped to ``kubectl apply``) applies
  with no error, rendered for what the cluster serves, and says on stderr what the minor lacks; ``--kubernetes-version``
  renders the same offline; the 1.36 manifests do not apply on 1.34/1.35 (the failure the issue reports);
- admission: a training GPU pod is placed off the reserved nodes, a pod naming a reserved node is denied, a pod
  without a GPU is left alone;
- the backstop with the webhook out of the path: training kept off the reserved nodes, every other pod admitted
  (on 1.33 the device backstop's ``resource.k8s.io`` parameter kind would deny them all: reproduced with the 1.36
  policy); GPU pods placed by the apiserver only where a MutatingAdmissionPolicy is served.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
import yaml
from cluster_objects import new_pod

from webhook.deploy import render, reserved_devices

from .controlplane import MINORS, kube_minor, loopback_environment, map_opt_in
from .harness import (
    RESERVED_POLICY,
    WEBHOOK_DENIAL,
    Cluster,
    cli,
    for_this_minor,
    gpu_pod,
    placement_served,
    serves_dra,
)
from .kube import ApiError, Obj, wait_until

pytestmark = pytest.mark.minors(*MINORS)

MAP_KINDS = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
RESERVED_KEY = "rocm-isolation.io/pool"


def _minor_number() -> int:
    return int(kube_minor().split(".")[1])


def _readme_install(
    cluster: Cluster, *extra: str, dry_run: bool = True
) -> tuple[subprocess.CompletedProcess[str], str]:
    """``manifests --overlay self-signed --ca-bundle CA`` (``extra``: e.g. the operator's kubeconfig) through
    ``kubectl apply`` (a dry run, server-side as the session installed them: its objects stay as they are, and each
    object is mapped, validated and admitted by the apiserver); (kubectl's result, manifests' stderr)."""
    rendered = cli(
        "manifests",
        "--overlay",
        "self-signed",
        "--ca-bundle",
        str(cluster.webhook.ca_file),
        *extra,
        check=True,
    )
    documents = _documents(rendered.stdout)
    for document in documents:
        if document["kind"] == "MutatingWebhookConfiguration":
            # As the session installed it: envtest has no Service network (harness.render_manifests).
            for hook in document["webhooks"]:
                hook["clientConfig"].pop("service")
                hook["clientConfig"]["url"] = f"https://127.0.0.1:{cluster.webhook.port}/mutate"
    applied = cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=rocm-isolation-e2e",
        *(["--dry-run=server"] if dry_run else []),
        "-f",
        "-",
        input=yaml.safe_dump_all(documents),
        check=False,
    )
    return applied, rendered.stderr


def _documents(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_the_readme_install_applies_with_no_error_and_says_what_the_minor_lacks(cluster: Cluster) -> None:
    applied, notes = _readme_install(cluster, *for_this_minor(), "--kubeconfig", str(cluster.kubeconfig))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    minor = kube_minor()
    lines = [line for line in notes.splitlines() if line.startswith("note: ")]
    if minor == "1.36":
        assert lines == [], notes
        return
    assert all(line.startswith(f"note: {minor}: no ") for line in lines), notes
    assert any("DRA extended resources" in line for line in lines) == (minor in ("1.34", "1.35")), notes
    assert any("no DRA (resource.k8s.io not served)" in line for line in lines) == (minor == "1.33"), notes
    assert any("no MutatingAdmissionPolicy" in line for line in lines) == (not placement_served()), notes
    # What was installed (the session's manifests, rendered the same way) holds no kind the minor lacks.
    kinds = {d["kind"] for d in cluster.manifests}
    assert bool(kinds & set(MAP_KINDS)) == placement_served(), kinds
    device_policies = {d["metadata"]["name"] for d in cluster.manifests} & set(reserved_devices.POLICY_NAMES)
    assert bool(device_policies) == serves_dra(), device_policies


def test_the_136_manifests_do_not_apply_on_an_older_minor_without_the_opt_in(cluster: Cluster) -> None:
    """What issue 47 reports: the manifests of 1.36 (``--kubernetes-version 1.36``: what ``manifests`` rendered
    before it read the cluster) exit 1 on a stock 1.34/1.35, naming the MutatingAdmissionPolicy kind."""
    applied, _ = _readme_install(cluster, "--kubernetes-version", "1.36")
    if placement_served() and _minor_number() >= 36:
        assert applied.returncode == 0, applied.stderr
        return
    if map_opt_in():
        pytest.skip("the emulating apiserver with the opt-in also serves v1 (controlplane.minor_options)")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert 'no matches for kind "MutatingAdmissionPolicy" in version "admissionregistration.k8s.io/v1"' in (
        applied.stderr
    ), applied.stderr


def test_rendering_offline_for_the_minor_is_what_reading_the_cluster_renders(cluster: Cluster) -> None:
    common = ["manifests", "--overlay", "self-signed", "--ca-bundle", str(cluster.webhook.ca_file), *for_this_minor()]
    read = cli(*common, "--kubeconfig", str(cluster.kubeconfig), check=True)
    offline = cli(*common, "--kubernetes-version", kube_minor(), check=True)
    assert _documents(offline.stdout) == _documents(read.stdout)
    assert offline.stderr == read.stderr
    assert f"--kubernetes-version {kube_minor()}" in offline.stdout.splitlines()[0]


def test_admission_places_training_denies_reserved_nodes_and_leaves_other_pods_alone(
    cluster: Cluster, namespace: Callable[..., str]
) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    placed = cluster.kube.create(gpu_pod("trainer", ns), dry_run=True)
    terms = placed["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert all(
        {"key": RESERVED_KEY, "operator": "NotIn", "values": ["inference"]} in term["matchExpressions"]
        for term in terms["nodeSelectorTerms"]
    ), terms
    with pytest.raises(ApiError) as denied:
        cluster.kube.create(gpu_pod("pinned", ns, node_name=cluster.reserved[0]), dry_run=True)
    assert WEBHOOK_DENIAL in denied.value.message, denied.value.message
    cpu = cluster.kube.create(new_pod("cpu", ns, {"cpu": "1"}), dry_run=True)
    assert "affinity" not in cpu["spec"], cpu["spec"]


def test_the_backstop_keeps_training_off_reserved_nodes_and_admits_every_other_pod_with_the_webhook_down(
    cluster: Cluster, namespace: Callable[..., str]
) -> None:
    training = namespace("training", labels={"rocm-isolation.io/class": "training"})
    inference = namespace("inference", labels={"rocm-isolation.io/class": "inference"})
    with cluster.without_webhook_configuration():
        reviews = cluster.webhook_reviews()
        for pod in (
            gpu_pod("pinned", training, node_name=cluster.reserved[0]),  # the names policy
            gpu_pod("selector", training, nodeSelector={RESERVED_KEY: "inference"}),  # the label policy
        ):
            with pytest.raises(ApiError) as denied:
                cluster.kube.create(pod, dry_run=True)
            # rocm-isolation-reserved-nodes or rocm-isolation-reserved-node-names
            assert f"ValidatingAdmissionPolicy '{RESERVED_POLICY[:-1]}" in denied.value.message, denied.value.message
        # Every other pod of the bound namespaces is admitted: no policy fails to be configured.
        for pod in (
            new_pod("cpu", training, {"cpu": "1"}),
            new_pod("cpu", inference, {"cpu": "1"}),
            gpu_pod("trainer", training),
            gpu_pod("server", inference),
        ):
            admitted = cluster.kube.create(pod, dry_run=True)
            gpu = "amd.com/gpu" in str(pod["spec"])
            # Placed in the apiserver only where a MutatingAdmissionPolicy is served.
            assert ("affinity" in admitted["spec"]) == (gpu and placement_served()), (pod["metadata"], admitted)
        assert cluster.webhook_reviews() == reviews


@pytest.mark.skipif(kube_minor() != "1.33", reason="1.33 only: the minor that serves no resource.k8s.io")
def test_on_1_33_the_136_device_backstop_would_deny_every_pod(cluster: Cluster, namespace: Callable[..., str]) -> None:
    """The failure issue 47 reports, reproduced with one namespace bound: the 1.36 device backstop's pods policy (its
    ``paramKind`` a resource.k8s.io DeviceClass) cannot be configured on 1.33 and, failing closed, denies a CPU pod;
    what ``manifests`` renders for 1.33 leaves the policy out."""
    ns = namespace(labels={"e2e-device-backstop": "bound"})
    rendered = render.render(overlay="self-signed", ca_bundle=cluster.webhook.ca_file.read_bytes())
    policy = next(
        d
        for d in rendered
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == reserved_devices.PODS_POLICY
    )
    policy = {**policy, "metadata": {"name": "e2e-133-device-pods"}}
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "e2e-133-device-pods"},
        "spec": {
            "policyName": "e2e-133-device-pods",
            "validationActions": ["Deny"],
            "paramRef": {"name": "amd-gpu-reserved", "parameterNotFoundAction": "Allow"},
            "matchResources": {"namespaceSelector": {"matchLabels": {"e2e-device-backstop": "bound"}}},
        },
    }
    cluster.kube.create(policy)
    cluster.kube.create(binding)
    try:
        messages: list[str] = []

        def cpu_pod_denied() -> bool:
            try:
                cluster.kube.create(new_pod("cpu", ns, {"cpu": "1"}), dry_run=True)
            except ApiError as err:
                messages.append(err.message)
                return True
            return False

        wait_until(cpu_pod_denied, timeout=30, what="the unconfigurable policy to deny a CPU pod")
        assert "paramKind" in messages[-1], messages[-1]
    finally:
        cluster.kube.delete("ValidatingAdmissionPolicyBinding", "e2e-133-device-pods")
        cluster.kube.delete("ValidatingAdmissionPolicy", "e2e-133-device-pods")
    assert reserved_devices.PODS_POLICY not in {d["metadata"]["name"] for d in cluster.manifests}


def test_kubectl_of_this_run_talks_to_the_emulated_minor(cluster: Cluster) -> None:
    """The harness: discovery tells the minor (``/version`` names the binary under emulation)."""
    result = subprocess.run(
        [cluster.plane.binary("kubectl"), "--kubeconfig", str(cluster.kubeconfig), "api-versions"],
        env=loopback_environment(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    versions = set(result.stdout.split())
    assert ("resource.k8s.io/v1" in versions) == serves_dra(), versions
    assert cluster.plane.emulated_version == (None if kube_minor() == "1.36" else kube_minor())
