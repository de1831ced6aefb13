"""The largest pods the apiserver takes, through every admission step the product installs.

The webhook's ``matchConditions``, the placement MutatingAdmissionPolicy and the backstop
ValidatingAdmissionPolicy are CEL run by the apiserver under a cost budget (per expression and per
policy). An expression over budget is an error, and with ``failurePolicy: Fail`` an error rejects the
pod: a legitimate pod refused for its size, or (match conditions, ``failurePolicy: Ignore``) a webhook
skipped. The routes' CEL reads every variable of every container, so the worst case is a pod of many
containers with many variables: 200 containers of 100 variables each (1 MB of JSON, near etcd's
1.5 MiB object limit). Each such pod must be admitted or denied by the rules, never by the budget, with
the webhook up and with only the policies (the webhook's configuration deleted). (Measured on v1.36.2
when this was written: 250 containers of 150 variables, 2 MB, dry run, pass too.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import pytest
from cluster_objects import new_pod

from .harness import RESERVED_POLICY, WEBHOOK_DENIAL, Cluster
from .kube import ApiError, Obj

CONTAINERS, VARIABLES = 200, 100
TRAINING = {"rocm-isolation.io/class": "training"}
INFERENCE = {"rocm-isolation.io/class": "inference"}
POOL = {"rocm-isolation.io/pool": "inference"}
LAST = f"spec.containers[{CONTAINERS - 1}]"
BACKSTOP = f"ValidatingAdmissionPolicy '{RESERVED_POLICY}'"


def _large_pod(name: str, ns: str, *, last: dict[str, Any], **spec: Any) -> Obj:
    """CONTAINERS containers of VARIABLES variables each; ``last`` is merged into the last container (the
    one a route scan reaches last)."""
    containers = []
    for index in range(CONTAINERS):
        env = [{"name": f"SETTING_{j}", "value": "x" * 20} for j in range(VARIABLES)]
        container: dict[str, Any] = {"name": f"c{index}", "image": "busybox", "env": env}
        if index == CONTAINERS - 1:
            extra = dict(last)
            container["env"] = env + extra.pop("env", [])
            container.update(extra)
        containers.append(container)
    return new_pod(name, ns, labels={"app": name}, containers=containers, **spec)


GPU = {"resources": {"limits": {"amd.com/gpu": "1"}}}
PRIVILEGED = {"securityContext": {"privileged": True}}
RUNTIME_VARIABLE = {"env": [{"name": "DOCKER_RESOURCE_GPU0", "value": "0"}]}

# (name, namespace class, the last container's extra fields, extra spec, the fields a denial names or None)
CASES = [
    ("no-gpu", TRAINING, {}, {}, None),
    ("training", TRAINING, GPU, {}, None),
    ("inference", INFERENCE, GPU, {}, None),
    ("training-on-reserved", TRAINING, GPU, {"nodeSelector": POOL}, ["spec.nodeSelector"]),
    (
        "privileged-on-reserved",
        TRAINING,
        PRIVILEGED,
        {"nodeSelector": POOL},
        ["spec.nodeSelector", f"{LAST}.securityContext.privileged"],
    ),
    (
        "runtime-variable-on-reserved",
        TRAINING,
        RUNTIME_VARIABLE,
        {"nodeSelector": POOL},
        ["spec.nodeSelector", f"{LAST}.env[{VARIABLES}](DOCKER_RESOURCE_GPU0)"],
    ),
]


@pytest.fixture(params=["webhook", "policies alone"])
def admission(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[str]:
    with cluster.without_webhook_configuration() if request.param == "policies alone" else nullcontext():
        yield request.param


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_the_largest_pods_are_judged_by_the_rules_not_the_cel_budget(
    cluster: Cluster, namespace: Callable[..., str], admission: str, case: tuple[Any, ...]
) -> None:
    name, labels, last, spec, named = case
    ns = namespace(labels=labels)
    pod = _large_pod(name, ns, last=last, **spec)
    try:
        admitted = cluster.kube.create(pod, dry_run=True)
    except ApiError as err:
        assert named is not None, f"{name} refused ({admission}): {err.message[:600]}"
        assert err.status == 403, err.message[:600]
        assert (WEBHOOK_DENIAL if admission == "webhook" else BACKSTOP) in err.message, err.message[:600]
        # The backstop's static message names the placement field only (the webhook's also the GPU route).
        for field in named if admission == "webhook" else named[:1]:
            assert field in err.message, (field, err.message[:600])
        return
    assert named is None, f"{name} admitted ({admission})"
    # Placed by its class (by the webhook, or by the MutatingAdmissionPolicy without it); a pod asking
    # for no GPU is left alone.
    affinity = admitted["spec"].get("affinity")
    if last:
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        keys = {e["key"] for term in terms for e in term.get("matchExpressions") or []}
        assert "rocm-isolation.io/pool" in keys, terms
    else:
        assert affinity is None, affinity
