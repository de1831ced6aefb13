"""A local HTTP server answering as Prometheus's HTTP API does, for the tests of what reads it (the real Prometheus:
tests/e2e/test_e2e_gpu_metrics.py, tests/e2e/test_e2e_recommend.py)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Prometheus(BaseHTTPRequestHandler):
    """Answers by query (``*``: any other), and records each request's path, fields and Authorization header."""

    answers: dict[str, tuple[int, Any]] = {}
    seen: list[tuple[str, dict[str, str], str | None]] = []

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        fields = dict(urllib.parse.parse_qsl(url.query))
        self.seen.append((url.path, fields, self.headers.get("Authorization")))
        status, body = self.answers.get(fields.get("query", ""), self.answers.get("*", (404, "not found")))
        data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serving() -> Iterator[str]:
    """The server on loopback (its answers and records reset): its URL."""
    Prometheus.answers, Prometheus.seen = {}, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Prometheus)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
