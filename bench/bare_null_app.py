"""The bare null webhook: the least a FastAPI admission webhook can do, as an outside baseline.

One ``@app.post("/mutate")`` that reads the body, decodes it with the same JSON library as the
webhook (orjson), echoes ``apiVersion`` and ``request.uid`` and answers ``allowed``. No middleware,
no logging, no metrics, no checks (Content-Type, size limit, read deadline, envelope validation).
It runs on the same uvicorn settings as ``serve`` (one worker, uvloop + httptools, keep-alive 95 s,
no access log, no ``Server`` header) behind the same TLS context (``webhook.service.tls.server_context``:
TLS 1.2+, the same cipher suites, ALPN http/1.1) with the same certificate.

Where ``bench/null_app.py`` measures the policy's cost on top of the project's own transport, this
one measures what the transport (and everything else around ``decide()``) costs against a plain
framework endpoint: issue 11's budget is stated against it.

``python -m bench.bare_null_app --cert-dir DIR --host H --port P`` (the other ``serve`` options the
benchmark passes, ``--policy`` and ``--no-cluster``, are accepted and ignored).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import Response

from bench.baseline import allowed_reply, arguments, tls_context
from webhook.service.serve import DEFAULT_KEEP_ALIVE

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@app.post("/mutate")
async def mutate(request: Request) -> Response:
    return Response(allowed_reply(await request.body()), media_type="application/json")


@app.get("/healthz")
async def healthz() -> Response:
    # For the benchmark's start-up probe only.
    return Response(b'{"status":"ok"}', media_type="application/json")


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    args = arguments("python -m bench.bare_null_app", argv)
    context = tls_context(args.cert_dir)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        workers=1,
        loop="uvloop",
        http="httptools",
        ssl_context_factory=lambda config, default: context,
        timeout_keep_alive=DEFAULT_KEEP_ALIVE,
        access_log=False,
        server_header=False,
        proxy_headers=False,
        lifespan="off",
        log_level="warning",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
