"""The operator's view of run stores: one ControlStore per store Secret, read for progress, written for stops.

An AgentRun names its store by Secret (``spec.store.secretRef``, keys
``postgresDsn`` and optional ``redisUrl`` and ``postgresListenDsn``: a direct
DSN for the progress LISTEN when ``postgresDsn`` goes through a pooler in
transaction mode; contract.py). The operator reads that Secret
in the run's namespace once and then follows it by watch (``caches.SecretCache``),
and keeps one connection pool per distinct DSN: Secrets in many namespaces that
name the same database share it. A pool no live run uses is closed after
``store_idle_seconds``. Credentials never leave this module: not in logs, not
in status, not in events.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from agentrun import checkpoint
from agentrun.checkpoint.base import Checkpointer, ControlStore

from ..decide.decision import StoreProblem
from ..decide.reasons import Reason
from ..decide.storeconfig import (
    LOCAL_STORE,
    StoreConfig,
    explain,
    listen_plan,
    not_a_store_url,
    redact,
    sensitive,
    store_config,
)
from .caches import SecretCache, SecretView
from .notify import LISTEN_NAME, Listeners
from .runs import Runs

if TYPE_CHECKING:
    from agentrun.checkpoint.cached import CachedStore

log = logging.getLogger("agentrun_operator.store")

__all__ = ["LOCAL_STORE", "RETRY_SECONDS", "StoreRegistry", "StoreUnavailable", "open_store", "redact"]

# The operator's own store calls retry for this long at most (the runner's bound is a minute): a reconcile
# holds its run's lock meanwhile, and an outage shows as StoreAvailable=False rather than a stalled loop.
RETRY_SECONDS = 2.0
_sensitive = sensitive  # (the name tests know)


def open_store(dsn: str, redis_url: str | None, *, listen: str | None = None) -> Checkpointer:
    """The one place the operator constructs a store (from a store Secret's keys): the runner's factory.

    ``listen``: where its ``watch_progress`` LISTENs (``decide.storeconfig.listen_plan``).
    """
    return checkpoint.open_store(dsn, redis_url=redis_url, retry_timeout=RETRY_SECONDS, listen_url=listen)


class StoreUnavailable(Exception):
    """The Secret is missing or unusable; ``problem`` says why, as a status reason and message."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.problem = StoreProblem(reason=reason, message=message)

    @classmethod
    def of(cls, problem: StoreProblem) -> StoreUnavailable:
        """The exception for ``problem`` (decide.storeconfig's answer)."""
        return cls(problem.reason, problem.message)


def _cached(pg: Checkpointer, redis_url: str) -> CachedStore:
    """A store's Redis cache over a PostgreSQL pool shared with other Secrets (closed by ``_close``).

    Imported here rather than at the top: redis costs the operator about 7 MB, loaded only once a store
    Secret has a ``redisUrl``.
    """
    from agentrun.checkpoint.cached import CachedStore

    return CachedStore(pg, redis_url=redis_url)


@dataclass
class _Pool:
    """One PostgreSQL pool (one DSN) and the stores over it (one per Redis URL; None: the pool itself)."""

    pg: Checkpointer
    stores: dict[str | None, ControlStore]
    # Since when no live run has used it (None: in use, or its last run was forgotten: the sweep notes it).
    idle_since: float | None = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Resolved:
    view: SecretView  # the Secret version this was read from (the cache hands out a new view on a change)
    dsn: str
    store: ControlStore
    secrets: list[str]  # what no message may quote


class StoreRegistry:
    """The stores the operator talks to: one PostgreSQL pool per distinct DSN, whatever Secrets name it.

    Secrets come from the watch-fed ``SecretCache`` (no API read per reconcile); what they mean is
    ``decide.storeconfig``'s. ``listeners`` (optional) is told when a pool opens and closes, to LISTEN for
    its progress (``io/notify.py``). Which runs use which store is kept in their records (``runs``); a pool
    no live run has used for ``idle_seconds`` is closed by ``sweep`` (its listener too).
    ``local_stores``: a sqlite:/// postgresDsn is accepted too (settings.local_stores).
    """

    def __init__(
        self,
        secrets: SecretCache,
        *,
        idle_seconds: float = 300.0,
        listeners: Listeners | None = None,
        runs: Runs | None = None,
        local_stores: bool = False,
    ) -> None:
        self.secrets = secrets
        self.idle_seconds = idle_seconds
        self.listeners = listeners
        self.runs = runs if runs is not None else Runs()
        self.local_stores = local_stores
        self._resolved: dict[tuple[str, str], _Resolved] = {}
        self._pools: dict[str, _Pool] = {}

    async def get(self, namespace: str, secret: str, *, user: str | None = None) -> ControlStore:
        """The store of Secret ``namespace/secret``; ``user``: the uid of a live run using it (keeps it open).

        Raises ``StoreUnavailable`` when the Secret is missing or unusable.
        """
        key = (namespace, secret)
        view = await self.secrets.get(namespace, secret)
        if not view.exists:
            self._resolved.pop(key, None)
        resolved = self._resolved.get(key)
        if resolved is None or resolved.view is not view:
            resolved = self._resolve(namespace, secret, view)
            self._resolved[key] = resolved
        if user is not None:
            self._bind(user, resolved.dsn)
        if self.listeners is not None:
            await self.listeners.listening(resolved.dsn)  # before the caller reads progress
        return resolved.store

    def dsn_of(self, user: str) -> str | None:
        """The DSN of the store the live run ``user`` last used (for a resync of that store's runs)."""
        record = self.runs.get(user)
        return record.store if record is not None else None

    def users_of(self, dsn: str) -> set[str]:
        """The live runs that last used store ``dsn`` (the runs a resync of that store reconciles)."""
        return self.runs.store_users(dsn) if dsn in self._pools else set()

    def release(self, user: str) -> None:
        """The run ended or is gone: it no longer keeps its store's pool open."""
        dsn = self.dsn_of(user)
        if self.runs.use_store(user, None) and dsn is not None and (pool := self._pools.get(dsn)) is not None:
            pool.idle_since = time.monotonic()

    def _bind(self, user: str, dsn: str) -> None:
        if self.dsn_of(user) != dsn:
            self.release(user)
            self.runs.use_store(user, dsn)
        self._pools[dsn].idle_since = None

    def _resolve(self, namespace: str, secret: str, view: SecretView) -> _Resolved:
        config = store_config(namespace, secret, view.data if view.exists else None, local_stores=self.local_stores)
        if isinstance(config, StoreProblem):
            raise StoreUnavailable.of(config)
        pool = self._pools.get(config.dsn)
        if pool is None:
            pool = self._pools[config.dsn] = self._open(namespace, secret, config)
        redis_url = config.redis_url
        store = pool.stores.get(redis_url)
        if store is None:
            assert redis_url is not None
            cached = _cached(pool.pg, redis_url)
            store = pool.stores[redis_url] = cached
            if self.listeners is not None:
                # The cache's own subscription: the pool's LISTEN above already hears PostgreSQL.
                self.listeners.open_redis(config.dsn, redis_url, cached.cache.watch_progress())
        return _Resolved(view, config.dsn, store, config.secrets)

    def _open(self, namespace: str, secret: str, config: StoreConfig) -> _Pool:
        """A new pool for ``config``'s DSN, and its LISTEN (``decide.storeconfig.listen_plan``)."""
        plan = listen_plan(namespace, secret, config)
        if isinstance(plan, StoreProblem):
            raise StoreUnavailable.of(plan)
        if plan.note:
            log.info("%s", plan.note)
        try:
            pg = open_store(config.dsn, None, listen=plan.dsn)
        except ValueError as e:  # an unknown scheme; the factory's message names the scheme only
            raise StoreUnavailable.of(not_a_store_url(namespace, secret, config, e)) from None
        log.info("store pool opened for secret %s/%s (%d pools)", namespace, secret, len(self._pools) + 1)
        if self.listeners is not None and plan.dsn is not None:  # SQLite cannot notify: the resync finds it
            self.listeners.open(config.dsn, pg.watch_progress(name=LISTEN_NAME))
        return _Pool(pg, {None: pg})

    async def sweep(self) -> int:
        """Close the pools no live run has used for ``idle_seconds``; returns how many were closed."""
        now = time.monotonic()
        idle: list[str] = []
        for dsn, pool in self._pools.items():
            if self.runs.store_users(dsn):
                pool.idle_since = None
                continue
            if pool.idle_since is None:  # its last run was forgotten (deleted) since the last sweep
                pool.idle_since = now
            if now - pool.idle_since >= self.idle_seconds:
                idle.append(dsn)
        for dsn in idle:
            await self._close(dsn, f"no live run used it for {self.idle_seconds:.0f}s")
        return len(idle)

    async def _close(self, dsn: str, why: str) -> None:
        pool = self._pools.pop(dsn)
        for key in [k for k, r in self._resolved.items() if r.dsn == dsn]:
            del self._resolved[key]
        if self.listeners is not None:
            await self.listeners.close(dsn)
        for redis_url, store in pool.stores.items():
            if redis_url is not None:
                with contextlib.suppress(Exception):
                    await cast("CachedStore", store).cache.aclose()  # its cache only: the pool is shared
        await pool.pg.aclose()
        log.info("store pool closed: %s (%d left)", why, len(self._pools))

    def explain(self, namespace: str, secret: str, error: BaseException) -> StoreProblem | str:
        """A failed store call as ``InvalidStore`` or the outage's cause (``decide.storeconfig.explain``).

        An ``InvalidStore`` also drops the cached Secret: its credentials may have changed without a watch
        event reaching us, so the next reconcile reads it again.
        """
        entry = self._resolved.get((namespace, secret))
        explained = explain(namespace, secret, error, entry.secrets if entry is not None else [])
        if isinstance(explained, StoreProblem):
            self.secrets.invalidate(namespace, secret)
        return explained

    async def close(self) -> None:
        """Close every pool and its listeners; idempotent (the operator's shutdown calls it twice)."""
        for dsn in list(self._pools):
            await self._close(dsn, "the operator is stopping")
