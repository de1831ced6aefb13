"""Polling loops for files that change under the server (mounted ConfigMaps and Secrets, which do not
reliably send file events)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

log = logging.getLogger("webhook.polling")


async def every(
    interval: float,
    stop: asyncio.Event,
    check: Callable[[], Awaitable[None]],
    *,
    what: str,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Await ``check()`` every ``interval`` seconds until ``stop`` is set. Never raises: a failing
    check is logged and tried again at the next interval."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval)
            return
        except TimeoutError:
            pass
        try:
            await check()
        except Exception:
            log.exception("%s check crashed; will retry", what, extra=dict(extra or {}))
