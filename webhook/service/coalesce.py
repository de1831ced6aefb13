"""A connection's transport whose writes within one event-loop turn leave as one.

uvicorn writes a response in two calls, the status line and headers, then the body. Over TLS each
write is its own ``SSL_write``, TLS record and ``send()``: for an AdmissionReview reply that is
twice the encryption and system-call overhead, and the apiserver reads two records. Holding the
writes until the end of the turn (or until the response is complete, see
``DeadlineHttpToolsProtocol.on_response_complete``) sends head and body in one.

Nothing is held longer than the current turn: the first held write schedules a flush with
``call_soon``, so a response that streams, or a ``100 Continue`` before the body is read, still
leaves at once. Any other use of the transport (close, pause, buffer sizes...) flushes first, so
the order of bytes and events on the connection is what the caller wrote. ``abort`` drops what is
held, as it drops the transport's own buffer.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescedWrites:
    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes | bytearray | memoryview] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Send what is held, as one write; nothing when the connection is already closing."""
        held = self._held
        if not held:
            return
        self._held = []
        if self._transport.is_closing():
            return  # the peer is gone or the connection was closed: as the transport drops a write
        self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        # pause_reading, set_protocol, get_write_buffer_size, write_eof...: in order after what is held.
        self.flush()
        return getattr(self._transport, name)
