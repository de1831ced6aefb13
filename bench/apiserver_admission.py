"""What the product's admission policies cost the apiserver per pod, against a floor, in one run.

On a real control plane (the end-to-end suite's: tests/e2e/controlplane.py and harness.py, v1.36 from
``KUBEBUILDER_ASSETS``) with the product installed from its manifests and the webhook up (``--webhook
down``: its configuration deleted, what an outage amounts to), pods are created by server-side dry
run in a training and an inference namespace, in rounds. Each round binds one variant of one group,
creates the pods, and unbinds it; the variants of a group alternate, their order rotated every round,
so that whatever else the machine does falls on all of them alike:

- **MAP group** (the backstop bound as shipped): ``none`` (no MutatingAdmissionPolicy bound),
  ``product`` (the placement MAP of the manifests), ``floor`` (``FLOOR_MAP``: one match condition, one
  mutation that adds one label, its binding skipping the pods that carry it: the least any MAP that
  changes a GPU pod costs on this machine), ``baseline`` (the MAP as the manifests shipped it before
  issue 27, ``bench/apiserver_baseline.yaml``);
- **VAP group** (the placement MAP bound as shipped): ``none`` (no backstop ValidatingAdmissionPolicy
  bound), ``product`` (the backstop of the manifests: reserved nodes, reserved node names (a policy of
  its own again since issue 42), the device-level ones, which the apiserver skips while no device
  reservation exists),
  ``floor`` (``FLOOR_VAP``: one condition, one validation that holds), ``baseline`` (the backstop
  before issue 27: ``rocm-isolation-reserved-nodes`` by label and taint, ``-reserved-node-names`` by name,
  one policy from issue 27 to 42), and ``rocm-isolation-reserved-device-pods`` alone, now and before (against the
  floor: one VAP each); the device-level pods policy alone and the whole backstop again (``product,
  devices reserved``, ``baseline, devices reserved``) are measured with the reserved DeviceClass present
  for their rounds (a device reservation applied: the apiserver then evaluates the pods policy's
  condition for every pod).

Every round measures GPU pods (one container with ``amd.com/gpu``) and pods that reach no GPU, each
with the apiserver's own figures from ``/metrics``, subtracted before and after: the time of each
admission plugin (``apiserver_admission_controller_admission_duration_seconds``, observed once per pass
of the mutating chain), the MAP's mutation evaluations (``..._mutating_admission_policy_check_...``),
the admission steps, the webhook's call, and the evaluations of a policy's match conditions that
excluded a pod (``apiserver_admission_match_condition_evaluation_seconds``, observed when the
conditions exclude the pod, not when they hold: one per policy for a pod that reaches no GPU). The
report gives each variant's median over the rounds (and the range), and the ratios that mean something
on any machine: product / floor, product / baseline (``none``'s plugin time subtracted), and the
machine's CPUs and load average.

    KUBEBUILDER_ASSETS=.cache/envtest/bin python -m bench.apiserver_admission [--pods 100] [--rounds 5]
        [--other-pods 25] [--groups map,vap] [--webhook up|down] [--json]

No timing is asserted anywhere: the numbers depend on the machine (docs/benchmarks.md says which).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.controlplane import ASSETS_ENV, HOW_TO_GET_BINARIES, LOOPBACK, ControlPlane, missing_binaries
from tests.e2e.harness import (
    MI300X_LABELS,
    OPT_OUT,
    RESERVED_NODES,
    SHARED_NODES,
    WEBHOOK_CONFIGURATION,
    cli,
    deploy,
    gpu_pod,
    make_node,
    wait_reserved_nodes_known,
)
from tests.e2e.kube import ApiError, Kube, Obj, wait_until
from webhook.core.pods import DEVICE_CLASS_RESOURCE_PREFIX
from webhook.core.policy import default_policy, default_policy_text
from webhook.deploy import mutating_policy, render, reserved_devices, reserved_nodes
from webhook.deploy.device_classes import ACTIVE, STATE_LABEL

CLASS_LABEL = "rocm-isolation.io/class"
LENDING_LABEL = "rocm-isolation.io/lending"
BORROW_LABEL = "rocm-isolation.io/borrow"
NAMESPACES = {"training": "bench-training", "inference": "bench-inference"}
BASELINE_FILE = Path(__file__).with_name("apiserver_baseline.yaml")
BASELINE_SUFFIX = "-baseline"
GROUPS = ("map", "vap")
PLACEMENT = mutating_policy.POLICY_NAME
NODES = render.RESERVED_NODES_POLICY
# Before issue 27 the reserved node names had a policy of their own (bench/apiserver_baseline.yaml), and
# again since issue 42 (the label checks then take no parameter: a deleted ConfigMap turns off only these).
BASELINE_NAMES = reserved_nodes.NAMES_POLICY_NAME
NAMES = reserved_nodes.NAMES_POLICY_NAME
DEVICES = reserved_devices.POLICY_NAMES
DEVICE_PODS = reserved_devices.PODS_POLICY
# The device-level backstop's parameter: the reserved DeviceClass. Without it (no ``pool apply
# --devices-per-node`` yet) the apiserver skips those policies (parameterNotFoundAction: Allow); the
# variants of DEVICES_RESERVED create it for their rounds, as the policies read it (its state label
# active), not labelled as ours, so the webhook steers nothing to the reserved class: the pods measured
# stay the same (amd.com/gpu).
RESERVED_DEVICE_CLASS = default_policy().spec.reserved_devices.reserved_class_name
DRA_PROBE_RESOURCE = DEVICE_CLASS_RESOURCE_PREFIX + "gpu.amd.com"

STEP = "apiserver_admission_step_admission_duration_seconds"
PLUGIN = "apiserver_admission_controller_admission_duration_seconds"
WEBHOOK = "apiserver_admission_webhook_admission_duration_seconds"
MAP_CHECK = "apiserver_mutating_admission_policy_check_duration_seconds"
# Observed when a policy's match conditions exclude a pod (or fail), not when they all hold.
EXCLUDED = "apiserver_admission_match_condition_evaluation_seconds"
_CREATED = {"operation": "CREATE", "rejected": "false"}
# (row, metric, the labels a sample must carry). None of them has a resource label: they count every
# CREATE, and nothing else is created while the pods are (no kubelet, no running pods).
SERIES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("mutating step", STEP, {"type": "admit", **_CREATED}),
    ("validating step", STEP, {"type": "validate", **_CREATED}),
    ("plugin MutatingAdmissionPolicy", PLUGIN, {"name": "MutatingAdmissionPolicy", **_CREATED}),
    ("plugin MutatingAdmissionWebhook", PLUGIN, {"name": "MutatingAdmissionWebhook", **_CREATED}),
    ("plugin ValidatingAdmissionPolicy", PLUGIN, {"name": "ValidatingAdmissionPolicy", **_CREATED}),
    ("webhook call", WEBHOOK, {"name": "pods.rocm-isolation.io", **_CREATED}),
    ("MAP mutation evaluations", MAP_CHECK, {}),
)

# --- the floors -----------------------------------------------------------------------------------

FLOOR_MAP_NAME = "bench-floor-placement"
FLOOR_VAP_NAME = "bench-floor-backstop"
FLOOR_LABEL = "bench.rocm-isolation.io/floor"
# The floor VAP's validation holds for every measured pod; a probe carrying this label is denied, which
# is how the bench knows the binding is in effect.
FLOOR_PROBE_LABEL = "bench.rocm-isolation.io/deny"
_FLOOR_CONDITION = "object.spec.containers.exists(c, has(c.resources.limits) && 'amd.com/gpu' in c.resources.limits)"
_POD_RULES = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]


def _baseline(names: Iterable[str]) -> list[str]:
    return [name + BASELINE_SUFFIX for name in names]


# group -> variant -> the policies it binds (each round binds one variant of the group: the other group's
# product stays bound as shipped). The device-level backstop is skipped by the apiserver while no
# device reservation exists (its parameter, the reserved DeviceClass, is not found: Allow).
GROUP_VARIANTS: dict[str, dict[str, list[str]]] = {
    "map": {
        "none": [],
        "product": [PLACEMENT],
        "floor": [FLOOR_MAP_NAME],
        "baseline": _baseline([PLACEMENT]),
    },
    "vap": {
        "none": [],
        "product": [NODES, NAMES, *DEVICES],
        "floor": [FLOOR_VAP_NAME],
        "baseline": _baseline([NODES, BASELINE_NAMES, *DEVICES]),
        "reserved-device-pods": [DEVICE_PODS],
        "reserved-device-pods baseline": _baseline([DEVICE_PODS]),
        "product, devices reserved": [NODES, NAMES, *DEVICES],
        "baseline, devices reserved": _baseline([NODES, BASELINE_NAMES, *DEVICES]),
    },
}
# The variants measured with the reserved DeviceClass present (a device reservation applied).
DEVICES_RESERVED = frozenset(
    {"reserved-device-pods", "reserved-device-pods baseline", "product, devices reserved", "baseline, devices reserved"}
)


def group_variants(group: str, *, lending: bool = False) -> dict[str, list[str]]:
    """The group's variants; lending on: the lending backstop with the product's (it binds the namespaces
    labelled to borrow, the training one here), the baseline's left out (no borrowers)."""
    variants = GROUP_VARIANTS[group]
    if not lending:
        return variants
    return {
        name: [*policies, reserved_nodes.LENDING_POLICY_NAME] if NODES in policies else policies
        for name, policies in variants.items()
        if "baseline" not in name
    }


