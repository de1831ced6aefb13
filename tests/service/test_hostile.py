"""Hostile input against the real server (``rocm-isolation-webhook serve``, uvicorn over TLS on a
loopback port). Nothing is mocked: every body below goes over TLS to the running process. The
caller is not kube-apiserver but an attacker or a broken client, so requests are written by hand
(``exchange``/``raw_exchange``); replies to well-formed envelopes are still checked by the
apiserver's own rules (``kube_apiserver.verify_response``).

Each input has a documented answer (docs/reliability.md, "Hostile input"):

- a broken *envelope* (not JSON, not an AdmissionReview, wrong media type, wrong method) gets a
  4xx with a one-line JSON error (or uvicorn's plain-text 400 when the HTTP framing itself is
  broken);
- a valid envelope around a broken *pod* gets HTTP 200 and a well-formed AdmissionReview reply
  carrying the request's uid (a denial with ``status.code`` 400 naming the field, or an allow);
- no reply ever contains a Python traceback, and the server keeps serving afterwards.

What test_server.py already proves is not repeated here: empty body, ``{not json``, a JSON
array, wrong kind, no request, no uid, ``text/plain`` and missing Content-Type, a declared body
over 7 MiB, GET on /mutate, a chunked body streamed past the limit (413 without buffering it),
v1beta1 echo, TLS < 1.2 refused at the handshake.
"""

from __future__ import annotations

import copy
import json
import socket
import ssl
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, load_review, module_server
from kube_apiserver import SERVICE_HOST, ApiserverClient, apply_patch, verify_response

JSON = {"Content-Type": "application/json"}
# What a Python traceback looks like in a body; none may reach a client.
TRACEBACK_MARKERS = (b"Traceback (most recent call last)", b'File "/', b"site-packages")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_server(tmp_path_factory, "hostile")


