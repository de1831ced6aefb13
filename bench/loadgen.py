"""The load generator: a separate process that calls the webhook the way kube-apiserver does.

kube-apiserver calls admission webhooks over pooled keep-alive HTTP/1.1 connections (TLS, verified
against the ``caBundle``), ``POST /mutate?timeout=10s``, one request at a time per connection. This
client does the same over ``connections`` keep-alive TLS connections; the TLS handshakes happen
before the clock starts. Every request carries a fresh ``request.uid`` and every reply is checked:
HTTP 200, the same uid, and ``allowed`` as expected.

Two modes:

- ``closed``: every connection sends its next request as soon as the reply arrives (saturation);
- ``open``: requests are *scheduled* at ``rate`` per second (``t0 + i / rate``) and sent on the
  first free connection; latency is measured from the scheduled time (no coordinated omission: a
  request that waits for a free connection counts its wait) and, separately, from the send.

One thread drives every connection with non-blocking sockets and *busy-polls* (``epoll`` with a
zero timeout) on its own core: no sleep, timer or thread hand-off sits between a scheduled time and
its send, or between a reply's arrival and its timestamp. A sleeping client (the earlier design:
one blocking thread per connection, ``time.sleep`` until the scheduled time) added its own timer
slack, GIL hand-offs and CPU wake-ups to every latency: up to a millisecond at p99 on a virtual
machine, more than the server itself took. The garbage collector is off during the run for the
same reason (the client only appends floats).

Run as ``python -m bench.loadgen`` with a JSON job on stdin; prints a JSON result on stdout.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import select
import socket
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import steal
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
        while (parsed := parse_response(self.buffer)) is None:
            chunk = self.sock.recv(262144)
            if not chunk:
                raise ProtocolError("connection closed by the server")
            self.buffer += chunk
        status, body, self.buffer = parsed
        return status, body

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
        return request_bytes("POST", "/mutate?timeout=10s", self.prefix + uid + self.suffix)


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


def parse_response(buffer: bytes) -> tuple[int, bytes, bytes] | None:
    """``(status, body, rest)`` when ``buffer`` holds a whole response, else None."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buffer[:end]
    lower = head.lower()
    index = lower.find(b"\r\ncontent-length:")
    if index < 0:
        raise ProtocolError("response without Content-Length")
    stop = lower.find(b"\r\n", index + 2)
    length = int(head[index + 17 : stop if stop >= 0 else len(head)])
    body_end = end + 4 + length
    if len(buffer) < body_end:
        return None
    return int(head[9:12]), buffer[end + 4 : body_end], buffer[body_end:]


