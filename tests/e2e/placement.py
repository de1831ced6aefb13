"""What the placement MutatingAdmissionPolicy is compared on (test_mutating_policy.py for v1,
test_e2e_map_v1beta1.py for v1beta1): the engine fixture pods, the pod as the policy sees it before
admission, the engine's result on it, and the fields the policy places."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from webhook.core import engine
from webhook.core.decision import Decision, NamespaceFacts, NodeFacts
from webhook.core.policy import Policy, PolicyError, default_policy_text, parse_policy

from .harness import OPT_OUT, RESERVED_NODES
from .kube import Kube, Obj

FIXTURES = Path(__file__).parent.parent / "fixtures" / "engine"
CLASS_LABEL = "rocm-isolation.io/class"
PLACED = ("affinity", "tolerations")
PRIORITY_FIELDS = ("priorityClassName", "priority", "preemptionPolicy", "terminationGracePeriodSeconds")
BORROW_LABEL = "rocm-isolation.io/borrow"


def policy_without_claims() -> Policy:
    """The default policy with the claim route off: the GPU pods the MAP places."""
    text = default_policy_text()
    assert "resourceClaims: true" in text
    return parse_policy(text.replace("resourceClaims: true", "resourceClaims: false"))


def fixture_pods() -> list[Any]:
    out = []
    for path in sorted(FIXTURES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("raw") or doc.get("policy", "default") != "default":
                continue
            body = doc.get("pod")
            if not isinstance(body, dict) or ((body.get("metadata") or {}).get("labels") or {}).get(OPT_OUT) == "true":
                continue
            out.append(pytest.param(body, id=f"{path.stem}:{doc['name']}"))
    return out


PODS = fixture_pods()


def as_pod(body: Obj, namespace: str) -> Obj:
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(body)}
    meta = pod.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta["name"] = "pod"
    meta["namespace"] = namespace
    pod["spec"].pop("ephemeralContainers", None)
    return pod


def before_admission(kube: Kube, pod: Obj) -> Obj:
    """The pod as MAP and webhook see it (defaulted, built-in plugins run): created with the opt-out
    label, which both skip; the label and any node name taken out and put back."""
    body = copy.deepcopy(pod)
    if not isinstance(body["metadata"].get("labels"), dict):
        body["metadata"]["labels"] = {}
    body["metadata"]["labels"][OPT_OUT] = "true"
    node_name = body["spec"].pop("nodeName", None)
    result = kube.create(body, dry_run=True)
    result["metadata"]["labels"].pop(OPT_OUT)
    if node_name:
        result["spec"]["nodeName"] = node_name
    return result


def engine_result(pod: Obj, labels: dict[str, str], policy: Policy) -> Obj:
    namespace = pod["metadata"]["namespace"]
    facts = NamespaceFacts(namespace, {**labels, "kubernetes.io/metadata.name": namespace})
    nodes = NodeFacts(frozenset(RESERVED_NODES))

    def decide(facts: NamespaceFacts) -> Decision:
        return engine.decide(operation="CREATE", pod=copy.deepcopy(pod), namespace=facts, nodes=nodes, policy=policy)

    decision = decide(facts)
    if not decision.allowed:  # denied in enforce mode: what it places is what warn mode patches
        decision = decide(NamespaceFacts(namespace, {**facts.labels, "rocm-isolation.io/mode": "warn"}))  # type: ignore[dict-item]
    return jsonpatch.apply_patch(pod, list(decision.patch)) if decision.patch else copy.deepcopy(pod)


def placed(pod: Obj) -> dict[str, Any]:
    """What the MAP takes over: affinity, tolerations, the class annotation, and its entries of the
    mutations annotation (recorded exactly when it changed the affinity or the tolerations)."""
    annotations = pod["metadata"].get("annotations") or {}
    recorded = (annotations.get(engine.MUTATIONS_ANNOTATION) or "").split(",")
    return {
        **{field: pod["spec"].get(field) for field in PLACED},
        "class": annotations.get(engine.CLASS_ANNOTATION),
        "recorded": [entry for entry in recorded if entry in ("node-affinity", "tolerations")],
        # Lending: the priority a borrower (or an inference pod raised above borrowers) gets, and the
        # borrow label (the engine's and the MAP's record that the pod borrows).
        **{field: pod["spec"].get(field) for field in PRIORITY_FIELDS},
        "borrow": (pod["metadata"].get("labels") or {}).get(BORROW_LABEL),
    }


# --- every policy fixture (tests/fixtures/policies) ----------------------------------------------

POLICY_FIXTURES = Path(__file__).parent.parent / "fixtures" / "policies"
FIXTURE_LABEL = "e2e.rocm-isolation.io/map-fixture"


def accepted_policy_fixtures() -> list[tuple[str, str]]:
    """(name, text) of every policy fixture the renderer accepts (the bad-* ones are refused)."""
    out = []
    for path in sorted(POLICY_FIXTURES.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        try:
            parse_policy(text, source=str(path))
        except PolicyError:
            continue
        out.append((path.stem, text))
    return out


def claims_off(text: str) -> Policy:
    """The policy with the DRA claim route switched off: what the MAP places (CEL cannot read a claim)."""
    document = yaml.safe_load(text)
    scope = document["spec"].setdefault("scope", {}) or {}
    document["spec"]["scope"] = scope
    scope.setdefault("routes", {})["resourceClaims"] = False
    return parse_policy(yaml.safe_dump(document))


def every_fixture_pod() -> list[Obj]:
    """Every engine fixture pod that a CREATE sends (whatever policy its case uses: a pod is a pod), once."""
    out: list[Obj] = []
    seen: set[str] = set()
    for path in sorted(FIXTURES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("raw") or doc.get("operation", "CREATE") != "CREATE":
                continue
            body = doc.get("pod")
            if not isinstance(body, dict) or ((body.get("metadata") or {}).get("labels") or {}).get(OPT_OUT) == "true":
                continue
            key = json.dumps(body, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(body)
    return out


def _instance(glob: str, tag: str) -> str:
    """A namespace name matching a namespace rule's glob (``*`` -> the fixture's tag, ``?`` -> q)."""
    name = re.sub(r"\[!?([^]])[^]]*\]", r"\1", glob)
    return name.replace("*", tag).replace("?", "q")


def fixture_namespaces(policy: Policy, tag: str) -> dict[str, dict[str, str]]:
    """The namespaces a policy fixture is compared in (name -> labels): one per class (its class label),
    one unlabelled (the default class), one per name of each namespace rule (with the rule's labels), one in
    audit mode and, for a policy whose mode is audit, one in enforce mode."""
    spec = policy.spec
    class_key, mode_key = spec.labels.namespace_class, spec.labels.namespace_mode
    out: dict[str, dict[str, str]] = {f"{tag}-{name}": {class_key: name} for name in spec.classes}
    out[f"{tag}-unlabelled"] = {}
    for index, rule in enumerate(spec.namespaces):
        for name in [_instance(name, tag) for name in rule.match.names] or [f"{tag}-rule{index}"]:
            out.setdefault(name, dict(rule.match.labels))
    placed_class = next((n for n, c in spec.classes.items() if c.placement == "reserved"), next(iter(spec.classes)))
    out[f"{tag}-audit"] = {class_key: placed_class, mode_key: "audit"}
    lending = spec.lending
    if lending.enabled:
        # One namespace per unreserved class that may borrow (the lending label).
        for name, cls in spec.classes.items():
            if cls.placement == "unreserved":
                out[f"{tag}-lending-{name}"] = {class_key: name, lending.namespaces.label_key: "allowed"}
    if spec.mode == "audit":
        out[f"{tag}-enforce"] = {class_key: placed_class, mode_key: "enforce"}
    excluded = set(spec.excluded_namespaces)
    return {name: {**labels, FIXTURE_LABEL: tag} for name, labels in out.items() if name not in excluded}
