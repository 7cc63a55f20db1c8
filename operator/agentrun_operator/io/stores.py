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

import base64
import contextlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast
from urllib.parse import quote, unquote, urlsplit

from agentrun import checkpoint
from agentrun.checkpoint.base import Checkpointer, ControlStore
from agentrun.contract import POSTGRES_DSN_KEY, POSTGRES_LISTEN_DSN_KEY, REDIS_URL_KEY
from agentrun.errors import AgentRunError, StoreConfigError, StoreUnavailableError

from ..decide.decision import StoreProblem
from ..decide.reasons import Reason
from .caches import SecretCache, SecretView
from .notify import LISTEN_NAME, Listeners

if TYPE_CHECKING:
    from agentrun.checkpoint.cached import CachedStore

log = logging.getLogger("agentrun_operator.store")


# The operator's own store calls retry for this long at most (the runner's bound is a minute): a reconcile
# holds its run's lock meanwhile, and an outage shows as StoreAvailable=False rather than a stalled loop.
RETRY_SECONDS = 2.0
# asyncpg errors that no retry fixes, should one escape the store's own classification (by class name, so
# this module does not import asyncpg).
_CONFIG_ERRORS = frozenset(
    {
        "InvalidPasswordError",
        "InvalidAuthorizationSpecificationError",
        "InvalidCatalogNameError",
        "ClientConfigurationError",
    }
)


