"""The placement MutatingAdmissionPolicy as ``manifests --mutating-admission-policy v1beta1`` renders it
(for Kubernetes 1.35 with the opt-in), on a real kube-apiserver serving admissionregistration.k8s.io/v1beta1
(``--runtime-config=admissionregistration.k8s.io/v1beta1=true``, the flag docs/operations.md gives for
those versions; v1.36 still serves the beta version when it is turned on):

- the policy and its binding are created without warnings (the apiserver compiles every expression);
- alone (no webhook, no backstop) it gives every engine fixture pod, in a namespace of each class, the
  affinity, tolerations and class annotation the engine gives it: what test_mutating_policy.py proves
  for the v1 policy.

Its own control plane (the session's does not serve the beta version), started once for the module: a 1.36 one,
or, on a run of 1.34 or 1.35 (``--kube-minor``), one emulating that minor with the documented opt-in
(``controlplane.minor_options``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import jsonpatch
import pytest
from cluster_objects import new_namespace

from webhook.core.policy import default_policy
from webhook.deploy import mutating_policy, render

from .controlplane import (
    ASSETS_ENV,
    LOOPBACK,
    MAP_OPT_IN_MINORS,
    ControlPlane,
    kube_minor,
    loopback_only,
    minor_options,
)
from .harness import cli, gpu_pod
from .kube import ApiError, Kube, Obj, wait_until
from .placement import CLASS_LABEL, PODS, as_pod, before_admission, engine_result, placed, policy_without_claims

BETA = "admissionregistration.k8s.io/v1beta1"
KINDS = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")

pytestmark = pytest.mark.minors("1.35")  # the opt-in of 1.35 (issue 47); 1.34's refusal below


@pytest.fixture(scope="module")
def beta_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    loopback_only()
    options = (
        minor_options(opt_in=True)
        if kube_minor() in MAP_OPT_IN_MINORS
        else {"apiserver_args": (f"--runtime-config={BETA}=true",)}
    )
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), tmp_path_factory.mktemp("controlplane-v1beta1"), **options)
    try:
        plane.start()
        yield Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def documents() -> list[Obj]:
    """The policy and its binding as ``manifests --mutating-admission-policy v1beta1`` renders them."""
    rendered = [d for d in render.render(mutating_admission_policy="v1beta1") if d["kind"] in KINDS]
    assert [(d["apiVersion"], d["kind"]) for d in rendered] == [(BETA, kind) for kind in KINDS]
    return rendered


@pytest.fixture(scope="module")
def installed(beta_apiserver: Kube, documents: list[Obj]) -> tuple[dict[str, str], list[str]]:
    """The v1beta1 policy and binding created (with the warnings the apiserver sent), a namespace per
    class, and the policy in effect: a probe pod in the inference namespace gets the reserved toleration."""
    kube = beta_apiserver
    warnings: list[str] = []
    for document in documents:
        kube.create(document)
        warnings.extend(kube.last_warnings)
    namespaces = {}
    for class_name in default_policy().spec.classes:
        namespaces[class_name] = f"beta-{class_name}"
        kube.create(new_namespace(namespaces[class_name], {CLASS_LABEL: class_name}))
    probe = gpu_pod("probe", namespaces["inference"])
    reserved_key = default_policy().spec.reserved_nodes.taint.key

    def placed_by_the_policy() -> bool:
        try:
            pod = kube.create(probe, dry_run=True)  # also waits for the namespace's default ServiceAccount
        except ApiError:
            return False
        return any(t.get("key") == reserved_key for t in pod["spec"].get("tolerations") or [])

    wait_until(placed_by_the_policy, timeout=60, what="the v1beta1 placement policy to take effect")
    return namespaces, warnings


def test_the_v1beta1_policy_is_served_and_accepted_without_warnings(
    beta_apiserver: Kube, documents: list[Obj], installed: tuple[dict[str, str], list[str]]
) -> None:
    _, warnings = installed
    assert warnings == []
    live = beta_apiserver.request("GET", f"/apis/{BETA}/mutatingadmissionpolicies/{mutating_policy.POLICY_NAME}")
    assert live["apiVersion"] == BETA
    assert live["spec"]["mutations"] == documents[0]["spec"]["mutations"]


@pytest.mark.parametrize("body", PODS)
def test_the_v1beta1_policy_alone_places_like_the_engine(
    beta_apiserver: Kube, installed: tuple[dict[str, str], list[str]], body: Obj
) -> None:
    namespaces, _ = installed
    policy = policy_without_claims()
    for class_name, namespace in namespaces.items():
        pod = as_pod(body, namespace)
        try:
            before = before_admission(beta_apiserver, pod)
        except ApiError:
            continue  # invalid as a pod: nothing to place
        expected = engine_result(before, {CLASS_LABEL: class_name}, policy)
        got = beta_apiserver.create(pod, dry_run=True)  # no backstop here: nothing may refuse it
        assert placed(got) == placed(expected), (class_name, jsonpatch.make_patch(placed(expected), placed(got)).patch)


@pytest.mark.minors("1.34")
@pytest.mark.skipif(kube_minor() != "1.34", reason="1.34 only")
def test_on_1_34_the_apiserver_refuses_the_policy_and_manifests_does_not_render_it(
    beta_apiserver: Kube, documents: list[Obj]
) -> None:
    """1.34 serves the beta API with the opt-in, but its CEL environment has no flatten(): the apiserver refuses the
    policy (``deploy/minors.NO_FLATTEN``), so ``manifests`` refuses v1beta1 for 1.34 and renders no placement
    policy when reading such a cluster."""
    with pytest.raises(ApiError) as refused:
        beta_apiserver.create(documents[0])
    assert "undeclared reference to 'flatten'" in refused.value.message, refused.value.message
    rendered = cli("manifests", "--kubernetes-version", "1.34", "--mutating-admission-policy", "v1beta1")
    assert rendered.returncode == 2, rendered.stdout + rendered.stderr
    assert "flatten()" in rendered.stderr, rendered.stderr
