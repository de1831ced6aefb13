"""The rendered webhook configuration against the Kubernetes "Admission Webhook Good Practices"
(kubernetes.io/docs/concepts/cluster-administration/admission-webhooks-good-practices), one test per
practice, for every overlay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from webhook.deploy import render
from webhook.service import certs

SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


@pytest.fixture(scope="module", params=render.OVERLAYS)
def resources(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    ca = None
    if request.param == "self-signed":
        out: Path = tmp_path_factory.mktemp("certs")
        certs.write_certificates(out, dns_names=certs.service_dns_names())
        ca = render.read_ca_bundle(out / certs.CA_CERT)
    return render.render(overlay=request.param, ca_bundle=ca)


def find(resources: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(r for r in resources if r["kind"] == kind and (name is None or r["metadata"]["name"] == name))


@pytest.fixture
def hook(resources: list[dict[str, Any]]) -> dict[str, Any]:
    webhooks = find(resources, "MutatingWebhookConfiguration")["webhooks"]
    # Consolidate: one call per object. Each resource is matched by exactly one webhook of ours.
    matched = [resource for w in webhooks for rule in w["rules"] for resource in rule["resources"]]
    assert len(matched) == len(set(matched)), matched
    result: dict[str, Any] = next(w for w in webhooks if w["name"] == render.POD_WEBHOOK)
    return result


@pytest.fixture
def claim_hook(resources: list[dict[str, Any]]) -> dict[str, Any]:
    webhooks = find(resources, "MutatingWebhookConfiguration")["webhooks"]
    result: dict[str, Any] = next(w for w in webhooks if w["name"] == render.CLAIM_WEBHOOK)
    return result


def test_the_claims_webhook_follows_the_same_practices(hook: dict[str, Any], claim_hook: dict[str, Any]) -> None:
    # Small timeout, no side effects, v1 reviews, fail open (the backstop VAPs hold the line), the same
    # excluded namespaces; CREATE only (a claim's spec is immutable); v1 with Equivalent matching.
    for key in ("timeoutSeconds", "sideEffects", "admissionReviewVersions", "failurePolicy", "matchPolicy"):
        assert claim_hook[key] == hook[key], key
    assert excluded_names(claim_hook) == excluded_names(hook)
    assert claim_hook["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "scope": "Namespaced",
        }
    ]
    # The scheduler's claims for DRA extended resources are never sent (they are made after allocation).
    [condition] = claim_hook["matchConditions"]
    assert "resource.kubernetes.io/extended-resource-claim" in condition["expression"]
    assert claim_hook["clientConfig"].get("caBundle") == hook["clientConfig"].get("caBundle")


def excluded_names(hook: dict[str, Any]) -> set[str]:
    expressions = hook["namespaceSelector"]["matchExpressions"]
    return {
        value
        for e in expressions
        if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
        for value in e["values"]
    }


def test_set_a_small_timeout(hook: dict[str, Any]) -> None:
    # Mutating webhooks run in sequence and share the request's 34 s budget; the default is 10 s.
    assert 1 <= hook["timeoutSeconds"] <= 3


def test_declare_no_side_effects(hook: dict[str, Any]) -> None:
    assert hook["sideEffects"] == "None"


def test_use_admission_review_v1(hook: dict[str, Any]) -> None:
    assert hook["admissionReviewVersions"] == ["v1"]


def test_fail_open_and_validate_the_final_state(resources: list[dict[str, Any]], hook: dict[str, Any]) -> None:
    assert hook["failurePolicy"] == "Ignore"
    policy = find(resources, "ValidatingAdmissionPolicy", render.RESERVED_NODES_POLICY)
    assert policy["spec"]["failurePolicy"] == "Fail"
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["resources"] == ["pods"] and set(rule["operations"]) == {"CREATE", "UPDATE"}
    bindings = [
        r
        for r in resources
        if r["kind"] == "ValidatingAdmissionPolicyBinding" and r["spec"]["policyName"] == render.RESERVED_NODES_POLICY
    ]
    assert any("Deny" in b["spec"]["validationActions"] for b in bindings)


def test_avoid_system_namespaces(hook: dict[str, Any]) -> None:
    assert set(SYSTEM_NAMESPACES) <= excluded_names(hook)


def test_avoid_self_mutation_deadlocks(resources: list[dict[str, Any]], hook: dict[str, Any]) -> None:
    # The webhook's own pods must be admitted while the webhook is down.
    deployment = find(resources, "Deployment", render.APP_NAME)
    assert deployment["metadata"]["namespace"] in excluded_names(hook)
    assert hook["clientConfig"]["service"]["namespace"] in excluded_names(hook)


def test_limit_the_scope_with_match_conditions(hook: dict[str, Any]) -> None:
    assert "gpu-pods" in [c["name"] for c in hook["matchConditions"]]


def test_match_only_what_is_needed(hook: dict[str, Any]) -> None:
    # Only pods: never node Leases, TokenReviews, SubjectAccessReviews or subresources (pods/status
    # storms during node incidents) but the one that adds containers to a running pod
    # (pods/ephemeralcontainers, UPDATE only: kubectl debug); no wildcards; no DELETE or CONNECT.
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        },
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods/ephemeralcontainers"],
            "scope": "Namespaced",
        },
    ]


def test_match_equivalent_versions(hook: dict[str, Any]) -> None:
    assert hook["matchPolicy"] == "Equivalent"


def test_do_not_mutate_mirror_pods() -> None:
    # Mirror pods reach the webhook (anyone can set the annotation, so they are checked), but the
    # engine never patches them: the kubelet owns them.
    from webhook.core.decision import NamespaceFacts, NodeFacts
    from webhook.core.engine import RULE_MIRROR, decide
    from webhook.core.policy import default_policy

    mirror = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "static-gpu-node-1", "annotations": {"kubernetes.io/config.mirror": "abc"}},
        "spec": {
            "nodeName": "gpu-node-1",
            "containers": [{"name": "c", "image": "rocm", "resources": {"limits": {"amd.com/gpu": "1"}}}],
        },
    }
    decision = decide(
        operation="CREATE",
        pod=mirror,
        namespace=NamespaceFacts("research", {}),
        nodes=NodeFacts(frozenset()),
        policy=default_policy(),
    )
    assert decision.allowed and decision.rule == RULE_MIRROR and decision.patch == ()


def test_reinvocation_for_idempotent_mutation(hook: dict[str, Any]) -> None:
    # Idempotence itself is proven by the engine's tests (a second run yields no patch).
    assert hook["reinvocationPolicy"] == "IfNeeded"


def test_opt_out_by_object_selector_never_bypasses_the_backstop(
    resources: list[dict[str, Any]], hook: dict[str, Any]
) -> None:
    assert hook["objectSelector"]["matchExpressions"][0]["key"] == render.OPT_OUT_LABEL
    for binding in resources:
        if binding["kind"] == "ValidatingAdmissionPolicyBinding":
            assert "objectSelector" not in binding["spec"].get("matchResources", {})


def test_run_several_replicas_behind_a_service(resources: list[dict[str, Any]], hook: dict[str, Any]) -> None:
    deployment = find(resources, "Deployment", render.APP_NAME)
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["replicas"] >= 2
    assert pod["spec"]["affinity"]["podAntiAffinity"]
    pdb = find(resources, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    service = find(resources, "Service", hook["clientConfig"]["service"]["name"])
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    port = next(p for p in service["spec"]["ports"] if p["port"] == hook["clientConfig"]["service"]["port"])
    container = pod["spec"]["containers"][0]
    assert port["targetPort"] in [p["name"] for p in container["ports"]]
    assert hook["clientConfig"]["service"]["path"] == "/mutate"


def test_be_scheduled_and_drained_like_a_critical_component(resources: list[dict[str, Any]]) -> None:
    pod = find(resources, "Deployment", render.APP_NAME)["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    graceful = next(int(a.split("=")[1]) for a in container["args"] if a.startswith("--graceful-timeout-seconds="))
    drain = next(float(a.split("=")[1]) for a in container["args"] if a.startswith("--drain-seconds="))
    # The kubelet kills the container at the end of the grace period: preStop, then the drain (/readyz
    # 503, reviews still served), then the reviews in flight must all fit, with a margin.
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain + graceful
    # The readiness probe sees the drain: /readyz fails for at least one probe period before shutdown.
    assert drain >= container["readinessProbe"]["periodSeconds"]
    assert container["resources"]["requests"] and container["resources"]["limits"]


def test_run_with_a_restricted_security_context(resources: list[dict[str, Any]]) -> None:
    pod = find(resources, "Deployment", render.APP_NAME)["spec"]["template"]["spec"]
    context = pod["containers"][0]["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}


def test_least_privilege_rbac(resources: list[dict[str, Any]]) -> None:
    role = find(resources, "ClusterRole", render.APP_NAME)
    read = ["get", "list", "watch"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces", "nodes"], "verbs": read},
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceclaimtemplates", "deviceclasses", "resourceslices"],
            "verbs": read,
        },
        # The audit lists the DeviceTaintRules of a device reservation by taints; the lending view watches them.
        {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"], "verbs": read},
        # The background audit's reports: listed (compared, stale ones found), server-side applied (patch, and
        # create when the apply creates one), deleted.
        {
            "apiGroups": ["wgpolicyk8s.io"],
            "resources": ["policyreports", "clusterpolicyreports"],
            "verbs": ["list", "create", "patch", "delete"],
        },
        {
            "apiGroups": ["openreports.io"],
            "resources": ["reports", "clusterreports"],
            "verbs": ["list", "create", "patch", "delete"],
        },
    ]
    # The other writes, in the webhook's own namespace: the background audit's Lease, and the one
    # ConfigMap the Lease holder keeps in step with the reserved nodes (by name, no create: it is shipped).
    roles = [r for r in resources if r["kind"] == "Role"]
    assert [(r["metadata"]["namespace"], r["rules"]) for r in roles] == [
        (
            "rocm-isolation-system",
            [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}],
        ),
        (
            "rocm-isolation-system",
            [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": ["rocm-isolation-reserved-node-names"],
                    "verbs": ["get", "patch"],
                }
            ],
        ),
    ]
    for role in roles:
        binding = find(resources, "RoleBinding", role["metadata"]["name"])
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": render.APP_NAME, "namespace": "rocm-isolation-system"}
        ]
