"""Start, probe and stop the benchmarked servers: the real ``serve`` (compiled or pure Python), the
project's null webhook (bench/null_app.py) and the bare FastAPI null webhook (bench/bare_null_app.py)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.loadgen import Connection, ProtocolError, client_context
from webhook.service import certs

REPO = Path(__file__).resolve().parent.parent
BARE_MODULES = ("bench.bare_null_app", "bench.floor_app")  # no /metrics


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def make_certs(directory: Path) -> Path:
    """CA + serving certificate for the Service names; returns the CA bundle path."""
    certs.write_certificates(
        directory, dns_names=[*certs.service_dns_names(), "localhost"], ip_addresses=["127.0.0.1"], new_ca=True
    )
    return directory / certs.CA_CERT


def pin(cpus: str | None) -> list[str]:
    """``taskset -c <cpus>`` when available and asked for."""
    if cpus is None or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", cpus]


@dataclass
class Server:
    name: str
    port: int
    ca_file: Path
    process: subprocess.Popen[bytes]
    log_file: Path
    has_metrics: bool = True  # the bare null webhook and the floor serve /mutate and /healthz only

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_kib(self) -> int:
        """VmRSS of the server process, in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def get(self, path: str) -> tuple[int, bytes]:
        connection = Connection(self.port, client_context(str(self.ca_file)))
        try:
            return connection.request("GET", path)
        finally:
            connection.close()

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return body.decode()

    def log_size(self) -> int:
        return self.log_file.stat().st_size

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)


def pure_python_tree(work: Path) -> Path:
    """A copy of the ``webhook`` package without its compiled modules: what runs without a C compiler.

    A server started with this directory as its working directory imports the pure Python sources
    (``python -m`` puts the working directory first on ``sys.path``, before the editable install)."""
    target = work / "pure-python"
    shutil.copytree(
        REPO / "webhook", target / "webhook", ignore=shutil.ignore_patterns("*.so", "__pycache__"), dirs_exist_ok=True
    )
    return target


def start(
    name: str,
    module: str,
    *,
    cert_dir: Path,
    ca_file: Path,
    policy: Path,
    work: Path,
    cpus: str | None,
    cwd: Path = REPO,
) -> Server:
    """``python -m <module> --cert-dir ... --policy ... --no-cluster`` on a free loopback port.

    ``module`` is ``webhook serve`` (the real webhook), ``bench.null_app`` or ``bench.bare_null_app``;
    all run with the production defaults of ``serve`` (1 worker, uvloop + httptools, log level info,
    keep-alive 95 s). ``cwd``: where the ``webhook`` package is imported from (``pure_python_tree``).
    """
    port = free_port()
    log_file = work / f"{name}-{port}.log"
    command = [
        *pin(cpus), sys.executable, "-m", *module.split(),
        "--cert-dir", str(cert_dir), "--policy", str(policy),
        "--host", "127.0.0.1", "--port", str(port), "--no-cluster",
    ]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if key != "PROMETHEUS_MULTIPROC_DIR"}
    with log_file.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    server = Server(name, port, ca_file, process, log_file, has_metrics=module not in BARE_MODULES)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_file.read_text()[-3000:]}")
        try:
            if server.get("/healthz")[0] == 200:
                return server
        except (OSError, ssl.SSLError, ProtocolError):
            pass  # not listening yet, or closed the probe: try again until the deadline
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"{name} did not become healthy:\n{log_file.read_text()[-3000:]}")
        time.sleep(0.1)


_BUCKET = re.compile(r'^rocm_isolation_admission_review_duration_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)$', re.M)
_REVIEWS = re.compile(r"^rocm_isolation_admission_reviews_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def histogram(metrics: str) -> dict[float, float]:
    """Cumulative bucket counts of the server's review latency histogram, by upper bound."""
    return {float(le): float(count) for le, count in _BUCKET.findall(metrics)}


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative ``buckets`` (linear within the bucket)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def reviews_total(metrics: str) -> int:
    return int(sum(float(value) for value in _REVIEWS.findall(metrics)))
