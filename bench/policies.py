"""The policy the benchmarks run with: the shipped defaults plus namespace rules.

Without a cluster connection namespace labels are unknown, so inference namespaces are matched by
name (``inference-*``). ``policy_text(rules)`` pads the rule list to ``rules`` entries with rules
that never match the benchmark namespaces (exact names, globs and label rules, in equal parts) and
puts the matching rule *last*: the worst case for a first-match-wins scan.
"""

from __future__ import annotations

from typing import Any

import yaml

from webhook.core.policy import Policy, default_policy_text, parse_policy

INFERENCE_RULE: dict[str, Any] = {"match": {"names": ["inference-*"]}, "allowedClasses": ["inference"]}


def filler_rule(index: int) -> dict[str, Any]:
    kind = index % 3
    if kind == 0:
        match: dict[str, Any] = {"names": [f"team-{index:04d}"]}
    elif kind == 1:
        match = {"names": [f"project-{index:04d}-*"]}
    else:
        match = {"labels": {"example.com/team": f"team-{index:04d}"}}
    return {"match": match, "allowedClasses": ["training"]}


def policy_document(rules: int = 1) -> dict[str, Any]:
    if rules < 1:
        raise ValueError("at least one rule (the inference rule)")
    doc: dict[str, Any] = yaml.safe_load(default_policy_text())
    doc["metadata"] = {"name": f"bench-{rules}-rules"}
    doc["spec"]["namespaces"] = [*(filler_rule(i) for i in range(rules - 1)), INFERENCE_RULE]
    return doc


def policy_text(rules: int = 1) -> str:
    return yaml.safe_dump(policy_document(rules), sort_keys=False)


def policy(rules: int = 1) -> Policy:
    return parse_policy(policy_text(rules), source=f"<bench policy, {rules} rules>")
