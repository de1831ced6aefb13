"""Leader election on a ``coordination.k8s.io/v1`` Lease, over ``webhook.cluster.kubeapi``.

The background audit runs on one replica at a time: the one holding the Lease. This is client-go's
``leaderelection`` algorithm with a ``LeaseLock``, reduced to what the audit needs:

- a candidate reads the Lease; it takes it when it does not exist (create), when it holds it
  already (renew), or when the holder has not renewed it for ``leaseDurationSeconds`` as measured
  on the candidate's own clock since it last saw the record change (client-go's ``observedTime``:
  the clocks of two nodes are never compared);
- every write is an update with the ``resourceVersion`` read (a ``409 Conflict`` means another
  candidate wrote first: not the leader this round);
- the leader renews every ``retry_period``; when it cannot renew for ``renew_deadline`` it stops
  calling itself leader, before the lease can expire for the others (deadline < duration);
- ``release`` (on shutdown) empties ``holderIdentity`` so that another replica takes over at once.

The ``kubernetes`` package ships ``kubernetes.leaderelection``, but it deserializes into models and
blocks in its own loop with callbacks; this is small, raw JSON, and testable against the fake API.
Defaults are client-go's: lease 15 s, renew deadline 10 s, retry period 2 s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from webhook.cluster.kubeapi import ApiError, Conflict, KubeApi, NotFound, api_path

log = logging.getLogger("webhook.lease")

GROUP_VERSION = "coordination.k8s.io/v1"


def micro_time(moment: datetime) -> str:
    """A ``metav1.MicroTime`` (RFC 3339 with microseconds, UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_change = on_change  # called with the new state when leadership changes
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._observed: tuple[str, str] | None = None  # (holderIdentity, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # when this candidate last wrote the lease as holder
        self._leader = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> str:
        return api_path(GROUP_VERSION, "leases", namespace=self.namespace, name=self.name)

    @property
    def is_leader(self) -> bool:
        """Holding the lease, and renewed it within the renew deadline."""
        renewed = self._renewed_at
        return self._leader and renewed is not None and self._monotonic() - renewed < self.renew_deadline

    def _set_leader(self, leader: bool) -> None:
        if leader != self._leader:
            self._leader = leader
            log.info(
                "audit leadership " + ("acquired" if leader else "lost"),
                extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
            )
            if self.on_change is not None:
                self.on_change(leader)

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this candidate holds the lease after it. API errors count as not
        renewed (the renew deadline then ends the leadership)."""
        try:
            held = self._round()
        except ApiError as err:
            log.warning("lease round failed", extra={"lease": f"{self.namespace}/{self.name}", "error": str(err)})
            held = False
        if held:
            self._renewed_at = self._monotonic()
            self._set_leader(True)
        elif not self.is_leader or self._observed_holder_is_other():
            self._set_leader(False)
        return self.is_leader

    def _observed_holder_is_other(self) -> bool:
        return self._observed is not None and self._observed[0] not in ("", self.identity)

    def _round(self) -> bool:
        now = self._wall_clock()
        spec_mine: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": 0,
        }
        try:
            lease = self.api.get(self.path)
        except NotFound:
            body = {
                "apiVersion": GROUP_VERSION,
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec_mine,
            }
            try:
                self.api.create(api_path(GROUP_VERSION, "leases", namespace=self.namespace), body)
            except Conflict:
                return False  # another candidate created it first
            self._observe(self.identity, str(spec_mine["renewTime"]))
            return True
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        renew = str(spec.get("renewTime") or "")
        self._observe(holder, renew)
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and self._monotonic() - self._observed_at < duration:
            return False  # held by another, and renewed within its duration (as seen from here)
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder != self.identity:
            spec.update(spec_mine, leaseTransitions=transitions + 1)
        else:
            spec.update(
                holderIdentity=self.identity,
                leaseDurationSeconds=int(self.lease_duration),
                renewTime=micro_time(now),
            )
        lease["spec"] = spec
        try:
            self.api.replace(self.path, lease)
        except Conflict:
            return False
        self._observe(self.identity, str(spec["renewTime"]))
        return True

    def _observe(self, holder: str, renew: str) -> None:
        if self._observed != (holder, renew):
            self._observed = (holder, renew)
            self._observed_at = self._monotonic()

    def release(self) -> None:
        """Give the lease up (shutdown): another replica can take it without waiting for expiry."""
        if not self._leader:
            return
        try:
            lease = self.api.get(self.path)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") == self.identity:
                now = micro_time(self._wall_clock())
                spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=now, acquireTime=now)
                lease["spec"] = spec
                self.api.replace(self.path, lease)
        except ApiError as err:
            log.warning("lease release failed", extra={"lease": f"{self.namespace}/{self.name}", "error": str(err)})
        self._set_leader(False)

    # -- background -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lease-elector", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0, *, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if release:
            self.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.try_acquire_or_renew()
            self._stop.wait(self.retry_period)