class Channel:
    """One non-blocking keep-alive connection and the request in flight on it."""

    def __init__(self, index: int, job: Job) -> None:
        self.index = index
        self.job = job
        self.counter = 0
        self._connect()

    def _connect(self) -> None:
        connection = Connection(self.job.port, client_context(self.job.ca_file))
        # One request before the clock starts: the apiserver keeps only connections that have
        # carried a request, and the server closes one that carries none within its read deadline.
        status, _ = connection.request("GET", "/healthz")
        if status != 200:
            raise ProtocolError(f"GET /healthz answered {status}")
        self.sock = connection.sock
        self.sock.setblocking(False)
        self.inbox = b""
        self.outbox = memoryview(b"")
        self.template: Template | None = None  # of the request in flight
        self.uid = b""
        self.scheduled = self.sent = 0.0

    def reconnect(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        self._connect()

    @property
    def busy(self) -> bool:
        return self.template is not None

    def start(self, template: Template, scheduled: float) -> None:
        self.counter += 1
        # 36 characters, like a UUID, unique per connection and request.
        self.uid = f"bench000-{self.index:04x}-4000-8000-{self.counter:012x}".encode()
        self.template = template
        self.outbox = memoryview(template.request(self.uid))
        self.scheduled = scheduled
        self.sent = time.perf_counter()
        self.flush()

    def flush(self) -> None:
        """Write what the socket takes now; the rest waits for the next turn of the loop."""
        while self.outbox:
            try:
                written = self.sock.send(self.outbox)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                return
            self.outbox = self.outbox[written:]

    def receive(self) -> tuple[int, bytes] | None:
        """Read what arrived; the whole response once it is complete."""
        try:
            while True:
                chunk = self.sock.recv(262144)
                if not chunk:
                    raise ProtocolError("connection closed by the server")
                self.inbox += chunk
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            pass
        parsed = parse_response(self.inbox)
        if parsed is None:
            return None
        status, body, self.inbox = parsed
        return status, body


class Run:
    """The busy-polling loop over every channel, and what it measured."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.closed = job.mode == "closed"  # closed loop: back to back; open: at the job's rate
        self.templates = [Template.from_file(path, allowed) for path, allowed in job.reviews]
        self.channels = [Channel(i, job) for i in range(job.connections)]
        self.from_send: list[float] = []
        self.from_schedule: list[float] = []
        self.errors = 0
        self.error_samples: list[str] = []
        self.issued = 0
        self.in_flight = 0
        self.replaced = 0  # connections that failed or that the server closed, and were re-opened
        self.free: list[Channel] = []  # connections with no request in flight
        self.poller = select.epoll()
        self.by_fd: dict[int, Channel] = {}

    def _error(self, message: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(message)

    def _check(self, channel: Channel, status: int, body: bytes) -> None:
        template = channel.template
        assert template is not None
        if status != 200:
            self._error(f"HTTP {status}: {body[:200]!r}")
        elif channel.uid not in body:
            self._error("response uid does not match the request")
        elif (b'"allowed":true' in body) != template.allowed:
            self._error(f"allowed is not {template.allowed}: {body[:200]!r}")

    def _issue(self, channel: Channel, scheduled: float) -> None:
        self.in_flight += 1
        try:
            channel.start(self.templates[self.issued % len(self.templates)], scheduled)
        except (OSError, ProtocolError) as err:
            self._replace(channel, err)
        self.issued += 1

    def _done(self, channel: Channel) -> None:
        channel.template = None
        self.in_flight -= 1
        self.free.append(channel)

    def _replace(self, channel: Channel, err: Exception) -> None:
        """A new connection for a failed one; the request in flight on it (if any) is an error."""
        self.poller.unregister(channel.sock.fileno())
        self.replaced += 1
        channel.reconnect()
        self.by_fd = {c.sock.fileno(): c for c in self.channels}
        self.poller.register(channel.sock.fileno(), select.EPOLLIN)
        if channel.busy:  # an idle connection the server closed is only replaced
            self._error(f"transport: {err}")
            self._done(channel)

    def execute(self, start: float) -> float:
        """Drive the channels until the job is done; returns the time the last reply arrived."""
        job = self.job
        self.by_fd = {c.sock.fileno(): c for c in self.channels}
        for fd in self.by_fd:
            self.poller.register(fd, select.EPOLLIN)
        # Free connections are reused most recently used first, as Go's http.Transport (the
        # apiserver's client) takes its idle connections.
        self.free = list(reversed(self.channels))
        self.in_flight = 0
        perf_counter, free, poll = time.perf_counter, self.free, self.poller.poll
        closed = self.closed
        interval = 0.0 if closed else 1.0 / job.rate
        total = job.max_requests if closed else int(job.duration * job.rate)
        end = start + job.duration
        waiting: collections.deque[float] = collections.deque()  # open loop: scheduled, no connection yet
        scheduled = 0
        while perf_counter() < start:
            pass
        last = start
        while True:
            now = perf_counter()
            if closed:
                while free and now < end and not (total and self.issued >= total):
                    self._issue(free.pop(), now)
            else:
                while scheduled < total and start + scheduled * interval <= now:
                    waiting.append(start + scheduled * interval)
                    scheduled += 1
                while waiting and free:
                    self._issue(free.pop(), waiting.popleft())
            if not self.in_flight and not waiting and (closed or scheduled >= total):
                return last
            self._flush()
            for fd, _ in poll(0):
                if (arrived := self._receive(fd)) is not None:
                    last = arrived

    def _flush(self) -> None:
        """Write on to the requests the sockets did not take whole."""
        for channel in self.channels:
            if channel.outbox:
                try:
                    channel.flush()
                except OSError as err:
                    self._replace(channel, err)

    def _receive(self, fd: int) -> float | None:
        """Read what arrived on ``fd``; the time a reply completed there, or None."""
        channel = self.by_fd.get(fd)
        if channel is None:  # replaced earlier in this turn
            return None
        try:
            reply = channel.receive()
        except (OSError, ProtocolError) as err:
            self._replace(channel, err)
            return None
        if reply is None:
            return None
        arrived = time.perf_counter()
        self.from_send.append(arrived - channel.sent)
        if not self.closed:
            self.from_schedule.append(arrived - channel.scheduled)
        self._check(channel, *reply)
        self._done(channel)
        return arrived


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
    runner = Run(job)  # connections are established (and TLS handshakes done) before the clock starts
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter() + 0.05
        steal_before = steal.read()  # the hypervisor's steal over the timed window only
        finished = runner.execute(start)
        steal_after = steal.read()
    finally:
        gc.enable()
        runner.poller.close()
        for channel in runner.channels:
            with contextlib.suppress(OSError):
                channel.sock.close()
    elapsed = max(finished - start, 1e-9)
    return {
        "mode": job.mode,
        "rate": job.rate,
        "connections": job.connections,
        "requests": len(runner.from_send),
        "errors": runner.errors,
        "error_samples": runner.error_samples[:5],
        "connections_replaced": runner.replaced,
        "elapsed": elapsed,
        "throughput": len(runner.from_send) / elapsed,
        "client_cpu_seconds": time.process_time(),
        "latency_from_send": quantiles(runner.from_send),
        "latency_from_schedule": quantiles(runner.from_schedule),
        "steal_readings": [steal_before, steal_after],
    }


def main() -> int:
    spec = json.loads(sys.stdin.read())
    spec["reviews"] = [tuple(item) for item in spec["reviews"]]
    print(json.dumps(run(Job(**spec))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
