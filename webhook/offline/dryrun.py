"""``mutate``: the webhook's decision run offline on manifests, the pod author's and CI's dry run.

Every pod, every pod template of a known workload (core controllers and the ML CRDs of
``workloads.TABLE``) and every AdmissionReview in the input goes through the same ``decide`` as
``serve``, as a CREATE (or the review's own operation), with the labels the template's controller
will add and the DRA claims of the input's ResourceClaim(Template) documents. The engine's patch
is relative to the pod; here it is moved to where the pod sits in the object (``/spec/template``,
``/request/object``, a KServe component's fields) and applied to the object itself, so the
manifests printed are by construction what the patch gives.

While a device-level reservation is active (a reserved DeviceClass document of the input labelled
active, or ``--device-reservation-active``), the ResourceClaim and ResourceClaimTemplate documents of
``resource.k8s.io/v1`` go through the same ``decide_claim`` as ``serve``, and the pods see the claims
as they will be admitted (steered).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from webhook.core.decision import DeviceFacts, NodeFacts
from webhook.core.engine import CLAIM_UNRESOLVED, LABELS_UNKNOWN
from webhook.core.policy import PolicyError, default_policy, load_policy
from webhook.offline import manifest_yaml
from webhook.offline.documents import (
    Document,
    DryRunError,
    Facts,
    api_group,
    claim_documents,
    device_class_documents,
    namespace_labels,
    parse_documents,
    read_text,
)
from webhook.offline.outcomes import RULE_PATCH_FAILED, Outcome, process_document, process_object

EXIT_ADMITTED = 0
EXIT_DENIED = 1
EXIT_UNREADABLE = 2

CORE_KINDS = frozenset({("batch", "Job"), ("batch", "CronJob")})
CLAIM_NOT_IN_INPUT = "could not be resolved (not in the input: add its document to the manifests checked)"

EPILOG = """\
input:
  Multi-document YAML or JSON (a file, or - for stdin; -f may be repeated): Pods; the pod
  templates of Deployments, StatefulSets, DaemonSets, ReplicaSets, ReplicationControllers, Jobs
  and CronJobs, and of the ML workload CRDs (Kubeflow PyTorchJob, TFJob, MPIJob, PaddleJob,
  XGBoostJob, JAXJob; Trainer TrainJob, TrainingRuntime, ClusterTrainingRuntime; JobSet;
  LeaderWorkerSet; RayCluster, RayJob, RayService; KServe InferenceService; Volcano Job): each
  checked as a CREATE of the pod the controller would make, with the labels it would add;
  AdmissionReviews (admission.k8s.io/v1: request.object is checked with request.operation,
  request.namespace and request.oldObject); and the items of a List. Other kinds are passed
  through unchanged, with a note on stderr (and a warning when they request a GPU). Empty
  documents (e.g. after a trailing ---) are skipped.

namespace of an object:
  metadata.namespace (for a review: request.namespace), else --namespace (default: default).

namespace labels (they decide the class, the mode and the Pod Security level), first that applies:
  1. --namespace-label KEY=VALUE: the labels of every object's namespace;
  2. the labels of a `kind: Namespace` document of the same name in the input;
  3. unknown: the policy's defaultClass applies, and stderr says so once per run.

DRA claims: ResourceClaim and ResourceClaimTemplate documents (resource.k8s.io v1, v1beta2,
  v1beta1) in the input resolve the claims of the pods in their namespace; a claim not in the
  input counts as a GPU request, with a warning.

device-level reservation (pool apply --devices-per-node), active when the input holds the reserved
  DeviceClass labelled rocm-isolation.io/device-reservation=active, or with --device-reservation-active:
  resource.k8s.io/v1 ResourceClaims and ResourceClaimTemplates are checked as CREATEs and printed as
  they will be admitted (GPU requests pointed at the reserved or the shared DeviceClass; the reserved
  one denied where no inference class is allowed), the pods see them so, and a pod's amd.com/gpu and
  deviceclass.resource.kubernetes.io/<GPU class> are steered like the webhook steers them. A claim
  of v1beta1 or v1beta2 is printed unchanged with a note: the webhook sees it converted to v1, which
  the dry run does not do.

