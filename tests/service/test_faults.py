"""Faults, each against the real server (``rocm-isolation-webhook serve`` over TLS in a subprocess).

Only kube-apiserver is replayed: as the webhook's client by ``kube_apiserver.ApiserverClient``, and
as the API the cluster-facts cache lists and watches by ``fake_kube_api.FakeKubeApi`` (recorded
responses over real HTTP). Files, signals, sockets and slow clients are real.

Already proven elsewhere and not repeated here (docs/reliability.md lists them):
certificate files replaced by a valid pair, then a broken one, under load
(test_rotation.py::test_certificate_rotation_under_load); a broken policy under load
(test_rotation.py::test_broken_policy_keeps_the_last_good_one_under_load); the Kubernetes API
answering 500 from the start (tests/cluster/test_cache.py::test_readiness_waits_for_the_cluster); SIGTERM with
one review in flight (test_server.py::test_sigterm_finishes_the_review_in_flight).
"""

from __future__ import annotations

import http.client
import json
import resource
import shutil
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import PKI, Server, ServerFactory, load_review, wait_for
from fake_kube_api import FakeKubeApi, listed, status, watched
from kube_apiserver import SERVICE_HOST, ApiserverClient, apply_patch, verify_response

POLICY = Path(__file__).parents[1] / "fixtures" / "admission" / "policy.yaml"
READ_TIMEOUT = 2.0


def metric(server: Server, name: str, labels: str = "") -> float:
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    for line in server.metrics().splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def roundtrip(server: Server, review: dict[str, Any], client: ApiserverClient | None = None) -> dict[str, Any]:
    own = client is None
    client = client or ApiserverClient(server.port, server.ca_file)
    try:
        code, reply = client.post_review(review)
    finally:
        if own:
            client.close()
    assert code == 200, reply
    return verify_response(review, reply)


def gpu_max_hw_queues(review: dict[str, Any], response: dict[str, Any]) -> str | None:
    pod = apply_patch(review["request"]["object"], response)
    for var in pod["spec"]["containers"][0].get("env", []):
        if var["name"] == "GPU_MAX_HW_QUEUES":
            return str(var["value"])
    return None


def tls_socket(server: Server, timeout: float = 30.0) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(server.ca_file))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    return context.wrap_socket(raw, server_hostname=SERVICE_HOST)