def open_store(dsn: str, redis_url: str | None, *, listen: str | None = None) -> Checkpointer:
    """The one place the operator constructs a store (from a store Secret's keys): the runner's factory.

    ``listen``: where its ``watch_progress`` LISTENs (``StoreRegistry._listen_dsn``).
    """
    return checkpoint.open_store(dsn, redis_url=redis_url, retry_timeout=RETRY_SECONDS, listen_url=listen)


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` without any of ``secrets`` (the DSN, the URL, their passwords), whatever quoted them."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _sensitive(*urls: str | None) -> list[str]:
    found: list[str] = []
    for url in urls:
        if not url:
            continue
        found.append(url)
        with contextlib.suppress(ValueError):
            password = urlsplit(url).password
            if password and len(password) >= 3:  # shorter would blank out ordinary words
                found += [password, unquote(password), quote(unquote(password), safe="")]
        found += [m.group(1) for m in re.finditer(r"password=([^&\s]+)", url) if len(m.group(1)) >= 3]
    return found


class StoreUnavailable(Exception):
    """The Secret is missing or unusable; ``problem`` says why, as a status reason and message."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.problem = StoreProblem(reason=reason, message=message)


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
    users: set[str] = field(default_factory=set)  # uids of the live runs on this store
    idle_since: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Resolved:
    view: SecretView  # the Secret version this was read from (the cache hands out a new view on a change)
    dsn: str
    store: ControlStore
    secrets: list[str]  # what no message may quote


_POOLED = "it goes through a transaction pooler"
# A store URL one machine shares (settings.local_stores: agentrun-dev's single-machine cluster).
LOCAL_STORE = "sqlite:///"


class StoreRegistry:
    """The stores the operator talks to: one PostgreSQL pool per distinct DSN, whatever Secrets name it.

    Secrets come from the watch-fed ``SecretCache`` (no API read per reconcile). ``listeners`` (optional)
    is told when a pool opens and closes, to LISTEN for its progress (``io/notify.py``). A pool no live
    run has used for ``idle_seconds`` is closed by ``sweep`` (its listener too).
    """

    # Set from settings.local_stores: a sqlite:/// postgresDsn is accepted too.
    local_stores = False

    def __init__(
        self, secrets: SecretCache, *, idle_seconds: float = 300.0, listeners: Listeners | None = None
    ) -> None:
        self.secrets = secrets
        self.idle_seconds = idle_seconds
        self.listeners = listeners
        self._resolved: dict[tuple[str, str], _Resolved] = {}
        self._pools: dict[str, _Pool] = {}
        self._user_dsn: dict[str, str] = {}

    async def get(self, namespace: str, secret: str, *, user: str | None = None) -> ControlStore:
        """The store of Secret ``namespace/secret``; ``user``: the uid of a live run using it (keeps it open).

        Raises ``StoreUnavailable`` when the Secret is missing or unusable.
        """
        key = (namespace, secret)
        view = await self.secrets.get(namespace, secret)
        if not view.exists:
            self._resolved.pop(key, None)
            raise StoreUnavailable(Reason.STORE_SECRET_NOT_FOUND, f"store secret {namespace}/{secret} does not exist")
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
        return self._user_dsn.get(user)

    def users_of(self, dsn: str) -> set[str]:
        """The live runs that last used store ``dsn`` (the runs a resync of that store reconciles)."""
        pool = self._pools.get(dsn)
        return set(pool.users) if pool is not None else set()

    def release(self, user: str) -> None:
        """The run ended or is gone: it no longer keeps its store's pool open."""
        dsn = self._user_dsn.pop(user, None)
        pool = self._pools.get(dsn) if dsn is not None else None
        if pool is not None:
            pool.users.discard(user)
            if not pool.users:
                pool.idle_since = time.monotonic()

    def _bind(self, user: str, dsn: str) -> None:
        if self._user_dsn.get(user) != dsn:
            self.release(user)
            self._user_dsn[user] = dsn
        self._pools[dsn].users.add(user)

    def _resolve(self, namespace: str, secret: str, view: SecretView) -> _Resolved:
        data = view.data
        if POSTGRES_DSN_KEY not in data:
            raise StoreUnavailable(
                Reason.STORE_SECRET_INVALID, f"store secret {namespace}/{secret} has no key {POSTGRES_DSN_KEY}"
            )
        try:
            dsn = base64.b64decode(data[POSTGRES_DSN_KEY]).decode()
            redis_url = base64.b64decode(data[REDIS_URL_KEY]).decode() if data.get(REDIS_URL_KEY) else None
            direct = (
                base64.b64decode(data[POSTGRES_LISTEN_DSN_KEY]).decode() if data.get(POSTGRES_LISTEN_DSN_KEY) else None
            )
        except ValueError:
            raise StoreUnavailable(
                Reason.STORE_SECRET_INVALID, f"store secret {namespace}/{secret} is not valid base64 text"
            ) from None
        local = self.local_stores and dsn.startswith(LOCAL_STORE)
        if not dsn.startswith(("postgresql://", "postgres://")) and not local:
            # The factory would take a bare string for a SQLite path: no pod on another node could share it.
            raise StoreUnavailable(
                Reason.INVALID_STORE,
                f"{StoreConfigError.code}: store secret {namespace}/{secret}: postgresDsn is not a postgresql:// URL",
            )
        pool = self._pools.get(dsn)
        if pool is None:
            try:
                listen = None if local else self._listen_dsn(namespace, secret, dsn, direct, redis_url)
                pg = open_store(dsn, None, listen=listen)
            except ValueError as e:  # an unknown scheme; the factory's message names the scheme only
                raise StoreUnavailable(
                    Reason.INVALID_STORE,
                    f"{StoreConfigError.code}: store secret {namespace}/{secret}: postgresDsn is not a store URL "
                    f"({redact(str(e), _sensitive(dsn, redis_url, direct))})",
                ) from None
            pool = self._pools[dsn] = _Pool(pg, {None: pg})
            log.info("store pool opened for secret %s/%s (%d pools)", namespace, secret, len(self._pools))
            if self.listeners is not None and listen is not None:  # SQLite cannot notify: the resync finds it
                self.listeners.open(dsn, pg.watch_progress(name=LISTEN_NAME))
        store = pool.stores.get(redis_url)
        if store is None:
            assert redis_url is not None
            cached = _cached(pool.pg, redis_url)
            store = pool.stores[redis_url] = cached
            if self.listeners is not None:
                # The cache's own subscription: the pool's LISTEN above already hears PostgreSQL.
                self.listeners.open_redis(dsn, redis_url, cached.cache.watch_progress())
        return _Resolved(view, dsn, store, _sensitive(dsn, redis_url, direct))

    @staticmethod
    def _listen_dsn(namespace: str, secret: str, dsn: str, direct: str | None, redis_url: str | None) -> str | None:
        """Where to LISTEN for the store's progress: ``postgresListenDsn``, else ``postgresDsn`` unless pooled.

        Raises ``StoreUnavailable`` (InvalidStore) when ``postgresListenDsn`` is no direct PostgreSQL URL.
        """
        try:
            listen = checkpoint.listen_dsn(direct) if direct is not None else checkpoint.listen_dsn(dsn)
        except ValueError as e:
            listen, problem = None, redact(str(e), _sensitive(dsn, redis_url, direct))
        else:
            problem = _POOLED if listen is None else ""
        if direct is not None and (problem or not direct.startswith(("postgresql://", "postgres://"))):
            raise StoreUnavailable(
                Reason.INVALID_STORE,
                f"{StoreConfigError.code}: store secret {namespace}/{secret}: {POSTGRES_LISTEN_DSN_KEY} must be a "
                f"direct postgresql:// URL ({problem or 'another scheme'})",
            )
        if listen is None and problem == _POOLED:  # (a malformed postgresDsn: the store's factory says so)
            log.info(
                "store of secret %s/%s: no LISTEN (postgresDsn goes through a transaction pooler and the Secret has "
                "no %s); its progress arrives by %s, pod events and the resync",
                namespace,
                secret,
                POSTGRES_LISTEN_DSN_KEY,
                "Redis pub/sub" if redis_url else "(no redisUrl)",
            )
        return listen

    async def sweep(self) -> int:
        """Close the pools no live run has used for ``idle_seconds``; returns how many were closed."""
        now = time.monotonic()
        idle = [d for d, pool in self._pools.items() if not pool.users and now - pool.idle_since >= self.idle_seconds]
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
        """A failed store call as ``InvalidStore`` (configuration: no retry helps) or the outage's cause (str).

        Neither quotes the DSN or a password.
        """
        entry = self._resolved.get((namespace, secret))
        secrets = entry.secrets if entry is not None else []
        chain: list[BaseException] = []
        cause: BaseException | None = error
        while cause is not None and cause not in chain and len(chain) < 10:
            chain.append(cause)
            cause = cause.__cause__ or cause.__context__
        if isinstance(error, StoreConfigError) or any(type(e).__name__ in _CONFIG_ERRORS for e in chain):
            # The credentials may have changed without a watch event reaching us: read the Secret again.
            self.secrets.invalidate(namespace, secret)
            text = error.args[0] if isinstance(error, StoreConfigError) and error.args else type(error).__name__
            detail = redact(" ".join(str(text).split()), secrets)
            return StoreProblem(
                Reason.INVALID_STORE, f"{StoreConfigError.code}: {detail} (store secret {namespace}/{secret})"
            )
        code = getattr(error, "code", None) or StoreUnavailableError.code
        text = error.args[0] if isinstance(error, AgentRunError) and error.args else f"{type(error).__name__}: {error}"
        return f"{code}: " + redact(" ".join(str(text).split()), secrets)[:500]

    async def close(self) -> None:
        """Close every pool and its listeners; idempotent (the operator's shutdown calls it twice)."""
        for dsn in list(self._pools):
            await self._close(dsn, "the operator is stopping")
        self._user_dsn.clear()