output (stdout):
  manifests  the objects in input order, mutated, as multi-document YAML; an object left unchanged
             (or denied) is printed as the text it came in, so the stream stays aligned with the input.
  patch      a JSON array, one entry per object: file, document, item (List items only), apiVersion,
             kind, namespace, name, allowed, rule, message, warnings, podPath (where the pod sits
             in the object; null for CRDs, whose entry lists its templates in "templates") and
             patch: RFC 6902 operations relative to that object (the document, or items[item] of a
             List); applying them gives the object of the manifests output.

stderr: one line per object (per pod template for CRDs: what was done, or why it is denied) and
  its warnings.
exit status: 0 all admitted, 1 any denied (or, with --strict, a GPU request the dry run cannot
  check), 2 unreadable input or policy.
"""


# --- command line ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "-f",
        "--filename",
        dest="filenames",
        action="append",
        required=True,
        metavar="FILE",
        help="manifests to check (YAML or JSON, - for stdin); may be repeated",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="namespace of objects that name none (default: %(default)s)",
    )
    parser.add_argument(
        "--namespace-label",
        dest="namespace_labels",
        action="append",
        type=_label,
        default=[],
        metavar="KEY=VALUE",
        help="a label of the objects' namespace; may be repeated (overrides Namespace documents)",
    )
    parser.add_argument(
        "--reserved-node",
        dest="reserved_nodes",
        action="append",
        default=[],
        metavar="NAME",
        help="name of a reserved node, to check spec.nodeName and matchFields; may be repeated",
    )
    parser.add_argument(
        "--device-reservation-active",
        action="store_true",
        help="assume a device-level reservation is active (the reserved DeviceClass labelled "
        "rocm-isolation.io/device-reservation=active, as pool apply --devices-per-node leaves it), whatever the "
        "input's DeviceClass documents say: claims and DRA extended resources are decided as the webhook then "
        "decides them",
    )
    parser.add_argument("--policy", metavar="FILE", help="IsolationPolicy YAML (default: the built-in policy)")
    parser.add_argument(
        "-o",
        "--output",
        choices=("manifests", "patch"),
        default="manifests",
        help="print the mutated manifests (YAML) or the JSON patches (default: %(default)s)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="do not print the policy's warnings")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when an object the dry run cannot check (an unknown kind) requests a GPU",
    )


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def main(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy) if args.policy else default_policy()
        documents = [doc for name in args.filenames for doc in parse_documents(name, read_text(name))]
        devices = device_class_documents(documents, policy)
        if args.device_reservation_active:
            devices = DeviceFacts(devices.gpu_classes, devices.extended_resources, devices_reserved=True)
        facts = Facts(
            policy=policy,
            nodes=NodeFacts(frozenset(args.reserved_nodes) if args.reserved_nodes else None),
            default_namespace=args.namespace,
            given_labels=dict(args.namespace_labels) if args.namespace_labels else None,
            namespace_documents=namespace_labels(documents),
            devices=devices,
        )
        # The pods see the claims as they will be admitted (steered while a reservation is active); deciding a
        # claim needs no claim facts.
        unresolved = facts
        facts = replace(
            facts,
            claim_documents=claim_documents(
                documents, args.namespace, lambda item: process_object(item, unresolved).output
            ),
        )
        results = [process_document(doc, facts) for doc in documents]
    except (DryRunError, PolicyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    if not args.quiet:
        for warning in policy.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    outcomes = [outcome for _, found in results for outcome in found]
    unlabelled = unlabelled_namespaces(outcomes)
    if unlabelled:
        print(
            f"warning: namespace labels not given for {', '.join(unlabelled)} (no --namespace-label, no Namespace "
            "document): the class comes from the namespace rules by name or the policy's defaultClass; label "
            "rules, the mode label and Pod Security labels were not checked",
            file=sys.stderr,
        )
    for outcome in outcomes:
        print("\n".join(report_lines(outcome)), file=sys.stderr)
    if args.output == "patch":
        sys.stdout.write(json.dumps([patch_entry(o) for o in outcomes], indent=2) + "\n")
    else:
        sys.stdout.write(dump_manifests(documents, (output for output, _ in results)))
    if not all(o.allowed for o in outcomes):
        return EXIT_DENIED
    if args.strict and any(o.uncovered for o in outcomes):
        return EXIT_DENIED
    return EXIT_ADMITTED


def unlabelled_namespaces(outcomes: Sequence[Outcome]) -> list[str]:
    """Namespaces whose labels were unknown, in order of first use (said once per run, not per object)."""
    found: dict[str, None] = {}
    for outcome in outcomes:
        for warnings in (outcome.warnings, *(t.warnings for t in outcome.templates)):
            for warning in warnings:
                if LABELS_UNKNOWN in warning and warning.startswith("namespace "):
                    found[warning.removeprefix("namespace ").partition(LABELS_UNKNOWN)[0]] = None
    return list(found)


def _shown(warnings: Iterable[str]) -> list[str]:
    # The engine's per-review "labels unknown" warning is said once per run by main(); offline, a claim
    # the engine does not know is one the input does not contain.
    return [_offline(w) for w in warnings if LABELS_UNKNOWN not in w]


def _offline(warning: str) -> str:
    return warning.replace(CLAIM_UNRESOLVED, CLAIM_NOT_IN_INPUT)


# --- output ---------------------------------------------------------------------------------


def _who(outcome: Outcome) -> str:
    kind, namespace, name = outcome.body["kind"], outcome.namespace, outcome.name
    group = api_group(outcome.body["apiVersion"])
    if outcome.templates and (group, kind) not in CORE_KINDS and ("batch", kind) in CORE_KINDS:
        kind = f"{kind}.{group}"  # kubectl's spelling, where the kind alone names a core kind (Volcano's Job)
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"


def report_lines(outcome: Outcome) -> list[str]:
    who = _who(outcome)
    if outcome.templates:
        lines = []
        for template in outcome.templates:
            if not template.allowed:
                what = f"denied [{template.rule}] (fields are {template.fields}): {template.message}"
            elif not outcome.allowed:
                what = f"admitted, not printed (the object is denied): {template.message}"
            else:
                what = f"{'mutated' if template.patch else 'unchanged'}: {template.message}"
            lines.append(f"{outcome.where}: {who} {template.name}: {what}")
            lines.extend(f"  warning: {w}" for w in _shown(template.warnings))
        if not outcome.allowed and outcome.rule == RULE_PATCH_FAILED:
            lines.append(f"{outcome.where}: {who}: denied [{outcome.rule}]: {outcome.message}")
        return lines
    if outcome.verdict == "denied":
        where = f" (fields are relative to {_dotted(outcome.pod_path)})" if outcome.pod_path else ""
        what = f"denied [{outcome.rule}]{where}: {outcome.message}"
    else:
        what = f"{outcome.verdict}: {outcome.message}"
    return [f"{outcome.where}: {who}: {what}", *(f"  warning: {w}" for w in _shown(outcome.warnings))]


def _dotted(pointer: str) -> str:
    return pointer[1:].replace("/", ".")


def patch_entry(outcome: Outcome) -> dict[str, Any]:
    entry: dict[str, Any] = {"file": outcome.where.file, "document": outcome.where.document}
    if outcome.where.item is not None:
        entry["item"] = outcome.where.item
    entry.update(
        apiVersion=outcome.body["apiVersion"],
        kind=outcome.body["kind"],
        namespace=outcome.namespace,
        name=outcome.name,
        allowed=outcome.allowed,
        rule=outcome.rule,
        message=outcome.message,
        warnings=[_offline(w) for w in outcome.warnings],
        podPath=outcome.pod_path,
        patch=list(outcome.patch),
    )
    if outcome.templates:
        entry["templates"] = [
            {
                "name": t.name,
                "podPath": t.pod_path,
                "allowed": t.allowed,
                "rule": t.rule,
                "message": t.message,
                "warnings": [_offline(w) for w in t.warnings],
            }
            for t in outcome.templates
        ]
    if outcome.uncovered:
        entry["gpuRequests"] = list(outcome.uncovered)
    return entry


def dump_manifests(documents: Iterable[Document], outputs: Iterable[Any]) -> str:
    """The printed stream: a document left as it was is its input text; a changed one keeps its comments."""
    return manifest_yaml.dump((doc.source, doc.body, output) for doc, output in zip(documents, outputs, strict=True))
