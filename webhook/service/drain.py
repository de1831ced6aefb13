"""Shutdown that does not depend on luck: SIGTERM starts a drain before uvicorn's own shutdown.

Without it, uvicorn stops listening within ~0.05 s of SIGTERM, and zero failed reviews during a rollout
rely on the preStop sleep and the endpoint removal racing the right way. With ``--drain-seconds D``:

1. SIGTERM: ``/readyz`` answers 503 at once (``shutdown`` in its ``missing`` list), so a readiness probe
   or a load balancer's health check takes the replica out; reviews keep being served, on new
   connections and on the pooled keep-alive ones, for D seconds, each answered with ``Connection: close``
   (the apiserver stops reusing that connection and dials a live replica next);
2. then uvicorn's graceful shutdown: stop accepting, close idle keep-alive connections (the apiserver
   redials a live replica), let the reviews in flight finish (``--graceful-timeout-seconds``), exit.

A second SIGTERM, or SIGINT (Ctrl-C), skips what is left of the drain. The handler is installed by the
lifespan of each worker process over the one uvicorn installed, which it calls when the drain ends:
with ``--workers N`` the supervisor forwards SIGTERM to every worker, and each drains.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("webhook.serve")

Handler = Callable[[int, FrameType | None], Any]


class Drain:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started: float | None = None  # monotonic time of the SIGTERM
        self._previous: Handler | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def draining(self) -> bool:
        return self.started is not None

    def status(self) -> dict[str, Any]:
        """What ``/readyz`` says while draining."""
        elapsed = 0.0 if self.started is None else time.monotonic() - self.started
        return {
            "ok": False,
            "detail": f"SIGTERM received {elapsed:.1f} s ago: draining, reviews are still answered for "
            f"{max(self.seconds - elapsed, 0.0):.1f} s more, then shutdown",
        }

    def install(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Put the drain in front of the current SIGTERM handler (uvicorn's). Only in the main thread,
        only with a drain to do, and only over a handler that can be called (not the defaults)."""
        if self.seconds <= 0 or threading.current_thread() is not threading.main_thread():
            return False
        previous = signal.getsignal(signal.SIGTERM)
        if not callable(previous):
            return False
        self._previous = previous
        self._loop = loop
        signal.signal(signal.SIGTERM, self._on_sigterm)
        return True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler: only a flag and a wake-up of the loop here (call_soon_threadsafe writes to the
        # loop's self-pipe); the timer is set from the loop itself.
        if self.started is not None or self._loop is None:
            self._finish(signum)  # the second SIGTERM: no more waiting
            return
        self.started = time.monotonic()
        self._loop.call_soon_threadsafe(self._schedule, signum)

    def _schedule(self, signum: int) -> None:
        log.info(
            "SIGTERM: draining for %.1f s (/readyz answers 503, reviews are still served), then shutting down",
            self.seconds,
        )
        assert self._loop is not None
        self._loop.call_later(self.seconds, self._finish, signum)

    def _finish(self, signum: int) -> None:
        previous, self._previous = self._previous, None
        if previous is not None:
            previous(signum, None)