def reserved_device_class() -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": RESERVED_DEVICE_CLASS, "labels": {STATE_LABEL: ACTIVE}},
        "spec": {},
    }


def floor_map() -> Obj:
    """One condition (a container limits amd.com/gpu), one mutation adding one label; the binding
    (``floor_map_binding``) skips a pod that has it, so the reinvocation pass costs no CEL."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": FLOOR_MAP_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {"resourceRules": _POD_RULES},
            "matchConditions": [{"name": "gpu-pods", "expression": _FLOOR_CONDITION}],
            "mutations": [
                {
                    "patchType": "JSONPatch",
                    "jsonPatch": {
                        "expression": "[JSONPatch{op: 'add', path: '/metadata/labels/"
                        + FLOOR_LABEL.replace("/", "~1")
                        + "', value: 'placed'}]"
                    },
                }
            ],
        },
    }


def floor_vap() -> Obj:
    """One condition (as the floor MAP's), one validation that every measured pod passes."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": FLOOR_VAP_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": _POD_RULES},
            "matchConditions": [{"name": "gpu-pods", "expression": _FLOOR_CONDITION}],
            "validations": [
                {
                    "expression": f"!has(object.metadata.labels) || !({FLOOR_PROBE_LABEL!r} in object.metadata.labels)",
                    "message": "bench floor probe",
                }
            ],
        },
    }


