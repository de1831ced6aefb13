"""The policy in force, reloaded when its file changes; an invalid new file keeps the last good policy.

The file is polled (a ConfigMap mount is updated by the kubelet swapping a symlink, which file-event
APIs do not report reliably). A change is detected by ``stat`` and confirmed by the content's digest,
so a touched but identical file is not a reload, and a broken file is parsed once, not every poll.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from pathlib import Path

from webhook.core.policy import PolicyError, default_policy, parse_policy
from webhook.service import polling
from webhook.service.metrics import Metrics

log = logging.getLogger("webhook.policy")


class PolicyStore:
    """Holds the policy in force. ``policy`` is a plain attribute read: swapping it is atomic."""

    def __init__(self, path: Path | None, *, metrics: Metrics | None = None) -> None:
        self.path = path
        self.metrics = metrics
        self.error: str | None = None  # why the file on disk is not in force, or None
        self._stat: tuple[int, int, int] | None = None
        self._seen_digest = ""
        if path is None:
            self.policy = default_policy()
            self._seen_digest = self.policy.digest
        else:
            # At startup an invalid policy is fatal: raise PolicyError (there is no last good one).
            text = self._read(path)
            self.policy = parse_policy(text, source=str(path))
            self._seen_digest = _digest(text)
        if metrics is not None:
            metrics.policy_last_reload_ok.set(1)
        for warning in self.policy.warnings:
            log.warning("policy warning: %s", warning, extra={"policy_file": self.source})

    @property
    def source(self) -> str:
        return str(self.path) if self.path is not None else self.policy.source

    def _read(self, path: Path) -> str:
        self._stat = _stat(path)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise PolicyError(str(path), [f"cannot read the file: {err}"]) from None

    def check(self) -> bool:
        """Reload if the file changed. Returns True when a new policy was put in force."""
        if self.path is None:
            return False
        stat = _stat(self.path)
        if stat == self._stat and stat is not None:
            return False
        try:
            text = self._read(self.path)
        except PolicyError as err:
            self._failed(err.problems, digest=f"unreadable:{stat}")
            return False
        digest = _digest(text)
        if digest == self._seen_digest:
            return False
        try:
            policy = parse_policy(text, source=str(self.path))
        except PolicyError as err:
            self._failed(err.problems, digest=digest)
            return False
        self._seen_digest = digest
        self.policy = policy
        self.error = None
        if self.metrics is not None:
            self.metrics.policy_reloads.inc()
            self.metrics.policy_last_reload_ok.set(1)
        log.info(
            "policy reloaded",
            extra={"policy_file": self.source, "policy_name": policy.name, "policy_digest": policy.digest[:12]},
        )
        for warning in policy.warnings:
            log.warning("policy warning: %s", warning, extra={"policy_file": self.source})
        return True

    def _failed(self, problems: list[str], *, digest: str) -> None:
        if digest == self._seen_digest:
            return  # already reported
        self._seen_digest = digest
        self.error = f"{self.source}: " + "; ".join(problems)
        if self.metrics is not None:
            self.metrics.policy_reload_failures.inc()
            self.metrics.policy_last_reload_ok.set(0)
        log.error(
            "policy reload failed, keeping the last good policy",
            extra={
                "policy_file": self.source,
                "problems": problems,
                "policy_in_force": self.policy.digest[:12],
            },
        )

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """Poll every ``interval`` seconds until ``stop`` is set. Never raises."""

        async def check() -> None:
            await asyncio.to_thread(self.check)

        await polling.every(interval, stop, check, what="policy reload", extra={"policy_file": self.source})


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
