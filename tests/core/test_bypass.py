"""The bypass catalogue: every way a training pod could try to reach a reserved node or raise its own
priority (design.md rules 2, 3, 4, 6, 8 and "Defence in depth"), each shown denied or neutralised,
on CREATE and on UPDATE.

Each attempt is run three ways:

- through ``decide`` with the reserved node names known (the webhook watching the cluster) and
  unknown (no cluster connection);
- on the real server (``rocm-isolation-webhook serve`` over TLS, default policy, ``--no-cluster``),
  called as kube-apiserver calls it (``kube_apiserver``; nothing else is replayed);
- and whenever the pod is admitted, the patched pod is run through an independent scheduler and
  kubelet model (``test_properties.reachable``: nodeName, nodeSelector, required node affinity with
  terms ORed and expressions ANDed including ``matchFields``, taints and tolerations; it does not use
  ``webhook.core.scheduling``) over a cluster with two reserved, tainted nodes: no reserved node may be
  reachable.

Attempts that never reach the webhook (the opt-out label, a namespace relabelled by its owner) are
checked against the ValidatingAdmissionPolicy the apiserver runs instead (evaluated with the CEL
helpers of test_cel.py).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from cel_harness import OPTED_OUT_NODE_NAME, rendered, reserved_nodes_verdict
from conftest import Server, launch_server, make_pki
from kube_apiserver import ApiserverClient, apply_patch, validate_pod, verify_response
from test_properties import CLUSTER, RESERVED_NODES, reachable, term_matches

from webhook.core import engine
from webhook.core.decision import Decision, NamespaceFacts, NodeFacts
from webhook.core.policy import default_policy

POLICY = default_policy()
NAMESPACE = "research"  # no rule, no class label: training (the policy's defaultClass)
RESERVED = frozenset(node.name for node in RESERVED_NODES)
POOL = "rocm-isolation.io/pool"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
NOT_IN = {"key": POOL, "operator": "NotIn", "values": ["inference"]}
REPO = Path(__file__).parents[2]


def training_pod(**spec: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sneaky", "namespace": NAMESPACE, "labels": {"app": "sneaky"}},
        "spec": {
            "containers": [{"name": "trainer", "image": "rocm/pytorch", "resources": {"limits": {"amd.com/gpu": "8"}}}],
        },
    }
    pod["spec"].update(copy.deepcopy(spec))
    return pod


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(terms)}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def names(*nodes: str) -> dict[str, Any]:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(nodes)}]}


RESERVED_TERM = {"matchExpressions": [expr(POOL, "In", "inference")]}
TRAINING_TERM = {"matchExpressions": [expr(POOL, "In", "training")]}
TOLERATE_RESERVED = {
    "key": "rocm-isolation.io/reserved",
    "operator": "Equal",
    "value": "inference",
    "effect": "NoSchedule",
}


def _env(container: dict[str, Any], *entries: dict[str, Any]) -> None:
    container["env"] = [copy.deepcopy(e) for e in entries]


def with_containers(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    pod = training_pod()
    mutate(pod)
    return pod


@dataclass(frozen=True)
class Attempt:
    """A CREATE bypass attempt. ``deny``: the rule that must deny it with node names known (None: it
    is admitted and must be neutralised); ``deny_unknown``: the same without node names."""

    name: str
    pod: dict[str, Any]
    deny: str | None
    deny_unknown: str | None = None
    check: Callable[[dict[str, Any]], None] | None = None  # extra checks on the patched pod


def _gpu_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key in ("initContainers", "containers"):
        for container in pod["spec"].get(key) or []:
            limits = (container.get("resources") or {}).get("limits") or {}
            if any(name.startswith("amd.com/") for name in limits):
                out.append(container)
    return out


def priority_is_low(pod: dict[str, Any]) -> None:
    """Every GPU container ends with HSA_QUEUE_PRIORITY=low as a plain value, in every entry of that
    name (explicit ``env`` wins over ``envFrom`` in Kubernetes; the kubelet takes the last duplicate)."""
    containers = _gpu_containers(pod)
    assert containers
    for container in containers:
        entries = [e for e in container.get("env") or [] if e["name"] == "HSA_QUEUE_PRIORITY"]
        assert entries, container
        assert all(e == {"name": "HSA_QUEUE_PRIORITY", "value": "low"} for e in entries), entries


def class_is_training(pod: dict[str, Any]) -> None:
    assert pod["metadata"]["annotations"]["rocm-isolation.io/class"] == "training"


def every_term_has_not_in(pod: dict[str, Any]) -> None:
    """Every term of the required affinity excludes the reserved nodes by itself: it carries the
    NotIn, or already selects another value of the reserved label (``In [training]``); an empty
    term matches nothing. Checked per term with the independent model."""
    terms = pod["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert terms
    for term in terms:
        assert not any(term_matches(term, node) for node in RESERVED_NODES), term
        if term.get("matchExpressions") or term.get("matchFields"):
            assert NOT_IN in term["matchExpressions"] or any(
                e["key"] == POOL and e["operator"] == "In" and "inference" not in e["values"]
                for e in term["matchExpressions"]
            ), term


def init_only(pod: dict[str, Any]) -> None:
    pod["spec"]["initContainers"] = [
        {"name": "warmup", "image": "rocm/pytorch", "resources": {"limits": {"amd.com/gpu": "1"}}}
    ]
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}


def partition(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["resources"] = {"limits": {"amd.com/cpx_nps4": "1"}}


def env_high(pod: dict[str, Any]) -> None:
    _env(pod["spec"]["containers"][0], {"name": "HSA_QUEUE_PRIORITY", "value": "high"})


def env_value_from(pod: dict[str, Any]) -> None:
    _env(
        pod["spec"]["containers"][0],
        {"name": "HSA_QUEUE_PRIORITY", "valueFrom": {"configMapKeyRef": {"name": "prio", "key": "level"}}},
    )


def env_from(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "has-hsa-queue-priority-high"}}]


def env_duplicates(pod: dict[str, Any]) -> None:
    _env(
        pod["spec"]["containers"][0],
        {"name": "HSA_QUEUE_PRIORITY", "value": "high"},
        {"name": "OTHER", "value": "x"},
        {"name": "HSA_QUEUE_PRIORITY", "value": "high"},
    )


def preset_annotation(pod: dict[str, Any]) -> None:
    pod["metadata"]["annotations"] = {"rocm-isolation.io/class": "inference", "rocm-isolation.io/mutations": "all"}


def class_label(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"]["rocm-isolation.io/workload-class"] = "inference"


def opt_out_label(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"]["rocm-isolation.io/ignore"] = "true"
    pod["spec"]["nodeSelector"] = {POOL: "inference"}


def dra_claim(pod: dict[str, Any]) -> None:
    """GPUs through Dynamic Resource Allocation instead of amd.com/gpu: a claim template the webhook
    cannot resolve here (no cluster facts), which counts as a GPU request."""
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "mi300x-8"}]
    for container in pod["spec"]["containers"]:
        container["resources"] = {"claims": [{"name": "gpu"}]}


def dra_pod(**spec: Any) -> dict[str, Any]:
    pod = training_pod(**spec)
    dra_claim(pod)
    return pod


CREATE_ATTEMPTS = [
    Attempt("DRA claim: nodeName of a reserved node", dra_pod(nodeName="gpu-inf-0"), engine.DENY_NODE_NAME, None),
    Attempt(
        "DRA claim: nodeSelector on the reserved label",
        dra_pod(nodeSelector={POOL: "inference"}),
        engine.DENY_NODE_SELECTOR,
        engine.DENY_NODE_SELECTOR,
    ),
    Attempt(
        "DRA claim: toleration of the reserved taint",
        dra_pod(tolerations=[TOLERATE_RESERVED]),
        engine.DENY_TOLERATION,
        engine.DENY_TOLERATION,
    ),
    Attempt(
        "DRA claim: required affinity In the reserved value",
        dra_pod(affinity=required(RESERVED_TERM)),
        engine.DENY_NODE_AFFINITY,
        engine.DENY_NODE_AFFINITY,
    ),
    Attempt("DRA claim, no placement of its own", dra_pod(), None, None),
    Attempt("nodeName of a reserved node", training_pod(nodeName="gpu-inf-0"), engine.DENY_NODE_NAME, None),
    Attempt(
        "nodeSelector on the reserved label",
        training_pod(nodeSelector={POOL: "inference"}),
        engine.DENY_NODE_SELECTOR,
        engine.DENY_NODE_SELECTOR,
    ),
    Attempt(
        "nodeSelector on the reserved label among others",
        training_pod(nodeSelector={"amd.com/gpu.device-id": "74a1", POOL: "inference"}),
        engine.DENY_NODE_SELECTOR,
        engine.DENY_NODE_SELECTOR,
    ),
    Attempt(
        "required affinity In the reserved value",
        training_pod(affinity=required(RESERVED_TERM)),
        engine.DENY_NODE_AFFINITY,
        engine.DENY_NODE_AFFINITY,
    ),
    Attempt(
        "required affinity: every term reserved (label, and matchFields names)",
        training_pod(affinity=required(RESERVED_TERM, names("gpu-inf-0", "gpu-inf-1"))),
        engine.DENY_NODE_AFFINITY,
        None,
    ),
    Attempt(
        "required affinity: matchFields names of reserved nodes",
        training_pod(affinity=required(names("gpu-inf-1"))),
        engine.DENY_NODE_AFFINITY,
        None,
    ),
    Attempt(
        "required affinity: hostname label of a reserved node",
        training_pod(affinity=required({"matchExpressions": [expr("kubernetes.io/hostname", "In", "gpu-inf-0")]})),
        None,
        None,
    ),
    Attempt(
        "required affinity: a second OR term added to widen placement",
        training_pod(affinity=required(RESERVED_TERM, TRAINING_TERM)),
        None,
        None,
        every_term_has_not_in,
    ),
    Attempt(
        "required affinity: an empty term next to a reserved one",
        training_pod(affinity=required({"matchExpressions": []}, RESERVED_TERM)),
        engine.DENY_NODE_AFFINITY,
        engine.DENY_NODE_AFFINITY,
    ),
    Attempt("required affinity: only an empty term", training_pod(affinity=required({})), None, None),
    Attempt(
        "preferred affinity to reserved nodes",
        training_pod(
            affinity={
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": RESERVED_TERM}]
                }
            }
        ),
        None,
        None,
        every_term_has_not_in,
    ),
    Attempt(
        "toleration: key Equal value",
        training_pod(tolerations=[TOLERATE_RESERVED]),
        engine.DENY_TOLERATION,
        engine.DENY_TOLERATION,
    ),
    Attempt(
        "toleration: key Exists",
        training_pod(tolerations=[{"key": "rocm-isolation.io/reserved", "operator": "Exists"}]),
        engine.DENY_TOLERATION,
        engine.DENY_TOLERATION,
    ),
    Attempt(
        "toleration: Exists, no key, no effect",
        training_pod(tolerations=[{"operator": "Exists"}]),
        engine.DENY_TOLERATION,
        engine.DENY_TOLERATION,
    ),
    Attempt(
        "toleration: Exists, no key, effect NoSchedule",
        training_pod(tolerations=[{"operator": "Exists", "effect": "NoSchedule"}]),
        engine.DENY_TOLERATION,
        engine.DENY_TOLERATION,
    ),
    Attempt(
        "toleration: key Equal value, effect empty (all effects)",
        training_pod(tolerations=[{"key": "rocm-isolation.io/reserved", "operator": "Equal", "value": "inference"}]),
        engine.DENY_TOLERATION,
        engine.DENY_TOLERATION,
    ),
    Attempt(
        "toleration + nodeSelector together",
        training_pod(tolerations=[TOLERATE_RESERVED], nodeSelector={POOL: "inference"}),
        engine.DENY_NODE_SELECTOR,
        engine.DENY_NODE_SELECTOR,
    ),
    Attempt(
        "pod label asks for inference in a training namespace",
        with_containers(class_label),
        engine.DENY_CLASS,
        engine.DENY_CLASS,
    ),
    Attempt(
        "pre-set annotation rocm-isolation.io/class: inference",
        with_containers(preset_annotation),
        None,
        None,
        class_is_training,
    ),
    Attempt("HSA_QUEUE_PRIORITY=high set by the pod", with_containers(env_high), None, None, priority_is_low),
    Attempt("HSA_QUEUE_PRIORITY via valueFrom", with_containers(env_value_from), None, None, priority_is_low),
    Attempt("HSA_QUEUE_PRIORITY via envFrom ConfigMap", with_containers(env_from), None, None, priority_is_low),
    Attempt("duplicate HSA_QUEUE_PRIORITY entries", with_containers(env_duplicates), None, None, priority_is_low),
    Attempt("GPU only in an init container", with_containers(init_only), None, None, priority_is_low),
    Attempt("GPU via a partition resource amd.com/cpx_nps4", with_containers(partition), None, None, priority_is_low),
    Attempt(
        "opt-out label with a reserved nodeSelector (if called)",
        with_containers(opt_out_label),
        engine.DENY_NODE_SELECTOR,
        engine.DENY_NODE_SELECTOR,
    ),
]
IDS = [a.name for a in CREATE_ATTEMPTS]


def decide(pod: dict[str, Any], *, known: bool, operation: str = "CREATE", old: Any = None) -> Decision:
    before = copy.deepcopy(pod)
    decision = engine.decide(
        operation=operation,
        pod=pod,
        old_pod=old,
        namespace=NamespaceFacts(NAMESPACE, {} if known else None),
        nodes=NodeFacts(RESERVED if known else None),
        policy=POLICY,
    )
    assert pod == before
    return decision


def assert_unreachable(pod: dict[str, Any]) -> None:
    """The independent model: the pod can be placed on no reserved node."""
    reach = set(reachable(pod, CLUSTER))
    assert not reach & RESERVED, f"reaches reserved nodes {sorted(reach & RESERVED)}"


def check_admitted(attempt: Attempt, patched: dict[str, Any]) -> None:
    assert_unreachable(patched)
    class_is_training(patched)
    every_term_has_not_in(patched)
    if attempt.check is not None:
        attempt.check(patched)


@pytest.mark.parametrize("known", [True, False], ids=["nodes known", "nodes unknown"])
@pytest.mark.parametrize("attempt", CREATE_ATTEMPTS, ids=IDS)
def test_create_attempt_is_denied_or_neutralised(attempt: Attempt, known: bool) -> None:
    decision = decide(attempt.pod, known=known)
    expected = attempt.deny if known else attempt.deny_unknown
    if expected is not None:
        assert decision.allowed is False, decision
        assert decision.rule == expected, decision
        assert decision.code == 403 and not decision.patch
        assert "rocm-isolation.io/class=inference" in decision.message  # says what to do
        return
    assert decision.allowed is True, decision.message
    patched: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(attempt.pod), list(decision.patch))
    check_admitted(attempt, patched)
    # Reinvocation on our own output: nothing left to undo or add.
    assert decide(patched, known=known).patch == ()


def test_the_model_sees_the_attempts_as_real_threats() -> None:
    """Without the webhook, the admitted-and-neutralised attempts do reach a reserved node in the
    model (so the assertion above is not vacuous), apart from those that only touch env/annotations."""
    threatening = [a for a in CREATE_ATTEMPTS if a.deny is None and a.check not in (priority_is_low, class_is_training)]
    for attempt in threatening:
        if attempt.name == "required affinity: only an empty term":
            assert reachable(attempt.pod, CLUSTER) == []  # an empty term matches no node at all
            continue
        pod = copy.deepcopy(attempt.pod)
        pod["spec"].setdefault("tolerations", []).append(TOLERATE_RESERVED)  # as if the taint were missing
        assert set(reachable(pod, CLUSTER)) & RESERVED, attempt.name


# ---------------------------------------------------------------------------------------------
# UPDATE: only checked, never patched; what an update adds is denied
# ---------------------------------------------------------------------------------------------


def admitted(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as stored after CREATE went through the webhook."""
    decision = decide(pod, known=True)
    assert decision.allowed
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(pod), list(decision.patch))
    return result


