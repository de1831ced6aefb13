"""``serve``: the HTTPS admission webhook (uvicorn, TLS 1.2+, hot-reloaded certificates and policy).

uvicorn settings that matter for kube-apiserver as a client:

- ``timeout_keep_alive`` 95 s: the apiserver pools idle webhook connections for 90 s (Go's
  ``IdleConnTimeout``); a server that closes first races the next POST on a reused connection.
- ``timeout_graceful_shutdown``: on SIGTERM uvicorn stops accepting, answers the reviews in flight,
  then exits; idle pooled connections are closed so the apiserver redials a live replica. With
  ``--drain-seconds`` that waits for a drain first: ``/readyz`` fails at once, reviews are still served
  (``drain.py``).
- read deadline (``--read-timeout-seconds``, default 10 s): uvicorn has no header or body read
  timeout, so a client that connects and then sends nothing, or trickles its headers a byte at a
  time (slowloris), would hold its connection forever. ``DeadlineHttpToolsProtocol`` closes a
  connection whose request is not complete (headers and body) within that time of the connection
  being made or of the request's first byte (Go's ``ReadHeaderTimeout``; controller-runtime uses
  32 s). kube-apiserver writes a review in one go and gives up on the call after at most 30 s
  (``timeoutSeconds``, 2 s in our manifests), so no real review is ever cut. The TLS handshake
  itself is bounded by asyncio's 60 s ``ssl_handshake_timeout``.
- ``--workers N`` runs N processes on one socket. Each worker loads the policy, the certificates
  and (with a cluster) its own watch cache, and polls the files itself. Metrics are aggregated
  across workers through ``PROMETHEUS_MULTIPROC_DIR`` (set here when not given).

Worker processes are started by uvicorn with ``spawn``: the settings reach them in the
environment variable ``ROCM_ISOLATION_WEBHOOK_SERVE`` (JSON), and each process builds its
``WebhookService`` once, shared by the app factory and the TLS context factory.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import socket
import ssl
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from webhook.cluster.cache import ClusterCache, kubeconfig_available, load_api_client
from webhook.core.policy import PolicyError
from webhook.service.app import MAX_BODY_BYTES, WebhookService, create_app
from webhook.service.coalesce import CoalescedWrites
from webhook.service.drain import Drain
from webhook.service.logs import DEFAULT_SUMMARY_SECONDS, configure, uvicorn_log_config
from webhook.service.metrics import Metrics
from webhook.service.reload import PolicyStore
from webhook.service.tls import CertificateError, CertificateReloader

if TYPE_CHECKING:
    from webhook.service.auditloop import BackgroundAudit
    from webhook.service.lending_loop import LendingKeeper
    from webhook.service.names_sync import ReservedNamesSync

SETTINGS_ENV = "ROCM_ISOLATION_WEBHOOK_SERVE"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_NAMESPACE = "rocm-isolation-system"
DEFAULT_KEEP_ALIVE = 95
DEFAULT_READ_TIMEOUT = 10.0

log = logging.getLogger("webhook.serve")


@dataclass(frozen=True)
class Settings:
    cert_dir: str = "certs"
    policy: str | None = None
    host: str = "0.0.0.0"
    port: int = 8443
    workers: int = 1
    cluster: bool = False
    kubeconfig: str | None = None
    cert_poll_seconds: float = 10.0
    policy_poll_seconds: float = 5.0
    resync_seconds: float = 600.0
    keep_alive_seconds: int = DEFAULT_KEEP_ALIVE
    graceful_timeout_seconds: int = 30
    drain_seconds: float = 0.0
    log_level: str = "info"
    log_summary_seconds: float = DEFAULT_SUMMARY_SECONDS
    max_body_bytes: int = MAX_BODY_BYTES
    read_timeout_seconds: float = DEFAULT_READ_TIMEOUT
    audit_interval_seconds: float = 300.0
    names_sync_seconds: float = 2.0
    lending_seconds: float = 5.0
    audit_reports: bool = True
    # audit --gpu-metrics and its credentials, for the background audit (issue 48); None: the GPUs not judged
    audit_gpu_metrics: str | None = None
    audit_gpu_metrics_token_file: str | None = None
    audit_gpu_metrics_ca: str | None = None
    audit_gpu_metrics_insecure: bool = False

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> Settings:
        raw = os.environ.get(SETTINGS_ENV)
        if not raw:
            raise RuntimeError(f"{SETTINGS_ENV} is not set: start the webhook with `rocm-isolation-webhook serve`")
        return cls(**json.loads(raw))


def build_service(settings: Settings) -> WebhookService:
    """Load policy and certificates (raising PolicyError / CertificateError) and wire the cluster cache."""
    metrics = Metrics()
    policies = PolicyStore(Path(settings.policy) if settings.policy else None, metrics=metrics)
    certificates = CertificateReloader(Path(settings.cert_dir), metrics=metrics)
    cluster = None
    if settings.cluster:
        cluster = ClusterCache(
            api_client(settings),
            reserved_label=policies.policy.spec.reserved_nodes.label,
            metrics=metrics,
            resync_seconds=settings.resync_seconds,
        )
    auditor = None
    names_sync = None
    lending = None
    if settings.cluster and settings.audit_interval_seconds > 0:
        auditor = build_auditor(settings, metrics)
        if cluster is not None and settings.names_sync_seconds > 0:
            names_sync = build_names_sync(settings, metrics, cluster, policies, auditor)
        if settings.lending_seconds > 0:
            lending = build_lending(settings, metrics, policies, auditor)
            auditor.view_dump = lending.dump_view  # the audit reads the keeper's view instead of listing
    return WebhookService(
        policies=policies,
        metrics=metrics,
        certificates=certificates,
        cluster=cluster,
        auditor=auditor,
        policy_poll_seconds=settings.policy_poll_seconds,
        cert_poll_seconds=settings.cert_poll_seconds,
        max_body_bytes=settings.max_body_bytes,
        log_summary_seconds=settings.log_summary_seconds,
        drain=Drain(settings.drain_seconds),
        names_sync=names_sync,
        lending=lending,
    )


def api_client(settings: Settings) -> Any:
    """A new ``kubernetes`` ApiClient from the settings' kubeconfig (or in-cluster): one per user, as the
    cache's reflectors, the Lease election and the report writer run in threads of their own."""
    client = load_api_client(settings.kubeconfig)
    if client is None:
        raise RuntimeError("no kubeconfig and not running in a cluster")
    return client