def closed_by_peer(sock: ssl.SSLSocket, *, within: float) -> float | None:
    """Seconds until the server closes ``sock`` (reading only), or None if it stays open ``within``."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < within:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except (TimeoutError, ssl.SSLWantReadError):
            continue
        except OSError:
            return time.monotonic() - started
    return None


# ---------------------------------------------------------------------------------------------
# Policy file broken, then deleted
# ---------------------------------------------------------------------------------------------


def test_policy_file_broken_then_deleted_keeps_the_last_good_policy(
    running_server: ServerFactory, pki: PKI, tmp_path: Path
) -> None:
    policy_file = tmp_path / "policy.yaml"
    shutil.copy(POLICY, policy_file)
    server = running_server(
        cert_dir=pki.dir, ca_file=pki.ca_file, policy=policy_file, args=["--policy-poll-seconds", "0.2"]
    )
    review = load_review("inference-pod-create.json")
    assert gpu_max_hw_queues(review, roundtrip(server, review)) == "4"

    policy_file.write_text("spec: [this is not a policy\n")
    wait_for(lambda: metric(server, "rocm_isolation_policy_reload_failures_total") >= 1, what="broken policy seen")
    policy_file.unlink()
    wait_for(lambda: metric(server, "rocm_isolation_policy_reload_failures_total") >= 2, what="deleted policy seen")

    # Deleted: the last good policy still decides, and the problem is visible.
    assert gpu_max_hw_queues(review, roundtrip(server, review)) == "4"
    code, ready = server.get_json("/readyz")
    assert code == 200
    assert ready["checks"]["policy"]["name"] == "service-tests"
    assert "cannot read the file" in ready["checks"]["policy"]["lastReloadError"]
    assert metric(server, "rocm_isolation_policy_last_reload_success") == 0
    assert any(line.get("msg") == "policy reload failed, keeping the last good policy" for line in server.log_lines())

    # Restored with a change: picked up, error cleared.
    policy_file.write_text(POLICY.read_text().replace('value: "4"', 'value: "5"'))
    wait_for(lambda: gpu_max_hw_queues(review, roundtrip(server, review)) == "5", what="restored policy")
    _, ready = server.get_json("/readyz")
    assert "lastReloadError" not in ready["checks"]["policy"]
    assert server.alive()


# ---------------------------------------------------------------------------------------------
# The Kubernetes API unreachable, or failing after the cache synced
# ---------------------------------------------------------------------------------------------


def test_kubernetes_api_unreachable_from_the_start(running_server: ServerFactory, pki: PKI, tmp_path: Path) -> None:
    """Nothing listens at the API address: /readyz is 503 naming the cluster (the Service sends the
    apiserver elsewhere), yet reviews that do reach the pod are answered, with the class from the
    policy's name rules and a warning that namespace labels were unknown."""
    dead = FakeKubeApi()
    dead.httpd.server_close()  # a free port nobody listens on
    kubeconfig = dead.write_kubeconfig(tmp_path / "kubeconfig")
    server = running_server(
        cert_dir=pki.dir, ca_file=pki.ca_file, policy=POLICY, cluster=True, args=["--kubeconfig", str(kubeconfig)]
    )

    def cluster_error() -> bool:
        code, body = server.get_json("/readyz")
        return code == 503 and "lastError" in body["checks"]["cluster"]["namespaces"]

    wait_for(cluster_error, what="the connection error in /readyz")
    _, body = server.get_json("/readyz")
    assert body["missing"] == ["cluster"]
    assert "onnection" in body["checks"]["cluster"]["namespaces"]["lastError"]  # Connection refused / error

    review = load_review("inference-pod-create.json")
    started = time.monotonic()
    response = roundtrip(server, review)
    assert time.monotonic() - started < 5, "a review never waits for the API"
    assert response["allowed"] is True
    assert any("labels unknown" in warning for warning in response["warnings"])
    assert apply_patch(review["request"]["object"], response)["metadata"]["annotations"]["rocm-isolation.io/class"] == (
        "inference"
    )
    training = load_review("training-pod-reserved-denied.json")
    assert roundtrip(server, training)["allowed"] is False
    assert metric(server, "rocm_isolation_cluster_cache_synced", 'resource="namespaces"') == 0


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    fake = FakeKubeApi().start()
    yield fake
    fake.stop()


def test_kubernetes_api_failing_after_sync_keeps_the_cached_facts(
    api: FakeKubeApi, running_server: ServerFactory, pki: PKI, tmp_path: Path
) -> None:
    """Listed once, then every watch drops and every relist answers 500: the cache keeps serving the
    facts it has (docs/architecture.md), so readiness stays 200, namespace classes still come from
    labels and a reserved node named in spec.nodeName is still denied; the error is in /readyz."""
    api.script(
        "namespaces",
        lists=[listed("namespaces-list-1.json"), status(500, "status-500.json")],
        watches=[watched("namespaces-watch-1.jsonl", end="drop")],
    )
    api.script(
        "nodes",
        lists=[listed("nodes-list.json"), status(500, "status-500.json")],
        watches=[watched("nodes-watch.jsonl", end="drop")],
    )
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file, cluster=True, args=["--kubeconfig", str(kubeconfig)])

    def failing_after_sync() -> bool:
        code, body = server.get_json("/readyz")
        cluster = body["checks"]["cluster"]
        return code == 200 and all("lastError" in cluster[r] for r in ("namespaces", "nodes"))

    wait_for(failing_after_sync, what="relists failing after the first sync")
    wait_for(
        lambda: all(len([r for r in api.requests_for(c) if not r.watch]) >= 2 for c in ("namespaces", "nodes")),
        what="relists answered 500",
    )

    review = load_review("inference-pod-create.json")
    review["request"]["namespace"] = review["request"]["object"]["metadata"]["namespace"] = "team-a"
    response = roundtrip(server, review)
    assert apply_patch(review["request"]["object"], response)["metadata"]["annotations"]["rocm-isolation.io/class"] == (
        "inference"
    )
    assert not any("labels unknown" in warning for warning in response.get("warnings", []))
    training = load_review("training-pod-create.json")
    training["request"]["object"]["spec"]["nodeName"] = "gpu-node-1"
    denied = roundtrip(server, training)
    assert denied["allowed"] is False and "gpu-node-1" in denied["status"]["message"]
    assert metric(server, "rocm_isolation_cluster_cache_synced", 'resource="nodes"') == 1


