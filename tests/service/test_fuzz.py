"""Fuzzing the admission endpoint: generated AdmissionReview envelopes (valid and broken) and raw
bodies posted to the app, plus schemathesis against the app's OpenAPI schema.

Where it runs: the FastAPI app in process (Starlette's TestClient: no TLS, no mocks; the app and
the engine are the real ones) for speed, and a sample against the real TLS server
(``rocm-isolation-webhook serve`` in a subprocess, called as kube-apiserver calls it).

Properties, for every body:

- never a 5xx, and never a Python traceback in a body;
- a valid envelope gets HTTP 200 and a reply kube-apiserver accepts (``verify_response``: same
  uid, apiVersion echoed, patch and patchType together), never an internal-error review
  (``status.code`` 500), and a patch that applies;
- a broken envelope gets a 4xx with a JSON error, or (when the breakage is inside the pod) a
  well-formed reply with the request's uid.

Budgets come from the Hypothesis profile registered in tests/strategies.py: ``default`` in
``make test`` (this whole file well under a minute), ``fuzz`` in ``make fuzz`` (HYPOTHESIS_PROFILE).
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import strategies as S
from conftest import Server, launch_server, make_pki
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kube_apiserver import apply_patch, verify_response

from webhook.core.review import OPERATIONS, SUPPORTED_API_VERSIONS
from webhook.service.app import WebhookService, create_app
from webhook.service.metrics import Metrics
from webhook.service.reload import PolicyStore
from webhook.service.tls import CertificateReloader

TRACEBACK_MARKERS = ("Traceback (most recent call last)", 'File "/', "site-packages")
# The active profile's budget (150 by default, 5000 with HYPOTHESIS_PROFILE=fuzz), shared out below.
BUDGET = settings.default.max_examples


def examples(share: float) -> Any:
    return settings(max_examples=max(10, int(BUDGET * share)), suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------------------------------------
# Strategies: envelopes
# ---------------------------------------------------------------------------------------------

POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
POD_RESOURCE = {"group": "", "version": "v1", "resource": "pods"}
uids = st.one_of(st.uuids().map(str), st.text(min_size=1, max_size=40))


@st.composite
def valid_envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """An AdmissionReview as kube-apiserver could send it for a pod (or a pod subresource)."""
    operation = draw(st.sampled_from(sorted(OPERATIONS)))
    pod = draw(S.pods())
    namespace = draw(st.sampled_from(S.NAMESPACE_NAMES))
    pod["metadata"]["namespace"] = namespace
    request: dict[str, Any] = {
        "uid": draw(uids),
        "kind": POD_KIND,
        "resource": POD_RESOURCE,
        "requestKind": POD_KIND,
        "requestResource": POD_RESOURCE,
        "namespace": namespace,
        "name": pod["metadata"]["name"],
        "operation": operation,
        "userInfo": {"username": draw(st.text(max_size=20))},
        "dryRun": draw(st.booleans()),
        "object": pod,
        "oldObject": None,
    }
    if operation == "UPDATE":
        request["oldObject"] = pod
        request["object"] = draw(S.updated_pods(pod))
    elif operation == "DELETE":
        request["oldObject"], request["object"] = pod, None
    if draw(st.integers(0, 5)) == 0:
        request["subResource"] = draw(st.sampled_from(["status", "ephemeralcontainers", "binding", "resize"]))
    review = {
        "apiVersion": draw(st.sampled_from(SUPPORTED_API_VERSIONS)),
        "kind": "AdmissionReview",
        "request": request,
    }
    return copy.deepcopy(review)  # no sharing with the module's constants or between object and oldObject


@st.composite
def broken_envelopes(draw: st.DrawFn) -> dict[str, Any] | Any:
    """A valid envelope with one to three places replaced by arbitrary JSON, or deleted."""
    review: Any = copy.deepcopy(draw(valid_envelopes()))  # drawn values are never mutated
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in S.json_paths(review) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = review
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(S.json_values)
    return review


raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    S.json_values.map(lambda value: json.dumps(value).encode()),
    valid_envelopes().flatmap(
        lambda review: st.integers(0, len(json.dumps(review))).map(lambda cut: json.dumps(review).encode()[:cut])
    ),
)


# ---------------------------------------------------------------------------------------------
# The app in process
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    metrics = Metrics()
    service = WebhookService(policies=PolicyStore(S.POLICY_DIR / "prop-kfd.yaml", metrics=metrics), metrics=metrics)
    with TestClient(create_app(service), raise_server_exceptions=False) as test_client:
        yield test_client


def post(client: TestClient, body: bytes) -> tuple[int, bytes]:
    answer = client.post("/mutate?timeout=10s", content=body, headers={"Content-Type": "application/json"})
    text = answer.text
    assert not any(marker in text for marker in TRACEBACK_MARKERS), text[:2000]
    assert answer.status_code < 500, (answer.status_code, text[:500])
    return answer.status_code, answer.content


def check_valid(review: dict[str, Any], status: int, data: bytes) -> None:
    assert status == 200, data[:500]
    response = verify_response(review, json.loads(data))
    if not response["allowed"]:
        assert response["status"]["code"] != 500, response["status"]["message"]  # an engine crash
    if "patch" in response:
        apply_patch(review["request"]["object"], response)


def check_any(review: Any, status: int, data: bytes) -> None:
    body = json.loads(data)
    if status == 200:
        # The envelope was still readable: a well-formed reply for the uid it carried.
        assert body["kind"] == "AdmissionReview"
        assert body["apiVersion"] == review["apiVersion"]
        assert body["response"]["uid"] == review["request"]["uid"]
        assert isinstance(body["response"]["allowed"], bool)
        assert ("patch" in body["response"]) == ("patchType" in body["response"])
    else:
        assert status in (400, 413, 415), status
        assert set(body) == {"error", "code"} and body["code"] == status


@examples(1.0)
@given(review=valid_envelopes())
def test_fuzz_valid_envelopes_get_a_reply_the_apiserver_accepts(client: TestClient, review: dict[str, Any]) -> None:
    status, data = post(client, json.dumps(review).encode())
    check_valid(review, status, data)


@examples(1.0)
@given(review=broken_envelopes())
def test_fuzz_broken_envelopes_get_4xx_or_a_well_formed_reply(client: TestClient, review: Any) -> None:
    status, data = post(client, json.dumps(review).encode())
    check_any(review, status, data)


@examples(0.7)
@given(body=raw_bodies)
def test_fuzz_raw_bodies_never_5xx(client: TestClient, body: bytes) -> None:
    status, data = post(client, body)
    if status != 200:
        assert json.loads(data)["code"] == status


def test_fuzz_the_service_counted_no_internal_error(client: TestClient) -> None:
    """After every generated input above (module-scoped app), not one internal error was counted."""
    metrics = client.get("/metrics").text
    assert 'rocm_isolation_errors_total{kind="internal"}' not in metrics or (
        'rocm_isolation_errors_total{kind="internal"} 0.0' in metrics
    )


# ---------------------------------------------------------------------------------------------
# A sample against the real TLS server
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("fuzz")
    pki = make_pki(workdir / "certs")
    server = launch_server(workdir, cert_dir=pki.dir, ca_file=pki.ca_file, policy=S.POLICY_DIR / "prop-kfd.yaml")
    yield server
    server.stop()


@examples(0.2)
@given(review=st.one_of(valid_envelopes(), broken_envelopes()), pooled=st.booleans())
def test_fuzz_sample_on_the_real_server(server: Server, review: Any, pooled: bool) -> None:
    client = server.clients[0] if pooled and server.clients else server.client()
    status, _, data = client.request(
        "POST", "/mutate?timeout=10s", json.dumps(review).encode(), {"Content-Type": "application/json"}
    )
    assert status < 500 and not any(marker.encode() in data for marker in TRACEBACK_MARKERS), data[:500]
    check_any(review, status, data)
    assert server.alive()


# ---------------------------------------------------------------------------------------------
# schemathesis against the app's OpenAPI schema
# ---------------------------------------------------------------------------------------------

ADMISSION_REVIEW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "request"],
    "properties": {
        "apiVersion": {"type": "string", "enum": list(SUPPORTED_API_VERSIONS)},
        "kind": {"type": "string", "enum": ["AdmissionReview"]},
        "request": {
            "type": "object",
            "required": ["uid", "operation"],
            "properties": {
                "uid": {"type": "string", "minLength": 1},
                "operation": {"type": "string", "enum": sorted(OPERATIONS)},
                # Optional fields may be null (what Go's omitempty-less encoders send): read as absent.
                "namespace": {"type": ["string", "null"]},
                "name": {"type": ["string", "null"]},
                "subResource": {"type": ["string", "null"]},
                "dryRun": {"type": ["boolean", "null"]},
                "kind": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
                "resource": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
                "object": {"type": ["object", "null"]},
                "oldObject": {"type": ["object", "null"]},
            },
        },
    },
}
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "code"],
    "properties": {"error": {"type": "string"}, "code": {"type": "integer"}},
}
REPLY_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "response"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"const": "AdmissionReview"},
        "response": {
            "type": "object",
            "required": ["uid", "allowed"],
            "properties": {"uid": {"type": "string"}, "allowed": {"type": "boolean"}},
        },
    },
}


def _json_response(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def openapi_schema() -> dict[str, Any]:
    """The app's own OpenAPI document (FastAPI builds it even though the app does not serve it:
    ``openapi_url=None`` in production), with the /mutate body and replies described, since the
    route reads the raw body to enforce its size limit."""
    metrics = Metrics()
    app = create_app(WebhookService(policies=PolicyStore(None, metrics=metrics), metrics=metrics))
    document = copy.deepcopy(app.openapi())
    document["openapi"] = "3.1.0"
    mutate = document["paths"]["/mutate"]["post"]
    mutate["requestBody"] = {"required": True, "content": {"application/json": {"schema": ADMISSION_REVIEW_SCHEMA}}}
    mutate["responses"] = {
        "200": _json_response(REPLY_SCHEMA, "an AdmissionReview reply"),
        "400": _json_response(ERROR_SCHEMA, "not an AdmissionReview"),
        "413": _json_response(ERROR_SCHEMA, "body too large"),
        "415": _json_response(ERROR_SCHEMA, "not application/json"),
    }
    readiness = {"type": "object", "required": ["ready", "missing", "checks"]}
    document["paths"]["/readyz"]["get"]["responses"] = {
        "200": _json_response(readiness, "ready"),
        "503": _json_response(readiness, "not ready: the body says what is missing"),
    }
    document["paths"]["/metrics"]["get"]["responses"] = {
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    }
    return document


_PKI_DIR = tempfile.TemporaryDirectory(prefix="fuzz-pki-")  # removed at interpreter exit


def _schemathesis_app() -> Any:
    """The app with the default policy and a loaded serving certificate, so /readyz answers 200."""
    metrics = Metrics()
    pki = make_pki(Path(_PKI_DIR.name))
    return create_app(
        WebhookService(
            policies=PolicyStore(None, metrics=metrics),
            metrics=metrics,
            certificates=CertificateReloader(pki.dir, metrics=metrics),
        )
    )


SCHEMA = schemathesis.openapi.from_dict(openapi_schema())
SCHEMA.app = _schemathesis_app()


def test_fuzz_schema_describes_the_endpoints() -> None:
    paths = set(openapi_schema()["paths"])
    assert {"/mutate", "/healthz", "/readyz", "/metrics"} <= paths


@SCHEMA.parametrize()
@examples(0.2)
def test_fuzz_schemathesis(case: Any) -> None:
    """Every operation of the schema, positive and negative data: no server error, responses match
    the documented status codes, content types and schemas."""
    response = case.call()
    assert response.status_code < 500, response.text[:500]
    assert not any(marker in response.text for marker in TRACEBACK_MARKERS)
    case.validate_response(response)
