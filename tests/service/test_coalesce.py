"""``CoalescedWrites`` on a real loopback TCP connection (asyncio): what leaves the transport, when,
and in which order. The transport's own ``write`` is wrapped to record each call; the peer reads
what actually arrived."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from webhook.service.coalesce import CoalescedWrites


@dataclass
class Link:
    writes: CoalescedWrites
    transport: asyncio.Transport
    reader: asyncio.StreamReader  # the peer's end
    sent: list[bytes] = field(default_factory=list)  # each call of the real transport's write


@asynccontextmanager
async def link() -> AsyncIterator[Link]:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.StreamReader] = loop.create_future()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(reader)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    peer = await accepted
    result = Link(CoalescedWrites(transport, loop), transport, peer)  # type: ignore[arg-type]
    real_write: Callable[[Any], None] = transport.write

    def recording_write(data: Any) -> None:
        result.sent.append(bytes(data))
        real_write(data)

    transport.write = recording_write  # type: ignore[method-assign]
    try:
        yield result
    finally:
        transport.abort()
        server.close()
        await server.wait_closed()


async def turn() -> None:
    """Let the event loop run one full turn (the held writes' ``call_soon`` included)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_the_writes_of_one_turn_leave_in_one_call_in_order() -> None:
    async def scenario() -> None:
        async with link() as conn:
            conn.writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
            conn.writes.write(b"hello")
            assert conn.sent == []  # held until the end of the turn
            await turn()
            assert conn.sent == [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"]
            received = await conn.reader.readexactly(len(conn.sent[0]))
            assert received == conn.sent[0]

    asyncio.run(scenario())


def test_flush_sends_at_once_and_leaves_nothing_for_the_end_of_the_turn() -> None:
    async def scenario() -> None:
        async with link() as conn:
            conn.writes.write(b"head ")
            conn.writes.write(bytearray(b"body"))
            conn.writes.flush()
            assert conn.sent == [b"head body"]
            await turn()
            assert conn.sent == [b"head body"]

    asyncio.run(scenario())


def test_a_write_with_nothing_after_it_still_leaves_within_the_turn() -> None:
    """A ``100 Continue`` before the body is read, or a streamed response: no later write comes to
    push it out, and the peer waits for it."""

    async def scenario() -> None:
        async with link() as conn:
            conn.writes.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            received = await asyncio.wait_for(conn.reader.readexactly(25), timeout=5)
            assert received == b"HTTP/1.1 100 Continue\r\n\r\n"

    asyncio.run(scenario())


def test_each_turn_sends_its_own_writes() -> None:
    async def scenario() -> None:
        async with link() as conn:
            conn.writes.write(b"one")
            await turn()
            conn.writes.writelines([b"two", b"", b"three"])
            await turn()
            assert conn.sent == [b"one", b"twothree"]
            assert await conn.reader.readexactly(11) == b"onetwothree"

    asyncio.run(scenario())


def test_close_sends_what_is_held_first() -> None:
    async def scenario() -> None:
        async with link() as conn:
            conn.writes.write(b"last ")
            conn.writes.write(b"words")
            conn.writes.close()
            assert conn.sent == [b"last words"]
            assert await asyncio.wait_for(conn.reader.read(), timeout=5) == b"last words"  # then EOF

    asyncio.run(scenario())


def test_any_other_use_of_the_transport_flushes_first() -> None:
    async def scenario() -> None:
        async with link() as conn:
            conn.writes.write(b"held")
            assert conn.writes.get_write_buffer_size() == 0  # type: ignore[attr-defined]
            assert conn.sent == [b"held"]

    asyncio.run(scenario())


def test_abort_drops_what_is_held() -> None:
    async def scenario() -> None:
        async with link() as conn:
            conn.writes.write(b"never sent")
            conn.writes.abort()
            await turn()
            assert conn.sent == []
            assert conn.writes.is_closing()
            assert await asyncio.wait_for(conn.reader.read(), timeout=5) == b""

    asyncio.run(scenario())


def test_writes_held_when_the_connection_closes_are_dropped_without_error() -> None:
    async def scenario() -> None:
        async with link() as conn:
            conn.writes.write(b"too late")
            conn.transport.close()  # closed under the wrapper (what connection_lost leaves)
            await turn()
            assert conn.sent == []

    asyncio.run(scenario())


def test_extra_info_is_the_transports() -> None:
    async def scenario() -> None:
        async with link() as conn:
            assert conn.writes.get_extra_info("peername") == conn.transport.get_extra_info("peername")
            assert conn.writes.get_extra_info("no-such-thing", "default") == "default"

    asyncio.run(scenario())
