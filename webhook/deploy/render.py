"""``rocm-isolation-webhook manifests``: render the deployable YAML without kubectl or kustomize.

``manifests/`` (shipped in the package as ``webhook/_manifests``) is a kustomize base plus overlays.
This module builds it with the small subset of kustomize the tree uses (``resources`` and
JSON 6902 ``patches`` with a ``target``; anything else is refused, so the tree stays buildable by
both), then fills in what depends on the inputs: the policy (ConfigMap, the webhook's scope, the
ValidatingAdmissionPolicy CEL and its bindings per mode), the image and the CA bundle.
"""

from __future__ import annotations

import argparse
import base64
import copy
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import yaml
from cryptography import x509

from webhook import __version__
from webhook.core.lending import switchable
from webhook.core.policy import Policy, PolicyError, default_policy, default_policy_text, load_policy, parse_policy
from webhook.deploy import (
    cel,
    lending_access,
    minors,
    mutating_policy,
    priority_classes,
    reserved_devices,
    reserved_nodes,
)

NAMESPACE = "rocm-isolation-system"
APP_NAME = "rocm-isolation-webhook"
POLICY_CONFIGMAP = "rocm-isolation-policy"
POLICY_KEY = "policy.yaml"
WEBHOOK_CONFIGURATION = "rocm-isolation-webhook"
WEBHOOK_NAME = "pods.rocm-isolation.io"
RESERVED_NODES_POLICY = reserved_nodes.POLICY_NAME
NAMESPACE_CLASS_POLICY = "rocm-isolation-namespace-class"
PLACEMENT_POLICY = mutating_policy.POLICY_NAME
POD_WEBHOOK = "pods.rocm-isolation.io"
CLAIM_WEBHOOK = "claims.rocm-isolation.io"
CLASS_LABEL_EDITORS = cel.CLASS_LABEL_EDITORS
# Pods carrying this label are not sent to the webhook (the ValidatingAdmissionPolicy still applies).
OPT_OUT_LABEL = cel.OPT_OUT_LABEL
DEFAULT_IMAGE_REPOSITORY = "rocm-isolation-webhook"
OVERLAYS = ("cert-manager", "self-signed")
DEFAULT_OVERLAY = "cert-manager"
# Added to either certificate overlay by --monitoring: ServiceMonitor, PrometheusRule, Grafana dashboard.
MONITORING_OVERLAY = "monitoring"
MODES = ("enforce", "warn", "audit")
# What a ValidatingAdmissionPolicyBinding does in each policy mode (audit: record only, never deny).
MODE_ACTIONS: dict[str, list[str]] = {"enforce": ["Deny"], "warn": ["Warn", "Audit"], "audit": ["Audit"]}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
_KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
_KUSTOMIZATION_KEYS = frozenset({"apiVersion", "kind", "resources", "patches"})

Resource = dict[str, Any]


class RenderError(Exception):
    """The manifests cannot be rendered; the message says what to fix."""


def manifests_dir() -> Path:
    """The manifests tree: ``webhook/_manifests`` is a symlink to ``manifests/`` in a checkout and a
    real directory in an installed wheel, so one lookup serves both."""
    return Path(__file__).resolve().parents[1] / "_manifests"


def monitoring_dir(root: Path | None = None) -> Path:
    return (root or manifests_dir()) / "overlays" / MONITORING_OVERLAY


def with_runbook_base_url(resources: list[Resource], base_url: str) -> None:
    """The PrometheusRule's runbook_url annotations are paths in this project's tree
    (docs/operations.md#...); prefix them with where the operator's copy of the docs is served."""
    for resource in resources:
        if resource.get("kind") != "PrometheusRule":
            continue
        for group in resource["spec"]["groups"]:
            for rule in group["rules"]:
                annotations = rule.get("annotations") or {}
                if "runbook_url" in annotations:
                    annotations["runbook_url"] = f"{base_url.rstrip('/')}/{annotations['runbook_url']}"


def default_image() -> str:
    return f"{DEFAULT_IMAGE_REPOSITORY}:{__version__}"


# --- the kustomize subset -------------------------------------------------------------------------


def _kustomization(directory: Path) -> Mapping[str, Any]:
    for name in _KUSTOMIZATION_FILES:
        path = directory / name
        if path.is_file():
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            if not isinstance(data, Mapping):
                raise RenderError(f"{path}: not a kustomization")
            unsupported = sorted(set(data) - _KUSTOMIZATION_KEYS)
            if unsupported:
                raise RenderError(
                    f"{path}: {', '.join(unsupported)} not supported by the built-in renderer "
                    "(it implements resources and JSON 6902 patches with a target)"
                )
            return data
    raise RenderError(f"{directory}: no kustomization.yaml")


