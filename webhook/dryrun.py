"""``mutate``: the webhook's decision run offline on manifests, the pod author's and CI's dry run.

Every pod, pod template (Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController,
Job, CronJob) and AdmissionReview in the input goes through the same ``decide`` as ``serve``,
as a CREATE (or the review's own operation). The engine's patch is relative to the pod; here it is
prefixed with where the pod sits in the object (``/spec/template``, ``/request/object``) and
applied to the object itself, so the manifests printed are by construction what the patch gives.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jsonpatch

from webhook import manifest_yaml, patch, pods
from webhook.decision import Decision, NamespaceFacts, NodeFacts
from webhook.engine import RULE_MALFORMED, decide
from webhook.policy import Policy, PolicyError, default_policy, load_policy

STDIN = "-"
EXIT_ADMITTED = 0
EXIT_DENIED = 1
EXIT_UNREADABLE = 2
RULE_PASSED = "passed-through"
RULE_PATCH_FAILED = "patch-not-applicable"

# kind -> (API groups it is recognised in, where its pod template sits)
WORKLOADS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "Pod": (frozenset({""}), ()),
    "Deployment": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "StatefulSet": (frozenset({"apps"}), ("spec", "template")),
    "DaemonSet": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "ReplicaSet": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "ReplicationController": (frozenset({""}), ("spec", "template")),
    "Job": (frozenset({"batch"}), ("spec", "template")),
    "CronJob": (frozenset({"batch"}), ("spec", "jobTemplate", "spec", "template")),
}
REVIEW_PATH = ("request", "object")
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")

EPILOG = """\
input:
  Multi-document YAML or JSON (a file, or - for stdin; -f may be repeated): Pods; the pod
  templates of Deployments, StatefulSets, DaemonSets, ReplicaSets, ReplicationControllers, Jobs
  and CronJobs (checked as a CREATE of the pod the controller would make); AdmissionReviews
  (admission.k8s.io/v1: request.object is checked with request.operation, request.namespace and
  request.oldObject); and the items of a List. Other kinds are passed through unchanged, with a
  note on stderr. Empty documents (e.g. after a trailing ---) are skipped.

namespace of an object:
  metadata.namespace (for a review: request.namespace), else --namespace (default: default).

namespace labels (they decide the class, the mode and the Pod Security level), first that applies:
  1. --namespace-label KEY=VALUE: the labels of every object's namespace;
  2. the labels of a `kind: Namespace` document of the same name in the input;
  3. unknown: the policy's defaultClass applies and each object gets a warning.

output (stdout):
  manifests  the objects in input order, mutated, as multi-document YAML; an object left unchanged
             (or denied) is printed as the text it came in, so the stream stays aligned with the input.
  patch      a JSON array, one entry per object: file, document, item (List items only), apiVersion,
             kind, namespace, name, allowed, rule, message, warnings, podPath (where the pod sits
             in the object) and patch: RFC 6902 operations relative to that object (the document,
             or items[item] of a List); applying them gives the object of the manifests output.

