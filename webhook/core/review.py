"""The AdmissionReview envelope: parse the request, build the response. No web framework here.

Only the envelope is validated (apiVersion, kind, request.uid, request.operation, ...); the pod
itself stays a plain ``dict`` for the engine, which copes with any shape.

The response follows kube-apiserver's ``VerifyAdmissionResponse``
(k8s.io/apiserver ``pkg/admission/plugin/webhook/request/admissionreview.go``):

- the reply echoes the request's ``apiVersion`` and ``kind``; ``response.uid`` equals ``request.uid``;
- ``patchType: JSONPatch`` goes with a base64 ``patch`` and never alone: an empty patch is sent as
  neither (a ``patchType`` without ``patch`` is a call failure);
- a denial carries ``status: {code, message, reason}``;
- ``auditAnnotations`` keys are unprefixed qualified names (the apiserver prefixes them with the
  webhook's name).

``admission.k8s.io/v1beta1`` envelopes are accepted and answered in v1beta1, like controller-runtime
and the Kubernetes e2e webhook do: the two versions have the same shape, and the apiserver reads a
v1beta1 patch as JSONPatch. Any other apiVersion is a 400.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Final

import orjson

from webhook.core import claims, pods
from webhook.core.decision import NO_ANNOTATIONS

SUPPORTED_API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
REVIEW_KIND = "AdmissionReview"
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})

# Qualified name without prefix (k8s IsQualifiedName, name part): the apiserver rejects anything else.
_AUDIT_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

# HTTP status reasons the apiserver uses in metav1.Status.reason.
_STATUS_REASONS = {400: "BadRequest", 403: "Forbidden", 422: "Invalid", 500: "InternalError"}


class ReviewError(ValueError):
    """The body is not an AdmissionReview we can answer: the caller replies with HTTP 400."""


class AdmissionRequest:
    """The parts of ``AdmissionReview.request`` the webhook reads. ``object`` is kept as sent."""

    __slots__ = (
        "api_version", "dry_run", "kind", "name", "namespace", "object", "old_object", "operation", "resource",
        "sub_resource", "uid",
    )  # fmt: skip

    def __init__(
        self,
        *,
        api_version: str,
        uid: str,
        operation: str,
        kind: Mapping[str, str],
        resource: Mapping[str, str],
        sub_resource: str,
        namespace: str,
        name: str,
        dry_run: bool,
        object: dict[str, Any] | None,
        old_object: dict[str, Any] | None,
    ) -> None:
        self.api_version: Final = api_version
        self.uid: Final = uid
        self.operation: Final = operation
        self.kind: Final = kind
        self.resource: Final = resource
        self.sub_resource: Final = sub_resource
        self.namespace: Final = namespace
        self.name: Final = name
        self.dry_run: Final = dry_run
        self.object: Final = object
        self.old_object: Final = old_object

    @property
    def is_pod(self) -> bool:
        return (
            self.kind.get("kind") == "Pod"
            and self.kind.get("group", "") == ""
            and self.resource.get("resource", "pods") == "pods"
        )

    @property
    def is_claim(self) -> bool:
        """A ResourceClaim or ResourceClaimTemplate (resource.k8s.io): steered under device-level reservation."""
        return self.kind.get("group") == claims.GROUP and self.kind.get("kind") in (
            claims.CLAIM_KIND,
            claims.TEMPLATE_KIND,
        )

    @property
    def pod_name(self) -> str:
        """The pod's name, or its generateName (a CREATE with generateName has no name yet)."""
        return self.name or pods.pod_name(self.object or {})


class AdmissionResponse:
    """What goes into ``AdmissionReview.response``, before encoding."""

    __slots__ = ("allowed", "audit_annotations", "code", "message", "patch", "reason", "warnings")

    def __init__(
        self,
        *,
        allowed: bool,
        code: int = 200,
        message: str = "",
        reason: str = "",
        patch: tuple[Mapping[str, Any], ...] = (),
        warnings: tuple[str, ...] = (),
        audit_annotations: Mapping[str, str] = NO_ANNOTATIONS,
    ) -> None:
        self.allowed: Final = allowed
        self.code: Final = code
        self.message: Final = message
        self.reason: Final = reason
        self.patch: Final = patch
        self.warnings: Final = warnings
        self.audit_annotations: Final = audit_annotations