# --- histograms -----------------------------------------------------------------------------------


@dataclass
class Histogram:
    """One histogram (or counter: ``total`` only) summed over the label sets that match."""

    total: float
    count: float

    def __sub__(self, other: Histogram) -> Histogram:
        return Histogram(self.total - other.total, self.count - other.count)


def scrape(kube: Kube) -> dict[str, Any]:
    """The SERIES rows, the MAP evaluations per policy, and the exclusions per policy name."""
    text = kube.request("GET", "/metrics", raw=True)
    wanted = {metric for _, metric, _ in SERIES} | {EXCLUDED}
    families = {f.name: f for f in text_string_to_metric_families(text) if f.name in wanted}
    out: dict[str, Any] = {}
    for row, metric, labels in SERIES:
        out[row] = _select(families.get(metric), labels)
    per_policy: dict[str, Histogram] = {}
    family = families.get(MAP_CHECK)
    for sample in family.samples if family else []:
        policy = sample.labels.get("policy", "")
        current = per_policy.setdefault(policy, Histogram(0.0, 0.0))
        if sample.name.endswith("_sum"):
            current.total += sample.value
        elif sample.name.endswith("_count"):
            current.count += sample.value
    out["checks by policy"] = per_policy
    exclusions: dict[str, Histogram] = {}
    family = families.get(EXCLUDED)
    for sample in family.samples if family else []:
        if sample.labels.get("kind") != "policy":
            continue
        current = exclusions.setdefault(sample.labels.get("name", ""), Histogram(0.0, 0.0))
        if sample.name.endswith("_sum"):
            current.total += sample.value
        elif sample.name.endswith("_count"):
            current.count += sample.value
    out["exclusions"] = exclusions
    return out