def build_names_sync(
    settings: Settings, metrics: Metrics, cluster: ClusterCache, policies: PolicyStore, auditor: BackgroundAudit
) -> ReservedNamesSync:
    """The reserved-node-names ConfigMap kept in step with the labelled nodes of the watch cache, by the
    replica holding the audit Lease (its own API client)."""
    from webhook.cluster.kubeapi import KubeApi
    from webhook.service.names_sync import ReservedNamesSync

    def counted(result: str) -> None:
        metrics.reserved_names_syncs.labels(result).inc()

    return ReservedNamesSync(
        KubeApi(api_client(settings)),
        cluster,
        lambda: policies.policy,
        lambda: auditor.leading,
        interval=settings.names_sync_seconds,
        on_write=counted,
    )


def build_lending(
    settings: Settings, metrics: Metrics, policies: PolicyStore, auditor: BackgroundAudit
) -> LendingKeeper:
    """Lending kept by the replica holding the audit Lease: the reserved nodes closed to new borrowers, the
    reserved devices lent and taken back, and lending's gauges, all from the view of the cluster it watches
    while it holds the Lease (``cluster/view.py``)."""
    from webhook.cluster.kubeapi import KubeApi
    from webhook.cluster.view import ClusterView
    from webhook.service.lending_loop import LendingKeeper

    # The view's reflectors have their own client (their watches hold connections); the writes theirs.
    def received(resource: str, how: str, size: int) -> None:
        metrics.lending_view_bytes.labels(resource, how).inc(size)

    view = ClusterView(
        api_client(settings), lambda: policies.policy, resync_seconds=settings.resync_seconds, on_bytes=received
    )
    return LendingKeeper(
        view.api(KubeApi(api_client(settings))),
        lambda: policies.policy,
        lambda: auditor.leading,
        interval=settings.lending_seconds,
        on_round=metrics.lending_round,
        view=view,
    )