def exchange(
    server: Server, body: bytes | None, headers: dict[str, str] | None = None, *, method: str = "POST", path: str = ""
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh apiserver-like connection (a 413 or 400 may close it)."""
    with ApiserverClient(server.port, server.ca_file, timeout=60) as client:
        status, response_headers, data = client.request(
            method, path or "/mutate?timeout=10s", body, JSON if headers is None else headers
        )
    assert not any(marker in data for marker in TRACEBACK_MARKERS), data[:2000]
    return status, response_headers, data


def raw_exchange(server: Server, request: bytes, *, timeout: float = 30.0) -> bytes:
    """Send raw bytes over TLS (framing an HTTP client library would refuse to send); return the reply."""
    context = ssl.create_default_context(cafile=str(server.ca_file))
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname=SERVICE_HOST) as sock,
    ):
        sock.sendall(request)
        answer = b""
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError):
                break
            if not data:
                break
            answer += data
            if b"\r\n\r\n" in answer and _complete(answer):
                break
    assert not any(marker in answer for marker in TRACEBACK_MARKERS), answer[:2000]
    return answer


def _complete(answer: bytes) -> bool:
    head, _, rest = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(rest) >= int(line.split(b":", 1)[1])
    return True


def still_serving(server: Server) -> None:
    review = load_review("training-pod-create.json")
    with server.client() as client:
        status, reply = client.post_review(review)
    assert status == 200
    assert verify_response(review, reply)["allowed"] is True
    assert server.alive()


def envelope(pod: Any = None, **request: Any) -> dict[str, Any]:
    review = load_review("training-pod-create.json")
    if pod is not None:
        review["request"]["object"] = pod
    review["request"].update(request)
    return review


def training_pod() -> dict[str, Any]:
    pod: dict[str, Any] = load_review("training-pod-create.json")["request"]["object"]
    return pod


def deep(depth: int, open_: str = "[", close: str = "]") -> bytes:
    return (open_ * depth + close * depth).encode()


# ---------------------------------------------------------------------------------------------
# Broken envelopes: 4xx with a JSON error
# ---------------------------------------------------------------------------------------------

_V1 = '"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"'

ENVELOPE_CASES: list[tuple[str, bytes, dict[str, str] | None, int]] = [
    ("truncated JSON", json.dumps(envelope()).encode()[:-7], None, 400),
    ("trailing garbage", json.dumps(envelope()).encode() + b"}{", None, 400),
    ("single quotes", b"{'kind': 'AdmissionReview'}", None, 400),
    ("NaN where a string belongs", ("{" + _V1 + ',"request":{"uid":NaN,"operation":"CREATE"}}').encode(), None, 400),
    ("invalid UTF-8", ("{" + _V1 + ',"request":{"uid":"').encode() + b"\xff\xfe" + b'"}}', None, 400),
    ("a JSON string", b'"AdmissionReview"', None, 400),
    ("JSON null", b"null", None, 400),
    ("JSON number", b"12", None, 400),
    ("whitespace only", b"  \r\n\t ", None, 400),
    ("100,000 nested arrays", deep(100_000), None, 400),
    ("100,000 nested objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, None, 400),
    (
        "100,000 nested arrays inside a valid envelope",
        json.dumps(envelope()).encode().replace(b'"restartPolicy": "Never"', b'"restartPolicy": ' + deep(100_000)),
        None,
        400,
    ),
    ("integer of 5,000 digits", ("{" + _V1 + ',"request":{"uid":' + "9" * 5000 + "}}").encode(), None, 400),
    ("kind in lower case", json.dumps({**envelope(), "kind": "admissionreview"}).encode(), None, 400),
    ("kind missing", json.dumps({k: v for k, v in envelope().items() if k != "kind"}).encode(), None, 400),
    ("apiVersion v2", json.dumps({**envelope(), "apiVersion": "admission.k8s.io/v2"}).encode(), None, 400),
    ("apiVersion v1 (core)", json.dumps({**envelope(), "apiVersion": "v1"}).encode(), None, 400),
    ("apiVersion a number", json.dumps({**envelope(), "apiVersion": 1}).encode(), None, 400),
    ("request null", json.dumps({**envelope(), "request": None}).encode(), None, 400),
    ("request a list", json.dumps({**envelope(), "request": [envelope()["request"]]}).encode(), None, 400),
    ("request a string", json.dumps({**envelope(), "request": "CREATE"}).encode(), None, 400),
    ("uid empty", json.dumps(envelope(uid="")).encode(), None, 400),
    ("uid a number", json.dumps(envelope(uid=7)).encode(), None, 400),
    ("uid null", json.dumps(envelope(uid=None)).encode(), None, 400),
    ("uid an object", json.dumps(envelope(uid={"$ne": ""})).encode(), None, 400),
    ("operation PATCH", json.dumps(envelope(operation="PATCH")).encode(), None, 400),
    ("operation in lower case", json.dumps(envelope(operation="create")).encode(), None, 400),
    ("operation missing", json.dumps(envelope(operation=None)).encode(), None, 400),
    ("dryRun a string", json.dumps(envelope(dryRun="true")).encode(), None, 400),
    ("request.kind a string", json.dumps(envelope(kind="Pod")).encode(), None, 400),
    ("request.resource with a number", json.dumps(envelope(resource={"resource": 1})).encode(), None, 400),
    ("object a list", json.dumps(envelope(object=[training_pod()])).encode(), None, 400),
    ("object a string", json.dumps(envelope(object="pod")).encode(), None, 400),
    ("oldObject a number", json.dumps(envelope(oldObject=3)).encode(), None, 400),
    ("namespace a list", json.dumps(envelope(namespace=["a"])).encode(), None, 400),
    ("Content-Type application/json-patch+json", b"{}", {"Content-Type": "application/json-patch+json"}, 415),
    ("Content-Type form", b"a=b", {"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ("Content-Type multipart", b"--x--", {"Content-Type": "multipart/form-data; boundary=x"}, 415),
    ("Content-Type application/yaml", b"kind: AdmissionReview", {"Content-Type": "application/yaml"}, 415),
]


@pytest.mark.parametrize(
    ("body", "headers", "expected"), [c[1:] for c in ENVELOPE_CASES], ids=[c[0] for c in ENVELOPE_CASES]
)
def test_broken_envelope_gets_4xx_with_a_json_error(
    server: Server, body: bytes, headers: dict[str, str] | None, expected: int
) -> None:
    status, response_headers, data = exchange(server, body, headers)
    assert status == expected, data[:500]
    assert response_headers["content-type"].startswith("application/json")
    error = json.loads(data)
    assert set(error) == {"error", "code"} and error["code"] == expected
    assert isinstance(error["error"], str) and "\n" not in error["error"]
    assert len(data) < 4096, "the error echoes at most a short description, never the body"


def test_content_type_is_matched_without_case_or_parameters(server: Server) -> None:
    review = envelope()
    status, _, data = exchange(server, json.dumps(review).encode(), {"Content-Type": "Application/JSON; charset=UTF-8"})
    assert status == 200
    verify_response(review, json.loads(data))


HTTP_CASES: list[tuple[str, str, str, int]] = [
    ("PUT /mutate", "PUT", "/mutate", 405),
    ("DELETE /mutate", "DELETE", "/mutate", 405),
    ("PATCH /mutate", "PATCH", "/mutate", 405),
    ("POST /healthz", "POST", "/healthz", 405),
    ("unknown path", "POST", "/validate", 404),
    ("path below /mutate", "POST", "/mutate/x", 404),
    ("dot segments are not resolved", "POST", "/x/../mutate", 404),
    ("OpenAPI schema is not served", "GET", "/openapi.json", 404),
    ("docs are not served", "GET", "/docs", 404),
]


@pytest.mark.parametrize(("method", "path", "expected"), [c[1:] for c in HTTP_CASES], ids=[c[0] for c in HTTP_CASES])
def test_other_methods_and_paths(server: Server, method: str, path: str, expected: int) -> None:
    status, _, data = exchange(server, b"{}", JSON, method=method, path=path)
    assert status == expected, data[:300]


BROKEN_FRAMING: list[tuple[str, bytes]] = [
    (
        "Content-Length not a number",
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: abc\r\n\r\n{}",
    ),
    (
        "negative Content-Length",
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: -1\r\n\r\n{}",
    ),
    (
        "Content-Length and chunked together (request smuggling)",
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    ),
    (
        "bad chunk size",
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    ),
    ("not HTTP at all", b"\x16\x03\x01garbage\r\n\r\n"),
    ("header without colon", b"POST /mutate HTTP/1.1\r\nHost: x\r\nbroken header\r\n\r\n"),
    ("NUL in the request line", b"POST /mu\x00tate HTTP/1.1\r\nHost: x\r\n\r\n"),
]


@pytest.mark.parametrize("request_bytes", [c[1] for c in BROKEN_FRAMING], ids=[c[0] for c in BROKEN_FRAMING])
def test_broken_http_framing_is_refused_by_the_parser(server: Server, request_bytes: bytes) -> None:
    """uvicorn's parser answers 400 (plain text, no traceback) or closes; the app is never reached."""
    answer = raw_exchange(server, request_bytes)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:300]


