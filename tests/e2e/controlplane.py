"""A real Kubernetes control plane for the end-to-end suite: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager from ``KUBEBUILDER_ASSETS`` on loopback, with their own PKI and kubeconfigs.

The binaries are controller-runtime envtest's convention (a directory with ``kube-apiserver``,
``etcd``, ``kubectl``); this suite also needs ``kube-scheduler`` and ``kube-controller-manager``
(the project's archive in ../shared/envtest has all five). There is no kubelet: pods are bound by
the scheduler and stay ``Pending``; nodes are Node objects whose status the suite writes itself.

All processes run in one process group of their own and are stopped by PID (SIGTERM, then SIGKILL)
when the session ends, also after a failure, Ctrl-C (pytest's finalizers), SIGTERM (our handler) or
an interpreter exit that skipped the finalizers (atexit).
"""

from __future__ import annotations

import atexit
import datetime as dt
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ASSETS_ENV = "KUBEBUILDER_ASSETS"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kubectl", "kube-scheduler", "kube-controller-manager")
HOW_TO_GET_BINARIES = (
    "put etcd, kube-apiserver, kubectl, kube-scheduler and kube-controller-manager v1.36 in a directory and "
    "export KUBEBUILDER_ASSETS=DIR: `mkdir -p .cache/envtest && xz -dc ../shared/envtest/"
    "kubernetes-v1.36.2-linux-amd64.tar.xz | tar -x -C .cache/envtest` (KUBEBUILDER_ASSETS=.cache/envtest/bin; "
    ".ci/run does this when the archive is there), or `setup-envtest use 1.36.x --bin-dir DIR` plus "
    "kube-scheduler and kube-controller-manager from https://dl.k8s.io/v1.36.2/bin/linux/amd64/"
)
LOOPBACK = "127.0.0.1"
# The Kubernetes minor the suite's control planes emulate (issue 47): E2E_KUBE_MINOR=1.35 (or pytest's
# --kube-minor), the binaries' own 1.36 when unset; E2E_MAP_OPT_IN=1: with the MutatingAdmissionPolicy opt-in of
# 1.35 (docs/operations.md; 1.34 serves the beta API with it but refuses the product's policy).
KUBE_MINOR_ENV = "E2E_KUBE_MINOR"
MAP_OPT_IN_ENV = "E2E_MAP_OPT_IN"
NATIVE_MINOR = "1.36"
MINORS = ("1.33", "1.34", "1.35", "1.36")
MAP_OPT_IN_MINORS = ("1.34", "1.35")  # the minors serving the beta API with the opt-in
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


def missing_binaries(assets: str | None) -> list[str]:
    """The binaries this suite needs that ``assets`` does not hold (all of them when it is unset)."""
    if not assets:
        return list(REQUIRED_BINARIES)
    return [name for name in REQUIRED_BINARIES if not os.access(Path(assets) / name, os.X_OK)]


def kube_minor() -> str:
    """The minor this run's control planes are (``KUBE_MINOR_ENV``; 1.36 by default)."""
    minor = os.environ.get(KUBE_MINOR_ENV) or NATIVE_MINOR
    if minor not in MINORS:
        raise ValueError(f"{KUBE_MINOR_ENV}={minor}: one of {', '.join(MINORS)}")
    return minor


def map_opt_in() -> bool:
    """Whether this run's control planes have the MutatingAdmissionPolicy opt-in (1.34 and 1.35 only)."""
    return os.environ.get(MAP_OPT_IN_ENV, "") not in ("", "0") and kube_minor() in MAP_OPT_IN_MINORS


def minor_options(minor: str | None = None, *, opt_in: bool | None = None) -> dict[str, Any]:
    """``ControlPlane`` keyword arguments for a cluster of ``minor`` (default: ``kube_minor()``), as it ships or with
    the documented MutatingAdmissionPolicy opt-in (``--feature-gates=MutatingAdmissionPolicy=true
    --runtime-config=admissionregistration.k8s.io/v1beta1=true``). The v1.36.2 apiserver emulating 1.34/1.35 with the
    gate on waits for its v1 informer, which that minor does not serve, and exits ("not yet ready to handle
    request"): ``--emulation-forward-compatible`` lets it serve the v1 resources too (a real 1.35 serves v1beta1
    only; the suite renders v1beta1 for it)."""
    minor = minor or kube_minor()
    opt_in = map_opt_in() if opt_in is None else opt_in
    options: dict[str, Any] = {"emulated_version": None if minor == NATIVE_MINOR else minor}
    if opt_in:
        options["apiserver_args"] = (
            "--feature-gates=MutatingAdmissionPolicy=true",
            "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
            "--emulation-forward-compatible=true",
        )
    return options