def _require_str(data: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ReviewError(f"{where}.{key} must be a string" if value is not None else f"{where}.{key} is missing")
    return value


def _gvk(data: Mapping[str, Any], key: str) -> dict[str, str]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ReviewError(f"request.{key} must be an object of strings")
    return {str(k): v for k, v in value.items()}


def _object(data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ReviewError(f"request.{key} must be an object or null")
    return value


def parse_review(data: Any) -> AdmissionRequest:
    """Validate the envelope of a decoded AdmissionReview; raise ReviewError naming the problem."""
    if not isinstance(data, dict):
        raise ReviewError("the body must be a JSON object (an AdmissionReview)")
    api_version = data.get("apiVersion")
    kind = data.get("kind")
    if kind != REVIEW_KIND:
        raise ReviewError(f"kind must be {REVIEW_KIND!r}, got {kind!r}")
    if api_version not in SUPPORTED_API_VERSIONS:
        raise ReviewError(f"apiVersion must be one of {', '.join(SUPPORTED_API_VERSIONS)}, got {api_version!r}")
    request = data.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request is missing (an AdmissionReview sent to a webhook carries a request)")
    uid = _require_str(request, "uid", "request")
    if not uid:
        raise ReviewError("request.uid is empty")
    operation = _require_str(request, "operation", "request")
    if operation not in OPERATIONS:
        raise ReviewError(f"request.operation must be one of {', '.join(sorted(OPERATIONS))}, got {operation!r}")
    dry_run = request.get("dryRun", False)
    if dry_run is None:
        dry_run = False
    if not isinstance(dry_run, bool):
        raise ReviewError("request.dryRun must be a boolean")
    return AdmissionRequest(
        api_version=str(api_version),
        uid=uid,
        operation=operation,
        kind=_gvk(request, "kind"),
        resource=_gvk(request, "resource"),
        sub_resource=_require_str(request, "subResource", "request", required=False),
        namespace=_require_str(request, "namespace", "request", required=False),
        name=_require_str(request, "name", "request", required=False),
        dry_run=dry_run,
        object=_object(request, "object"),
        old_object=_object(request, "oldObject"),
    )


def allowed(*, warnings: Sequence[str] = (), audit_annotations: Mapping[str, str] | None = None) -> AdmissionResponse:
    return AdmissionResponse(
        allowed=True, warnings=tuple(warnings), audit_annotations=audit_annotations or NO_ANNOTATIONS
    )


def patched(
    patch: Sequence[Mapping[str, Any]],
    *,
    warnings: Sequence[str] = (),
    audit_annotations: Mapping[str, str] | None = None,
) -> AdmissionResponse:
    return AdmissionResponse(
        allowed=True,
        patch=tuple(patch),
        warnings=tuple(warnings),
        audit_annotations=audit_annotations or NO_ANNOTATIONS,
    )


def denied(
    message: str,
    *,
    code: int = 403,
    warnings: Sequence[str] = (),
    audit_annotations: Mapping[str, str] | None = None,
) -> AdmissionResponse:
    return AdmissionResponse(
        allowed=False,
        code=code,
        message=message,
        reason=_STATUS_REASONS.get(code, ""),
        warnings=tuple(warnings),
        audit_annotations=audit_annotations or NO_ANNOTATIONS,
    )


def errored(message: str, *, code: int = 500) -> AdmissionResponse:
    """An internal failure, still answered as a well-formed review (controller-runtime's ``Errored``)."""
    return denied(message, code=code)


def _clean_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    return {key: str(value) for key, value in annotations.items() if _valid_audit_key(key)}


@lru_cache(maxsize=1024)
def _valid_audit_key(key: object) -> bool:
    # The same few keys in every reply: each is checked once.
    return isinstance(key, str) and _AUDIT_KEY.match(key) is not None


def encode_patch(patch: Sequence[Mapping[str, Any]]) -> str:
    return binascii.b2a_base64(orjson.dumps(patch), newline=False).decode("ascii")


def review_response(request: AdmissionRequest, response: AdmissionResponse) -> dict[str, Any]:
    """The AdmissionReview to send back for ``request``."""
    body: dict[str, Any] = {"uid": request.uid, "allowed": response.allowed}
    if not response.allowed:
        status: dict[str, Any] = {"code": response.code, "message": response.message}
        if response.reason:
            status["reason"] = response.reason
        body["status"] = status
    elif response.patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = encode_patch(response.patch)
    if response.warnings:
        body["warnings"] = list(response.warnings)
    annotations = _clean_annotations(response.audit_annotations)
    if annotations:
        body["auditAnnotations"] = annotations
    return {"apiVersion": request.api_version, "kind": REVIEW_KIND, "response": body}
