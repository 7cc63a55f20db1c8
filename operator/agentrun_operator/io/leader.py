"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go does it (through ``io/kube.py``).

Why not kopf's peering: kopf 1.45 pauses *every* operator when it sees a live
peer of the same priority, itself included (``_core/engines/peering.py``,
``process_peering_event``; its module docstring still says it only warns), so
two replicas of one Deployment would both stand still until one of them dies,
and a higher-priority peer pauses the others only after its keep-alive is
seen, with no per-object locks meanwhile. Here exactly one replica holds the
Lease and runs kopf (``standalone``); the others wait. Expiry is judged by
*local* observation time (the record has not changed for ``duration`` seconds
as seen by this process), not by comparing the holder's ``renewTime`` with our
clock, so clock skew between nodes cannot hand the lease to two replicas.

Takeover time after the leader dies without releasing: at most
``duration + retry`` seconds (15 s + 3 s with the defaults). A leader that
cannot renew for ``duration`` seconds gives up and the process exits, so it
never acts while another replica may hold the lease. A graceful shutdown
releases the lease for an immediate takeover.

Hazard: a renewal that hangs (no answer) is only given up after the client's
request timeout (30 s), so for that long this replica may go on acting after
its lease could have expired for the others. client-go bounds each renewal by
its renew deadline; doing so here made the 3 s test lease fail under a burst
of work on a busy event loop, so it is left for a change that measures it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from .kube import ApiError, Conflict, KubeClient, NotFound, lease_path

log = logging.getLogger("agentrun_operator.leader")


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Leader election on a coordination.k8s.io Lease: one operator acts, the others wait as standbys."""

    def __init__(self, kube: KubeClient, namespace: str, name: str, identity: str, duration: float) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.retry = max(0.2, duration / 5)
        self.renew_every = max(0.1, duration / 3)
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0

    def _expired(self, spec: dict[str, Any]) -> bool:
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
            return not spec.get("holderIdentity")
        return now - self._observed_at >= self.duration

    async def try_acquire_or_renew(self) -> bool:
        """Take or renew the Lease once; ``False`` when another holder's Lease is still valid."""
        path = lease_path(self.namespace, self.name)
        try:
            lease = await self.kube.get(path)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": int(self.duration),
                    "acquireTime": _micro_time(),
                    "renewTime": _micro_time(),
                    "leaseTransitions": 0,
                },
            }
            try:
                await self.kube.create(lease_path(self.namespace), body)
                return True
            except Conflict:
                return False
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity")
        if holder != self.identity and not self._expired(spec):
            return False
        now = _micro_time()
        if holder != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=self.identity, renewTime=now, leaseDurationSeconds=int(self.duration))
        lease["spec"] = spec
        try:
            # PUT with the resourceVersion we read: of two contenders exactly one wins.
            await self.kube.replace(path, lease)
        except Conflict:
            return False
        if holder != self.identity:
            log.info("acquired the leader lease %s/%s (previous holder: %s)", self.namespace, self.name, holder or "-")
        return True

    async def acquire(self) -> None:
        """Return once this operator holds the Lease (trying every few seconds meanwhile)."""
        waiting_logged = False
        while True:
            try:
                if await self.try_acquire_or_renew():
                    return
            except (TimeoutError, ApiError, OSError) as e:
                log.warning("leader election: %s", e)
            if not waiting_logged:
                log.info("standing by: another replica holds the leader lease %s/%s", self.namespace, self.name)
                waiting_logged = True
            await asyncio.sleep(self.retry)

    async def hold(self) -> None:
        """Renew until renewing fails for ``duration`` seconds; returns when leadership is lost."""
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                if await self.try_acquire_or_renew():
                    last_ok = time.monotonic()
                    continue
                log.error("the leader lease was taken by another replica")
                return
            except (TimeoutError, ApiError, OSError) as e:
                log.warning("could not renew the leader lease: %r", e)
            if time.monotonic() - last_ok >= self.duration - self.renew_every:
                log.error("could not renew the leader lease for %.0fs; giving up leadership", self.duration)
                return

    async def release(self) -> None:
        """Give the Lease up (a graceful stop): a standby takes over at once instead of after it expires."""
        path = lease_path(self.namespace, self.name)
        try:
            lease = await self.kube.get(path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            await self.kube.replace(path, lease)
            log.info("released the leader lease")
        except (ApiError, OSError) as e:
            log.warning("could not release the leader lease: %s", e)