def loopback_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every component: no proxy (the apiserver's webhook client honours the proxy
    variables, and would send the loopback webhook calls to it), loopback never proxied."""
    env = {key: value for key, value in (base or os.environ).items() if key not in PROXY_VARIABLES}
    env["NO_PROXY"] = env["no_proxy"] = f"{LOOPBACK},localhost"
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


# --- PKI --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


class Pki:
    """One CA for everything (serving and client certificates), and the service-account signing key."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._ca_key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "e2e-kubernetes-ca")])
        now = dt.datetime.now(dt.UTC)
        self._ca_name = name
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_file = directory / "ca.crt"
        self.ca_file.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        self.ca_key_file = directory / "ca.key"
        _write_key(self.ca_key_file, self._ca_key)
        sa_key = _key()
        self.service_account_key = directory / "sa.key"
        _write_key(self.service_account_key, sa_key)
        self.service_account_pub = directory / "sa.pub"
        self.service_account_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def issue(
        self,
        name: str,
        *,
        common_name: str,
        organizations: Sequence[str] = (),
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        server: bool = False,
    ) -> KeyPair:
        key = _key()
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        # A ServiceAccount's username (system:serviceaccount:NS:NAME) can pass RFC 5280's 64-character
        # upper bound on a CN; Go's parser, which the apiserver authenticates with, accepts it.
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name, _validate=len(common_name) <= 64))
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


def write_kubeconfig(path: Path, *, server: str, ca_file: Path, client: KeyPair, user: str) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: {server}
    certificate-authority: {ca_file}
users:
- name: {user}
  user:
    client-certificate: {client.cert}
    client-key: {client.key}
contexts:
- name: e2e
  context: {{cluster: e2e, user: {user}}}