# ---------------------------------------------------------------------------------------------
# Slow clients
# ---------------------------------------------------------------------------------------------


@dataclass
class Prober:
    """Posts reviews on fresh connections in a thread; records each latency and any failure."""

    server: Server
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        review = load_review("training-pod-create.json")
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                roundtrip(self.server, review)
                self.latencies.append(time.monotonic() - started)
            except Exception as err:
                self.failures.append(f"{type(err).__name__}: {err}")
            time.sleep(0.05)

    def __enter__(self) -> Prober:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


@pytest.fixture
def deadline_server(running_server: ServerFactory, pki: PKI) -> Server:
    return running_server(cert_dir=pki.dir, ca_file=pki.ca_file, args=["--read-timeout-seconds", str(READ_TIMEOUT)])


def test_headers_trickled_a_byte_at_a_time_are_cut_off(deadline_server: Server) -> None:
    """Slowloris: a byte of headers every 100 ms (the headers never end). The server closes the
    connection once the read deadline passes, and meanwhile answers everyone else promptly."""
    server = deadline_server
    head = b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 10_000
    sockets = [tls_socket(server) for _ in range(20)]
    closed_at: list[float | None] = [None] * len(sockets)
    started = time.monotonic()
    with Prober(server) as prober:
        for byte in head:
            for index, sock in enumerate(sockets):
                if closed_at[index] is not None:
                    continue
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    closed_at[index] = time.monotonic() - started
            if all(at is not None for at in closed_at) or time.monotonic() - started > READ_TIMEOUT + 30:
                break
            for index, sock in enumerate(sockets):
                if closed_at[index] is None and closed_by_peer(sock, within=0.005) is not None:
                    closed_at[index] = time.monotonic() - started
            time.sleep(0.1)
    for sock in sockets:
        sock.close()
    assert all(at is not None for at in closed_at), closed_at
    assert max(at for at in closed_at if at is not None) < READ_TIMEOUT + 30
    assert min(at for at in closed_at if at is not None) >= READ_TIMEOUT * 0.9
    assert prober.failures == []
    assert len(prober.latencies) >= 5
    assert max(prober.latencies) < 5, max(prober.latencies)
    assert any("not complete in time" in line.get("msg", "") for line in server.log_lines())
    assert server.alive()


def test_a_connection_that_sends_nothing_is_closed(deadline_server: Server) -> None:
    with tls_socket(deadline_server) as sock:
        after = closed_by_peer(sock, within=READ_TIMEOUT + 30)
    assert after is not None and after >= READ_TIMEOUT * 0.9