def _select(family: Any, labels: dict[str, str]) -> Histogram:
    total = count = 0.0
    for sample in family.samples if family else []:
        if any(sample.labels.get(key) != want for key, want in labels.items()):
            continue
        if sample.name.endswith("_sum"):
            total += sample.value
        elif sample.name.endswith("_count"):
            count += sample.value
    return Histogram(total, count)


def delta(after: dict[str, Any], before: dict[str, Any], pods: int) -> dict[str, Any]:
    """Per pod: milliseconds and observations of each row; exclusions of each policy."""
    rows = {}
    for row, _, _ in SERIES:
        d = after[row] - before[row]
        rows[row] = {"ms_per_pod": d.total / pods * 1e3, "per_pod": d.count / pods}
    exclusions = {}
    for name, value in after["exclusions"].items():
        d = value - before["exclusions"].get(name, Histogram(0.0, 0.0))
        if d.count > 0:
            exclusions[name] = {"per_pod": d.count / pods, "ms_per_pod": d.total / pods * 1e3}
    return {"series": rows, "exclusions_per_pod": exclusions}


# --- the cluster ----------------------------------------------------------------------------------


@dataclass
class Bench:
    plane: ControlPlane
    kube: Kube
    manifests: list[Obj]
    # every binding a variant may create (the shipped ones, the floors', the baseline's)
    bindings: list[Obj] = field(default_factory=list)
    # --lending: the product's policy lends, and every training GPU pod asks to borrow (the backstop's
    # worst case: a borrower tolerates the reserved taint, so its conditions let it through to be judged).
    lending: bool = False

    def variants(self, group: str) -> dict[str, list[str]]:
        return group_variants(group, lending=self.lending)

    def checks(self, policy: str) -> float:
        return float(scrape(self.kube)["checks by policy"].get(policy, Histogram(0.0, 0.0)).count)

    def probe(self, labels: dict[str, str] | None = None) -> None:
        pod = gpu_pod("probe", NAMESPACES["inference"], labels=labels)
        self.kube.create(pod, dry_run=True)

    def denied_by(self, policy: str) -> bool:
        """Whether a probe is denied by ``policy`` (a VAP). The backstops' probes opt out of the webhook
        and the MAP (nothing placed) in a training namespace, and select the reserved nodes by label
        (``rocm-isolation-reserved-nodes``) or, for the baseline's names policy, by name in ``matchFields``
        (a ``spec.nodeName`` with the opt-out label is the other baseline policy's denial too), or ask for
        AMD's DeviceClass by its DRA extended resource (``rocm-isolation-reserved-device-pods``, while the
        reserved DeviceClass exists)."""
        if policy == FLOOR_VAP_NAME:
            pod = gpu_pod("probe", NAMESPACES["training"], labels={FLOOR_PROBE_LABEL: "x"})
        elif policy.removesuffix(BASELINE_SUFFIX) == DEVICE_PODS:
            # A training pod asking for AMD's own class by its DRA extended resource (reservation active).
            pod = gpu_pod("probe", NAMESPACES["training"], labels={OPT_OUT: "true"})
            pod["spec"]["containers"][0]["resources"] = {"limits": {DRA_PROBE_RESOURCE: "1"}}
        elif policy.removesuffix(BASELINE_SUFFIX) == BASELINE_NAMES:
            term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [RESERVED_NODES[0]]}]}
            affinity = {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
            }
            pod = gpu_pod("probe", NAMESPACES["training"], labels={OPT_OUT: "true"}, affinity=affinity)
        else:
            pod = gpu_pod("probe", NAMESPACES["training"], labels={OPT_OUT: "true"})
            pod["spec"]["nodeSelector"] = {"rocm-isolation.io/pool": "inference"}
        try:
            self.kube.create(pod, dry_run=True)
        except ApiError as err:
            return f"ValidatingAdmissionPolicy '{policy}'" in err.message
        return False

    def map_in_effect(self, policy: str, wanted: bool) -> Callable[[], bool]:
        def check() -> bool:
            before = self.checks(policy)
            self.probe()
            self.probe()
            return (self.checks(policy) > before) == wanted

        return check

    def _bindings(self, group: str, variant: str) -> list[Obj]:
        policies = set(self.variants(group)[variant])
        return [b for b in self.bindings if b["spec"]["policyName"] in policies]

    def _wait(self, group: str, variant: str, wanted: bool) -> None:
        for policy in self.variants(group)[variant]:
            if self.lending and policy == NODES:
                # Lending on, the training namespace is the lending backstop's (probed in its place); this
                # one binds neither namespace here (the inference one, of a reserved class, is left out by
                # both backstops' bindings: nothing there can be denied).
                continue
            if group == "map":
                wait_until(self.map_in_effect(policy, wanted), timeout=60, what=f"{policy} in effect: {wanted}")
            elif policy.removesuffix(BASELINE_SUFFIX) in (
                NODES,
                BASELINE_NAMES,
                FLOOR_VAP_NAME,
                reserved_nodes.LENDING_POLICY_NAME,
            ) or (
                # Without the reserved DeviceClass the apiserver skips it: nothing to probe.
                policy.removesuffix(BASELINE_SUFFIX) == DEVICE_PODS and variant in DEVICES_RESERVED
            ):
                wait_until(
                    lambda policy=policy: self.denied_by(policy) == wanted,
                    timeout=60,
                    what=f"{policy} in effect: {wanted}",
                )

    def bind(self, group: str, variant: str) -> None:
        if variant in DEVICES_RESERVED:
            self.kube.apply(reserved_device_class())
        for binding in self._bindings(group, variant):
            self.kube.apply(binding)
        self._wait(group, variant, True)

    def unbind(self, group: str, variant: str) -> None:
        for binding in self._bindings(group, variant):
            self.kube.delete(binding["kind"], binding["metadata"]["name"])
        self._wait(group, variant, False)
        if variant in DEVICES_RESERVED:
            self.kube.delete("DeviceClass", RESERVED_DEVICE_CLASS)
        # The bindings without a probe (the device claims' ones) and the DeviceClass went at the same
        # time: a moment more for the apiserver's informers.
        time.sleep(0.5)


