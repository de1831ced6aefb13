"""What the two baselines outside the project's transport share (bench/bare_null_app.py and
bench/floor_app.py): their command line, their TLS and their reply."""

from __future__ import annotations

import argparse
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from webhook.service.tls import CERT_FILE, KEY_FILE, server_context


def arguments(prog: str, argv: Sequence[str] | None) -> argparse.Namespace:
    """``--cert-dir``, ``--host``, ``--port``; the other ``serve`` options the benchmark passes
    (``--policy``, ``--no-cluster``) are accepted and ignored."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--cert-dir", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return args


def tls_context(cert_dir: str) -> ssl.SSLContext:
    """The webhook's TLS context (TLS 1.2+, its cipher suites, ALPN http/1.1) with the certificate."""
    context = server_context()
    context.load_cert_chain(Path(cert_dir) / CERT_FILE, Path(cert_dir) / KEY_FILE)
    return context


def allowed_reply(body: bytes) -> bytes:
    """The review decoded with the webhook's JSON library, answered ``allowed`` with its uid."""
    review = orjson.loads(body)
    return orjson.dumps(
        {
            "apiVersion": review["apiVersion"],
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }
    )