def test_a_body_that_stalls_is_cut_off_and_counted_as_a_disconnect(deadline_server: Server) -> None:
    server = deadline_server
    body = json.dumps(load_review("training-pod-create.json")).encode()
    with tls_socket(server) as sock:
        sock.sendall(
            f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
        after = closed_by_peer(sock, within=READ_TIMEOUT + 30)
    assert after is not None
    wait_for(
        lambda: metric(server, "rocm_isolation_errors_total", 'kind="disconnected"') == 1,
        what="the disconnect counted",
    )
    assert metric(server, "rocm_isolation_errors_total", 'kind="internal"') == 0
    assert "Traceback" not in server.log()


def test_the_read_deadline_does_not_cut_idle_keep_alive_or_slow_answers(deadline_server: Server) -> None:
    """The deadline runs only while a request is being received: a pooled connection idle for
    longer than it is reused (the keep-alive timeout governs idling), and a request whose bytes
    arrive in pieces within the deadline is answered."""
    server = deadline_server
    review = load_review("training-pod-create.json")
    with server.client() as client:
        roundtrip(server, review, client)
        time.sleep(READ_TIMEOUT + 1.5)
        roundtrip(server, review, client)
        assert client.connections_made == 1
    body = json.dumps(review).encode()
    with tls_socket(server) as sock:
        sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
        time.sleep(READ_TIMEOUT / 4)
        sock.sendall(f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        time.sleep(READ_TIMEOUT / 4)
        sock.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200")


# ---------------------------------------------------------------------------------------------
# Many idle keep-alive connections
# ---------------------------------------------------------------------------------------------

IDLE_CONNECTIONS = 1000


def test_1000_idle_keep_alive_connections_do_not_stop_new_clients(running_server: ServerFactory, pki: PKI) -> None:
    """1,000 pooled connections, each used once and left idle (as an apiserver pool keeps them):
    a new client is still answered promptly, and the idle connections are still usable."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE_CONNECTIONS * 2 + 256
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < wanted:
        pytest.skip(f"the file descriptor limit ({hard}) is below {wanted}")
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file)  # inherits the raised limit
    clients: list[ApiserverClient] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            client = ApiserverClient(server.port, server.ca_file, timeout=60)
            code, _, _ = client.request("GET", "/healthz")
            assert code == 200
            clients.append(client)
        review = load_review("training-pod-create.json")
        started = time.monotonic()
        for _ in range(5):
            assert roundtrip(server, review)["allowed"] is True
        assert (time.monotonic() - started) / 5 < 2.0
        # The idle ones were kept, not dropped: a sample reuses its connection.
        for client in clients[:: IDLE_CONNECTIONS // 10]:
            assert roundtrip(server, review, client)["allowed"] is True
            assert client.connections_made == 1
        code, _ = server.get_json("/healthz")
        assert code == 200
    finally:
        for client in clients:
            client.close()
    assert server.alive()


# ---------------------------------------------------------------------------------------------
# SIGTERM under load
# ---------------------------------------------------------------------------------------------

# Connection-level failures a client may see once the server stops accepting: the apiserver
# retries a request on a pooled connection the server closed before anything was written.
CONNECTION_ERRORS = (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest, ssl.SSLError)


def _send_head_and_half(server: Server, body: bytes) -> ssl.SSLSocket:
    sock = tls_socket(server)
    sock.sendall(
        f"POST /mutate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body[: len(body) // 2]
    )
    return sock


def _read_reply(sock: ssl.SSLSocket) -> bytes:
    answer = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return answer
        answer += data
        head, sep, rest = answer.partition(b"\r\n\r\n")
        if sep:
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            if len(rest) >= length:
                return answer


def test_sigterm_under_load_completes_the_reviews_in_flight(running_server: ServerFactory, pki: PKI) -> None:
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file, args=["--graceful-timeout-seconds", "20"])
    review = load_review("training-pod-create.json")
    body = json.dumps(review).encode()
    stop = threading.Event()
    answered = [0] * 6
    bad: list[str] = []  # anything but a complete 200 reply or a connection-level error
    refused: list[str] = []

    def load(index: int) -> None:
        client = ApiserverClient(server.port, server.ca_file, timeout=30)
        while not stop.is_set():
            try:
                code, reply = client.post_review(review)
                if code != 200:
                    bad.append(f"HTTP {code}")
                else:
                    verify_response(review, reply)
                    answered[index] += 1
            except CONNECTION_ERRORS as err:
                refused.append(type(err).__name__)
                client.close()
                if not server.alive():
                    return
                client = ApiserverClient(server.port, server.ca_file, timeout=30)
                time.sleep(0.01)
            except Exception as err:  # a truncated or invalid reply
                bad.append(f"{type(err).__name__}: {err}")
        client.close()

    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(len(answered))]
    for thread in threads:
        thread.start()
    wait_for(lambda: all(n >= 3 for n in answered), what="load on every connection")
    # Reviews in flight at the signal: headers and half a body sent, the rest after it.
    in_flight = [_send_head_and_half(server, body) for _ in range(5)]
    time.sleep(0.3)
    before = sum(answered)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    replies = []
    for sock in in_flight:
        sock.sendall(body[len(body) // 2 :])
        replies.append(_read_reply(sock))
        sock.close()
    exit_code = server.process.wait(40)
    stop.set()
    for thread in threads:
        thread.join(30)
    for reply in replies:
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        verify_response(review, json.loads(reply.partition(b"\r\n\r\n")[2]))
    assert bad == [], bad
    assert before > 0
    assert exit_code in (0, -signal.SIGTERM)
    assert "Finished server process" in server.log()
    # No new connection is accepted once it has gone.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
