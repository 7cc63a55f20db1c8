"""Watch-fed caches: the reconcile reads Secrets and pods from memory, not from the API.

Secrets (``SecretCache``). A Secret is read from the API once per (namespace,
name), the first time a run needs it; afterwards the operator's watch of
Secrets (``handlers.on_secret``) replaces the entry on every change and marks
it missing on deletion, and a store that refuses the credentials
(``invalidate``) makes the next reconcile read it again. Only what the
operator uses is kept: labels (the runner-access check) and the two store
keys (``postgresDsn``, ``redisUrl``, still base64); every other key of the
Secret is dropped, and Secrets no run referenced are never kept at all. A read
that raced with a watch event keeps the event's version (``_events``).

Pods (``PodCache``). The index of the operator's pods (fed by its own list and
watch of them, io/informer.py and io/handlers.py) answers "the pod of attempt N";
no reconcile starts before that index holds its first complete listing
(``Handlers.ready``), so after an operator restart or a leader change a pod
that exists is never taken for a missing one (which would reschedule its
attempt: a second pod). A pod the operator just created
is not in the index until its ADDED event arrives: the API's answer to the
create is used meanwhile (``assume``), for at most ``ASSUME_SECONDS``; past
that the pod is read from the API once (a pod created and deleted before the
watch reported it).

HAZARD: without ``list``/``watch`` on Secrets (RBAC), a cached Secret would
never be refreshed; the chart grants both (helm/agentrun/templates/_helpers.tpl).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun.contract import OPERATOR_STORE_KEYS

from ..decide.classify import PodView
from .kube import KubeClient, NotFound, pod_path, secret_path

STORE_KEYS = OPERATOR_STORE_KEYS
ASSUME_SECONDS = 30.0
ENDED_KEPT = 1000  # deleted pods' last views kept at most (``PodCache.ended``)

SecretKey = tuple[str, str]  # (namespace, name)
PodKey = tuple[str, str]


@dataclass(frozen=True)
class SecretView:
    """What the operator keeps of a Secret: existence, version, labels and the store keys (base64)."""

    exists: bool
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    data: Mapping[str, str] = field(default_factory=dict)  # only STORE_KEYS

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> SecretView:
        """The facts a reconcile uses of a Secret body (its data, its opt-in label), or a missing one."""
        meta = body.get("metadata") or {}
        raw = body.get("data") or {}
        return cls(
            exists=True,
            resource_version=str(meta.get("resourceVersion", "")),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            data={k: str(raw[k]) for k in STORE_KEYS if raw.get(k)},
        )


MISSING = SecretView(exists=False)


class SecretCache:
    """The Secrets runs use, read once and then kept current by the operator's watch (``observe``)."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._views: dict[SecretKey, SecretView] = {}
        self._locks: dict[SecretKey, asyncio.Lock] = {}  # one read in flight per key: a burst of runs reads once
        self._reading: dict[SecretKey, int] = {}  # watch events seen while a read is in flight
        self.reads = 0  # API reads made

    async def get(self, namespace: str, name: str) -> SecretView:
        """The Secret as last seen (``MISSING`` when it does not exist); read from the API only when unknown."""
        key = (namespace, name)
        if (view := self._views.get(key)) is not None:
            return view
        async with self._locks.setdefault(key, asyncio.Lock()):
            if (view := self._views.get(key)) is not None:
                return view
            self._reading[key] = 0
            try:
                self.reads += 1
                view = SecretView.of(await self.kube.get(secret_path(namespace, name)))
            except NotFound:
                view = MISSING
            finally:
                raced = self._reading.pop(key, 0) > 0
            if raced and key in self._views:
                return self._views[key]  # a watch event arrived during the read: it is at least as new
            self._views[key] = view
            return view

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """A watch event of a Secret; True when the operator uses that Secret (its entry changed)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if key not in self._views and key not in self._reading:
            return False  # a Secret no run referenced: not kept
        if key in self._reading:
            self._reading[key] += 1
        self._views[key] = MISSING if event_type == "DELETED" else SecretView.of(body)
        return True

    def invalidate(self, namespace: str, name: str) -> None:
        """Read the Secret again next time (its credentials were refused: it may have changed unseen)."""
        self._views.pop((namespace, name), None)


class PodCache:
    """The operator's pods as its watch last showed them, and the pods it created that the watch has not shown yet."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.index: dict[PodKey, PodView] = {}  # fed by Handlers' pod informer (``put``, ``drop``)
        self._assumed: dict[PodKey, tuple[PodView, float]] = {}
        # Deleted pods whose last view had ended, until their run's next read (``ended``, ``get``).
        self._ended: dict[PodKey, tuple[PodView, float]] = {}
        self.reads = 0

    def put(self, namespace: str, view: PodView) -> None:
        """A pod as the watch (or a list) showed it."""
        self.index[(namespace, view.name)] = view
        self._ended.pop((namespace, view.name), None)

    def drop(self, namespace: str, name: str) -> PodView | None:
        """A pod the watch saw deleted (or a list no longer showed); what was kept of it."""
        return self.index.pop((namespace, name), None)

    def ended(self, namespace: str, final: PodView) -> None:
        """A pod deleted right after it ended (an eviction: its exit, then its deletion, one event after the
        other): its last view is what its run's next reconcile reads, once (``get``), as if that reconcile had
        run between the two events. Without it, a reconcile queued by the exit and run after the deletion read
        no pod, and an evicted attempt was recorded as Deleted, not Disrupted."""
        if final.exit_code is None and final.disruption is None and final.phase not in ("Succeeded", "Failed"):
            return
        now = time.monotonic()
        if len(self._ended) >= ENDED_KEPT:  # runs deleted meanwhile never read theirs
            self._ended = {k: v for k, v in self._ended.items() if now - v[1] < ASSUME_SECONDS}
        self._ended[(namespace, final.name)] = (final, now)

    def assume(self, namespace: str, manifest: Mapping[str, Any]) -> None:
        """The pod the operator just created (the API's answer), until the watch reports it."""
        view = PodView.from_manifest(dict(manifest))
        self._assumed[(namespace, view.name)] = (view, time.monotonic())

    async def get(self, namespace: str, name: str) -> PodView | None:
        """The pod as the watch last reported it (None: it does not exist)."""
        key = (namespace, name)
        if (indexed := self.index.get(key)) is not None:
            self._assumed.pop(key, None)
            return indexed
        if (ended := self._ended.pop(key, None)) is not None and time.monotonic() - ended[1] < ASSUME_SECONDS:
            return ended[0]
        assumed = self._assumed.get(key)
        if assumed is None:
            return None
        view, since = assumed
        if time.monotonic() - since < ASSUME_SECONDS:
            return view
        self._assumed.pop(key, None)
        self.reads += 1
        try:
            return PodView.from_manifest(await self.kube.get(pod_path(namespace, name)))
        except NotFound:
            return None

    def forget(self, namespace: str, name: str) -> None:
        """Forget a pod created here that the index has not shown (it was deleted, or it is in the index now)."""
        self._assumed.pop((namespace, name), None)

    def of_owner(self, namespace: str, uid: str) -> list[str]:
        """The names of the pods in ``namespace`` that the AgentRun ``uid`` controls, as the watch reported them."""
        return sorted(name for (ns, name), view in self.index.items() if ns == namespace and view.owner_uid == uid)