current-context: e2e
""",
        encoding="utf-8",
    )
    return path


# --- processes --------------------------------------------------------------------------------------


@dataclass
class Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ProcessGroup:
    """Child processes in one process group of their own (not the test runner's: a Ctrl-C in the
    terminal reaches pytest, which then stops them in order), stopped by PID."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.components: list[Component] = []
        self._pgid: int | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def start(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Component:
        log = self.log_dir / f"{name}.log"
        with self._lock:
            out = log.open("ab")
            try:
                process = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=dict(env if env is not None else loopback_environment()),
                    process_group=0 if self._pgid is None else self._pgid,
                )
            finally:
                out.close()
            if self._pgid is None:
                self._pgid = process.pid
            component = Component(name, process, log)
            self.components.append(component)
            return component

    def stop_one(self, component: Component, *, timeout: float = 15.0) -> None:
        process = component.process
        if process.poll() is None:
            try:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
            except ProcessLookupError:
                pass
        with self._lock:
            if component in self.components:
                self.components.remove(component)

    def stop_all(self) -> None:
        """Reverse start order (the webhook and controllers before the apiserver, etcd last)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            components = list(reversed(self.components))
        for component in components:
            self.stop_one(component)


# --- the control plane ------------------------------------------------------------------------------


def loopback_only() -> None:
    """No proxy between the tests and the control plane: loopback addresses are reached directly."""
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ.pop(variable, None)
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = f"{LOOPBACK},localhost"


@dataclass
class ControlPlane:
    assets: Path
    workdir: Path
    pki: Pki = field(init=False)
    processes: ProcessGroup = field(init=False)
    etcd_port: int = 0
    apiserver_port: int = 0
    admin_kubeconfig: Path = field(init=False)
    admin: KeyPair = field(init=False)
    # More kube-apiserver flags (e.g. --runtime-config for an API version that is off by default).
    apiserver_args: tuple[str, ...] = ()
    # Feature gates turned on in kube-apiserver, kube-scheduler and kube-controller-manager alike
    # (e.g. DRADeviceTaintRules, which all three read in 1.36).
    feature_gates: tuple[str, ...] = ()
    # The Kubernetes minor the three components emulate (``--emulated-version=kube=1.35``, KEP-4330: that
    # minor's APIs and feature-gate defaults on the v1.36 code); None: the binaries' own (1.36).
    emulated_version: str | None = None
    # What start() issued for the three components, kept so that upgrade() starts them again with the same.
    _serving: KeyPair = field(init=False, repr=False)
    _front_proxy: KeyPair = field(init=False, repr=False)
    _scheduler_kubeconfig: Path = field(init=False, repr=False)
    _kcm_kubeconfig: Path = field(init=False, repr=False)

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.apiserver_port}"

    def binary(self, name: str) -> str:
        return str(self.assets / name)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_dir = self.workdir / "logs"
        log_dir.mkdir(exist_ok=True)
        self.processes = ProcessGroup(log_dir)
        _install_stop_handlers(self.processes)
        self.pki = Pki(self.workdir / "pki")
        self.etcd_port, peer_port, self.apiserver_port = free_port(), free_port(), free_port()
        self._serving = self.pki.issue(
            "apiserver",
            common_name="kube-apiserver",
            dns_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            ip_addresses=[LOOPBACK, "10.96.0.1"],
            server=True,
        )
        self.admin = self.pki.issue("admin", common_name="e2e-admin", organizations=["system:masters"])
        scheduler = self.pki.issue("scheduler", common_name="system:kube-scheduler")
        controller_manager = self.pki.issue("controller-manager", common_name="system:kube-controller-manager")
        self._front_proxy = self.pki.issue("front-proxy-client", common_name="front-proxy-client")
        self.admin_kubeconfig = self.kubeconfig("admin", self.admin)
        self._scheduler_kubeconfig = self.kubeconfig("system:kube-scheduler", scheduler)
        self._kcm_kubeconfig = self.kubeconfig("system:kube-controller-manager", controller_manager)

        etcd = self.processes.start(
            "etcd",
            [
                self.binary("etcd"),
                "--data-dir",
                str(self.workdir / "etcd"),
                "--name",
                "e2e",
                "--listen-client-urls",
                f"http://{LOOPBACK}:{self.etcd_port}",
                "--advertise-client-urls",
                f"http://{LOOPBACK}:{self.etcd_port}",
                "--listen-peer-urls",
                f"http://{LOOPBACK}:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://{LOOPBACK}:{peer_port}",
                "--initial-cluster",
                f"e2e=http://{LOOPBACK}:{peer_port}",
                "--log-level",
                "warn",
                # A test cluster: losing it on a crash costs nothing, the fsyncs cost seconds.
                "--unsafe-no-fsync",
            ],
        )
        self._wait(etcd, lambda: _http_ok(f"http://{LOOPBACK}:{self.etcd_port}/health"), "etcd /health")
        self._start_components()

    def _start_components(self) -> None:
        """kube-apiserver on etcd (waited for until ready), then kube-scheduler and kube-controller-manager, all at
        ``emulated_version``."""
        apiserver = self.processes.start(
            "kube-apiserver",
            [
                self.binary("kube-apiserver"),
                f"--etcd-servers=http://{LOOPBACK}:{self.etcd_port}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={self.apiserver_port}",
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={self._serving.cert}",
                f"--tls-private-key-file={self._serving.key}",
                f"--client-ca-file={self.pki.ca_file}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={self.pki.service_account_pub}",
                f"--service-account-signing-key-file={self.pki.service_account_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--profiling=false",
                f"--requestheader-client-ca-file={self.pki.ca_file}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={self._front_proxy.cert}",
                f"--proxy-client-key-file={self._front_proxy.key}",
                *self.apiserver_args,
                *self._gates(),
                *self._emulation(),
            ],
        )
        self._wait(apiserver, self._apiserver_ready, "kube-apiserver /readyz", timeout=90)
        common = [
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--leader-elect=false",
            "-v=1",
            *self._gates(),
            *self._emulation(),
        ]
        self.processes.start(
            "kube-scheduler",
            [
                self.binary("kube-scheduler"),
                f"--kubeconfig={self._scheduler_kubeconfig}",
                f"--authentication-kubeconfig={self._scheduler_kubeconfig}",
                f"--authorization-kubeconfig={self._scheduler_kubeconfig}",
                *common,
            ],
        )
        self.processes.start(
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                f"--kubeconfig={self._kcm_kubeconfig}",
                f"--authentication-kubeconfig={self._kcm_kubeconfig}",
                f"--authorization-kubeconfig={self._kcm_kubeconfig}",
                f"--service-account-private-key-file={self.pki.service_account_key}",
                f"--root-ca-file={self.pki.ca_file}",
                "--use-service-account-credentials=true",
                "--controllers=*,-node-lifecycle-controller,-node-ipam-controller",
                *common,
            ],
        )

    def upgrade(self, emulated_version: str | None = None) -> None:
        """Move the running cluster to another minor in place, as an operator upgrades a control plane (the suite's
        proof of docs/operations.md, "When the cluster moves to a newer minor"): kube-controller-manager,
        kube-scheduler and kube-apiserver stopped, then started again emulating ``emulated_version`` (None: the
        binaries' own 1.36), the apiserver first and ready before the others (the version skew policy). etcd keeps
        running with its data, and so do the certificates, the kubeconfigs and the apiserver's port: every object and
        every client of the old control plane are those of the new one (a kept-alive connection reconnects)."""
        names = ("kube-controller-manager", "kube-scheduler", "kube-apiserver")
        for name in names:
            for component in [c for c in self.processes.components if c.name == name]:
                self.processes.stop_one(component)
        self.emulated_version = emulated_version
        self._start_components()

    def _gates(self) -> list[str]:
        return (
            [f"--feature-gates={','.join(f'{gate}=true' for gate in self.feature_gates)}"] if self.feature_gates else []
        )

    def _emulation(self) -> list[str]:
        """The same emulated minor for all three components, as a real cluster of that minor has."""
        return [f"--emulated-version=kube={self.emulated_version}"] if self.emulated_version else []

    def kubeconfig(self, user: str, client: KeyPair) -> Path:
        safe = user.replace(":", "-")
        return write_kubeconfig(
            self.workdir / f"{safe}.kubeconfig", server=self.server, ca_file=self.pki.ca_file, client=client, user=user
        )

    def ssl_context(self, client: KeyPair | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_file))
        pair = client or self.admin
        context.load_cert_chain(str(pair.cert), str(pair.key))
        return context

    def _apiserver_ready(self) -> bool:
        return _http_ok(f"{self.server}/readyz", context=self.ssl_context())

    def _wait(self, component: Component, ready: Callable[[], bool], what: str, *, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if component.process.poll() is not None:
                raise RuntimeError(f"{component.name} exited with {component.process.returncode}:\n{component.tail()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}:\n{component.tail()}")

    def check_alive(self) -> None:
        """Fail loudly (with the log's tail) when a component died during the suite."""
        for component in list(self.processes.components):
            if component.process.poll() is not None:
                raise RuntimeError(f"{component.name} exited with {component.process.returncode}:\n{component.tail()}")

    def stop(self, *, keep: bool = False) -> None:
        self.processes.stop_all()
        if not keep:
            shutil.rmtree(self.workdir / "etcd", ignore_errors=True)


def _http_ok(url: str, *, context: ssl.SSLContext | None = None) -> bool:
    handler = urllib.request.HTTPSHandler(context=context) if context else urllib.request.HTTPHandler()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), handler)
    try:
        with opener.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