def gated(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    return pod


def add(path: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(pod: dict[str, Any]) -> dict[str, Any]:
        new = copy.deepcopy(pod)
        jsonpatch.apply_patch(new, [{"op": "add", "path": path, "value": value}], in_place=True)
        return new

    return change


def add_toleration(toleration: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(pod: dict[str, Any]) -> dict[str, Any]:
        new = copy.deepcopy(pod)
        new["spec"].setdefault("tolerations", []).append(copy.deepcopy(toleration))
        return new

    return change


def narrow_first_term(pod: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(pod)
    new["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][0]["matchExpressions"].append(
        expr(POOL, "In", "inference")
    )
    return new


UPDATE_ATTEMPTS: list[tuple[str, dict[str, Any], Callable[[dict[str, Any]], dict[str, Any]], str]] = [
    (
        "add a toleration of the reserved taint",
        admitted(training_pod()),
        add_toleration(TOLERATE_RESERVED),
        engine.DENY_TOLERATION,
    ),
    (
        "add an Exists-everything toleration",
        admitted(training_pod()),
        add_toleration({"operator": "Exists"}),
        engine.DENY_TOLERATION,
    ),
    (
        "add a reserved toleration next to an existing one",
        admitted(training_pod(tolerations=[{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])),
        add_toleration({"key": "rocm-isolation.io/reserved", "operator": "Exists"}),
        engine.DENY_TOLERATION,
    ),
    (
        "gated pod: add the reserved nodeSelector",
        admitted(gated(training_pod())),
        add("/spec/nodeSelector", {POOL: "inference"}),
        engine.DENY_NODE_SELECTOR,
    ),
    (
        "gated pod: narrow the affinity to reserved nodes",
        admitted(gated(training_pod())),
        narrow_first_term,
        engine.DENY_NODE_AFFINITY,
    ),
    (
        "add the inference class label",
        admitted(training_pod()),
        add("/metadata/labels/rocm-isolation.io~1workload-class", "inference"),
        engine.DENY_CLASS,
    ),
]


@pytest.mark.parametrize("known", [True, False], ids=["nodes known", "nodes unknown"])
@pytest.mark.parametrize(("name", "old", "change", "rule"), UPDATE_ATTEMPTS, ids=[u[0] for u in UPDATE_ATTEMPTS])
def test_update_attempt_is_denied(
    name: str, old: dict[str, Any], change: Callable[[dict[str, Any]], dict[str, Any]], rule: str, known: bool
) -> None:
    new = change(old)
    decision = decide(new, known=known, operation="UPDATE", old=old)
    assert decision.allowed is False, decision
    assert decision.rule == rule
    assert not decision.patch


def test_update_neutralised_even_where_not_denied() -> None:
    """Whatever an update adds to scheduling, the NotIn added at CREATE is still ANDed into every
    term (the apiserver lets a gated pod only narrow its affinity), so the model finds no way onto a
    reserved node for any of the updated pods above."""
    for _, old, change, _ in UPDATE_ATTEMPTS:
        assert_unreachable(change(old))


def test_update_does_not_patch_and_keeps_what_create_added() -> None:
    old = admitted(training_pod())
    decision = decide(copy.deepcopy(old), known=True, operation="UPDATE", old=old)
    assert decision.allowed and decision.patch == ()


# ---------------------------------------------------------------------------------------------
# On the real server (default policy, no cluster: node names unknown)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("bypass")
    pki = make_pki(workdir / "certs")
    server = launch_server(workdir, cert_dir=pki.dir, ca_file=pki.ca_file)
    yield server
    server.stop()


_UIDS = itertools.count()


def review_for(pod: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"bypass-{operation}-{next(_UIDS)}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NAMESPACE,
            "name": pod["metadata"]["name"],
            "operation": operation,
            "userInfo": {"username": "mallory"},
            "object": pod,
            "oldObject": old,
            "dryRun": False,
        },
    }


def test_create_attempts_on_the_real_server(server: Server) -> None:
    with ApiserverClient(server.port, server.ca_file) as client:
        for attempt in CREATE_ATTEMPTS:
            review = review_for(copy.deepcopy(attempt.pod))
            code, reply = client.post_review(review)
            assert code == 200, attempt.name
            response = verify_response(review, reply)
            if attempt.deny_unknown is not None:
                assert response["allowed"] is False, attempt.name
                assert response["status"]["code"] == 403
                assert "patch" not in response
                continue
            assert response["allowed"] is True, (attempt.name, response)
            patched = apply_patch(review["request"]["object"], response)
            validate_pod(patched)  # the apiserver would accept the patched pod
            check_admitted(attempt, patched)


def test_update_attempts_on_the_real_server(server: Server) -> None:
    with ApiserverClient(server.port, server.ca_file) as client:
        for name, old, change, _ in UPDATE_ATTEMPTS:
            review = review_for(change(old), "UPDATE", old)
            code, reply = client.post_review(review)
            assert code == 200, name
            response = verify_response(review, reply)
            assert response["allowed"] is False, name
            assert response["status"]["code"] == 403
            assert "patch" not in response


def test_pods_binding_subresource_cannot_move_an_admitted_pod_onto_a_reserved_node(server: Server) -> None:
    """pods/binding is a subresource: the webhook skips it (a Binding is not a pod spec). It cannot
    bypass anything, because the pod it binds was admitted with the NotIn requirement, and the
    kubelet re-checks required node affinity: a training pod bound to a reserved node is rejected
    by the kubelet (NodeAffinity admission) however it got its nodeName."""
    pod = training_pod()
    with ApiserverClient(server.port, server.ca_file) as client:
        review = review_for(pod)
        _, reply = client.post_review(review)
        stored = apply_patch(pod, verify_response(review, reply))
        binding = review_for({"metadata": {"name": "sneaky"}, "target": {"kind": "Node", "name": "gpu-inf-0"}})
        binding["request"]["subResource"] = "binding"
        binding["request"]["kind"] = {"group": "", "version": "v1", "kind": "Binding"}
        _, reply = client.post_review(binding)
        response = verify_response(binding, reply)
    assert response["allowed"] is True and "patch" not in response
    every_term_has_not_in(stored)
    bound = copy.deepcopy(stored)
    bound["spec"]["nodeName"] = "gpu-inf-0"
    assert reachable(bound, CLUSTER) == []  # the kubelet refuses it on gpu-inf-0 (and it is bound nowhere else)


# ---------------------------------------------------------------------------------------------
# What never reaches the webhook: the ValidatingAdmissionPolicy backstop (manifests/base)
# ---------------------------------------------------------------------------------------------


def _manifest(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((REPO / "manifests" / "base" / name).read_text()) if doc]


def test_opt_out_label_skips_only_the_webhook_and_the_policy_still_denies() -> None:
    """The webhook's objectSelector lets ``rocm-isolation.io/ignore=true`` pods skip the webhook; the
    reserved-nodes ValidatingAdmissionPolicy has no object selector, so it still denies an opted-out
    training pod that targets reserved nodes by selector, affinity or toleration."""
    (hook_config,) = _manifest("mutatingwebhookconfiguration.yaml")
    selector = hook_config["webhooks"][0]["objectSelector"]
    assert {"key": "rocm-isolation.io/ignore", "operator": "NotIn", "values": ["true"]} in selector["matchExpressions"]
    bindings = [
        d for d in _manifest("generated-reserved-nodes-policy.yaml") if d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    assert bindings and all("objectSelector" not in b["spec"]["matchResources"] for b in bindings)

    case = {"namespace": {"name": NAMESPACE, "labels": {}}}
    resources = rendered("default")
    for spec, rule in (
        ({"nodeSelector": {POOL: "inference"}}, engine.DENY_NODE_SELECTOR),
        ({"affinity": required(RESERVED_TERM)}, engine.DENY_NODE_AFFINITY),
        ({"tolerations": [{"operator": "Exists"}]}, engine.DENY_TOLERATION),
    ):
        pod = training_pod(**spec)
        pod["metadata"]["labels"]["rocm-isolation.io/ignore"] = "true"
        actions, failed, _ = reserved_nodes_verdict(resources, case, pod, "CREATE")
        assert actions == ["Deny"] and rule in failed, spec


def test_opt_out_label_with_node_name_is_denied_by_the_policy() -> None:
    """The policy cannot see node labels, and an opted-out pod never reaches the webhook (no NotIn
    added), while the kubelet does not check NoSchedule taints for a pod bound by name: so the policy
    denies any non-inference GPU pod that both opts out and sets ``spec.nodeName``. Without the
    opt-out label the webhook decides it (deny-node-name with node facts)."""
    case = {"namespace": {"name": NAMESPACE, "labels": {}}}
    pod = training_pod(nodeName="gpu-inf-0")
    pod["metadata"]["labels"]["rocm-isolation.io/ignore"] = "true"
    assert reachable(pod, CLUSTER) == ["gpu-inf-0"], "without the policy it would land there"
    actions, failed, messages = reserved_nodes_verdict(rendered("default"), case, pod, "CREATE")
    assert actions == ["Deny"] and failed == {OPTED_OUT_NODE_NAME}
    assert any("rocm-isolation.io/ignore" in message for message in messages)
    del pod["metadata"]["labels"]["rocm-isolation.io/ignore"]
    assert reserved_nodes_verdict(rendered("default"), case, pod, "CREATE")[1] == set()


def test_namespace_class_label_is_guarded_by_a_policy() -> None:
    """Relabelling one's own namespace rocm-isolation.io/class=inference, or rocm-isolation.io/mode=audit
    (which makes both the webhook and the policy binding only record), never reaches the webhook (it
    is a Namespace update): the namespace-class ValidatingAdmissionPolicy in manifests/base lets only
    the listed groups set, change or remove those labels (its CEL is evaluated in test_cel.py::
    test_namespace_class_labels_are_changed_only_by_the_listed_groups)."""
    docs = _manifest("generated-namespace-class-policy.yaml")
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert any("namespaces" in r["resources"] and "UPDATE" in r["operations"] for r in rules)
    guarded = policy["spec"]["variables"][0]["expression"]
    # The mode label too: audit or warn on a namespace turns the denials off there.
    assert "'rocm-isolation.io/class'" in guarded and "'rocm-isolation.io/mode'" in guarded
