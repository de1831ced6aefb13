"""The FastAPI app: transport only. Read the body with a limit, check the content type, decode,
hand the envelope to ``handler.handle``, encode the reply, record metrics (and a log line when the
review is one to act on, see webhook/service/logs.py).

``POST /mutate`` is answered straight from the ASGI call (``WebhookApp.__call__``): FastAPI's
per-request machinery (middleware stack, routing, dependency solving, ``Request`` and ``Response``
objects) cost more CPU than everything the webhook does around ``decide()``, and the route takes
nothing from it (it reads the raw body itself to enforce its limit). FastAPI keeps serving every
other request (``/healthz``, ``/readyz``, ``/metrics``, the 404s and 405s) and the OpenAPI schema,
in which ``/mutate`` stays documented by a route that answers with the same code.

HTTP status codes (what a caller that is not kube-apiserver can get):

=====  =================================================================================
200    an AdmissionReview reply (also for denials and for internal errors, with the uid)
400    empty body, not JSON, not an AdmissionReview (wrong kind/apiVersion, no request/uid)
405    not POST (FastAPI)
413    body over 7 MiB (checked from Content-Length first, else while reading)
415    Content-Type is not application/json
499    the client went away before its body was read (nobody receives it; counted as
       ``rocm_isolation_errors_total{kind="disconnected"}``, not as an internal error)
500    an unexpected failure before the envelope could be read (logged, counted)
=====  =================================================================================

An unexpected exception while deciding is answered as a well-formed AdmissionReview with
``allowed: false`` and ``status.code: 500`` (controller-runtime's ``Errored``): the reply still
carries the uid, the failure is logged with its traceback and counted in
``rocm_isolation_errors_total{kind="internal"}``, and the worker keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from webhook.cluster.cache import ClusterCache
from webhook.core import review
from webhook.core.handler import ClusterFacts, Handled, NoCluster, handle, owner_to_read
from webhook.core.review import ReviewError
from webhook.service.drain import Drain
from webhook.service.lending_loop import LendingKeeper
from webhook.service.logs import DEFAULT_SUMMARY_SECONDS, ReviewCounts, log_review, review_log_level
from webhook.service.metrics import CONTENT_TYPE, Metrics
from webhook.service.names_sync import ReservedNamesSync
from webhook.service.reload import PolicyStore
from webhook.service.tls import CertificateReloader

if TYPE_CHECKING:
    from webhook.service.auditloop import BackgroundAudit

log = logging.getLogger("webhook.app")

# controller-runtime's limit: the apiserver sends at most two objects (object, oldObject) of at most
# 3 MiB each (etcd's default request limit is 1.5 MiB, the apiserver's 3 MiB), plus 1 MiB of envelope.
MAX_BODY_BYTES = 7 * 1024 * 1024
_NO_CLUSTER = NoCluster()  # stateless: one for every review


@dataclass
class WebhookService:
    """Everything a worker process serves with; the app reads it, the lifespan runs its pollers."""

    policies: PolicyStore
    metrics: Metrics
    certificates: CertificateReloader | None = None
    cluster: ClusterCache | None = None
    auditor: BackgroundAudit | None = None
    # The Lease holder keeps the reserved-node-names ConfigMap in step with the labelled nodes.
    names_sync: ReservedNamesSync | None = None
    # The Lease holder closes reserved nodes to new borrowers while lending is on.
    lending: LendingKeeper | None = None
    policy_poll_seconds: float = 5.0
    cert_poll_seconds: float = 10.0
    max_body_bytes: int = MAX_BODY_BYTES
    log_summary_seconds: float = DEFAULT_SUMMARY_SECONDS  # 0: no summary line
    review_counts: ReviewCounts = field(default_factory=ReviewCounts, repr=False)
    # SIGTERM: /readyz fails at once while reviews are still served for drain.seconds (drain.py).
    drain: Drain = field(default_factory=lambda: Drain(0.0))
    _stop: asyncio.Event | None = field(default=None, repr=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, repr=False)

    @property
    def facts(self) -> ClusterFacts:
        return self.cluster if self.cluster is not None else _NO_CLUSTER

    async def start(self) -> None:
        self._stop = asyncio.Event()
        self.drain.install(asyncio.get_running_loop())
        if self.policies.path is not None:
            self._tasks.append(asyncio.create_task(self.policies.run(self.policy_poll_seconds, self._stop)))
        if self.certificates is not None:
            self._tasks.append(asyncio.create_task(self.certificates.run(self.cert_poll_seconds, self._stop)))
        if self.log_summary_seconds > 0:
            self._tasks.append(asyncio.create_task(self._summaries(self._stop)))
        if self.cluster is not None:
            self.cluster.start()
        if self.auditor is not None:
            self.auditor.start()
        if self.names_sync is not None:
            self.names_sync.start()
        if self.lending is not None:
            self.lending.start()

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.review_counts.log_summary()  # the last, partial period
        if self.names_sync is not None:
            await asyncio.to_thread(self.names_sync.stop)
        if self.lending is not None:
            await asyncio.to_thread(self.lending.stop)
        if self.auditor is not None:
            await asyncio.to_thread(self.auditor.stop)
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)

    async def _summaries(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.log_summary_seconds)
            except TimeoutError:
                self.review_counts.log_summary()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        policy = self.policies.policy
        checks: dict[str, Any] = {
            "policy": {
                "ok": True,
                "name": policy.name,
                "digest": policy.digest[:12],
                "source": self.policies.source,
                # A rejected new file does not make the pod unready (the last good policy serves),
                # but it is said here.
                **({"lastReloadError": self.policies.error} if self.policies.error else {}),
            }
        }
        certs = self.certificates
        if certs is None:
            checks["certificates"] = {"ok": False, "detail": "no serving certificate loaded"}
        else:
            checks["certificates"] = {
                "ok": certs.loaded,
                "notAfter": certs.not_after.isoformat() if certs.not_after else None,
                **({"lastReloadError": certs.error} if certs.error else {}),
            }
        if self.cluster is None:
            checks["cluster"] = {"ok": True, "detail": "no cluster configured: namespace labels and nodes unknown"}
        else:
            checks["cluster"] = {"ok": self.cluster.synced, **self.cluster.status()}
        if self.auditor is not None:
            # Informational: where the background audit's findings go never makes a replica unready.
            checks["auditReports"] = {"ok": True, **self.auditor.reports_status()}
        view = self.lending.view if self.lending is not None else None
        if view is not None:
            # Informational: the Lease holder's view of the cluster (lending decides nothing until it is
            # synced); admission never reads it, so it never makes a replica unready.
            checks["lendingView"] = {"ok": True, **view.status()}
        if self.drain.draining:
            checks["shutdown"] = self.drain.status()
        missing = [name for name, check in checks.items() if not check["ok"]]
        return not missing, {"ready": not missing, "missing": missing, "checks": checks}


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": status}, status_code=status, headers=headers or None)


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


class BodyTooLarge(Exception):
    pass


async def _read_body(receive: Receive, limit: int) -> bytes | bytearray:
    """Read at most ``limit`` bytes; raise BodyTooLarge as soon as the body is longer, and
    ClientDisconnect when the client goes away first (what ``Request.stream()`` does). A body that
    arrives in one piece is not copied (orjson decodes bytes and bytearray alike)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        if message["type"] != "http.request":
            continue
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if not more and not body:  # the whole body in one message: returned as it is
            if len(chunk) > limit:
                raise BodyTooLarge()
            return chunk
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge()
        if not more:
            return body


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header ``name`` (lower case, as ASGI servers give names), like Starlette's."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


