"""A local HTTP server that replays recorded Kubernetes API list and watch responses.

Each collection (``namespaces``, ``nodes``) has a script: the answers to its list requests and to
its watch requests, served in order over a real HTTP exchange (the last list answer repeats; when
the watch script runs out, the watch is held open). Watch answers stream their events as chunked
``application/json`` lines, as kube-apiserver does, and then end in one of three ways:

- ``close``: the server ends the response cleanly (watch ``timeoutSeconds`` reached);
- ``drop``: half an event, then the TCP connection is cut (a network failure or apiserver restart);
- ``hold``: stays open until the server stops.

Every request is recorded (collection, watch or not, query parameters) so tests can check what the
client asked for.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

KUBE_API_FIXTURES = Path(__file__).parent / "fixtures" / "kube-api"
NOT_FOUND = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "the server could not find the requested resource",
    "reason": "NotFound",
    "details": {},
    "code": 404,
}


def fixture(name: str) -> Any:
    path = KUBE_API_FIXTURES / name
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


@dataclass
class Answer:
    status: int = 200
    body: Any = None  # a JSON document (list answers, Status objects)
    events: list[dict[str, Any]] = field(default_factory=list)  # watch answers
    end: str = "close"  # close | drop | hold


def listed(name: str) -> Answer:
    return Answer(body=fixture(name))


def status(code: int, name: str) -> Answer:
    return Answer(status=code, body=fixture(name))


def watched(name: str, end: str = "close") -> Answer:
    return Answer(events=fixture(name), end=end)


@dataclass
class Request:
    collection: str
    watch: bool
    query: dict[str, str]
    path: str = ""


class FakeKubeApi:
    def __init__(self) -> None:
        self.lists: dict[str, list[Answer]] = {}
        self.watches: dict[str, list[Answer]] = {}
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api._serve(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def script(self, collection: str, *, lists: list[Answer], watches: list[Answer]) -> None:
        self.lists[collection] = list(lists)
        self.watches[collection] = list(watches)

    def start(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def requests_for(self, collection: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.collection == collection]

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "replayed"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def _next(self, collection: str, watch: bool) -> Answer | None:
        with self.lock:
            queue = (self.watches if watch else self.lists).get(collection)
            if not queue:
                return None
            if watch:
                return queue.pop(0)
            return queue.pop(0) if len(queue) > 1 else queue[0]

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        parts = url.path.rstrip("/").split("/")
        collection = parts[-1]
        # /apis/GROUP/VERSION/RESOURCE may be scripted per version ("resource.k8s.io/v1/resourceclaims");
        # an unscripted version answers 404, as an apiserver that does not serve it.
        versioned = "/".join(parts[2:5]) if len(parts) == 5 and parts[1] == "apis" else None
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        watch = query.get("watch") in ("true", "1", "True")
        with self.lock:
            self.requests.append(Request(collection, watch, query, url.path))
            if versioned is not None and (versioned in self.lists or versioned in self.watches):
                collection = versioned
        answer = self._next(collection, watch)
        if answer is None:
            if not watch:
                # What kube-apiserver answers for a path it does not serve (an API version it lacks).
                self._json(handler, 404, NOT_FOUND)
                return
            answer = Answer(end="hold")
        if not watch or answer.body is not None:
            self._json(handler, answer.status, answer.body)
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for event in answer.events:
            self._chunk(handler, json.dumps(event).encode() + b"\n")
        if answer.end == "drop":
            self._chunk(handler, b'{"type":"MODIFIED","object":{"metadata":{"na')
            handler.wfile.flush()
            handler.connection.shutdown(socket.SHUT_RDWR)
            handler.close_connection = True
            return
        if answer.end == "hold":
            self.stopping.wait(120)
        try:
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:
            pass

    @staticmethod
    def _chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        handler.wfile.flush()

    @staticmethod
    def _json(handler: BaseHTTPRequestHandler, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