def _documents(path: Path) -> Iterator[Resource]:
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if doc is None:
            continue
        if not isinstance(doc, dict) or "kind" not in doc:
            raise RenderError(f"{path}: every document must be a Kubernetes object")
        yield doc


def _matches(resource: Mapping[str, Any], target: Mapping[str, Any]) -> bool:
    group, _, version = str(resource.get("apiVersion", "")).rpartition("/")
    metadata = resource.get("metadata") or {}
    wanted = {
        "kind": resource.get("kind"),
        "name": metadata.get("name"),
        "namespace": metadata.get("namespace"),
        "group": group,
        "version": version,
    }
    unknown = set(target) - set(wanted)
    if unknown:
        raise RenderError(f"patch target fields {sorted(unknown)} not supported")
    return all(wanted[key] == value for key, value in target.items())


def build(directory: Path) -> list[Resource]:
    """``kustomize build`` for the subset used in manifests/: resources (files or directories), then patches."""
    kustomization = _kustomization(directory)
    out: list[Resource] = []
    for entry in kustomization.get("resources") or []:
        path = Path(os.path.normpath(directory / str(entry)))
        out.extend(build(path) if path.is_dir() else _documents(path))
    for patch in kustomization.get("patches") or []:
        if set(patch) != {"path", "target"}:
            raise RenderError(f"{directory}: a patch needs exactly path and target (JSON 6902), got {sorted(patch)}")
        operations = yaml.safe_load((directory / str(patch["path"])).read_text(encoding="utf-8"))
        targets = [index for index, resource in enumerate(out) if _matches(resource, patch["target"])]
        if not targets:
            raise RenderError(f"{directory}: patch {patch['path']} matches no resource")
        for index in targets:
            out[index] = jsonpatch.JsonPatch(operations).apply(out[index])
    return out


# --- inputs ---------------------------------------------------------------------------------------