class WebhookApp(FastAPI):
    """FastAPI, with ``POST /mutate`` answered before FastAPI's middleware and routing (module docstring)."""

    mutate_asgi: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None  # installed by create_app
    drain: Drain | None = None  # installed by create_app: while it runs, every answer closes its connection

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        drain = self.drain
        if drain is not None and drain.draining and scope["type"] == "http":
            send = _closing(send)
        lean = self.mutate_asgi
        if lean is not None and scope["type"] == "http" and scope["path"] == "/mutate" and scope["method"] == "POST":
            await lean(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


_REPLY_TYPE = (b"content-type", b"application/json")
_CLOSE = (b"connection", b"close")


def _closing(send: Send) -> Send:
    """``send`` answering with ``Connection: close``. While we drain, each pooled connection the apiserver sends a
    review on is closed after its answer (it dials a live replica next): fewer idle ones are left for the shutdown to
    close under a request the apiserver may be writing at that moment (Go does not retry a POST: it would fail open)."""

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
        await send(message)

    return closing


def create_app(service: WebhookService) -> WebhookApp:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = WebhookApp(title="rocm-isolation-webhook", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.service = service
    metrics = service.metrics

    def reject(kind: str, status: int, message: str, **headers: str) -> JSONResponse:
        metrics.errors.labels(kind).inc()
        log.warning("rejected request", extra={"error_kind": kind, "status": status, "problem": message})
        return _error(status, message, **headers)

    async def answer(headers: list[tuple[bytes, bytes]], receive: Receive) -> bytes | JSONResponse:
        """The reply to one ``POST /mutate``: the encoded AdmissionReview, or an error response."""
        started = time.perf_counter()
        try:
            media_type = _media_type(_header(headers, b"content-type") or "")
            if media_type != "application/json":
                return reject(
                    "unsupported_media_type",
                    415,
                    f"Content-Type must be application/json, got {media_type or 'none'!r}",
                )
            length = _header(headers, b"content-length")
            if length is not None:
                if not length.isdigit():
                    return reject("malformed", 400, f"invalid Content-Length {length!r}")
                if int(length) > service.max_body_bytes:
                    return reject(
                        "body_too_large",
                        413,
                        f"body of {length} bytes is over the {service.max_body_bytes} byte limit",
                        connection="close",
                    )
            try:
                body = await _read_body(receive, service.max_body_bytes)
            except BodyTooLarge:
                return reject(
                    "body_too_large", 413, f"body is over the {service.max_body_bytes} byte limit", connection="close"
                )
            except ClientDisconnect:
                # The client closed (or the server's read deadline closed) the connection mid-body.
                return reject("disconnected", 499, "the client disconnected before sending the whole body")
            if not body or body.isspace():
                return reject("malformed", 400, "empty body: expected an AdmissionReview")
            try:
                # orjson: twice as fast as json on AdmissionReviews, stricter (no NaN, no lone
                # surrogates, nesting capped at 1024), and the last of duplicate keys wins, as in json.
                data = orjson.loads(body)
            except (ValueError, RecursionError) as err:
                return reject("malformed", 400, f"body is not JSON: {err}")
            try:
                admission = review.parse_review(data)
            except ReviewError as err:
                return reject("malformed", 400, f"not an AdmissionReview: {err}")
        except Exception:
            metrics.errors.labels("internal").inc()
            log.exception("unexpected failure reading the request")
            return _error(500, "internal error reading the request; see the webhook's log")

        policy = service.policies.policy
        try:
            owner = None
            ref = owner_to_read(admission, policy=policy, facts=service.facts)
            if ref is not None:
                # A claim that may borrow reserved devices: its pod's priority says whether it does. The
                # one live read while admitting, off the event loop; unknown (None) means "not a borrower".
                owner = await asyncio.to_thread(service.facts.pod, admission.namespace, ref[0])
            handled = handle(admission, policy=policy, facts=service.facts, owner=owner)
        except Exception as err:
            metrics.errors.labels("internal").inc()
            log.exception("unexpected failure deciding", extra={"uid": admission.uid})
            handled = Handled(
                response=review.errored(
                    f"rocm-isolation-webhook: internal error ({type(err).__name__}) while checking this pod; "
                    f"the webhook's log has the details under uid {admission.uid}"
                ),
                workload_class="",
                decision="error",
                rule="internal-error",
                mode=policy.spec.mode,
            )
        payload = orjson.dumps(review.review_response(admission, handled.response))
        elapsed = time.perf_counter() - started
        _record(service, admission, handled, elapsed)
        return payload

    async def mutate_asgi(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            reply = await answer(scope["headers"], receive)
        except Exception as exc:  # pragma: no cover - last resort, as the exception handler below
            metrics.errors.labels("internal").inc()
            log.error("unhandled exception", exc_info=exc)
            reply = _error(500, "internal error; see the webhook's log")
        if isinstance(reply, bytes):
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-length", b"%d" % len(reply)), _REPLY_TYPE],
                }
            )
            await send({"type": "http.response.body", "body": reply})
        else:
            await reply(scope, receive, send)

    app.mutate_asgi = mutate_asgi
    app.drain = service.drain

    @app.post("/mutate")
    async def mutate(request: Request) -> Response:
        """Documents ``POST /mutate`` in the OpenAPI schema; answers like the lean path (which takes
        every ``POST /mutate`` an ASGI server sends: this runs only if the app is mounted under a prefix)."""
        reply = await answer(request.scope["headers"], request.receive)
        return Response(reply, media_type="application/json") if isinstance(reply, bytes) else reply

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready, body = service.readiness()
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:  # pragma: no cover - last resort
        metrics.errors.labels("internal").inc()
        log.error("unhandled exception", exc_info=exc)
        return _error(500, "internal error; see the webhook's log")

    return app


def _record(service: WebhookService, admission: review.AdmissionRequest, handled: Handled, elapsed: float) -> None:
    try:
        metrics = service.metrics
        decision = handled.decision
        patch_ops = len(handled.response.patch)
        metrics.labelled(metrics.reviews, admission.operation, handled.workload_class, decision, handled.mode).inc()
        metrics.latency.observe(elapsed)
        if patch_ops:
            metrics.patch_operations.inc(patch_ops)
        if decision == "denied":
            metrics.labelled(metrics.denials, handled.rule).inc()
        for rule in handled.violations:
            metrics.labelled(metrics.violations, rule, handled.mode).inc()
        service.review_counts.add(decision)
        level = review_log_level(decision, handled.violations)
        if level is not None:
            log_review(
                level,
                {
                    "uid": admission.uid,
                    "namespace": admission.namespace,
                    "pod": admission.pod_name,
                    "operation": admission.operation,
                    "workload_class": handled.workload_class,
                    "decision": decision,
                    "rule": handled.rule,
                    "mode": handled.mode,
                    "patch_operations": patch_ops,
                    "dry_run": admission.dry_run,
                    "latency_ms": round(elapsed * 1000, 3),
                    **({"violations": list(handled.violations)} if handled.violations else {}),
                },
            )
    except Exception:  # pragma: no cover - observability must never fail a review
        log.exception("failed to record a review")