def prepare(bench: Bench) -> None:
    """The floors and the baseline policies installed unbound; every variant's bindings recorded; the
    shipped MAP and backstop bindings deleted (each round binds what it measures)."""
    baseline = [d for d in yaml.safe_load_all(BASELINE_FILE.read_text(encoding="utf-8")) if d]
    for policy in (floor_map(), floor_vap(), *(d for d in baseline if not d["kind"].endswith("Binding"))):
        bench.kube.apply(policy)
    measured = {name for group in GROUPS for names in bench.variants(group).values() for name in names}
    shipped = [
        d
        for d in bench.manifests
        if d["kind"].endswith("AdmissionPolicyBinding") and d["spec"]["policyName"] in measured
    ]
    placement = next(d for d in shipped if d["spec"]["policyName"] == PLACEMENT)
    namespaces = copy.deepcopy(placement["spec"]["matchResources"]["namespaceSelector"])
    floors = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": FLOOR_MAP_NAME},
            "spec": {
                "policyName": FLOOR_MAP_NAME,
                "matchResources": {
                    "namespaceSelector": namespaces,
                    "objectSelector": {"matchExpressions": [{"key": FLOOR_LABEL, "operator": "DoesNotExist"}]},
                },
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": FLOOR_VAP_NAME},
            "spec": {
                "policyName": FLOOR_VAP_NAME,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": copy.deepcopy(namespaces)},
            },
        },
    ]
    bench.bindings = shipped + floors + [d for d in baseline if d["kind"].endswith("Binding")]
    # The shipped state (start() installed it), then every variant unbound.
    for group in GROUPS:
        bench.unbind(group, "product")


