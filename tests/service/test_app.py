"""The app in process (Starlette's TestClient, no TLS): guard clauses, the catch-all, readiness."""

from __future__ import annotations

import base64
import copy
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import PKI, load_review
from fastapi.testclient import TestClient
from kube_apiserver import verify_response
from starlette.applications import Starlette
from starlette.routing import Mount

import webhook
from webhook.service import app as app_module
from webhook.service.app import WebhookService, create_app
from webhook.service.metrics import Metrics
from webhook.service.reload import PolicyStore
from webhook.service.tls import CertificateReloader


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


@contextmanager
def caplog_at(level: int) -> Iterator[_Capture]:
    """Records of the review logger at ``level`` (a fresh capture: the client fixture is reused)."""
    handler = _Capture()
    logger = logging.getLogger("webhook.review")
    previous = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


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


def _review_records(caplog: _Capture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "webhook.review" and r.getMessage() == "admission review"]


def test_at_info_only_denials_get_a_review_line_and_at_debug_every_review(client: TestClient) -> None:
    patched = load_review("training-pod-create.json")
    denied = load_review("training-pod-reserved-denied.json")
    with caplog_at(logging.INFO) as caplog:
        assert post(client, patched).json()["response"]["allowed"] is True
        assert post(client, denied).json()["response"]["allowed"] is False
    assert [(r.levelno, r.__dict__["decision"]) for r in _review_records(caplog)] == [(logging.INFO, "denied")]
    with caplog_at(logging.DEBUG) as caplog:
        post(client, patched)
        post(client, denied)
    assert [(r.levelno, r.__dict__["decision"]) for r in _review_records(caplog)] == [
        (logging.DEBUG, "patched"),
        (logging.INFO, "denied"),
    ]
    assert _review_records(caplog)[0].__dict__["uid"] == patched["request"]["uid"]


def test_a_violation_in_audit_mode_is_logged_at_info(tmp_path: Path) -> None:
    """Audit mode allows everything: what enforce would deny still gets its line at the default level."""
    policy_file = tmp_path / "audit.yaml"
    default = (Path(webhook.__file__).parent / "default_policy.yaml").read_text()
    assert "  mode: enforce\n" in default
    policy_file.write_text(default.replace("  mode: enforce\n", "  mode: audit\n"))
    metrics = Metrics()
    service = WebhookService(policies=PolicyStore(policy_file, metrics=metrics), metrics=metrics)
    review = load_review("training-pod-reserved-denied.json")
    with TestClient(create_app(service)) as audit_client, caplog_at(logging.INFO) as caplog:
        assert post(audit_client, review).json()["response"]["allowed"] is True
    (record,) = _review_records(caplog)
    assert record.levelno == logging.INFO
    assert record.__dict__["mode"] == "audit"
    assert record.__dict__["violations"]


def test_a_summary_line_counts_the_reviews_of_each_decision(pki: PKI) -> None:
    service = make_service(pki)
    service.log_summary_seconds = 0.05
    patched = load_review("training-pod-create.json")
    denied = load_review("training-pod-reserved-denied.json")
    with caplog_at(logging.INFO) as caplog:
        with TestClient(create_app(service)) as summary_client:
            for review in (patched, patched, denied):
                post(summary_client, review)
            deadline = time.monotonic() + 30
            while not _summaries(caplog) and time.monotonic() < deadline:
                time.sleep(0.02)
        summaries = _summaries(caplog)
    assert summaries, "no summary line"
    totals: dict[str, int] = {}
    for record in summaries:
        assert record.levelno == logging.INFO
        assert record.__dict__["reviews"] == sum(record.__dict__["decisions"].values())
        for decision, count in record.__dict__["decisions"].items():
            totals[decision] = totals.get(decision, 0) + count
    assert totals == {"patched": 2, "denied": 1}  # every review counted once, over the periods


def _summaries(caplog: _Capture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "webhook.review" and r.getMessage() == "admission reviews"]


def test_mounted_under_a_prefix_the_fastapi_route_answers_like_the_lean_path(client: TestClient) -> None:
    """Every ``POST /mutate`` takes the lean path; the FastAPI route (which documents it in the OpenAPI
    schema) answers when the app is mounted under a prefix, with the same code."""
    app = client.app
    outer = Starlette(routes=[Mount("/prefix", app=app)])  # type: ignore[arg-type]
    review = load_review("training-pod-create.json")
    with TestClient(outer) as prefixed:
        via_route = prefixed.post(
            "/prefix/mutate", content=json.dumps(review), headers={"Content-Type": "application/json"}
        )
        refused = prefixed.post("/prefix/mutate", content=b"{}", headers={"Content-Type": "text/plain"})
    direct = post(client, review)
    assert via_route.status_code == direct.status_code == 200
    assert via_route.headers["content-type"] == direct.headers["content-type"] == "application/json"
    assert via_route.json() == direct.json()
    assert refused.status_code == 415 and refused.json()["code"] == 415
    assert "/mutate" in create_app(make_service(None)).openapi()["paths"]
