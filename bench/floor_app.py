"""The floor: the least any Python webhook can do over TLS on this machine, as a latency reference.

No web framework and no ASGI: an asyncio protocol on uvloop, behind the same TLS context and
certificate as ``serve``, that splits HTTP/1.1 requests by ``Content-Length``, decodes the body with
orjson, echoes ``apiVersion`` and ``request.uid`` and answers ``allowed`` with one write. Whatever
latency it shows at a fixed rate is the machine's (loopback, TLS, the CPU waking up for each request,
the load generator), not a framework's: a budget below it cannot be met by any server here.

It is not a webhook (no error handling worth the name): it serves the benchmark's well-formed
requests and ``GET /healthz`` only.

``python -m bench.floor_app --cert-dir DIR --host H --port P`` (other ``serve`` options are ignored).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import cast

import uvloop

from bench.baseline import allowed_reply, arguments, tls_context

_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
_HEALTHY = b'{"status":"ok"}'


class FloorProtocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TLS transport: not a subclass
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            index = head.find(b"\r\ncontent-length:")
            length = int(head[index + 17 :].split(b"\r\n", 1)[0]) if index >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
            self.transport.write(self._reply(head, body))

    @staticmethod
    def _reply(head: bytes, body: bytes) -> bytes:
        payload = _HEALTHY if head.startswith(b"get ") else allowed_reply(body)
        return _HEAD % len(payload) + payload


async def serve(host: str, port: int, cert_dir: str) -> None:
    server = await asyncio.get_running_loop().create_server(FloorProtocol, host, port, ssl=tls_context(cert_dir))
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments("python -m bench.floor_app", argv)
    uvloop.run(serve(args.host, args.port, args.cert_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