def _lending_policy(workdir: Path) -> Path:
    document = yaml.safe_load(default_policy_text())
    document["spec"]["lending"] = {"enabled": True}
    path = workdir / "lending-policy.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def start(workdir: Path, *, lending: bool = False) -> Bench:
    """The end-to-end suite's session set-up (tests/e2e/conftest.py), reduced to what admission needs:
    nodes (the webhook knows the reserved ones), the manifests, the webhook, ``pool apply``. ``lending``:
    the default policy with lending on, and the training namespace allowed to borrow."""
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ.pop(variable, None)
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = f"{LOOPBACK},localhost"
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), workdir / "controlplane")
    plane.start()
    kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
    for name in RESERVED_NODES + SHARED_NODES:
        make_node(kube, name, MI300X_LABELS)
    manifests = deploy(plane, workdir, policy_file=_lending_policy(workdir) if lending else None).manifests
    result = cli("pool", "apply", "--nodes", ",".join(RESERVED_NODES), kubeconfig=plane.admin_kubeconfig)
    if result.returncode != 0:
        raise RuntimeError(result.stdout + result.stderr)
    wait_reserved_nodes_known(kube, RESERVED_NODES[0])
    for class_name, namespace in NAMESPACES.items():
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": namespace,
                    # Lending: the training namespace may borrow (the inference one never borrows).
                    "labels": {
                        CLASS_LABEL: class_name,
                        **({LENDING_LABEL: "allowed"} if lending and class_name == "training" else {}),
                    },
                },
            }
        )
        # The controller-manager creates the default ServiceAccount; pod admission needs it.
        wait_until(_default_account(kube, namespace), timeout=60, what=f"{namespace}/default")
    return Bench(plane, kube, manifests, lending=lending)


def _default_account(kube: Kube, namespace: str) -> Callable[[], bool]:
    return lambda: any(sa["metadata"]["name"] == "default" for sa in kube.list("ServiceAccount", namespace))