def test_envelope_errors_leave_the_server_serving(server: Server) -> None:
    for _, body, headers, _ in ENVELOPE_CASES[:12]:
        exchange(server, body, headers)
    still_serving(server)
    metrics = server.metrics()
    assert 'rocm_isolation_errors_total{kind="malformed"}' in metrics
    assert 'rocm_isolation_errors_total{kind="internal"}' not in metrics or (
        'rocm_isolation_errors_total{kind="internal"} 0.0' in metrics
    )


# ---------------------------------------------------------------------------------------------
# Valid envelopes around broken or unusual pods: a well-formed review reply
# ---------------------------------------------------------------------------------------------


def review_reply(server: Server, review: dict[str, Any]) -> dict[str, Any]:
    status, _, data = exchange(server, json.dumps(review).encode())
    assert status == 200, data[:500]
    return verify_response(review, json.loads(data))


def _set(pod: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    target: Any = pod
    parts = path.split(".")
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
    last = parts[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return pod


# (field path in the pod, wrong value, field the denial must name). None: the pod may be allowed
# (the broken field is one the webhook does not read for this pod), but the reply is well-formed.
WRONG_TYPES: list[tuple[str, Any, str | None]] = [
    ("spec", "a string", "spec"),
    ("spec", [], "spec"),
    ("metadata", "a string", "metadata"),
    ("metadata.labels", ["a"], "metadata.labels"),
    ("metadata.labels", {"app": 1}, "metadata.labels"),
    ("metadata.annotations", {"a": {"b": "c"}}, "metadata.annotations"),
    ("spec.containers", "trainer", "spec.containers"),
    ("spec.containers", {"name": "trainer"}, "spec.containers"),
    ("spec.containers", [1, 2], "spec.containers[0]"),
    ("spec.containers", [None], None),  # null reads as empty (Go decodes it to a zero Container): no GPU
    ("spec.containers.0.resources", "8 GPUs", "resources"),
    ("spec.containers.0.resources.limits", ["amd.com/gpu"], "limits"),
    ("spec.containers.0.env", {"HSA_QUEUE_PRIORITY": "high"}, "env"),
    ("spec.containers.0.env", ["HSA_QUEUE_PRIORITY=high"], "env"),
    ("spec.containers.0.env", [{"name": 5, "value": "x"}], None),
    ("spec.initContainers", {"a": 1}, "spec.initContainers"),
    ("spec.tolerations", "rocm-isolation.io/reserved", "spec.tolerations"),
    ("spec.tolerations", [{"key": 1, "operator": "Exists"}], "spec.tolerations[0].key"),
    ("spec.tolerations", [{"operator": ["Exists"]}], "spec.tolerations[0].operator"),
    ("spec.nodeSelector", ["rocm-isolation.io/pool=inference"], "spec.nodeSelector"),
    ("spec.nodeSelector", {"rocm-isolation.io/pool": 1}, "spec.nodeSelector"),
    ("spec.nodeName", 5, "spec.nodeName"),
    ("spec.nodeName", ["gpu-inf-0"], "spec.nodeName"),
    ("spec.affinity", [], "spec.affinity"),
    ("spec.affinity.nodeAffinity", "any", "nodeAffinity"),
    ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", [], "requiredDuringScheduling"),
    (
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
        "all",
        "nodeSelectorTerms",
    ),
    (
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
        [{"matchExpressions": "rocm-isolation.io/pool in (inference)"}],
        "matchExpressions",
    ),
    (
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
        [{"matchExpressions": [{"key": "rocm-isolation.io/pool", "operator": "In", "values": "inference"}]}],
        "values",
    ),
    ("spec.topologySpreadConstraints", "spread", None),
    ("spec.volumes", {"name": "v"}, None),
]


@pytest.mark.parametrize(
    ("path", "value", "field"), WRONG_TYPES, ids=[f"{path}={json.dumps(value)[:40]}" for path, value, _ in WRONG_TYPES]
)
def test_wrong_field_types_in_the_pod_get_a_well_formed_reply(
    server: Server, path: str, value: Any, field: str | None
) -> None:
    review = envelope(_set(training_pod(), path, copy.deepcopy(value)))
    response = review_reply(server, review)
    if field is not None:
        assert response["allowed"] is False, response
    if not response["allowed"]:
        status = response["status"]
        assert status["code"] == 400, status  # malformed, never 500
        if field is not None:
            assert field in status["message"], status["message"]
        assert "patch" not in response
    else:
        # A pod the webhook can still place: the patch applies as the apiserver applies it.
        apply_patch(review["request"]["object"], response)


def test_a_null_item_is_read_as_empty_and_does_not_hide_the_gpu_container(server: Server) -> None:
    pod = training_pod()
    pod["spec"]["containers"] = [None, pod["spec"]["containers"][0]]
    review = envelope(pod)
    response = review_reply(server, review)
    assert response["allowed"] is True
    patched = apply_patch(review["request"]["object"], response)
    assert {"name": "GPU_MAX_HW_QUEUES", "value": "1"} in patched["spec"]["containers"][1]["env"]


def test_null_object_on_create_and_update_is_a_400_review(server: Server) -> None:
    for change in ({"object": None}, {"operation": "UPDATE", "object": None, "oldObject": training_pod()}):
        response = review_reply(server, envelope(**change))
        assert response["allowed"] is False and response["status"]["code"] == 400


def test_update_with_null_old_object_checks_everything_as_new(server: Server) -> None:
    """Without the old pod every toleration and selector counts as added by the update."""
    pod = training_pod()
    pod["spec"]["nodeSelector"] = {"rocm-isolation.io/pool": "inference"}
    response = review_reply(server, envelope(pod, operation="UPDATE", oldObject=None))
    assert response["allowed"] is False and response["status"]["code"] == 403
    response = review_reply(server, envelope(operation="UPDATE", oldObject=None))
    assert response["allowed"] is True and "patch" not in response


@pytest.mark.parametrize(
    "change",
    [
        {"subResource": "status", "operation": "UPDATE"},
        {"subResource": "ephemeralcontainers", "operation": "UPDATE"},
        {
            "subResource": "binding",
            "operation": "CREATE",
            "object": {"kind": "Binding", "target": {"name": "gpu-inf-0"}},
        },
        {"subResource": "eviction", "operation": "CREATE", "object": {"kind": "Eviction"}},
        {"operation": "DELETE", "object": None},
        {"operation": "CONNECT", "subResource": "exec", "object": {"kind": "PodExecOptions"}},
        {
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
        },
        {"kind": {"group": "apps", "version": "v1", "kind": "Pod"}},
        {"resource": {"group": "", "version": "v1", "resource": "nodes"}},
    ],
    ids=[
        "pods/status",
        "pods/ephemeralcontainers",
        "pods/binding",
        "pods/eviction",
        "DELETE",
        "pods/exec",
        "ConfigMap",
        "apps Pod",
        "nodes",
    ],
)
def test_other_kinds_and_subresources_are_allowed_untouched(server: Server, change: dict[str, Any]) -> None:
    """The pod the reviews carry would be denied (nodeSelector on the reserved pool) if it were
    checked: these requests are not pod CREATE/UPDATE, so they pass unchanged."""
    pod = training_pod()
    pod["spec"]["nodeSelector"] = {"rocm-isolation.io/pool": "inference"}
    review = envelope(pod, **copy.deepcopy(change))
    response = review_reply(server, review)
    assert response["allowed"] is True
    assert "patch" not in response and "patchType" not in response


# ---------------------------------------------------------------------------------------------
# Unicode, control characters, log injection
# ---------------------------------------------------------------------------------------------

NASTY_STRINGS = [
    "ünïcødé-☃-名前",
    "\u202egnp.exe",  # right-to-left override
    "a\u0000b",
    "line\nbreak",
    'quote"and\\backslash',
    "\u2028\u2029",
    "emoji-🚀" * 50,
]


@pytest.mark.parametrize("text", NASTY_STRINGS, ids=[repr(t)[:20] for t in NASTY_STRINGS])
def test_unicode_and_control_characters_in_names(server: Server, text: str) -> None:
    pod = training_pod()
    pod["metadata"]["generateName"] = text
    pod["metadata"]["labels"] = {"app": text}
    pod["metadata"]["annotations"] = {text: text}
    pod["spec"]["containers"][0]["name"] = text
    pod["spec"]["containers"][0]["env"] = [{"name": text, "value": text}]
    review = envelope(pod, namespace=text, name=text, uid=f"uid-{text}")
    response = review_reply(server, review)
    assert response["uid"] == f"uid-{text}"  # byte for byte, whatever it contains
    if response["allowed"]:
        apply_patch(review["request"]["object"], response)


def test_a_lone_surrogate_is_not_text_and_is_refused(server: Server) -> None:
    """``"\\ud800"`` is a valid JSON escape but no Unicode text (RFC 8259 8.2: behaviour unpredictable);
    kube-apiserver never sends one (Go encodes invalid text as U+FFFD). The body is refused with a
    400 naming the problem, and the server keeps serving."""
    review = envelope(uid="uid-surrogate")
    body = json.dumps(review).replace("uid-surrogate", "uid-\\ud800").encode()
    status, _, data = exchange(server, body)
    assert status == 400, data[:300]
    assert b"surrogate" in data and b"Traceback" not in data
    still_serving(server)


def test_a_uid_cannot_inject_log_lines(server: Server) -> None:
    """The log is one JSON object per line: a uid with line breaks stays inside its own line."""
    forged = '{"decision":"allowed","uid":"forged"}'
    uid = f"inject\n{forged}\r\n{forged}\u2028"
    review = load_review("training-pod-reserved-denied.json")  # a denial: logged at the default level
    review["request"]["uid"] = uid
    review_reply(server, review)

    def lines() -> list[str]:
        return [line for line in server.log().splitlines() if "inject" in line]

    deadline = time.monotonic() + 30
    while not lines() and time.monotonic() < deadline:
        time.sleep(0.05)
    (line,) = lines()
    assert json.loads(line)["uid"] == uid
    assert not any(line.strip() == forged for line in server.log().splitlines())


# ---------------------------------------------------------------------------------------------
# Duplicate keys
# ---------------------------------------------------------------------------------------------


def _duplicate(first: dict[str, Any], key: str, second: Any) -> bytes:
    """``first`` encoded with ``"key": second`` appended after its own ``key``."""
    text = json.dumps(first)
    assert text.endswith("}")
    return (text[:-1] + f", {json.dumps(key)}: {json.dumps(second)}}}").encode()


def _with_request(review: dict[str, Any], request: bytes) -> bytes:
    """The review's envelope around an already encoded ``request``."""
    return (
        json.dumps({k: v for k, v in review.items() if k != "request"})[:-1].encode()
        + b', "request": '
        + request
        + b"}"
    )


def test_duplicate_uid_the_last_one_is_answered(server: Server) -> None:
    """kube-apiserver encodes the review itself and never repeats a key; a body with a repeated key
    did not come from it. Such a body is decoded as Python's json (and Go's encoding/json) does:
    the last value wins. The reply names that uid, and nothing else is confused."""
    review = envelope(uid="first-uid")
    body = _with_request(review, _duplicate(review["request"], "uid", "last-uid"))
    status, _, data = exchange(server, body)
    assert status == 200
    reply = json.loads(data)
    assert reply["response"]["uid"] == "last-uid"


def test_duplicate_object_the_last_one_is_decided(server: Server) -> None:
    """Two ``object`` keys: the pod decided is the last one, both ways round. A denied pod first and
    a harmless one last is allowed (the apiserver would store the last one too); the reverse is denied."""
    reserved = training_pod()
    reserved["spec"]["nodeSelector"] = {"rocm-isolation.io/pool": "inference"}
    harmless = training_pod()
    for first, last, allowed in ((reserved, harmless, True), (harmless, reserved, False)):
        review = envelope(first)
        body = _with_request(review, _duplicate(review["request"], "object", last))
        status, _, data = exchange(server, body)
        assert status == 200
        response = json.loads(data)["response"]
        assert response["allowed"] is allowed
        if allowed:
            patched = apply_patch(last, response)
            terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert {"key": "rocm-isolation.io/pool", "operator": "NotIn", "values": ["inference"]} in terms[
                "nodeSelectorTerms"
            ][0]["matchExpressions"]


def test_duplicate_key_inside_the_pod_the_last_one_is_decided(server: Server) -> None:
    pod = training_pod()
    spec_text = (
        json.dumps(pod["spec"])[:-1] + ', "nodeSelector": {}, "nodeSelector": {"rocm-isolation.io/pool": "inference"}}'
    )
    pod_text = json.dumps({**pod, "spec": "SPEC"}).replace('"SPEC"', spec_text)
    review = envelope()
    review_text = json.dumps({**review, "request": {**review["request"], "object": "POD"}}).replace('"POD"', pod_text)
    status, _, data = exchange(server, review_text.encode())
    assert status == 200
    response = json.loads(data)["response"]
    assert response["allowed"] is False and "nodeSelector" in response["status"]["message"]


# ---------------------------------------------------------------------------------------------
# Huge inputs under the body limit
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "path", "value"),
    [
        ("150,000 tolerations", "spec.tolerations", [{"key": f"k{i}", "operator": "Exists"} for i in range(150_000)]),
        ("400,000 numbers in an unknown field", "spec.extra", list(range(400_000))),
        (
            "20,000 GPU containers",
            "spec.containers",
            [{"name": f"c{i}", "image": "x", "resources": {"limits": {"amd.com/gpu": "1"}}} for i in range(20_000)],
        ),
        (
            "20,000 affinity terms",
            "spec.affinity",
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": f"k{i}", "operator": "Exists"}]} for i in range(20_000)
                        ]
                    }
                }
            },
        ),
        ("a 6 MiB label value", "metadata.labels", {"app": "x" * (6 * 1024 * 1024)}),
    ],
)
def test_huge_arrays_and_strings_under_the_limit_are_answered(server: Server, what: str, path: str, value: Any) -> None:
    review = envelope(_set(training_pod(), path, value))
    body = json.dumps(review, separators=(",", ":")).encode()
    assert len(body) < 7 * 1024 * 1024, (what, len(body))
    started = time.monotonic()
    status, _, data = exchange(server, body)
    elapsed = time.monotonic() - started
    assert status == 200, data[:300]
    verify_response(review, json.loads(data))
    assert elapsed < 30, f"{what}: {elapsed:.1f}s"
    still_serving(server)


