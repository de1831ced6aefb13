"""Shared fixtures for the service tests (and the hostile-input and benchmark suites).

- ``pki``: a CA and a serving certificate for the webhook Service, made with ``webhook.service.certs``;
- ``running_server``: a factory that starts the real ``rocm-isolation-webhook serve`` (uvicorn over
  TLS on a free loopback port, in a subprocess) and stops it at the end of the test;
- ``admission_review``: loads an AdmissionReview fixture from tests/fixtures/admission/.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kube_apiserver import SERVICE_HOST, ApiserverClient

from webhook.service import certs

FIXTURES = Path(__file__).parent / "fixtures"
ADMISSION_FIXTURES = FIXTURES / "admission"
REPO = Path(__file__).parent.parent


def stale_compiled_modules(package: Path = REPO / "webhook") -> list[str]:
    """Compiled modules (mypyc, ``make compile``) older than their source: Python would import the
    old compiled code instead of the source being tested."""
    stale = []
    for compiled in package.rglob("*.so"):
        source = compiled.with_name(compiled.name.split(".", 1)[0] + ".py")
        if source.exists() and source.stat().st_mtime > compiled.stat().st_mtime:
            stale.append(f"{compiled.relative_to(package.parent)} (older than {source.name})")
    return stale


def pytest_configure(config: pytest.Config) -> None:
    stale = stale_compiled_modules()
    if stale:
        pytest.exit(
            "compiled modules are older than their sources: " + ", ".join(stale) + ". Run `make compile` "
            "(or `make pure` for the pure Python modules); `make test` does it for you.",
            returncode=4,
        )


@dataclass(frozen=True)
class PKI:
    dir: Path
    ca_file: Path
    ca: certs.Issued
    serving: certs.Issued

    def reissue(self, *, dns_names: Sequence[str] | None = None, days: int = 30) -> certs.Issued:
        """Write a new serving pair signed by the same CA into ``dir`` (what cert-manager does on renewal)."""
        _, serving = certs.write_certificates(
            self.dir,
            dns_names=list(dns_names) if dns_names is not None else default_dns_names(),
            ip_addresses=["127.0.0.1"],
            days=days,
            ca=self.ca,
        )
        return serving


def default_dns_names() -> list[str]:
    return [*certs.service_dns_names(), "localhost"]


def make_pki(directory: Path) -> PKI:
    ca, serving = certs.write_certificates(
        directory, dns_names=default_dns_names(), ip_addresses=["127.0.0.1"], new_ca=True
    )
    return PKI(dir=directory, ca_file=directory / certs.CA_CERT, ca=ca, serving=serving)


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    return make_pki(tmp_path / "certs")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(condition: Callable[[], bool], *, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> None:
    """Poll ``condition`` until true; fail with ``what`` after ``timeout`` seconds (generous: loaded CI)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")


@dataclass
class Server:
    """A running ``serve`` process."""

    port: int
    ca_file: Path
    cert_dir: Path
    process: subprocess.Popen[bytes]
    log_file: Path
    clients: list[ApiserverClient] = field(default_factory=list)

    def client(self, *, server_name: str = SERVICE_HOST, timeout: float = 30.0) -> ApiserverClient:
        client = ApiserverClient(self.port, self.ca_file, server_name=server_name, timeout=timeout)
        self.clients.append(client)
        return client

    def get_json(self, path: str) -> tuple[int, dict[str, Any]]:
        with ApiserverClient(self.port, self.ca_file) as client:
            status, _, body = client.request("GET", path)
        return status, json.loads(body)

    def metrics(self) -> str:
        with ApiserverClient(self.port, self.ca_file) as client:
            status, _, body = client.request("GET", "/metrics")
        assert status == 200
        return body.decode()

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return lines

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        for client in self.clients:
            client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        return self.process.returncode


def _healthy(port: int, ca_file: Path) -> bool:
    try:
        with ApiserverClient(port, ca_file, timeout=2) as client:
            status, _, _ = client.request("GET", "/healthz")
            return status == 200
    except (OSError, ssl.SSLError):
        return False


ServerFactory = Callable[..., Server]


def launch_server(
    workdir: Path,
    *,
    cert_dir: Path,
    ca_file: Path,
    policy: Path | None = None,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    cluster: bool = False,
    startup_timeout: float = 60.0,
) -> Server:
    """Start ``python -m webhook serve`` on a free loopback port; return once /healthz answers over TLS.

    ``--no-cluster`` unless ``cluster=True`` (then pass e.g. ``--kubeconfig`` in ``args``).
    The caller stops it (``Server.stop``); the ``running_server`` fixture does that itself.
    """
    port = free_port()
    log_file = workdir / f"server-{port}.log"
    command = [
        sys.executable, "-m", "webhook", "serve",
        "--cert-dir", str(cert_dir), "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    if not cluster:
        command.append("--no-cluster")
    if policy is not None:
        command += ["--policy", str(policy)]
    command += list(args)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with log_file.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=full_env)
    server = Server(port=port, ca_file=ca_file, cert_dir=cert_dir, process=process, log_file=log_file)
    deadline = time.monotonic() + startup_timeout
    while not _healthy(port, ca_file):
        if process.poll() is not None:
            raise AssertionError(f"serve exited with {process.returncode}:\n{server.log()}")
        if time.monotonic() > deadline:
            server.stop()
            raise AssertionError(f"serve did not become healthy:\n{server.log()}")
        time.sleep(0.1)
    return server


SERVICE_TEST_POLICY = Path(__file__).parent / "fixtures" / "admission" / "policy.yaml"


def module_server(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Server]:
    """A server with its own certificates and the service-test policy, for a module's read-only tests
    (a module defines its ``server`` fixture as ``yield from module_server(tmp_path_factory, name)``)."""
    workdir = tmp_path_factory.mktemp(name)
    pki = make_pki(workdir / "certs")
    server = launch_server(workdir, cert_dir=pki.dir, ca_file=pki.ca_file, policy=SERVICE_TEST_POLICY)
    yield server
    server.stop()


@pytest.fixture
def running_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Factory with the arguments of ``launch_server`` (minus ``workdir``); servers stop after the test."""
    started: list[Server] = []

    def start(**kwargs: Any) -> Server:
        server = launch_server(tmp_path, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def load_review(name: str) -> dict[str, Any]:
    review: dict[str, Any] = json.loads((ADMISSION_FIXTURES / name).read_text())
    return review


@pytest.fixture
def admission_review() -> Callable[[str], dict[str, Any]]:
    """Loads tests/fixtures/admission/<name> (a fresh copy each call)."""

    def load(name: str) -> dict[str, Any]:
        return copy.deepcopy(load_review(name))

    return load


@pytest.fixture
def service_policy() -> Path:
    """A policy with a namespace rule by name (``inference-*``), so inference exists without a cluster."""
    return ADMISSION_FIXTURES / "policy.yaml"
