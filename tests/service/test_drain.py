"""Shutdown with a drain (webhook/service/drain.py), on the real ``serve`` process: SIGTERM makes /readyz
fail at once while reviews keep being answered, on pooled keep-alive connections and new ones, for
``--drain-seconds``; then idle keep-alive connections are closed and the process exits. A second
SIGTERM ends the drain at once. Times here are bounds for correctness (the drain must have started
and must end), not speed measurements."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import threading
import time

from conftest import PKI, ServerFactory, load_review, wait_for
from kube_apiserver import ApiserverClient, verify_response

DRAIN = 3.0


def test_sigterm_drains_then_shuts_down(running_server: ServerFactory, pki: PKI) -> None:
    server = running_server(
        cert_dir=pki.dir,
        ca_file=pki.ca_file,
        args=["--drain-seconds", str(DRAIN), "--graceful-timeout-seconds", "20"],
    )
    review = load_review("training-pod-create.json")
    pooled = ApiserverClient(server.port, server.ca_file, timeout=10)
    code, reply = pooled.post_review(review)
    assert code == 200
    verify_response(review, reply)
    status, _, body = pooled.request("GET", "/readyz")
    assert status == 200, body
    # A second pooled connection, left idle through the drain: the one the shutdown must close.
    idle = ApiserverClient(server.port, server.ca_file, timeout=10)
    assert idle.post_review(review)[0] == 200
    assert pooled.connections_made == idle.connections_made == 1

    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    # /readyz fails at once: a readiness probe or a load balancer's check takes the replica out.
    wait_for(lambda: pooled.request("GET", "/readyz")[0] == 503, timeout=DRAIN / 2, what="/readyz 503")
    status, _, body = pooled.request("GET", "/readyz")
    ready = json.loads(body)
    assert ready["ready"] is False and "shutdown" in ready["missing"], ready
    assert "draining" in ready["checks"]["shutdown"]["detail"]
    # Reviews are still answered: on the pooled connection, and on a new one; liveness stays good. Each answer
    # closes its connection (Connection: close): the apiserver dials a live replica for the next review.
    status, headers, data = pooled.request(
        "POST", "/mutate?timeout=10s", json.dumps(review).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200 and headers.get("connection") == "close", headers
    verify_response(review, json.loads(data))
    assert pooled.connection.sock is None  # closed after the answer, as Go's client closes it
    with ApiserverClient(server.port, server.ca_file, timeout=10) as fresh:
        code, reply = fresh.post_review(review)
        assert code == 200
        verify_response(review, reply)
        assert fresh.request("GET", "/healthz")[0] == 200
    assert server.alive(), "the process must not exit before the drain ends"

    # Then the shutdown closes the pooled idle connection. Like Go's HTTP client (a read loop on every
    # idle pooled connection), the test reads it and closes its end when the server's close arrives.
    sock = idle.connection.sock
    assert isinstance(sock, ssl.SSLSocket)
    closed_by_server = threading.Event()

    def read_loop() -> None:
        sock.settimeout(DRAIN + 20)
        try:
            if sock.recv(1) == b"":
                closed_by_server.set()
        except (OSError, ssl.SSLError):
            closed_by_server.set()
        sock.close()

    reader = threading.Thread(target=read_loop, daemon=True)
    reader.start()
    exit_code = server.process.wait(DRAIN + 30)
    elapsed = time.monotonic() - signalled
    reader.join(5)
    assert closed_by_server.is_set(), "the idle keep-alive connection must be closed at shutdown"
    assert elapsed >= DRAIN * 0.9, f"exited {elapsed:.1f} s after SIGTERM, before the {DRAIN} s drain"
    # Well before --graceful-timeout-seconds (20): nothing was left to wait for.
    assert elapsed < DRAIN + 15, f"exited only {elapsed:.1f} s after SIGTERM"
    assert exit_code in (0, -signal.SIGTERM)
    log = server.log()
    assert "SIGTERM: draining for 3.0 s" in log
    assert "Finished server process" in log
    # No new connection is accepted once it has gone.
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
        raise AssertionError("a connection was accepted after the shutdown")
    except OSError:
        pass


def test_a_second_sigterm_ends_the_drain(running_server: ServerFactory, pki: PKI) -> None:
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file, args=["--drain-seconds", "60"])
    with ApiserverClient(server.port, server.ca_file, timeout=10) as client:
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: client.request("GET", "/readyz")[0] == 503, timeout=10, what="/readyz 503")
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) in (0, -signal.SIGTERM)


def test_without_a_drain_sigterm_shuts_down_at_once(running_server: ServerFactory, pki: PKI) -> None:
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file)
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) in (0, -signal.SIGTERM)
    assert time.monotonic() - signalled < 20
    assert "draining" not in server.log()
