"""End to end: the real server (``rocm-isolation-webhook serve``: uvicorn over TLS on a loopback port)
called the way kube-apiserver calls it. kube-apiserver itself cannot run here, so its side of the
HTTP exchange is replayed by ``kube_apiserver.ApiserverClient`` (certificate verified against the
CA bundle for the Service DNS name, pooled HTTP/1.1, ``POST /mutate?timeout=10s``) and its rules
for the reply by ``verify_response`` / ``apply_patch`` / ``validate_pod``.
"""

from __future__ import annotations

import copy
import json
import re
import signal
import socket
import ssl
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import PKI, SERVICE_TEST_POLICY, Server, launch_server, load_review, make_pki, module_server, wait_for
from kube_apiserver import (
    SERVICE_HOST,
    ApiserverClient,
    apply_patch,
    decoded_patch,
    reinvocation,
    validate_pod,
    verify_response,
)

POLICY = SERVICE_TEST_POLICY


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the read-only tests of this module."""
    yield from module_server(tmp_path_factory, "server")


def review_roundtrip(client: ApiserverClient, review: dict[str, Any]) -> dict[str, Any]:
    status, reply = client.post_review(review)
    assert status == 200, reply
    return verify_response(review, reply)


@pytest.mark.parametrize(
    ("fixture", "expected_class"),
    [("training-pod-create.json", "training"), ("inference-pod-create.json", "inference")],
)
def test_gpu_pod_is_patched_and_the_patched_pod_is_valid_and_stable(
    server: Server, fixture: str, expected_class: str
) -> None:
    review = load_review(fixture)
    with server.client() as client:
        response = review_roundtrip(client, review)
        assert response["allowed"] is True
        ops = decoded_patch(response)
        assert ops, "a GPU pod gets placement, env and annotation operations"
        pod = apply_patch(review["request"]["object"], response)
        validate_pod(pod)
        assert pod["metadata"]["annotations"]["rocm-isolation.io/class"] == expected_class
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        for term in terms["nodeSelectorTerms"]:
            keys = {expr["key"] for expr in term["matchExpressions"]}
            assert "rocm-isolation.io/pool" in keys
        if expected_class == "inference":
            assert any(t.get("key") == "rocm-isolation.io/reserved" for t in pod["spec"]["tolerations"])
        assert response["auditAnnotations"]

        # kube-apiserver reinvokes with the patched pod: nothing more to do.
        again = reinvocation(review, pod)
        second = review_roundtrip(client, again)
        assert second["allowed"] is True
        assert "patch" not in second and "patchType" not in second
        # Both reviews went over one pooled connection.
        assert client.connections_made == 1
        version = client.tls_version()
        assert version in ("TLSv1.2", "TLSv1.3")


def test_training_pod_targeting_reserved_nodes_is_denied(server: Server) -> None:
    review = load_review("training-pod-reserved-denied.json")
    with server.client() as client:
        response = review_roundtrip(client, review)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "rocm-isolation.io" in response["status"]["message"]
    assert "patch" not in response and "patchType" not in response


def test_pod_without_gpu_is_allowed_untouched(server: Server) -> None:
    review = load_review("cpu-pod-create.json")
    with server.client() as client:
        response = review_roundtrip(client, review)
    assert response["allowed"] is True
    assert "patch" not in response and "patchType" not in response


def test_a_privileged_debug_container_is_checked_and_never_patched(server: Server) -> None:
    """kubectl debug adds an ephemeral container through pods/ephemeralcontainers: a privileged one sees
    every GPU of the node. Without a cluster the node cannot be checked, and the pod is not kept off the
    reserved nodes by its affinity: denied. The same pod, placed by the webhook (its NotIn), is allowed."""
    review = load_review("ephemeral-privileged-debug.json")
    with server.client() as client:
        denied = review_roundtrip(client, review)
        placed = copy.deepcopy(review)
        for pod in (placed["request"]["object"], placed["request"]["oldObject"]):
            pod["spec"]["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "rocm-isolation.io/pool", "operator": "NotIn", "values": ["inference"]}
                                ]
                            }
                        ]
                    }
                }
            }
        allowed = review_roundtrip(client, placed)
    assert denied["allowed"] is False and denied["status"]["code"] == 403
    message = denied["status"]["message"]
    assert "spec.ephemeralContainers[0].securityContext.privileged" in message and "could not be checked" in message
    assert allowed["allowed"] is True
    for response in (denied, allowed):
        assert "patch" not in response and "patchType" not in response


def test_dry_run_gets_the_same_answer(server: Server) -> None:
    review = load_review("training-pod-create.json")
    dry = copy.deepcopy(review)
    dry["request"]["dryRun"] = True
    with server.client() as client:
        normal = review_roundtrip(client, review)
        dry_response = review_roundtrip(client, dry)
    assert dry_response == normal


def test_v1beta1_review_is_answered_in_v1beta1(server: Server) -> None:
    review = load_review("training-pod-create.json")
    review["apiVersion"] = "admission.k8s.io/v1beta1"
    with server.client() as client:
        status, reply = client.post_review(review)
    assert status == 200
    assert reply["apiVersion"] == "admission.k8s.io/v1beta1"
    assert reply["response"]["uid"] == review["request"]["uid"]
    assert reply["response"]["patchType"] == "JSONPatch"


def test_certificate_is_valid_for_the_service_name_only(server: Server, tmp_path: Path) -> None:
    with server.client(server_name=SERVICE_HOST) as client:
        status, _, _ = client.request("GET", "/healthz")
        assert status == 200
    with (
        ApiserverClient(server.port, server.ca_file, server_name="other.example.svc") as wrong_name,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        wrong_name.request("GET", "/healthz")
    other_ca = make_pki(tmp_path / "other")
    with ApiserverClient(server.port, other_ca.ca_file) as wrong_ca, pytest.raises(ssl.SSLCertVerificationError):
        wrong_ca.request("GET", "/healthz")


def test_tls_older_than_1_2_is_refused(server: Server) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(server.ca_file)
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock,
        pytest.raises(ssl.SSLError),
        context.wrap_socket(sock, server_hostname=SERVICE_HOST),
    ):
        pass


def _chunked(body: bytes, chunk: int = 1 << 20) -> Iterator[bytes]:
    for start in range(0, len(body), chunk):
        yield body[start : start + chunk]


BAD_INPUTS: list[tuple[str, str, str, bytes, dict[str, str], int]] = [
    ("empty body", "POST", "/mutate?timeout=10s", b"", {"Content-Type": "application/json"}, 400),
    ("not JSON", "POST", "/mutate?timeout=10s", b"{not json", {"Content-Type": "application/json"}, 400),
    ("JSON array", "POST", "/mutate?timeout=10s", b"[]", {"Content-Type": "application/json"}, 400),
    (
        "wrong kind",
        "POST",
        "/mutate?timeout=10s",
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": {"uid": "x"}}).encode(),
        {"Content-Type": "application/json"},
        400,
    ),
    (
        "no request",
        "POST",
        "/mutate?timeout=10s",
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
        {"Content-Type": "application/json"},
        400,
    ),
    (
        "no uid",
        "POST",
        "/mutate?timeout=10s",
        json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": "CREATE"}}
        ).encode(),
        {"Content-Type": "application/json"},
        400,
    ),
    ("wrong content type", "POST", "/mutate?timeout=10s", b"{}", {"Content-Type": "text/plain"}, 415),
    ("no content type", "POST", "/mutate?timeout=10s", b"{}", {}, 415),
    (
        "declared too large",
        "POST",
        "/mutate?timeout=10s",
        b"{}",
        {"Content-Type": "application/json", "Content-Length": str(8 * 1024 * 1024)},
        413,
    ),
    ("GET on /mutate", "GET", "/mutate", b"", {}, 405),
]


def test_bad_inputs_get_their_status_and_the_server_keeps_serving(server: Server) -> None:
    for name, method, path, body, headers, expected in BAD_INPUTS:
        # A fresh connection each: a 413 answered early closes its connection.
        with server.client() as client:
            status, response_headers, data = client.request(method, path, body or None, headers)
        assert status == expected, (name, status, data)
        if expected != 405:
            error = json.loads(data)
            assert error["code"] == expected and error["error"], (name, error)
            assert response_headers["content-type"].startswith("application/json")
    # Still serving, on a new and on a pooled connection.
    review = load_review("training-pod-create.json")
    with server.client() as client:
        assert review_roundtrip(client, review)["allowed"] is True
        assert review_roundtrip(client, review)["allowed"] is True
    assert server.alive()
    metrics = server.metrics()
    assert 'rocm_isolation_errors_total{kind="body_too_large"}' in metrics
    assert 'rocm_isolation_errors_total{kind="unsupported_media_type"}' in metrics
    assert 'rocm_isolation_errors_total{kind="malformed"}' in metrics


@contextmanager
def _tls_connection(server: Server, timeout: float = 30) -> Iterator[ssl.SSLSocket]:
    """A raw TLS connection to ``server`` (certificate verified for the Service name), for requests
    the pooled client cannot send: streamed, split, or waiting for an interim reply."""
    context = ssl.create_default_context(cafile=str(server.ca_file))
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname=SERVICE_HOST) as sock,
    ):
        yield sock


def _read_reply(sock: ssl.SSLSocket) -> bytes:
    """One whole reply (head and Content-Length body), or what came before the server closed."""
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _content_length(answer):
        data = sock.recv(65536)
        if not data:
            break
        answer += data
    return answer


def _content_length(answer: bytes) -> int:
    head = answer.partition(b"\r\n\r\n")[0]
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_streamed_body_over_the_limit_is_cut_off_with_413(server: Server) -> None:
    """A chunked body (no Content-Length) over 7 MiB: answered 413 without reading it all."""
    with _tls_connection(server) as sock:
        sock.sendall(
            b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"[" + b"0," * (512 * 1024)
        sent = 0
        answer = b""
        sock.settimeout(0.5)
        # Keep streaming (an "infinite" body) until the server answers; it must not wait for the end.
        while sent < 64 * 1024 * 1024:
            try:
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            except OSError:
                break
            sent += len(chunk)
            try:
                answer = sock.recv(65536)
            except (TimeoutError, ssl.SSLWantReadError):
                continue
            if answer:
                break
        sock.settimeout(30)
        while b"\r\n\r\n" not in answer:
            more = sock.recv(65536)
            if not more:
                break
            answer += more
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 32 * 1024 * 1024, "the server read far past the limit before answering"
    with server.client() as client:
        assert review_roundtrip(client, load_review("cpu-pod-create.json"))["allowed"] is True


def test_health_readiness_and_metrics(server: Server) -> None:
    with server.client() as client:
        review_roundtrip(client, load_review("training-pod-create.json"))
        review_roundtrip(client, load_review("training-pod-reserved-denied.json"))
    status, body = server.get_json("/healthz")
    assert status == 200 and body["status"] == "ok"
    status, body = server.get_json("/readyz")
    assert status == 200 and body["ready"] is True and body["missing"] == []
    assert body["checks"]["policy"]["name"] == "service-tests"
    assert body["checks"]["certificates"]["ok"] is True
    assert body["checks"]["cluster"]["ok"] is True
    metrics = server.metrics()
    assert (
        'rocm_isolation_admission_reviews_total{decision="patched",mode="enforce",operation="CREATE",'
        'workload_class="training"}' in metrics
    )
    assert "rocm_isolation_admission_review_duration_seconds_bucket" in metrics
    assert "rocm_isolation_patch_operations_total" in metrics
    assert 'rocm_isolation_denials_total{rule="' in metrics
    assert "rocm_isolation_certificate_expiry_timestamp_seconds" in metrics
    assert "rocm_isolation_policy_reloads_total" in metrics


def test_at_the_default_level_a_denied_review_gets_a_json_log_line_and_a_patched_one_none(server: Server) -> None:
    """Log level info (the default): a line for the reviews an operator may act on (here a denial),
    none per allowed or patched review (docs/operations.md, "Logs")."""
    patched = load_review("training-pod-create.json")
    patched["request"]["uid"] = "log-line-patched"
    denied = load_review("training-pod-reserved-denied.json")
    denied["request"]["uid"] = "log-line-denied"
    with server.client() as client:
        assert review_roundtrip(client, patched)["allowed"] is True
        assert review_roundtrip(client, denied)["allowed"] is False

    def logged(uid: str) -> list[dict[str, Any]]:
        return [line for line in server.log_lines() if line.get("uid") == uid]

    wait_for(lambda: bool(logged("log-line-denied")), what="the denied review's log line")
    (line,) = logged("log-line-denied")
    assert line["level"] == "info"
    assert line["namespace"] == "ml-training"
    assert line["pod"] == "llama-finetune-"  # generateName: the name does not exist yet
    assert line["operation"] == "CREATE"
    assert line["workload_class"] == "training"
    assert line["decision"] == "denied"
    assert line["rule"]
    assert line["patch_operations"] == 0
    assert line["latency_ms"] >= 0
    # Lines are written before the reply is sent: the patched review, answered first, wrote none.
    assert logged("log-line-patched") == []


def test_idle_pooled_connection_survives_past_uvicorn_default_keep_alive(server: Server) -> None:
    """uvicorn closes idle connections after 5 s by default; the apiserver pools them for 90 s."""
    review = load_review("cpu-pod-create.json")
    with server.client() as client:
        review_roundtrip(client, review)
        time.sleep(6.5)
        review_roundtrip(client, review)
        assert client.connections_made == 1


def test_sigterm_finishes_the_review_in_flight(pki: PKI, tmp_path: Path) -> None:
    server = launch_server(tmp_path, cert_dir=pki.dir, ca_file=pki.ca_file, policy=POLICY)
    try:
        review = load_review("training-pod-create.json")
        body = json.dumps(review).encode()
        with _tls_connection(server) as sock:
            head = (
                f"POST /mutate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            half = len(body) // 2
            sock.sendall(head + body[:half])
            wait_for(lambda: server.alive(), what="server alive")
            time.sleep(0.5)  # let the server start reading the request
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            sock.sendall(body[half:])
            answer = _read_reply(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        reply = json.loads(answer.partition(b"\r\n\r\n")[2])
        verify_response(review, reply)
        # uvicorn re-raises the captured SIGTERM after its graceful shutdown.
        assert server.process.wait(30) in (0, -signal.SIGTERM)
        assert "Finished server process" in server.log()
    finally:
        server.stop()


def _write_calls(pid: int) -> int:
    """The write system calls process ``pid`` made so far (``syscw`` in /proc/PID/io)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["syscw"])