def read_ca_bundle(path: Path) -> bytes:
    """A PEM CA certificate, checked: a serving certificate here would make every call fail TLS."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise RenderError(f"cannot read the CA bundle: {err}") from None
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise RenderError(f"{path}: not a PEM certificate") from None
    for certificate in certificates:
        try:
            is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise RenderError(
                f"{path}: {certificate.subject.rfc4514_string()} is not a CA certificate "
                "(pass the CA, e.g. certs/ca.crt, not the serving certificate tls.crt)"
            )
    return data


def _find(resources: list[Resource], kind: str, name: str) -> Resource:
    for resource in resources:
        if resource.get("kind") == kind and resource.get("metadata", {}).get("name") == name:
            return resource
    raise RenderError(f"the manifests have no {kind} {name}")


def excluded_namespaces_selector(policy: Policy) -> dict[str, Any]:
    """Excluded namespaces as a label selector; glob entries cannot be expressed (the engine still skips them)."""
    names = [name for name in policy.spec.excluded_namespaces if not any(ch in name for ch in "*?[")]
    if NAMESPACE not in names:
        names.append(NAMESPACE)
    return {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": names}


def mode_selector(policy: Policy, mode: str) -> dict[str, Any]:
    """Namespaces whose effective mode is ``mode``: the mode label, or the policy's mode when the label
    is absent or not a mode."""
    label = policy.spec.labels.namespace_mode
    if policy.spec.mode == mode:
        return {"key": label, "operator": "NotIn", "values": [other for other in MODES if other != mode]}
    return {"key": label, "operator": "In", "values": [mode]}


_LABELS = {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/part-of": APP_NAME}
_GENERATED_HEADER = (
    "# Generated from webhook/default_policy.yaml by webhook.deploy.render.write_generated_base(): do not edit.\n"
    "# `rocm-isolation-webhook manifests --policy FILE` regenerates this content from your policy.\n"
)


def _metadata(name: str, namespace: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if namespace:
        out["namespace"] = namespace
    out["labels"] = dict(_LABELS)
    return out


def backstop_resources(
    policy: Policy,
    excluded: dict[str, Any],
    policies: list[tuple[str, dict[str, Any], dict[str, str] | None]],
    namespaces: Mapping[str, list[dict[str, Any]]] | None = None,
) -> list[Resource]:
    """Each backstop ValidatingAdmissionPolicy and one binding per mode (the namespaces of that effective
    mode, none excluded, and ``namespaces[name]``'s requirements when given), each taking the policy's
    parameter, if it has one."""
    out: list[Resource] = []
    for name, spec, param_ref in policies:
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": _metadata(name),
                "spec": spec,
            }
        )
        for mode in MODES:
            binding: dict[str, Any] = {"policyName": name, "validationActions": MODE_ACTIONS[mode]}
            if param_ref is not None:
                binding["paramRef"] = dict(param_ref)
            out.append(
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "ValidatingAdmissionPolicyBinding",
                    "metadata": _metadata(f"{name}-{mode}"),
                    "spec": {
                        **binding,
                        "matchResources": {
                            "namespaceSelector": {
                                "matchExpressions": [
                                    excluded,
                                    mode_selector(policy, mode),
                                    *copy.deepcopy((namespaces or {}).get(name, [])),
                                ]
                            }
                        },
                    },
                }
            )
    return out


def generated_base_files(policy: Policy, policy_text: str) -> dict[str, str]:
    """The base's policy-dependent files, as plain kustomize sees them (``manifests`` rewrites the same
    fields from whatever policy it is given)."""
    excluded = excluded_namespaces_selector(policy)
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(POLICY_CONFIGMAP, NAMESPACE),
        "data": {POLICY_KEY: policy_text},
    }
    scope_patch = [
        {"op": "add", "path": "/webhooks/0/namespaceSelector", "value": {"matchExpressions": [excluded]}},
        {"op": "add", "path": "/webhooks/0/matchConditions", "value": cel.webhook_match_conditions(policy)},
        # The claims webhook keeps its own matchConditions (manifests/base/mutatingwebhookconfiguration.yaml).
        {"op": "add", "path": "/webhooks/1/namespaceSelector", "value": {"matchExpressions": [excluded]}},
    ]
    guard = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _metadata(NAMESPACE_CLASS_POLICY),
        "spec": cel.namespace_class_policy_spec(policy),
    }
    placement = mutating_policy.resources(policy, excluded=excluded, metadata=_metadata)
    reserved = backstop_resources(
        policy, excluded, reserved_nodes.policies(policy), reserved_nodes.binding_namespaces(policy)
    )
    devices = backstop_resources(policy, excluded, reserved_devices.policies(policy))
    return {
        "generated-policy-configmap.yaml": _GENERATED_HEADER + dump([configmap]),
        "generated-webhook-scope.yaml": _GENERATED_HEADER
        + yaml.dump(scope_patch, Dumper=_Dumper, sort_keys=False, width=110),
        "generated-reserved-nodes-policy.yaml": _GENERATED_HEADER + dump(reserved),
        "generated-namespace-class-policy.yaml": _GENERATED_HEADER + dump([guard]),
        "generated-placement-policy.yaml": _GENERATED_HEADER + dump(placement),
        "generated-reserved-devices-policy.yaml": _GENERATED_HEADER + dump(devices),
    }


def write_generated_base(root: Path | None = None) -> None:
    """Maintainers: rewrite manifests/base/generated-*.yaml after changing the default policy or this module."""
    base = (root or manifests_dir()) / "base"
    for name, text in generated_base_files(default_policy(), default_policy_text()).items():
        (base / name).write_text(text, encoding="utf-8")


def apply_policy(resources: list[Resource], policy: Policy, policy_text: str) -> None:
    """Write everything that depends on the policy, so the apiserver's CEL never disagrees with it."""
    configmap = _find(resources, "ConfigMap", POLICY_CONFIGMAP)
    configmap["data"] = {POLICY_KEY: policy_text}
    excluded = excluded_namespaces_selector(policy)
    configuration = _find(resources, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
    for hook in configuration["webhooks"]:
        hook["namespaceSelector"] = {"matchExpressions": [excluded]}
        if hook["name"] == POD_WEBHOOK:
            hook["matchConditions"] = cel.webhook_match_conditions(policy)
    guard = _find(resources, "ValidatingAdmissionPolicy", NAMESPACE_CLASS_POLICY)
    guard["spec"] = cel.namespace_class_policy_spec(policy)
    _find(resources, "MutatingAdmissionPolicy", PLACEMENT_POLICY)["spec"] = mutating_policy.placement_policy_spec(
        policy
    )
    _find(resources, "MutatingAdmissionPolicyBinding", PLACEMENT_POLICY)["spec"] = mutating_policy.binding_spec(
        policy, excluded
    )
    generated_backstop = backstop_resources(
        policy, excluded, reserved_nodes.policies(policy), reserved_nodes.binding_namespaces(policy)
    ) + backstop_resources(policy, excluded, reserved_devices.policies(policy))
    for generated in generated_backstop:
        try:
            _find(resources, generated["kind"], generated["metadata"]["name"])["spec"] = generated["spec"]
        except RenderError:
            # Lending on: the borrowing namespaces' backstop and its bindings, not in the base.
            resources.append(generated)


def in_switch_order(resources: list[Resource], policy: Policy) -> list[Resource]:
    """The order ``kubectl apply`` writes the objects in, so that none of them denies a pod while lending is
    switched on or off (issue 42): the objects of one apply reach the apiserver one after the other.

    Lending on: the PriorityClasses and the lending backstop (``reserved-nodes-lending``, bound to the
    namespaces that may borrow) before the backstop whose bindings then leave those namespaces out, and the
    placement MutatingAdmissionPolicy last: it makes borrowers (their PriorityClass, the reserved toleration)
    only once the class exists and the backstop admits them. Lending off: the placement policy first: it makes
    no more borrowers before the backstop's bindings cover the namespaces that may borrow again (what is
    pruned after, the PriorityClasses and the lending backstop, goes once nothing makes borrowers).

    With a lending section (``core/lending.switchable``) the backstop, its bindings and the PriorityClasses are
    the same on and off, and a switch changes the placement policy alone; the order matters when lending is
    first turned on and when the section is removed. Without one (the default policy) the order is the
    base's (``manifests/base``)."""
    if not switchable(policy):
        return resources
    placement = [r for r in resources if r.get("kind", "").startswith("MutatingAdmissionPolicy")]
    if policy.spec.lending.enabled:
        early = [
            r
            for r in resources
            if r.get("kind") == "PriorityClass"
            or (
                r.get("kind", "").startswith("ValidatingAdmissionPolicy")
                and _backstop_of(r) == reserved_nodes.LENDING_POLICY_NAME
            )
        ]
        last = placement
    else:
        early, last = placement, []
    moved = {id(r) for r in [*early, *placement]}
    rest = [r for r in resources if id(r) not in moved]
    at = next(
        (
            i
            for i, r in enumerate(rest)
            if r.get("kind") == "ValidatingAdmissionPolicy" and r["metadata"]["name"] == reserved_nodes.POLICY_NAME
        ),
        len(rest),
    )
    return [*rest[:at], *early, *rest[at:], *last]


def _backstop_of(resource: Resource) -> str:
    """The ValidatingAdmissionPolicy a policy or binding is of."""
    if resource.get("kind") == "ValidatingAdmissionPolicyBinding":
        return str((resource.get("spec") or {}).get("policyName", ""))
    return str(resource["metadata"]["name"])


def with_placement_policy_version(resources: list[Resource], version: str) -> list[Resource]:
    """The MutatingAdmissionPolicy and its binding in API ``version`` (v1: Kubernetes >= 1.36;
    v1beta1: 1.35 with the feature gate and runtime-config of docs/operations.md), or left
    out (``none``: older clusters, placement by the webhook only)."""
    if version not in mutating_policy.VERSIONS:
        raise RenderError(
            f"unknown MutatingAdmissionPolicy version {version!r} (one of {', '.join(mutating_policy.VERSIONS)})"
        )
    kinds = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    out = []
    for resource in resources:
        if resource.get("kind") in kinds and resource.get("apiVersion", "").startswith(mutating_policy.API_GROUP + "/"):
            if version == "none":
                continue
            resource["apiVersion"] = f"{mutating_policy.API_GROUP}/{version}"
        out.append(resource)
    return out


def for_served(resources: list[Resource], served: minors.Served) -> list[Resource]:
    """Without what ``served``'s cluster cannot store or evaluate: on a minor without DRA (1.33), the device-level
    backstop policies and their bindings (their ``paramKind`` is a ``resource.k8s.io`` DeviceClass: a policy whose
    parameter kind is not served cannot be configured and, failing closed, denies every pod it is bound to)."""
    if served.dra:
        return resources
    device_policies = {*reserved_devices.POLICY_NAMES, reserved_devices.LENT_CLAIMS_POLICY}
    return [
        r
        for r in resources
        if not (r.get("kind", "").startswith("ValidatingAdmissionPolicy") and _backstop_of(r) in device_policies)
    ]


def render(
    *,
    overlay: str = DEFAULT_OVERLAY,
    policy_text: str | None = None,
    policy_source: str = "<policy>",
    ca_bundle: bytes | None = None,
    image: str | None = None,
    root: Path | None = None,
    monitoring: bool = False,
    runbook_base_url: str | None = None,
    mutating_admission_policy: str | None = mutating_policy.DEFAULT_VERSION,
    served: minors.Served | None = None,
) -> list[Resource]:
    """The manifests; ``served``: for that cluster's minor (``minors``), the placement policy's version then the one it
    serves unless ``mutating_admission_policy`` names one it takes (None: the one it serves)."""
    if served is not None:
        try:
            mutating_admission_policy = minors.placement_policy_version(served, mutating_admission_policy)
        except minors.MinorError as err:
            raise RenderError(str(err)) from None
    elif mutating_admission_policy is None:
        mutating_admission_policy = mutating_policy.DEFAULT_VERSION
    if overlay not in OVERLAYS:
        raise RenderError(f"unknown overlay {overlay!r} (one of {', '.join(OVERLAYS)})")
    if overlay == "self-signed" and ca_bundle is None:
        raise RenderError(
            "the self-signed overlay needs --ca-bundle: run `rocm-isolation-webhook certs --out-dir certs` "
            "and pass --ca-bundle certs/ca.crt"
        )
    if overlay == "cert-manager" and ca_bundle is not None:
        raise RenderError("--ca-bundle is for the self-signed overlay: with cert-manager, its cainjector fills it in")
    if runbook_base_url is not None and not monitoring:
        raise RenderError("--runbook-base-url is for the alerts of --monitoring")
    text = default_policy_text() if policy_text is None else policy_text
    try:
        policy = parse_policy(text, source=policy_source)
    except PolicyError as err:
        raise RenderError(str(err)) from None
    resources = copy.deepcopy(build((root or manifests_dir()) / "overlays" / overlay))
    apply_policy(resources, policy, text)
    # Lending on: the borrowers' and the inference PriorityClass (none with lending off).
    resources.extend(priority_classes.resources(policy, metadata=_metadata))
    # ... and what the webhook may write to keep it (patch nodes, held to the no-borrowers taint): also with
    # lending off when the policy has a lending section (the keeper closes and opens after the switch).
    resources.extend(lending_access.resources(policy, NAMESPACE, APP_NAME, metadata=_metadata))
    resources = in_switch_order(resources, policy)
    resources = with_placement_policy_version(resources, mutating_admission_policy)
    if served is not None:
        resources = for_served(resources, served)
    if monitoring:
        resources.extend(copy.deepcopy(build(monitoring_dir(root))))
        if runbook_base_url is not None:
            with_runbook_base_url(resources, runbook_base_url)
    deployment = _find(resources, "Deployment", APP_NAME)
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        if container["name"] == "webhook":
            container["image"] = image or default_image()
    if ca_bundle is not None:
        encoded = base64.b64encode(ca_bundle).decode("ascii")
        for hook in _find(resources, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)["webhooks"]:
            hook["clientConfig"]["caBundle"] = encoded
    return resources


def policy_warnings(policy: Policy) -> list[str]:
    warnings = []
    if policy.spec.reserved_nodes.taint is None:
        warnings.append(
            "the policy sets no reservedNodes.taint: while the webhook is unavailable (failurePolicy: Ignore) "
            "nothing keeps an unmutated training pod off the reserved nodes"
        )
    globs = [name for name in policy.spec.excluded_namespaces if any(ch in name for ch in "*?[")]
    if globs:
        warnings.append(
            f"excludedNamespaces {', '.join(globs)}: globs cannot be written as a namespaceSelector; the webhook "
            "is still called for them (and allows them untouched)"
        )
    return warnings


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Multi-line strings (the policy file, long CEL) as literal blocks, so the output stays readable.
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump(resources: list[Resource], *, header: str = "") -> str:
    body = yaml.dump_all(resources, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=110)
    return header + body


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--overlay",
        choices=OVERLAYS,
        default=DEFAULT_OVERLAY,
        help="how the serving certificate is provided: cert-manager (Issuer + Certificate, CA injected by "
        "cainjector) or self-signed (the CA made by `rocm-isolation-webhook certs`). Default: %(default)s",
    )
    parser.add_argument(
        "--ca-bundle", metavar="FILE", type=Path, help="PEM CA certificate for the self-signed overlay (certs/ca.crt)"
    )
    parser.add_argument(
        "--policy", metavar="FILE", type=Path, help="IsolationPolicy YAML to ship (default: the built-in policy)"
    )
    parser.add_argument("--image", metavar="IMAGE", help=f"container image (default: {default_image()})")
    parser.add_argument(
        "--monitoring",
        action="store_true",
        help="also render the monitoring pack (overlays/monitoring): a ServiceMonitor and a PrometheusRule for "
        "the Prometheus Operator, and a Grafana dashboard ConfigMap for Grafana's dashboard sidecar",
    )
    parser.add_argument(
        "--runbook-base-url",
        metavar="URL",
        help="with --monitoring: prefix the alerts' runbook_url (docs/operations.md#...) with the URL where "
        "this project's docs are served, e.g. https://git.example.com/org/rocm-isolation-webhook/blob/v0.1.0",
    )
    parser.add_argument(
        "--mutating-admission-policy",
        choices=mutating_policy.VERSIONS,
        default=None,
        help="the placement MutatingAdmissionPolicy (placement in the apiserver while the webhook is down): "
        "v1 for Kubernetes >= 1.36, v1beta1 for 1.35 (the apiserver needs "
        f"{minors.MAP_OPT_IN_FLAGS}; 1.34 refuses the policy: no CEL flatten()), none for older clusters. "
        "Default: the one the cluster's minor serves (--kubernetes-version, or read from the cluster), v1 without "
        "either",
    )
    parser.add_argument(
        "--kubernetes-version",
        metavar="MINOR",
        help=f"render for a stock cluster of this Kubernetes minor ({', '.join(minors.SUPPORTED)}; 1.37 and later: "
        "as 1.36) instead of reading the cluster, e.g. for GitOps: leaves out what the minor cannot store or evaluate "
        "and says on stderr, one line each, what it lacks and what holds instead",
    )
    parser.add_argument(
        "--manifests-dir",
        metavar="DIR",
        type=Path,
        help="a manifests tree to render instead of the one shipped with the package",
    )