def build_auditor(settings: Settings, metrics: Metrics) -> BackgroundAudit:
    """The background audit: a child ``audit`` process with the server's kubeconfig and policy file,
    elected through a Lease in this namespace (the election has its own API client)."""
    from webhook.cluster.kubeapi import KubeApi
    from webhook.cluster.lease import LeaderElector
    from webhook.service.auditloop import LEASE_NAME, BackgroundAudit, audit_command

    elector = LeaderElector(
        KubeApi(api_client(settings)),
        namespace=own_namespace(),
        name=LEASE_NAME,
        identity=f"{socket.gethostname()}_{os.getpid()}",
    )
    writer = None
    if settings.audit_reports:
        from webhook.service.reportwriter import ReportWriter

        writer = ReportWriter(KubeApi(api_client(settings)))
    return BackgroundAudit(
        audit_command(settings.kubeconfig, settings.policy, gpu_metrics_args(settings)),
        metrics,
        interval=settings.audit_interval_seconds,
        elector=elector,
        reports=writer,
    )


def gpu_metrics_args(settings: Settings) -> list[str]:
    """The child audit's ``--gpu-metrics`` and credentials (serve's ``--audit-gpu-metrics*``)."""
    if not settings.audit_gpu_metrics:
        return []
    args = ["--gpu-metrics", settings.audit_gpu_metrics]
    if settings.audit_gpu_metrics_token_file:
        args += ["--token-file", settings.audit_gpu_metrics_token_file]
    if settings.audit_gpu_metrics_ca:
        args += ["--certificate-authority", settings.audit_gpu_metrics_ca]
    if settings.audit_gpu_metrics_insecure:
        args.append("--insecure-skip-tls-verify")
    return args


def own_namespace() -> str:
    """The namespace this pod runs in (its service account token's), for the audit Lease."""
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    try:
        return Path(SERVICE_ACCOUNT_NAMESPACE).read_text(encoding="utf-8").strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


_service: WebhookService | None = None


def process_service() -> WebhookService:
    """This process's service, built on first use from the settings in the environment."""
    global _service
    if _service is None:
        _service = build_service(Settings.from_env())
    return _service


def app_factory() -> Any:
    """uvicorn app factory (``webhook.service.serve:app_factory``), called once per worker process."""
    DeadlineHttpToolsProtocol.read_timeout = Settings.from_env().read_timeout_seconds
    app = create_app(process_service())
    # Everything loaded so far (modules, the app, the policy) lives as long as the process: move it
    # out of the collector's reach, so that the full collections the objects of large pods trigger
    # do not walk it again and again (-20% CPU per review of an 86 KiB pod, docs/benchmarks.md).
    gc.collect()
    gc.freeze()
    return app


class DeadlineHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a read deadline (see the module docstring).

    The deadline runs from the connection being made (TLS done) and from a request's first byte
    after an idle keep-alive period, until the request is complete. While a response is being
    computed or a connection idles between requests it does not run (the keep-alive timeout does).
    When it passes, the connection is closed without a reply.

    One timer per connection, re-armed when it fires, rather than one per request: creating and
    cancelling a timer for every review cost more than reading the clock at a request's start.
    """

    read_timeout: float = DEFAULT_READ_TIMEOUT  # set per process by app_factory

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._reading_since: float | None = None  # loop time the incomplete request started; None: not reading

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Head and body of a response in one TLS record and one send() (webhook/service/coalesce.py).
        self._writes = CoalescedWrites(transport, self.loop)
        self.transport = cast(asyncio.Transport, self._writes)
        if self.read_timeout > 0:
            self._reading_since = self.loop.time()
            self._deadline_timer = self.loop.call_later(self.read_timeout, self._check_read_deadline)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._reading_since is None:
            self._reading_since = self.loop.time()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_since = None

    def on_response_complete(self) -> None:
        self._writes.flush()  # the whole response now, not at the end of the turn
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        super().connection_lost(exc)

    def _check_read_deadline(self) -> None:
        self._deadline_timer = None
        if self.transport.is_closing():
            return
        since = self._reading_since
        # Not reading (idle, or answering): look again a full period later. Reading: at its deadline.
        left = self.read_timeout if since is None else since + self.read_timeout - self.loop.time()
        if left > 0:
            self._deadline_timer = self.loop.call_later(left, self._check_read_deadline)
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "unknown"
        log.warning(
            "closing a connection whose request was not complete in time",
            extra={"client": client, "read_timeout_seconds": self.read_timeout},
        )
        # abort, not close: a TLS close waits up to 30 s for the peer's close_notify.
        self.transport.abort()


def ssl_context_factory(config: Any, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """uvicorn ``ssl_context_factory``: the live context the certificate reloader keeps loaded."""
    certificates = process_service().certificates
    if certificates is None:  # pragma: no cover - build_service always loads certificates
        raise RuntimeError("no certificates")
    return certificates.context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cert-dir", default="certs", help="directory with tls.crt and tls.key, reloaded when they change"
    )
    parser.add_argument("--policy", help="IsolationPolicy YAML file, reloaded when it changes (default: built-in)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (default: 8443)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    cluster = parser.add_mutually_exclusive_group()
    cluster.add_argument(
        "--no-cluster",
        action="store_true",
        help="do not watch the cluster: namespace labels and reserved nodes are unknown (rules by name still work)",
    )
    cluster.add_argument(
        "--kubeconfig",
        help="kubeconfig to watch Namespaces and Nodes with (default: in-cluster, $KUBECONFIG, ~/.kube/config; "
        "without any of them the webhook runs as --no-cluster)",
    )
    parser.add_argument("--cert-poll-seconds", type=float, default=10.0, help="certificate file poll interval")
    parser.add_argument("--policy-poll-seconds", type=float, default=5.0, help="policy file poll interval")
    parser.add_argument("--resync-seconds", type=float, default=600.0, help="relist interval of the cluster cache")
    parser.add_argument(
        "--keep-alive-seconds",
        type=int,
        default=DEFAULT_KEEP_ALIVE,
        help="idle keep-alive (default 95: longer than the apiserver's 90 s connection pool)",
    )
    parser.add_argument(
        "--graceful-timeout-seconds", type=int, default=30, help="how long shutdown waits for reviews in flight"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=0.0,
        help="on SIGTERM, how long /readyz answers 503 while reviews are still served, before shutdown "
        "(default 0: shut down at once; the Deployment sets 5, docs/operations.md 'Shutdown')",
    )
    parser.add_argument(
        "--read-timeout-seconds",
        type=float,
        default=DEFAULT_READ_TIMEOUT,
        help="close a connection whose request (headers and body) is not complete within this time (slowloris)",
    )
    parser.add_argument(
        "--audit-interval-seconds",
        type=float,
        default=300.0,
        help="run the audit in the background this often and export it as metrics; one replica at a time "
        "(a Lease in the webhook's namespace); 0 disables it (default: 300; needs a cluster)",
    )
    parser.add_argument(
        "--audit-gpu-metrics",
        metavar="URL|FILE",
        help="the background audit also judges the reserved GPUs on AMD's device metrics exporter: the Prometheus "
        "scraping it, or a file of its series (audit --gpu-metrics; docs/operations.md)",
    )
    parser.add_argument(
        "--audit-gpu-metrics-token-file", metavar="FILE", help="--audit-gpu-metrics: Prometheus's bearer token file"
    )
    parser.add_argument(
        "--audit-gpu-metrics-certificate-authority", metavar="FILE", help="--audit-gpu-metrics: Prometheus's CA"
    )
    parser.add_argument(
        "--audit-gpu-metrics-insecure-skip-tls-verify",
        action="store_true",
        help="--audit-gpu-metrics: do not check Prometheus's certificate (insecure)",
    )
    parser.add_argument(
        "--names-sync-seconds",
        type=float,
        default=2.0,
        help="how often the replica holding the audit Lease compares the nodes carrying the reserved label "
        "with the backstop's reserved-node-names ConfigMap and patches it when they differ; 0 disables it "
        "(default: 2; needs the background audit's Lease)",
    )
    parser.add_argument(
        "--lending-seconds",
        type=float,
        default=5.0,
        help="while the policy's lending is on, how often the replica holding the audit Lease closes reserved "
        "nodes to new borrowers (the no-borrowers taint: every one while inference waits, else the idle ones "
        "keeping lending.headroomGPUs free) and exports lending's gauges; 0 disables it (default: 5)",
    )
    parser.add_argument(
        "--audit-reports",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write the background audit's findings to the cluster as PolicyReport/ClusterPolicyReport "
        "(wgpolicyk8s.io/v1alpha2) and Report/ClusterReport (openreports.io/v1alpha1), whichever CRDs it "
        "serves (default: on)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="info (default): denials, errors, violations and a periodic summary; debug: a line per review",
    )
    parser.add_argument(
        "--log-summary-seconds",
        type=float,
        default=DEFAULT_SUMMARY_SECONDS,
        help="log the reviews answered per decision every this many seconds (0: never)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    use_cluster = not args.no_cluster and kubeconfig_available(args.kubeconfig)
    return Settings(
        cert_dir=args.cert_dir,
        policy=args.policy,
        host=args.host,
        port=args.port,
        workers=args.workers,
        cluster=use_cluster,
        kubeconfig=args.kubeconfig,
        cert_poll_seconds=args.cert_poll_seconds,
        policy_poll_seconds=args.policy_poll_seconds,
        resync_seconds=args.resync_seconds,
        keep_alive_seconds=args.keep_alive_seconds,
        graceful_timeout_seconds=args.graceful_timeout_seconds,
        drain_seconds=args.drain_seconds,
        log_level=args.log_level,
        log_summary_seconds=args.log_summary_seconds,
        read_timeout_seconds=args.read_timeout_seconds,
        audit_interval_seconds=args.audit_interval_seconds,
        names_sync_seconds=args.names_sync_seconds,
        lending_seconds=args.lending_seconds,
        audit_reports=args.audit_reports,
        audit_gpu_metrics=args.audit_gpu_metrics,
        audit_gpu_metrics_token_file=args.audit_gpu_metrics_token_file,
        audit_gpu_metrics_ca=args.audit_gpu_metrics_certificate_authority,
        audit_gpu_metrics_insecure=args.audit_gpu_metrics_insecure_skip_tls_verify,
    )


def main(args: argparse.Namespace) -> int:
    import uvicorn

    configure(args.log_level)
    if args.workers < 1:
        print("serve: --workers must be at least 1", file=sys.stderr)
        return 2
    if (
        args.keep_alive_seconds < 1
        or args.cert_poll_seconds <= 0
        or args.policy_poll_seconds <= 0
        or args.read_timeout_seconds <= 0
        or args.audit_interval_seconds < 0
        or args.log_summary_seconds < 0
        or args.drain_seconds < 0
        or args.names_sync_seconds < 0
        or args.lending_seconds < 0
    ):
        print("serve: intervals must be positive", file=sys.stderr)
        return 2
    settings = settings_from_args(args)
    if not settings.cluster:
        log.warning(
            "running without a cluster: namespace labels and reserved nodes are unknown; "
            "namespace rules by name still apply and each review says what could not be checked"
        )
    os.environ[SETTINGS_ENV] = settings.to_env()
    if settings.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="rocm-isolation-metrics-")
    try:
        # Fail fast, with the file and the problem, before binding the port.
        service = build_service(settings)
    except PolicyError as err:
        print(f"serve: {err}", file=sys.stderr)
        return 1
    except (CertificateError, OSError, RuntimeError) as err:
        print(f"serve: {err}", file=sys.stderr)
        return 1
    if settings.workers == 1:
        global _service
        _service = service
    else:
        # Each worker builds its own; this one only validated the settings.
        if service.cluster is not None:
            service.cluster.stop()
    uvicorn.run(
        "webhook.service.serve:app_factory",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        ssl_context_factory=ssl_context_factory,
        http="webhook.service.serve:DeadlineHttpToolsProtocol",
        timeout_keep_alive=settings.keep_alive_seconds,
        timeout_graceful_shutdown=settings.graceful_timeout_seconds,
        log_config=uvicorn_log_config(settings.log_level),
        access_log=False,
        server_header=False,
        proxy_headers=False,
        lifespan="on",
    )
    return 0
