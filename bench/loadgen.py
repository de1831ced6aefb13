"""The load generator: a separate process that calls the webhook the way kube-apiserver does.

kube-apiserver calls admission webhooks over pooled keep-alive HTTP/1.1 connections (TLS, verified
against the ``caBundle``), ``POST /mutate?timeout=10s``, one request at a time per connection. This
client does the same with one blocking TLS socket per thread; the TLS handshakes happen before the
clock starts. Every request carries a fresh ``request.uid`` and every reply is checked: HTTP 200,
the same uid, and ``allowed`` as expected.

Two modes:

- ``closed``: ``connections`` threads send back to back (saturation throughput);
- ``open``: requests are *scheduled* at ``rate`` per second (``t0 + i / rate``) and sent by the
  first free connection; latency is measured from the scheduled time (no coordinated omission: a
  slow reply delays the next send, and that delay is counted) and, separately, from the send.

Run as ``python -m bench.loadgen`` with a JSON job on stdin; prints a JSON result on stdout.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.reviews import UID_PLACEHOLDER

SERVER_NAME = "rocm-isolation-webhook.rocm-isolation-system.svc"


class ProtocolError(Exception):
    pass


class Connection:
    """One keep-alive HTTP/1.1 connection over TLS (minimal client: the benchmark must not be the bottleneck)."""

    def __init__(self, port: int, context: ssl.SSLContext, server_name: str = SERVER_NAME) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = context.wrap_socket(raw, server_hostname=server_name)
        self.server_name = server_name
        self.buffer = b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, data: bytes) -> tuple[int, bytes]:
        self.sock.sendall(data)
        return self._read_response()

    def _read_response(self) -> tuple[int, bytes]:
        buffer = self.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            chunk = self.sock.recv(262144)
            if not chunk:
                raise ProtocolError("connection closed by the server")
            buffer += chunk
        head = buffer[:end]
        status = int(head[9:12])
        lower = head.lower()
        index = lower.find(b"\r\ncontent-length:")
        if index < 0:
            raise ProtocolError("response without Content-Length")
        stop = lower.find(b"\r\n", index + 2)
        length = int(head[index + 17 : stop if stop >= 0 else len(head)])
        body_end = end + 4 + length
        while len(buffer) < body_end:
            chunk = self.sock.recv(262144)
            if not chunk:
                raise ProtocolError("connection closed in the middle of a response")
            buffer += chunk
        self.buffer = buffer[body_end:]
        return status, buffer[end + 4 : body_end]

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        return self.send(request_bytes(method, path, body, self.server_name))


def request_bytes(method: str, path: str, body: bytes, server_name: str = SERVER_NAME) -> bytes:
    # The headers kube-apiserver's REST client sends.
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {server_name}:443\r\nUser-Agent: kube-apiserver-admission\r\n"
        f"Accept: application/json, */*\r\nAccept-Encoding: gzip\r\n"
    )
    if method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + body


def client_context(ca_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


@dataclass
class Template:
    """A review body split around its uid, with the expected ``allowed``."""

    prefix: bytes
    suffix: bytes
    allowed: bool

    @classmethod
    def from_file(cls, path: str, allowed: bool) -> Template:
        body = json.dumps(json.loads(Path(path).read_text()), separators=(",", ":")).encode()
        prefix, suffix = body.split(UID_PLACEHOLDER.encode(), 1)
        return cls(prefix, suffix, allowed)

    def request(self, uid: bytes) -> bytes:
        body = self.prefix + uid + self.suffix
        head = (
            f"POST /mutate?timeout=10s HTTP/1.1\r\nHost: {SERVER_NAME}:443\r\nUser-Agent: kube-apiserver-admission\r\n"
            f"Accept: application/json, */*\r\nAccept-Encoding: gzip\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


@dataclass
class Job:
    port: int
    ca_file: str
    mode: str  # closed | open
    connections: int
    duration: float
    reviews: list[tuple[str, bool]]  # (file, expected allowed); requests cycle through them
    rate: float = 0.0
    max_requests: int = 0  # closed mode: stop after this many (0: no limit)


class Worker(threading.Thread):
    def __init__(self, index: int, job: Job, templates: list[Template], shared: Shared) -> None:
        super().__init__(daemon=True)
        self.index = index
        self.job = job
        self.templates = templates
        self.shared = shared
        self.connection = Connection(job.port, client_context(job.ca_file))
        self.from_schedule: list[float] = []
        self.from_send: list[float] = []
        self.errors = 0
        self.error_samples: list[str] = []
        self.counter = 0

    def _uid(self) -> bytes:
        self.counter += 1
        # 36 characters, like a UUID, unique per worker and request.
        return f"bench000-{self.index:04x}-4000-8000-{self.counter:012x}".encode()

    def _call(self, template: Template) -> None:
        uid = self._uid()
        try:
            status, body = self.connection.send(template.request(uid))
        except (OSError, ProtocolError) as err:
            self._error(f"transport: {err}")
            self.connection.close()
            self.connection = Connection(self.job.port, client_context(self.job.ca_file))
            return
        if status != 200:
            self._error(f"HTTP {status}: {body[:200]!r}")
        elif uid not in body:
            self._error("response uid does not match the request")
        elif (b'"allowed":true' in body) != template.allowed:
            self._error(f"allowed is not {template.allowed}: {body[:200]!r}")

    def _error(self, message: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(message)

    def run(self) -> None:
        shared = self.shared
        shared.ready.wait()
        templates = self.templates
        count = len(templates)
        if self.job.mode == "closed":
            end = shared.start + self.job.duration
            limit = self.job.max_requests
            while True:
                i = next(shared.slots)
                if limit and i >= limit:
                    break
                sent = time.perf_counter()
                if sent >= end:
                    break
                self._call(templates[i % count])
                self.from_send.append(time.perf_counter() - sent)
        else:
            interval = 1.0 / self.job.rate
            total = int(self.job.duration * self.job.rate)
            while True:
                i = next(shared.slots)
                if i >= total:
                    break
                scheduled = shared.start + i * interval
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent = time.perf_counter()
                self._call(templates[i % count])
                done = time.perf_counter()
                self.from_schedule.append(done - scheduled)
                self.from_send.append(done - sent)
        self.connection.close()


class Shared:
    def __init__(self) -> None:
        self.ready = threading.Event()
        self.slots = itertools.count()
        self.start = 0.0


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    n = len(ordered)

    def q(p: float) -> float:
        return ordered[min(n - 1, int(p * n))]

    return {
        "count": n,
        "mean": sum(ordered) / n,
        "p50": q(0.50),
        "p90": q(0.90),
        "p99": q(0.99),
        "p999": q(0.999),
        "max": ordered[-1],
    }


def run(job: Job) -> dict[str, Any]:
    templates = [Template.from_file(path, allowed) for path, allowed in job.reviews]
    shared = Shared()
    workers = [Worker(i, job, templates, shared) for i in range(job.connections)]
    for worker in workers:
        worker.start()
    # Connections are established (and TLS handshakes done) before the clock starts.
    shared.start = time.perf_counter() + 0.05
    shared.ready.set()
    for worker in workers:
        worker.join()
    finished = time.perf_counter()
    from_send = [v for w in workers for v in w.from_send]
    from_schedule = [v for w in workers for v in w.from_schedule]
    elapsed = max(finished - shared.start, 1e-9)
    cpu = time.process_time()
    return {
        "mode": job.mode,
        "rate": job.rate,
        "connections": job.connections,
        "requests": len(from_send),
        "errors": sum(w.errors for w in workers),
        "error_samples": [s for w in workers for s in w.error_samples][:5],
        "elapsed": elapsed,
        "throughput": len(from_send) / elapsed,
        "client_cpu_seconds": cpu,
        "latency_from_send": quantiles(from_send),
        "latency_from_schedule": quantiles(from_schedule),
    }


def main() -> int:
    spec = json.loads(sys.stdin.read())
    spec["reviews"] = [tuple(item) for item in spec["reviews"]]
    sys.setswitchinterval(0.0005)
    print(json.dumps(run(Job(**spec))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
