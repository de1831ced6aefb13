"""The app in process (Starlette's TestClient, no TLS): guard clauses, the catch-all, readiness."""

from __future__ import annotations

import base64
import copy
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import PKI, load_review
from fastapi.testclient import TestClient
from kube_apiserver import verify_response

from webhook import app as app_module
from webhook.app import WebhookService, create_app
from webhook.metrics import Metrics
from webhook.reload import PolicyStore
from webhook.tls import CertificateReloader


def make_service(pki: PKI | None) -> WebhookService:
    metrics = Metrics()
    return WebhookService(
        policies=PolicyStore(None, metrics=metrics),
        metrics=metrics,
        certificates=CertificateReloader(pki.dir, metrics=metrics) if pki else None,
    )


@pytest.fixture
def service(pki: PKI) -> WebhookService:
    return make_service(pki)


@pytest.fixture
def client(service: WebhookService) -> Iterator[TestClient]:
    with TestClient(create_app(service)) as test_client:
        yield test_client


def post(client: TestClient, review: dict[str, Any], content_type: str = "application/json") -> Any:
    return client.post("/mutate?timeout=10s", content=json.dumps(review), headers={"Content-Type": content_type})


def test_content_type_with_charset_is_accepted(client: TestClient) -> None:
    review = load_review("training-pod-create.json")
    answer = post(client, review, "application/json; charset=utf-8")
    assert answer.status_code == 200
    response = verify_response(review, answer.json())
    # No cluster: the engine says what it could not check.
    assert any("unknown" in warning for warning in response["warnings"])


@pytest.mark.parametrize(
    ("change", "expected_allowed", "code"),
    [
        ({"subResource": "status", "operation": "UPDATE"}, True, None),
        ({"subResource": "ephemeralcontainers", "operation": "UPDATE"}, True, None),
        ({"subResource": "binding", "operation": "CREATE"}, True, None),
        ({"operation": "DELETE", "object": None}, True, None),
        ({"operation": "CONNECT"}, True, None),
        ({"kind": {"group": "", "version": "v1", "kind": "ConfigMap"}}, True, None),
        ({"resource": {"group": "", "version": "v1", "resource": "configmaps"}}, True, None),
        ({"object": None}, False, 400),
    ],
)
def test_guard_clauses(client: TestClient, change: dict[str, Any], expected_allowed: bool, code: int | None) -> None:
    review = load_review("training-pod-reserved-denied.json")  # would be denied if it reached the engine
    review["request"].update(copy.deepcopy(change))
    answer = post(client, review)
    assert answer.status_code == 200
    response = verify_response(review, answer.json())
    assert response["allowed"] is expected_allowed
    assert "patch" not in response
    if code is not None:
        assert response["status"]["code"] == code


def test_an_unexpected_exception_gives_a_well_formed_reply_a_log_line_and_a_metric(
    client: TestClient, service: WebhookService, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_handle = app_module.handle
    calls = {"n": 0}

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated bug")
        return real_handle(*args, **kwargs)

    monkeypatch.setattr(app_module, "handle", failing_once)
    review = load_review("training-pod-create.json")
    with caplog.at_level(logging.ERROR, logger="webhook.app"):
        answer = post(client, review)
    assert answer.status_code == 200
    response = verify_response(review, answer.json())
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert review["request"]["uid"] in response["status"]["message"]
    assert any("simulated bug" in (record.exc_text or "") for record in caplog.records)
    assert service.metrics.registry.get_sample_value("rocm_isolation_errors_total", {"kind": "internal"}) == 1
    # The same worker answers the next review normally.
    second = post(client, review)
    assert verify_response(review, second.json())["allowed"] is True


def test_readiness_says_what_is_missing() -> None:
    with TestClient(create_app(make_service(None))) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 503
    body = answer.json()
    assert body["ready"] is False
    assert body["missing"] == ["certificates"]


def test_metrics_endpoint_is_prometheus_text(client: TestClient) -> None:
    review = load_review("training-pod-create.json")
    ops = len(json.loads(base64.b64decode(post(client, review).json()["response"]["patch"])))
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert "rocm_isolation_admission_reviews_total" in answer.text
    assert f"rocm_isolation_patch_operations_total {float(ops)}" in answer.text
