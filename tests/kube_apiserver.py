"""An HTTPS client that calls the webhook the way kube-apiserver does, and checks the reply by the
apiserver's own rules. Only kube-apiserver cannot run here, so its side of the exchange is replayed:

- TLS verified against the CA bundle (the ``caBundle`` of the webhook configuration), with the
  server name the apiserver dials: ``<service>.<namespace>.svc``;
- HTTP/1.1 with pooled keep-alive connections, ``POST /mutate?timeout=10s``,
  ``Content-Type: application/json``, ``Accept: application/json, */*``;
- the reply checked as ``VerifyAdmissionResponse`` does (uid, apiVersion/kind, patch and patchType
  together, patchType JSONPatch), the patch applied as the mutating dispatcher applies it, and the
  patched pod validated against the 1.37 schema.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate

SERVICE_HOST = "rocm-isolation-webhook.rocm-isolation-system.svc"
K8S_VERSION = "1.37.0"


class _Connection(http.client.HTTPSConnection):
    """Connects to 127.0.0.1 but verifies the certificate for ``server_name`` (the Service's DNS name)."""

    def __init__(self, port: int, context: ssl.SSLContext, server_name: str, timeout: float) -> None:
        super().__init__("127.0.0.1", port, context=context, timeout=timeout)
        self._server_name = server_name
        self._tls_context = context

    def connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), self.timeout)
        # Go's net/http sets TCP_NODELAY too; without it Nagle + delayed ACK add ~40 ms per request.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._tls_context.wrap_socket(self.sock, server_hostname=self._server_name)


class ApiserverClient:
    """One pooled HTTP/1.1 connection, as one apiserver goroutine holds it."""

    def __init__(self, port: int, ca_file: Path, *, server_name: str = SERVICE_HOST, timeout: float = 30.0) -> None:
        self.port = port
        self.server_name = server_name
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.timeout = timeout
        self.connection = _Connection(port, self.context, server_name, timeout)
        self.connections_made = 0

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> ApiserverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        all_headers = {"Host": f"{self.server_name}:443", "Accept": "application/json, */*"}
        all_headers.update(headers or {})
        if self.connection.sock is None:
            self.connections_made += 1
        self.connection.request(method, path, body=body, headers=all_headers)
        response = self.connection.getresponse()
        data = response.read()
        if response.will_close:
            self.connection.close()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def post_review(self, review: dict[str, Any], *, timeout: str = "10s") -> tuple[int, dict[str, Any]]:
        status, _, data = self.request(
            "POST",
            f"/mutate?timeout={timeout}",
            json.dumps(review).encode(),
            {"Content-Type": "application/json"},
        )
        return status, json.loads(data)

    def peer_certificate(self) -> bytes:
        sock = self.connection.sock
        assert isinstance(sock, ssl.SSLSocket), "not connected"
        cert = sock.getpeercert(binary_form=True)
        assert cert is not None
        return cert

    def tls_version(self) -> str | None:
        sock = self.connection.sock
        return sock.version() if isinstance(sock, ssl.SSLSocket) else None


def verify_response(request_review: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """kube-apiserver's VerifyAdmissionResponse (v1); returns ``reply['response']``."""
    assert reply.get("apiVersion") == request_review["apiVersion"], reply
    assert reply.get("kind") == "AdmissionReview", reply
    response = reply.get("response")
    assert isinstance(response, dict), "response missing"
    assert response.get("uid") == request_review["request"]["uid"], "uid mismatch"
    assert isinstance(response.get("allowed"), bool)
    has_patch = "patch" in response
    has_type = "patchType" in response
    assert has_patch == has_type, "patch and patchType must go together"
    if has_patch:
        assert response["patchType"] == "JSONPatch"
        assert response["patch"], "empty patch with a patchType"
        base64.b64decode(response["patch"], validate=True)
    if not response["allowed"]:
        status = response.get("status")
        assert isinstance(status, dict) and isinstance(status.get("code"), int) and status.get("message"), status
        assert not has_patch, "a denial carries no patch"
    for key in response.get("auditAnnotations", {}):
        assert "/" not in key, "audit annotation keys are unprefixed"
    for warning in response.get("warnings", []):
        assert isinstance(warning, str)
    return response


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def apply_patch(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """Apply the reply's patch as the mutating dispatcher does (a patch that does not apply is a 500)."""
    ops = decoded_patch(response)
    if not ops:
        return copy.deepcopy(obj)
    patched: dict[str, Any] = jsonpatch.JsonPatch(ops).apply(copy.deepcopy(obj))
    return patched


def validate_pod(pod: dict[str, Any]) -> None:
    """Strict 1.37 schema validation (unknown fields are errors)."""
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def reinvocation(review: dict[str, Any], patched_pod: dict[str, Any]) -> dict[str, Any]:
    """The same review carrying the patched pod (``reinvocationPolicy: IfNeeded``)."""
    again = copy.deepcopy(review)
    again["request"]["uid"] = review["request"]["uid"] + "-reinvoked"
    again["request"]["object"] = patched_pod
    return again
