"""The dry run's input: manifests read into documents (files or stdin, Lists unrolled, where each came
from), and what the input says of the cluster (Namespaces, DRA claims and DeviceClasses) as the facts
the engine is given."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.core import claims, pods
from webhook.core.decision import NO_CLAIMS, NO_DEVICES, ClaimFacts, DeviceFacts, NamespaceFacts, NodeFacts
from webhook.core.policy import Policy
from webhook.offline import manifest_yaml

STDIN = "-"


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
    claim_documents: Mapping[str, ClaimFacts] = field(default_factory=dict)
    # The DeviceClass documents of the input: GPU classes by driver and their extendedResourceNames.
    devices: DeviceFacts = NO_DEVICES

    def namespace(self, name: str) -> NamespaceFacts:
        if self.given_labels is not None:
            return NamespaceFacts(name, self.given_labels)
        return NamespaceFacts(name, self.namespace_documents.get(name))

    def claims_in(self, namespace: str) -> ClaimFacts:
        return self.claim_documents.get(namespace, NO_CLAIMS)

    @property
    def spread_label_keys(self) -> frozenset[str]:
        """Label keys the engine keeps out of a spread's matchLabels: a controller label with one of
        these keys may be given to the engine with a placeholder value (it never reaches the output)."""
        return spread_label_keys(self.policy)


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


def api_group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def metadata_of(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(body.get("metadata"))


def object_items(doc: Document) -> Iterator[Document]:
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


def spread_label_keys(policy: Policy) -> frozenset[str]:
    """The label keys the engine keeps out of a spread's matchLabels (policy spec.spreadSelector);
    none when the engine knows no such keys, so that no placeholder can reach a selector."""
    selector = getattr(policy.spec, "spread_selector", None)
    if selector is None:
        return frozenset()
    excluded = getattr(selector, "excluded_label_keys", ())
    match = getattr(selector, "match_label_keys", ())
    return frozenset(excluded) | frozenset(match)


def claim_documents(
    documents: Iterable[Document], default_namespace: str, admitted: Callable[[Document], dict[str, Any]] | None = None
) -> dict[str, ClaimFacts]:
    """The device classes of the ResourceClaim and ResourceClaimTemplate documents, by namespace; of each
    claim as ``admitted`` prints it (the object the webhook's steering gives), when given."""
    found: dict[str, tuple[dict[str, frozenset[str]], dict[str, frozenset[str]]]] = {}
    for doc in documents:
        for item in object_items(doc):
            if not claims.is_claim_kind(item.body["apiVersion"], item.body["kind"]):
                continue
            body = admitted(item) if admitted is not None else item.body
            metadata = metadata_of(body)
            name = metadata.get("name")
            if not isinstance(name, str) or not name:
                raise InputError(f"{item.where}: {body['kind']}: metadata.name is missing")
            try:
                classes = claims.device_classes(body)
            except claims.MalformedClaim as err:
                raise InputError(f"{item.where}: {body['kind']} {name}: {err}") from None
            namespace = metadata.get("namespace") or default_namespace
            if not isinstance(namespace, str):
                raise InputError(f"{item.where}: {body['kind']} {name}: metadata.namespace must be a string")
            by_claim, by_template = found.setdefault(namespace, ({}, {}))
            (by_template if body["kind"] == claims.TEMPLATE_KIND else by_claim)[name] = classes
    return {namespace: ClaimFacts(claims=c, templates=t) for namespace, (c, t) in found.items()}


def device_class_documents(documents: Iterable[Document], policy: Policy) -> DeviceFacts:
    """What the DeviceClass documents of the input add to the GPU routes (as the webhook's DeviceClass
    watch does): classes selecting a GPU driver, whatever they are called, and their extendedResourceNames."""
    found: dict[str, claims.DeviceClassInfo] = {}
    for doc in documents:
        for item in object_items(doc):
            body = item.body
            if not claims.is_device_class_kind(body["apiVersion"], body["kind"]):
                continue
            name = metadata_of(body).get("name")
            if not isinstance(name, str) or not name:
                raise InputError(f"{item.where}: DeviceClass: metadata.name is missing")
            try:
                found[name] = claims.device_class_info(body)
            except claims.MalformedClaim as err:
                raise InputError(f"{item.where}: DeviceClass {name}: {err}") from None
    return (
        claims.device_facts(found, policy.spec.scope.gpu_drivers, policy.spec.reserved_devices.reserved_class_name)
        if found
        else NO_DEVICES
    )


def namespace_labels(documents: Iterable[Document]) -> dict[str, Mapping[str, str]]:
    """Labels of the ``kind: Namespace`` documents in the input, by namespace name."""
    found: dict[str, Mapping[str, str]] = {}
    for doc in documents:
        for item in object_items(doc):
            if item.body["kind"] != "Namespace" or api_group(item.body["apiVersion"]) != "":
                continue
            name = metadata_of(item.body).get("name")
            try:
                labels = pods.string_map(metadata_of(item.body).get("labels"), "metadata.labels")
            except pods.MalformedPod as err:
                raise InputError(f"{item.where}: Namespace {name}: {err}") from None
            if isinstance(name, str):
                found[name] = labels
    return found