def webhook_down(bench: Bench) -> None:
    """The MutatingWebhookConfiguration deleted (an outage with failurePolicy Ignore), until the
    apiserver no longer calls it."""
    bench.kube.delete("MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)

    def gone() -> bool:
        before = scrape(bench.kube)["webhook call"].count
        bench.probe()
        return scrape(bench.kube)["webhook call"].count == before

    wait_until(gone, timeout=60, what="the apiserver to stop calling the webhook")


# --- measuring ------------------------------------------------------------------------------------


def borrower_pod(name: str, namespace: str) -> Obj:
    """A GPU pod that asks to borrow (a borrower in the training namespace, which may borrow; the label
    changes nothing in the inference namespace)."""
    return gpu_pod(name, namespace, labels={"app": name, BORROW_LABEL: "true"})


def cpu_pod(name: str, namespace: str) -> Obj:
    pod = gpu_pod(name, namespace)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    return pod


def create_all(bench: Bench, make: Callable[[str, str], Obj], pods: int) -> tuple[dict[str, Any], float]:
    """``pods`` pods per namespace, alternating; the metrics before and after, and the client's time."""
    before = scrape(bench.kube)
    started = time.perf_counter()
    for i in range(pods):
        for namespace in NAMESPACES.values():
            bench.kube.create(make(f"pod-{i}", namespace), dry_run=True)
    elapsed = time.perf_counter() - started
    after = scrape(bench.kube)
    created = pods * len(NAMESPACES)
    figures = delta(after, before, created)
    figures["client_ms_per_pod"] = elapsed / created * 1e3
    checks = {
        policy: (value.count - before["checks by policy"].get(policy, Histogram(0.0, 0.0)).count) / created
        for policy, value in after["checks by policy"].items()
    }
    figures["checks_per_pod"] = {policy: n for policy, n in checks.items() if n > 0}
    return figures, elapsed


def measure(
    bench: Bench, *, pods: int, other_pods: int, rounds: int, groups: Iterable[str], log: Callable[[str], None]
) -> dict[str, Any]:
    """Every group's variants, ``rounds`` times, the order rotated each round. Returns group -> variant ->
    the list of per-round figures (``gpu`` and ``other`` pods)."""
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for group in groups:
        variants = list(bench.variants(group))
        results[group] = {variant: [] for variant in variants}
        # The other group's policies as shipped while this one is measured.
        other = "vap" if group == "map" else "map"
        bench.bind(other, "product")
        try:
            for index in range(rounds):
                shift = index % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    bench.bind(group, variant)
                    try:
                        for _ in range(5):  # warm-up, not counted
                            bench.probe()
                        gpu, _ = create_all(bench, borrower_pod if bench.lending else gpu_pod, pods)
                        others, _ = create_all(bench, cpu_pod, other_pods) if other_pods else ({}, 0.0)
                    finally:
                        bench.unbind(group, variant)
                    results[group][variant].append({"gpu": gpu, "other": others, "load": os.getloadavg()[0]})
                    row = "plugin MutatingAdmissionPolicy" if group == "map" else "plugin ValidatingAdmissionPolicy"
                    log(
                        f"{group} round {index + 1}/{rounds} {variant}: {row} "
                        f"{gpu['series'][row]['ms_per_pod']:.2f} ms, client {gpu['client_ms_per_pod']:.1f} ms "
                        "per GPU pod"
                    )
        finally:
            bench.unbind(other, "product")
    return results


# --- the report -----------------------------------------------------------------------------------

PLUGIN_ROW = {"map": "plugin MutatingAdmissionPolicy", "vap": "plugin ValidatingAdmissionPolicy"}
# (name, numerator, denominator) of the ratios reported per group, on the medians of plugin time per GPU
# pod with ``none`` (the plugin's own time with nothing bound) subtracted.
RATIOS = {
    "map": [
        ("product / floor", "product", "floor"),
        ("baseline / floor", "baseline", "floor"),
        ("product / baseline", "product", "baseline"),
    ],
    "vap": [
        ("product / floor", "product", "floor"),
        ("baseline / floor", "baseline", "floor"),
        ("product / baseline", "product", "baseline"),
        ("reserved-device-pods / floor", "reserved-device-pods", "floor"),
        ("reserved-device-pods / its baseline", "reserved-device-pods", "reserved-device-pods baseline"),
        ("product, devices reserved / floor", "product, devices reserved", "floor"),
        ("product, devices reserved / its baseline", "product, devices reserved", "baseline, devices reserved"),
    ],
}


def _values(rounds: list[dict[str, Any]], kind: str, get: Callable[[dict[str, Any]], float]) -> list[float]:
    return [get(r[kind]) for r in rounds if r[kind]]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _cell(values: list[float], digits: int = 2) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{_median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _series(row: str, what: str = "ms_per_pod") -> Callable[[dict[str, Any]], float]:
    return lambda figures: float(figures["series"][row][what])


def _client(figures: dict[str, Any]) -> float:
    return float(figures["client_ms_per_pod"])


def _exclusions(policies: Iterable[str], what: str = "per_pod") -> Callable[[dict[str, Any]], float]:
    names = set(policies)
    return lambda figures: sum(v[what] for name, v in figures["exclusions_per_pod"].items() if name in names)


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Each group's medians of plugin time per GPU pod, and the RATIOS on them above ``none``."""
    out: dict[str, Any] = {}
    for group, figures in results.items():
        medians = {v: _median(_values(rounds, "gpu", _series(PLUGIN_ROW[group]))) for v, rounds in figures.items()}
        none = medians["none"]
        out[group] = {"ms_per_gpu_pod": medians}
        for name, numerator, denominator in RATIOS[group]:
            if numerator in medians and denominator in medians:
                out[group][name] = (medians[numerator] - none) / (medians[denominator] - none)
    return out


def report(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"Machine: {meta['cpus']} CPUs, load average {meta['load_start']:.2f} at the start, "
        f"{meta['load_end']:.2f} at the end; {meta['rounds']} rounds of {meta['pods']} GPU pods and "
        f"{meta['other_pods']} pods without GPU per namespace (x{len(NAMESPACES)}), webhook {meta['webhook']}"
        + (", lending on (every training GPU pod a borrower)." if meta.get("lending") else "."),
        "Each cell: the median of the rounds' figures (their range), per pod; (observations per pod).",
    ]
    if "map" in results:
        lines += [
            "",
            "MutatingAdmissionPolicy (the backstop bound as shipped), GPU pods:",
            "",
            "| variant | plugin MutatingAdmissionPolicy ms | passes | mutation evaluations ms | evaluations | "
            "mutating step ms | webhook call ms | client ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for variant, rounds in results["map"].items():
            lines.append(
                f"| {variant} | {_cell(_values(rounds, 'gpu', _series(PLUGIN_ROW['map'])))} | "
                f"{_cell(_values(rounds, 'gpu', _series(PLUGIN_ROW['map'], 'per_pod')), 1)} | "
                f"{_cell(_values(rounds, 'gpu', _series('MAP mutation evaluations')))} | "
                f"{_cell(_values(rounds, 'gpu', _series('MAP mutation evaluations', 'per_pod')), 1)} | "
                f"{_cell(_values(rounds, 'gpu', _series('mutating step')))} | "
                f"{_cell(_values(rounds, 'gpu', _series('webhook call')))} | "
                f"{_cell(_values(rounds, 'gpu', _client), 1)} |"
            )
    if "vap" in results:
        lines += [
            "",
            "ValidatingAdmissionPolicies (the placement MAP bound as shipped), GPU pods:",
            "",
            "| variant | plugin ValidatingAdmissionPolicy ms | validating step ms | client ms |",
            "| --- | ---: | ---: | ---: |",
        ]
        for variant, rounds in results["vap"].items():
            lines.append(
                f"| {variant} | {_cell(_values(rounds, 'gpu', _series(PLUGIN_ROW['vap'])))} | "
                f"{_cell(_values(rounds, 'gpu', _series('validating step')))} | "
                f"{_cell(_values(rounds, 'gpu', _client), 1)} |"
            )
    for group, results_of in results.items():
        plugin = PLUGIN_ROW[group].removeprefix("plugin ")
        lines += [
            "",
            f"{plugin}, pods that reach no GPU (the match conditions' evaluations are counted when they exclude):",
            "",
            f"| variant | plugin {plugin} ms | condition evaluations | their ms |",
            "| --- | ---: | ---: | ---: |",
        ]
        for variant, rounds in results_of.items():
            policies = group_variants(group, lending=bool(meta.get("lending")))[variant]
            lines.append(
                f"| {variant} | {_cell(_values(rounds, 'other', _series(PLUGIN_ROW[group])))} | "
                f"{_cell(_values(rounds, 'other', _exclusions(policies)), 1)} | "
                f"{_cell(_values(rounds, 'other', _exclusions(policies, 'ms_per_pod')))} |"
            )
    lines += ["", "Ratios of the medians of plugin time per GPU pod, none's subtracted:", ""]
    for group, figures in ratios(results).items():
        parts = ", ".join(f"{name} {value:.2f}" for name, value in figures.items() if name != "ms_per_gpu_pod")
        lines.append(f"- {group}: {parts}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=100, help="GPU pods per namespace, variant and round")
    parser.add_argument("--other-pods", type=int, default=25, help="pods without GPU per namespace, variant and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per group (each variant once per round)")
    parser.add_argument("--groups", default="map,vap", help="what to measure: map, vap or both (default)")
    parser.add_argument("--webhook", choices=("up", "down"), default="up", help="the webhook in the path or not")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON, not tables")
    parser.add_argument(
        "--lending",
        action="store_true",
        help="the product's policy with lending on, every training GPU pod a borrower (the backstop judges each)",
    )
    args = parser.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g]
    if not set(groups) <= set(GROUPS):
        parser.error(f"--groups: one or both of {', '.join(GROUPS)}")
    missing = missing_binaries(os.environ.get(ASSETS_ENV))
    if missing:
        print(f"bench.apiserver_admission needs {ASSETS_ENV} ({', '.join(missing)} missing): {HOW_TO_GET_BINARIES}")
        return 2
    meta: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_start": os.getloadavg()[0],
        "rounds": args.rounds,
        "pods": args.pods,
        "other_pods": args.other_pods,
        "webhook": args.webhook,
        "lending": args.lending,
    }
    with tempfile.TemporaryDirectory(prefix="bench-apiserver-") as directory:
        bench = start(Path(directory), lending=args.lending)
        try:
            prepare(bench)
            if args.webhook == "down":
                webhook_down(bench)
            results = measure(
                bench,
                pods=args.pods,
                other_pods=args.other_pods,
                rounds=args.rounds,
                groups=groups,
                log=lambda line: print(line, file=sys.stderr, flush=True),
            )
        finally:
            bench.plane.stop()
    meta["load_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"meta": meta, "results": results, "ratios": ratios(results)}, indent=2))
    else:
        print(report(results, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