def test_a_reply_leaves_in_one_write(server: Server) -> None:
    """Head and body of a reply go out as one TLS record and one ``send()`` (webhook/service/coalesce.py),
    not one each: half the encryption and system calls per review."""
    review = load_review("inference-pod-create.json")  # patched: no log line at the default level
    reviews = 200
    with server.client() as client:
        review_roundtrip(client, review)  # connected and warm
        before = _write_calls(server.process.pid)
        for _ in range(reviews):
            review_roundtrip(client, review)
        writes = _write_calls(server.process.pid) - before
    assert reviews <= writes < reviews * 1.1, f"{writes} write calls for {reviews} reviews"


def test_expect_100_continue_is_answered_before_the_body_is_sent(server: Server) -> None:
    """curl sends ``Expect: 100-continue`` with larger bodies and waits for the interim reply: it
    must leave at once, not wait for the final reply it would be coalesced with."""
    review = load_review("training-pod-create.json")
    body = json.dumps(review).encode()
    with _tls_connection(server, timeout=10) as sock:
        sock.sendall(
            b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        interim = sock.recv(65536)  # the socket's 10 s timeout fails the test if it never comes
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        answer = _read_reply(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    verify_response(review, json.loads(answer.partition(b"\r\n\r\n")[2]))


def metric_files_mapped(pid: int) -> bool:
    """Whether process ``pid`` maps prometheus-client's multiprocess files (``counter_<pid>.db``, ...)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return re.search(r"/(counter|gauge_\w+|histogram|summary)_\d+\.db$", maps, re.M) is not None


def test_one_worker_keeps_its_metrics_in_memory(server: Server) -> None:
    """The multiprocess files cost about twice as much per update (docs/benchmarks.md); only
    ``--workers N`` needs them."""
    with server.client() as client:
        review_roundtrip(client, load_review("training-pod-create.json"))
    assert not metric_files_mapped(server.process.pid)
    assert "rocm_isolation_admission_reviews_total" in server.metrics()


def test_multiple_workers_serve_and_aggregate_metrics(pki: PKI, tmp_path: Path) -> None:
    server = launch_server(tmp_path, cert_dir=pki.dir, ca_file=pki.ca_file, policy=POLICY, args=["--workers", "2"])
    try:
        review = load_review("training-pod-create.json")
        for _ in range(12):
            with server.client() as client:  # new connections spread over the workers
                assert review_roundtrip(client, review)["allowed"] is True

        def counted() -> float:
            total = 0.0
            for line in server.metrics().splitlines():
                if line.startswith("rocm_isolation_admission_reviews_total{"):
                    total += float(line.rsplit(" ", 1)[1])
            return total

        # Every scrape sees all 12 reviews, whichever worker answers it.
        for _ in range(4):
            assert counted() == 12
        # Through prometheus-client's multiprocess files, mapped by the workers.
        workers = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text().split()
        assert any(metric_files_mapped(int(pid)) for pid in workers)
    finally:
        assert server.stop() in (0, -signal.SIGTERM)
