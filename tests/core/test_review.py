"""The AdmissionReview envelope: what is accepted, what is a 400, and the shape of every reply."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from conftest import load_review

from webhook.core import review


def test_parse_keeps_the_object_as_sent() -> None:
    data = load_review("training-pod-create.json")
    request = review.parse_review(data)
    assert request.uid == data["request"]["uid"]
    assert request.operation == "CREATE"
    assert request.is_pod and not request.sub_resource
    assert request.object is data["request"]["object"]
    assert request.pod_name == "llama-finetune-"
    assert request.dry_run is False


def _review(**request: Any) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ([], "JSON object"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}, "kind"),
        ({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {}}, "apiVersion"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request is missing"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": "x"}, "request is missing"),
        (_review(operation="CREATE"), "request.uid is missing"),
        (_review(uid="", operation="CREATE"), "request.uid is empty"),
        (_review(uid=7, operation="CREATE"), "request.uid must be a string"),
        (_review(uid="u"), "request.operation is missing"),
        (_review(uid="u", operation="PATCH"), "request.operation must be one of"),
        (_review(uid="u", operation="CREATE", dryRun="yes"), "dryRun"),
        (_review(uid="u", operation="CREATE", object=[1]), "request.object"),
        (_review(uid="u", operation="CREATE", kind="Pod"), "request.kind"),
        (_review(uid="u", operation="CREATE", namespace=3), "request.namespace"),
    ],
)
def test_bad_envelopes_name_the_problem(data: Any, problem: str) -> None:
    with pytest.raises(review.ReviewError, match=problem):
        review.parse_review(data)


def test_delete_with_null_object_parses() -> None:
    request = review.parse_review(_review(uid="u", operation="DELETE", object=None, oldObject={"kind": "Pod"}))
    assert request.object is None and request.old_object == {"kind": "Pod"}


def test_subresource_and_non_pod_are_recognised() -> None:
    status = review.parse_review(
        _review(
            uid="u",
            operation="UPDATE",
            kind={"group": "", "version": "v1", "kind": "Pod"},
            resource={"group": "", "version": "v1", "resource": "pods"},
            subResource="status",
        )
    )
    assert status.sub_resource == "status"
    config_map = review.parse_review(
        _review(uid="u", operation="CREATE", kind={"group": "", "version": "v1", "kind": "ConfigMap"})
    )
    assert not config_map.is_pod


def _request(api_version: str = "admission.k8s.io/v1") -> review.AdmissionRequest:
    data = load_review("training-pod-create.json")
    data["apiVersion"] = api_version
    return review.parse_review(data)


def test_allowed_reply_has_no_patch_type() -> None:
    body = review.review_response(_request(), review.allowed())
    assert body == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "6f1c2b1e-6a0e-4d8e-9a53-0b7d1f0c0001", "allowed": True},
    }


def test_patched_reply_carries_base64_json_patch() -> None:
    ops = [{"op": "add", "path": "/metadata/annotations", "value": {"a/b": "c"}}]
    body = review.review_response(_request(), review.patched(ops, warnings=["w"], audit_annotations={"class": "x"}))
    response = body["response"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == ops
    assert response["warnings"] == ["w"]
    assert response["auditAnnotations"] == {"class": "x"}


def test_patched_with_no_operations_sends_neither_patch_nor_type() -> None:
    response = review.review_response(_request(), review.patched([]))["response"]
    assert "patch" not in response and "patchType" not in response


def test_denial_carries_status_and_no_patch() -> None:
    response = review.review_response(_request(), review.denied("no", code=403))["response"]
    assert response["allowed"] is False
    assert response["status"] == {"code": 403, "message": "no", "reason": "Forbidden"}
    assert "patch" not in response


def test_errored_is_a_well_formed_denial_with_code_500() -> None:
    response = review.review_response(_request(), review.errored("boom"))["response"]
    assert response["uid"] and response["allowed"] is False
    assert response["status"]["code"] == 500


def test_audit_annotation_keys_must_be_unprefixed_qualified_names() -> None:
    annotations = {"class": "training", "patch-operations": "3", "example.com/x": "1", "bad key": "2", "": "3"}
    response = review.review_response(_request(), review.allowed(audit_annotations=annotations))["response"]
    assert response["auditAnnotations"] == {"class": "training", "patch-operations": "3"}


def test_v1beta1_is_echoed() -> None:
    body = review.review_response(_request("admission.k8s.io/v1beta1"), review.allowed())
    assert body["apiVersion"] == "admission.k8s.io/v1beta1"
