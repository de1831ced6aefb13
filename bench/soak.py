"""``make soak``: mixed load against the real server for a long time; failures, latency drift, RSS drift.

Starts ``rocm-isolation-webhook serve`` (TLS, the service-test policy, ``--no-cluster``) on a free
loopback port with a fresh CA, then runs for ``SOAK_SECONDS`` (default 600):

- ``SOAK_CLIENTS`` (default 4) apiserver-like clients on pooled HTTP/1.1 connections posting a mix
  of reviews (training, inference, denied, non-GPU, a reinvocation with the patched pod);
- one client dialling a new TLS connection for every review (the apiserver's empty pool);
- one client sending hostile bodies (not JSON, wrong kind, wrong Content-Type, a declared
  oversize body) and expecting the documented 4xx;
- every 2 s a GET of /readyz and /metrics.

Every answer is checked (status, uid, allowed as expected); anything else is a failure. The server's
RSS (``/proc/<pid>/status`` VmRSS) is sampled every second. The run is cut into ten windows (a
minute each by default); the report gives per window the reviews, failures, p50/p99 latency and RSS,
then the drift first-to-last window. Written to stdout and to ``build/soak.json``; exit status 1 if
any request failed or the server died.
"""

from __future__ import annotations

import base64
import copy
import http.client
import itertools
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.service import certs

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "admission"
SERVICE_HOST = "rocm-isolation-webhook.rocm-isolation-system.svc"
WINDOWS = 10


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Connection(http.client.HTTPSConnection):
    """Dials 127.0.0.1, verifies the certificate for the Service name (as the apiserver does)."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        super().__init__("127.0.0.1", port, context=context, timeout=30)
        self._tls = context

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # Go's net.Dial sets TCP_NODELAY too
        self.sock = self._tls.wrap_socket(raw, server_hostname=SERVICE_HOST)


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    samples: list[tuple[float, float]] = field(default_factory=list)  # (time since start, latency s)
    failures: list[tuple[float, str]] = field(default_factory=list)
    hostile: int = 0
    rss: list[tuple[float, int]] = field(default_factory=list)  # (time, kB)

    def ok(self, at: float, latency: float) -> None:
        with self.lock:
            self.samples.append((at, latency))

    def fail(self, at: float, what: str) -> None:
        with self.lock:
            self.failures.append((at, what))


def _reviews() -> list[tuple[dict[str, Any], bool]]:
    """(review, expected allowed) in the mix; the reinvocation carries an already patched pod."""
    out: list[tuple[dict[str, Any], bool]] = []
    for name, allowed in (
        ("training-pod-create.json", True),
        ("inference-pod-create.json", True),
        ("training-pod-reserved-denied.json", False),
        ("cpu-pod-create.json", True),
    ):
        out.append((json.loads((FIXTURES / name).read_text()), allowed))
    return out


def _patched(review: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    import jsonpatch

    ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    again = copy.deepcopy(review)
    again["request"]["object"] = jsonpatch.apply_patch(copy.deepcopy(review["request"]["object"]), ops)
    return again


class Soak:
    def __init__(self, seconds: float, clients: int) -> None:
        self.seconds = seconds
        self.clients = clients
        self.stats = Stats()
        self.stop = threading.Event()
        self.workdir = Path(tempfile.mkdtemp(prefix="soak-"))
        self.port = _free_port()
        certs.write_certificates(
            self.workdir / "certs", dns_names=certs.service_dns_names(), ip_addresses=["127.0.0.1"], new_ca=True
        )
        self.ca_file = self.workdir / "certs" / certs.CA_CERT
        self.context = ssl.create_default_context(cafile=str(self.ca_file))
        self.uids = itertools.count()
        self.uid_lock = threading.Lock()
        self.mix = _reviews()
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    # --- server -------------------------------------------------------------------------------

    def start_server(self) -> None:
        log = (self.workdir / "server.log").open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "webhook", "serve", "--no-cluster",
                "--cert-dir", str(self.workdir / "certs"), "--policy", str(FIXTURES / "policy.yaml"),
                "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
            ],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                conn = Connection(self.port, self.context)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"the server did not start; see {self.workdir / 'server.log'}")

    def stop_server(self) -> int | None:
        if self.process is None:
            return None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def rss_kb(self) -> int:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    # --- clients ------------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.started

    def uid(self) -> str:
        with self.uid_lock:
            return f"soak-{next(self.uids)}"

    def post(self, conn: Connection, body: bytes, content_type: str = "application/json") -> tuple[int, bytes]:
        conn.request(
            "POST",
            "/mutate?timeout=10s",
            body,
            {"Content-Type": content_type, "Host": f"{SERVICE_HOST}:443", "Accept": "application/json, */*"},
        )
        response = conn.getresponse()
        data = response.read()
        if response.will_close:
            conn.close()
        return response.status, data

    def review_once(self, conn: Connection, index: int) -> None:
        review, expected = self.mix[index % len(self.mix)]
        review = copy.deepcopy(review)
        review["request"]["uid"] = self.uid()
        reinvoke = index % 10 == 9
        started = time.perf_counter()
        status, data = self.post(conn, json.dumps(review).encode())
        if status != 200:
            raise AssertionError(f"HTTP {status}: {data[:200]!r}")
        response = json.loads(data)["response"]
        if response["uid"] != review["request"]["uid"] or response["allowed"] is not expected:
            raise AssertionError(f"unexpected reply {response}")
        if reinvoke and "patch" in response:
            again = _patched(review, response)
            again["request"]["uid"] = self.uid()
            status, data = self.post(conn, json.dumps(again).encode())
            second = json.loads(data)["response"]
            if status != 200 or "patch" in second:
                raise AssertionError(f"reinvocation was not a no-op: {second}")
        self.stats.ok(self.now(), time.perf_counter() - started)

    def pooled_client(self, offset: int) -> None:
        conn = Connection(self.port, self.context)
        for index in itertools.count(offset):
            if self.stop.is_set():
                break
            try:
                self.review_once(conn, index)
            except Exception as err:
                self.stats.fail(self.now(), f"pooled: {type(err).__name__}: {err}")
                conn.close()
                conn = Connection(self.port, self.context)
        conn.close()

    def fresh_client(self) -> None:
        for index in itertools.count():
            if self.stop.is_set():
                break
            conn = Connection(self.port, self.context)
            try:
                self.review_once(conn, index)
            except Exception as err:
                self.stats.fail(self.now(), f"fresh: {type(err).__name__}: {err}")
            finally:
                conn.close()

    HOSTILE: tuple[tuple[bytes, str, int], ...] = (
        (b"{not json", "application/json", 400),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}', "application/json", 400),
        (b"{}", "text/plain", 415),
        (b"[" * 50_000 + b"]" * 50_000, "application/json", 400),
    )

    def hostile_client(self) -> None:
        for index in itertools.count():
            if self.stop.is_set():
                break
            body, content_type, expected = self.HOSTILE[index % len(self.HOSTILE)]
            conn = Connection(self.port, self.context)
            try:
                status, data = self.post(conn, body, content_type)
                if status != expected or b"Traceback" in data:
                    self.stats.fail(self.now(), f"hostile: HTTP {status} for {body[:30]!r}")
                else:
                    with self.stats.lock:
                        self.stats.hostile += 1
            except Exception as err:
                self.stats.fail(self.now(), f"hostile: {type(err).__name__}: {err}")
            finally:
                conn.close()
            time.sleep(0.05)

    def monitor(self) -> None:
        conn = Connection(self.port, self.context)
        tick = 0
        while not self.stop.is_set():
            try:
                self.stats.rss.append((self.now(), self.rss_kb()))
                if tick % 2 == 0:
                    for path in ("/readyz", "/metrics"):
                        conn.request("GET", path)
                        response = conn.getresponse()
                        response.read()
                        if response.status != 200:
                            self.stats.fail(self.now(), f"GET {path}: HTTP {response.status}")
            except Exception as err:
                self.stats.fail(self.now(), f"monitor: {type(err).__name__}: {err}")
                conn.close()
                conn = Connection(self.port, self.context)
            tick += 1
            self.stop.wait(1.0)
        conn.close()

    # --- run and report -----------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.start_server()
        self.started = time.monotonic()
        threads = [threading.Thread(target=self.pooled_client, args=(i,), daemon=True) for i in range(self.clients)]
        threads += [threading.Thread(target=target, daemon=True) for target in (self.fresh_client, self.hostile_client)]
        threads.append(threading.Thread(target=self.monitor, daemon=True))
        for thread in threads:
            thread.start()
        while self.now() < self.seconds:
            time.sleep(min(1.0, self.seconds - self.now()) if self.seconds > self.now() else 0)
            if self.process is not None and self.process.poll() is not None:
                self.stats.fail(self.now(), f"server exited with {self.process.returncode}")
                break
        self.stop.set()
        for thread in threads:
            thread.join(60)
        alive = self.process is not None and self.process.poll() is None
        exit_code = self.stop_server()
        return self.report(alive, exit_code)

    def report(self, alive: bool, exit_code: int | None) -> dict[str, Any]:
        width = self.seconds / WINDOWS
        windows = []
        for index in range(WINDOWS):
            low, high = index * width, (index + 1) * width
            latencies = sorted(lat for at, lat in self.stats.samples if low <= at < high)
            rss = [kb for at, kb in self.stats.rss if low <= at < high]
            windows.append(
                {
                    "window": index + 1,
                    "from_s": round(low, 1),
                    "reviews": len(latencies),
                    "failures": sum(1 for at, _ in self.stats.failures if low <= at < high),
                    "p50_ms": round(_quantile(latencies, 0.50) * 1000, 2),
                    "p99_ms": round(_quantile(latencies, 0.99) * 1000, 2),
                    "rss_mib": round(max(rss) / 1024, 1) if rss else 0.0,
                }
            )
        first, last = windows[0], windows[-1]
        return {
            "seconds": self.seconds,
            "clients": {"pooled": self.clients, "fresh_connection": 1, "hostile": 1},
            "reviews": len(self.stats.samples),
            "hostile_requests_answered_as_documented": self.stats.hostile,
            "failures": len(self.stats.failures),
            "failure_examples": [what for _, what in self.stats.failures[:10]],
            "server_alive_at_end": alive,
            "server_exit_code": exit_code,
            "windows": windows,
            "drift": {
                "p50_ms": round(last["p50_ms"] - first["p50_ms"], 2),
                "p99_ms": round(last["p99_ms"] - first["p99_ms"], 2),
                "rss_mib": round(last["rss_mib"] - first["rss_mib"], 1),
            },
        }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]


def print_report(report: dict[str, Any]) -> None:
    print(f"soak: {report['seconds']:.0f} s, {report['reviews']} reviews, {report['failures']} failures")
    print(f"{'window':>6} {'from s':>7} {'reviews':>8} {'fail':>5} {'p50 ms':>8} {'p99 ms':>8} {'RSS MiB':>8}")
    for w in report["windows"]:
        print(
            f"{w['window']:>6} {w['from_s']:>7} {w['reviews']:>8} {w['failures']:>5} "
            f"{w['p50_ms']:>8} {w['p99_ms']:>8} {w['rss_mib']:>8}"
        )
    drift = report["drift"]
    print(
        f"drift first->last window: p50 {drift['p50_ms']:+} ms, p99 {drift['p99_ms']:+} ms, RSS {drift['rss_mib']:+} MiB"
    )
    for example in report["failure_examples"]:
        print(f"  failure: {example}")


def main() -> int:
    seconds = float(os.environ.get("SOAK_SECONDS", "600"))
    clients = int(os.environ.get("SOAK_CLIENTS", "4"))
    soak = Soak(seconds, clients)
    report = soak.run()
    print_report(report)
    out = REPO / "build" / "soak.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}")
    return 0 if report["failures"] == 0 and report["server_alive_at_end"] else 1


if __name__ == "__main__":
    sys.exit(main())