_groups: list[ProcessGroup] = []
_handlers_installed = False


def _stop_everything() -> None:
    for group in list(_groups):
        group.stop_all()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _stop_everything()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_stop_handlers(group: ProcessGroup) -> None:
    """atexit for an exit that skips the fixtures' finalizers; SIGTERM/SIGHUP (a CI runner cancelling
    the job) stop the children before the default action. SIGINT stays pytest's: KeyboardInterrupt
    runs the session finalizers, which stop the children."""
    global _handlers_installed
    _groups.append(group)
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_stop_everything)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous: Any = signal.getsignal(signum)
            if previous in (signal.SIG_DFL, None):
                signal.signal(signum, _on_signal)


def main() -> int:  # pragma: no cover - a manual aid: `python tests/e2e/controlplane.py` starts one and waits
    assets = os.environ.get(ASSETS_ENV)
    missing = missing_binaries(assets)
    if missing:
        print(f"missing {', '.join(missing)}: {HOW_TO_GET_BINARIES}", file=sys.stderr)
        return 2
    plane = ControlPlane(
        Path(str(assets)), Path(os.environ.get("E2E_WORKDIR", "/tmp/e2e-controlplane")), **minor_options()
    )
    plane.start()
    print(f"export KUBECONFIG={plane.admin_kubeconfig}", flush=True)
    try:
        signal.pause()
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
