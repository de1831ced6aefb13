"""A round every few seconds, in a daemon thread: what the Lease holder's keepers (the reserved node names,
lending) run. A round that raises is logged and the next one runs: a keeper never stops on an error."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable


class Periodic:
    def __init__(self, name: str, interval: float, round_: Callable[[], object], log: logging.Logger) -> None:
        self.name = name
        self.interval = interval
        self._round = round_
        self._log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._round()
            except Exception:  # never stop the loop: the next round tries again
                self._log.exception(f"{self.name}: unexpected error")