stderr: one line per object (what was done, or why it is denied) and its warnings.
exit status: 0 all admitted, 1 any denied, 2 unreadable input or policy.
"""


class DryRunError(Exception):
    """The dry run cannot start: the input or the policy cannot be used (exit 2)."""


class InputError(DryRunError):
    """An input document cannot be read; the message names the file and the document."""


@dataclass(frozen=True)
class Location:
    file: str
    document: int
    item: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}: document {self.document}"
        return where if self.item is None else f"{where}, items[{self.item}]"


@dataclass(frozen=True)
class Document:
    where: Location
    body: dict[str, Any]
    source: manifest_yaml.Source | None = None  # the text it came in, to print it unchanged


@dataclass(frozen=True)
class Facts:
    """What the engine is told about the cluster; offline, most of it comes from the command line."""

    policy: Policy
    nodes: NodeFacts
    default_namespace: str
    given_labels: Mapping[str, str] | None
    namespace_documents: Mapping[str, Mapping[str, str]]

    def namespace(self, name: str) -> NamespaceFacts:
        if self.given_labels is not None:
            return NamespaceFacts(name, self.given_labels)
        return NamespaceFacts(name, self.namespace_documents.get(name))


Verdict = Literal["mutated", "unchanged", "denied", "passed through"]


@dataclass(frozen=True)
class Outcome:
    """One object's result: the object printed, the patch that leads to it, and what to report."""

    where: Location
    body: dict[str, Any]
    namespace: str | None
    name: str
    output: dict[str, Any]
    verdict: Verdict
    rule: str
    message: str
    pod_path: str | None = None
    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.verdict != "denied"


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
    parser.add_argument("--policy", metavar="FILE", help="IsolationPolicy YAML (default: the built-in policy)")
    parser.add_argument(
        "-o",
        "--output",
        choices=("manifests", "patch"),
        default="manifests",
        help="print the mutated manifests (YAML) or the JSON patches (default: %(default)s)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="do not print the policy's warnings")


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def main(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy) if args.policy else default_policy()
        documents = [doc for name in args.filenames for doc in parse_documents(name, read_text(name))]
        facts = Facts(
            policy=policy,
            nodes=NodeFacts(frozenset(args.reserved_nodes) if args.reserved_nodes else None),
            default_namespace=args.namespace,
            given_labels=dict(args.namespace_labels) if args.namespace_labels else None,
            namespace_documents=namespace_labels(documents),
        )
        results = [process_document(doc, facts) for doc in documents]
    except (DryRunError, PolicyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    if not args.quiet:
        for warning in policy.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    outcomes = [outcome for _, found in results for outcome in found]
    for outcome in outcomes:
        print("\n".join(report_lines(outcome)), file=sys.stderr)
    if args.output == "patch":
        sys.stdout.write(json.dumps([patch_entry(o) for o in outcomes], indent=2) + "\n")
    else:
        sys.stdout.write(dump_manifests(documents, (output for output, _ in results)))
    return EXIT_ADMITTED if all(o.allowed for o in outcomes) else EXIT_DENIED


# --- input ----------------------------------------------------------------------------------


def read_text(name: str) -> str:
    try:
        if name == STDIN:
            return sys.stdin.read()
        return Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{_file_label(name)}: cannot read: {err}") from None


def _file_label(name: str) -> str:
    return "<stdin>" if name == STDIN else name


def parse_documents(name: str, text: str) -> list[Document]:
    """The objects of a YAML or JSON stream, read as kubectl reads them; null documents are skipped."""
    label = _file_label(name)
    try:
        loaded = manifest_yaml.load(text)
    except manifest_yaml.ReadError as err:
        raise InputError(f"{label}: {err}") from None
    documents = []
    for found in loaded:
        where = Location(label, found.number)
        _check_object(found.body, where)
        documents.append(Document(where, found.body, found.source))
    return documents


def _check_object(body: Any, where: Location) -> None:
    if not isinstance(body, dict):
        raise InputError(f"{where}: not a Kubernetes object (a mapping with apiVersion and kind)")
    for key in ("apiVersion", "kind"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise InputError(f"{where}: not a Kubernetes object: {key} is missing")


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _metadata(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(body.get("metadata"))


def _items(doc: Document) -> Iterator[Document]:
    """The document itself, or the items of a List (an item may omit kind: a PodList's items are Pods)."""
    body = doc.body
    kind = body["kind"]
    if not (kind.endswith("List") and isinstance(body.get("items"), list)):
        yield doc
        return
    for index, item in enumerate(body["items"]):
        where = Location(doc.where.file, doc.where.document, index)
        if isinstance(item, dict) and "kind" not in item and kind != "List":
            item = {"apiVersion": body["apiVersion"], "kind": kind.removesuffix("List"), **item}
        _check_object(item, where)
        yield Document(where, item)


def namespace_labels(documents: Iterable[Document]) -> dict[str, Mapping[str, str]]:
    """Labels of the ``kind: Namespace`` documents in the input, by namespace name."""
    found: dict[str, Mapping[str, str]] = {}
    for doc in documents:
        for item in _items(doc):
            if item.body["kind"] != "Namespace" or _group(item.body["apiVersion"]) != "":
                continue
            name = _metadata(item.body).get("name")
            try:
                labels = pods.string_map(_metadata(item.body).get("labels"), "metadata.labels")
            except pods.MalformedPod as err:
                raise InputError(f"{item.where}: Namespace {name}: {err}") from None
            if isinstance(name, str):
                found[name] = labels
    return found


# --- decision -------------------------------------------------------------------------------


def process_document(doc: Document, facts: Facts) -> tuple[dict[str, Any], list[Outcome]]:
    """The document to print, and one outcome per object in it (one, or one per List item)."""
    items = list(_items(doc))
    if len(items) == 1 and items[0] is doc:
        outcome = process_object(doc, facts)
        return outcome.output, [outcome]
    outcomes = [process_object(item, facts) for item in items]
    return {**doc.body, "items": [o.output for o in outcomes]}, outcomes


def process_object(doc: Document, facts: Facts) -> Outcome:
    body = doc.body
    kind, group = body["kind"], _group(body["apiVersion"])
    if kind == "AdmissionReview" and group == "admission.k8s.io":
        return _review(doc, facts)
    workload = WORKLOADS.get(kind)
    if workload is None or group not in workload[0]:
        return _passed(doc, _pass_reason(body, facts))
    _, template_path = workload
    namespace = str(_metadata(body).get("namespace") or facts.default_namespace)
    try:
        pod = _pod_of(body, template_path)
    except pods.MalformedPod as err:
        return _malformed(doc, namespace, template_path, err)
    decision = decide(
        operation="CREATE",
        pod=pod,
        namespace=facts.namespace(namespace),
        nodes=facts.nodes,
        policy=facts.policy,
    )
    return _apply(doc, namespace, pods.pod_name(body), template_path, decision)


def _pass_reason(body: Mapping[str, Any], facts: Facts) -> str:
    if body["kind"] == "Namespace" and _group(body["apiVersion"]) == "":
        if facts.given_labels is None:
            return "its labels are used for the objects in it"
        return "its labels are not used (--namespace-label given)"
    return f"{body['apiVersion']} {body['kind']} is not a pod or a known workload with a pod template"


def _pod_of(body: Mapping[str, Any], template_path: tuple[str, ...]) -> Any:
    """The pod the workload's controller would create: the template's metadata and spec, as they are."""
    if not template_path:
        return body
    template = pods.mapping(patch.resolve(body, template_path), ".".join(template_path))
    return {"apiVersion": "v1", "kind": "Pod", **{k: template[k] for k in ("metadata", "spec") if k in template}}


def _review(doc: Document, facts: Facts) -> Outcome:
    request = doc.body.get("request")
    if not isinstance(request, Mapping):
        raise InputError(f"{doc.where}: AdmissionReview: request must be an object")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise InputError(f"{doc.where}: AdmissionReview: request.operation must be one of {', '.join(OPERATIONS)}")
    obj, old = request.get("object"), request.get("oldObject")
    request_kind = _mapping(request.get("kind")).get("kind") or _mapping(obj).get("kind")
    if request_kind != "Pod":
        return _passed(doc, f"the AdmissionReview is for a {request_kind or 'non-pod object'}, not a pod")
    namespace = str(request.get("namespace") or _metadata(_mapping(obj)).get("namespace") or facts.default_namespace)
    decision = decide(
        operation=str(operation),
        pod=obj,
        old_pod=old,
        namespace=facts.namespace(namespace),
        nodes=facts.nodes,
        policy=facts.policy,
    )
    name = str(request.get("name") or pods.pod_name(_mapping(obj)))
    return _apply(doc, namespace, name, REVIEW_PATH, decision)


def _apply(doc: Document, namespace: str, name: str, pod_path: tuple[str, ...], decision: Decision) -> Outcome:
    common: dict[str, Any] = {
        "where": doc.where,
        "body": doc.body,
        "namespace": namespace,
        "name": name,
        "pod_path": patch.pointer(*pod_path),
        "warnings": decision.warnings,
    }
    if not decision.allowed:
        return Outcome(**common, output=doc.body, verdict="denied", rule=decision.rule, message=decision.message)
    operations = prefixed(decision.patch, doc.body, pod_path)
    try:
        output = jsonpatch.apply_patch(doc.body, operations)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
        # The apiserver fails the request when a webhook's patch does not apply.
        return Outcome(
            **common,
            output=doc.body,
            verdict="denied",
            rule=RULE_PATCH_FAILED,
            message=f"the webhook's patch does not apply to this object ({str(err)[:200]}); please report this as a bug",
        )
    return Outcome(
        **common,
        output=output,
        verdict="mutated" if operations else "unchanged",
        rule=decision.rule,
        message=decision.message,
        patch=tuple(operations),
    )


def prefixed(
    operations: Sequence[Mapping[str, Any]], body: Mapping[str, Any], pod_path: Sequence[str]
) -> list[dict[str, Any]]:
    """The pod's operations made relative to the object, creating the pod's parents when absent."""
    if not operations:
        return []
    prefix = patch.pointer(*pod_path)
    out: list[dict[str, Any]] = []
    if pod_path and not isinstance(patch.resolve(body, pod_path), Mapping):
        out.extend(patch.set_map_entries(pods.mapping(body, "the document"), tuple(pod_path[:-1]), {pod_path[-1]: {}}))
    for operation in operations:
        moved = {**operation, "path": prefix + operation["path"]}
        if "from" in operation:
            moved["from"] = prefix + operation["from"]
        out.append(moved)
    return out


def _passed(doc: Document, why: str) -> Outcome:
    namespace = _metadata(doc.body).get("namespace")
    return Outcome(
        where=doc.where,
        body=doc.body,
        namespace=namespace if isinstance(namespace, str) else None,
        name=pods.pod_name(doc.body),
        output=doc.body,
        verdict="passed through",
        rule=RULE_PASSED,
        message=why,
    )


def _malformed(doc: Document, namespace: str, pod_path: tuple[str, ...], err: pods.MalformedPod) -> Outcome:
    return Outcome(
        where=doc.where,
        body=doc.body,
        namespace=namespace,
        name=pods.pod_name(doc.body),
        output=doc.body,
        verdict="denied",
        rule=RULE_MALFORMED,
        message=f"the pod template cannot be checked: {err}",
        pod_path=patch.pointer(*pod_path),
    )


# --- output ---------------------------------------------------------------------------------


def report_lines(outcome: Outcome) -> list[str]:
    kind, namespace, name = outcome.body["kind"], outcome.namespace, outcome.name
    who = f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"
    if outcome.verdict == "denied":
        where = f" (fields are relative to {outcome.pod_path[1:].replace('/', '.')})" if outcome.pod_path else ""
        what = f"denied [{outcome.rule}]{where}: {outcome.message}"
    else:
        what = f"{outcome.verdict}: {outcome.message}"
    return [f"{outcome.where}: {who}: {what}", *(f"  warning: {w}" for w in outcome.warnings)]


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
        warnings=list(outcome.warnings),
        podPath=outcome.pod_path,
        patch=list(outcome.patch),
    )
    return entry


def dump_manifests(documents: Iterable[Document], outputs: Iterable[Any]) -> str:
    """The printed stream: a document left as it was is its input text; a changed one keeps its comments."""
    return manifest_yaml.dump((doc.source, doc.body, output) for doc, output in zip(documents, outputs, strict=True))