def test_a_huge_body_does_not_block_other_clients_for_long(server: Server) -> None:
    """While one client's 6 MiB review is being decoded and decided, small reviews still get answers."""
    pod = training_pod()
    pod["spec"]["tolerations"] = [{"key": f"k{i}", "operator": "Exists"} for i in range(150_000)]
    big = json.dumps(envelope(pod)).encode()
    done = threading.Event()

    def send_big() -> None:
        try:
            for _ in range(3):
                exchange(server, big)
        finally:
            done.set()

    sender = threading.Thread(target=send_big, daemon=True)
    sender.start()
    answered = 0
    while not done.is_set():
        still_serving(server)
        answered += 1
    sender.join(60)
    assert answered >= 1


# ---------------------------------------------------------------------------------------------
# TLS on the webhook port
# ---------------------------------------------------------------------------------------------


def _old_tls_client(version: ssl.TLSVersion, ca_file: Path) -> ssl.SSLContext:
    """A client that really offers ``version``: OpenSSL 3 refuses TLS < 1.2 at security level 1+,
    so the level is lowered to 0 and the version pinned."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(ca_file)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = version
        context.maximum_version = version
    return context


def _legacy_server(cert_dir: Path) -> tuple[socket.socket, threading.Thread, list[str]]:
    """A control server that accepts TLS 1.0+: proves the client above does offer the old versions."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
    context.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
    listener = socket.create_server(("127.0.0.1", 0))
    versions: list[str] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    versions.append(str(tls.version()))
            except (OSError, ssl.SSLError):
                conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return listener, thread, versions


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1], ids=["TLS 1.0", "TLS 1.1"])
def test_tls_1_0_and_1_1_are_refused_by_the_server(server: Server, version: ssl.TLSVersion) -> None:
    context = _old_tls_client(version, server.ca_file)
    listener, _, versions = _legacy_server(server.cert_dir)
    try:
        with (
            socket.create_connection(listener.getsockname(), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=SERVICE_HOST) as tls,
        ):
            assert tls.version() == {ssl.TLSVersion.TLSv1: "TLSv1", ssl.TLSVersion.TLSv1_1: "TLSv1.1"}[version]
    finally:
        listener.close()
    deadline = time.monotonic() + 30  # the control server's thread records the handshake after the client
    while not versions and time.monotonic() < deadline:
        time.sleep(0.01)
    assert versions, "the control server saw the old-version handshake"
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        pytest.raises(ssl.SSLError) as refused,
        context.wrap_socket(raw, server_hostname=SERVICE_HOST),
    ):
        pass
    # Refused by the server (an alert, or the connection closed on the ClientHello), not a client-side
    # "no protocols available": the same client completed the handshake with the control server.
    assert refused.value.reason in (
        "TLSV1_ALERT_PROTOCOL_VERSION",
        "UNSUPPORTED_PROTOCOL",
        "UNEXPECTED_EOF_WHILE_READING",
    ), refused.value
    still_serving(server)


def test_plaintext_http_on_the_tls_port_is_refused(server: Server) -> None:
    """Plain HTTP gets no HTTP answer: the TLS layer rejects the bytes and closes the connection."""
    body = json.dumps(envelope()).encode()
    request = (
        f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    assert not answer.startswith(b"HTTP/"), answer[:200]
    assert b"AdmissionReview" not in answer
    still_serving(server)