def main(args: argparse.Namespace, served: minors.Served | None = None) -> int:
    """``served``: what the target cluster serves, read from it (``ops/manifests.py``); else from
    ``--kubernetes-version``, else the 1.36 manifests."""
    try:
        if served is None and getattr(args, "kubernetes_version", None):
            served = minors.for_minor(
                minors.parse_minor(args.kubernetes_version), placement_policy=args.mutating_admission_policy
            )
        policy_text = None
        source = "<built-in default policy>"
        if args.policy is not None:
            policy = load_policy(args.policy)  # reports unreadable and invalid files with their path
            policy_text = args.policy.read_text(encoding="utf-8")
            source = str(args.policy)
        else:
            policy = parse_policy(default_policy_text(), source=source)
        ca_bundle = read_ca_bundle(args.ca_bundle) if args.ca_bundle is not None else None
        resources = render(
            overlay=args.overlay,
            policy_text=policy_text,
            policy_source=source,
            ca_bundle=ca_bundle,
            image=args.image,
            root=args.manifests_dir,
            monitoring=args.monitoring,
            runbook_base_url=args.runbook_base_url,
            mutating_admission_policy=args.mutating_admission_policy,
            served=served,
        )
        placement = (
            minors.placement_policy_version(served, args.mutating_admission_policy)
            if served is not None
            else args.mutating_admission_policy or mutating_policy.DEFAULT_VERSION
        )
    except (RenderError, PolicyError, minors.MinorError) as err:
        print(f"rocm-isolation-webhook manifests: {err}", file=sys.stderr)
        return 2
    for warning in policy_warnings(policy):
        print(f"warning: {warning}", file=sys.stderr)
    for line in minors.missing(served, placement) if served is not None else ():
        print(f"note: {line}", file=sys.stderr)
    lending = policy.spec.lending
    said = (
        minors.lending_without_placement(
            served,
            placement,
            switchable=switchable(policy),
            enabled=lending.enabled,
            borrower_priority_class=lending.borrower_priority_class.name,
        )
        if served is not None
        else None
    )
    if said is not None:
        print(f"{said[0]}: {said[1]}", file=sys.stderr)
    header = (
        f"# Rendered by rocm-isolation-webhook {__version__}: manifests --overlay {args.overlay}"
        f"{' --monitoring' if args.monitoring else ''}"
        f"{f' --kubernetes-version {served.minor}' if served is not None else ''}"
        f" --mutating-admission-policy {placement}\n"
        f"# policy: {source} (sha256 {policy.digest[:16]})\n"
    )
    sys.stdout.write(dump(resources, header=header))
    return 0
