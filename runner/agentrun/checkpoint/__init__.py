"""Checkpointers: the protocols (``base``), one module per backend, the Redis hot cache as a wrapper.

``PgCheckpointer`` and ``CachedStore`` load on first use, so importing
agentrun imports neither asyncpg nor redis.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .base import (
    Checkpoint,
    Checkpointer,
    CheckpointWrite,
    ControlStore,
    Intent,
    LedgerEntry,
    LedgerStore,
    Progress,
    RunInputsRecord,
    StateStore,
)
from .memory import InMemoryCheckpointer
from .sqlite import SqliteCheckpointer

if TYPE_CHECKING:
    from .cached import CachedStore
    from .postgres import PgCheckpointer

_LAZY = {"PgCheckpointer": ".postgres", "CachedStore": ".cached"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ``agentrun_listen=off`` in a PostgreSQL URL: runs poll for stop requests instead of LISTENing
# (PgBouncer in transaction mode). Ours, so it is taken out before asyncpg sees the URL.
_LISTEN_PARAM = re.compile(r"([?&])agentrun_listen=([^&#]*)")
_OFF = frozenset({"0", "false", "no", "off"})
_ON = frozenset({"1", "true", "yes", "on"})


def _listen_option(url: str) -> tuple[str, bool]:
    """``url`` without ``agentrun_listen``, and whether it asks to listen (the default)."""
    match = _LISTEN_PARAM.search(url)
    if match is None:
        return url, True
    value = match.group(2).lower()
    if value not in _OFF | _ON:
        raise ValueError(f"agentrun_listen={match.group(2)!r} in the store URL must be on or off")
    before, after = url[: match.start()], url[match.end() :]
    if match.group(1) == "?":
        after = after.removeprefix("&")
        rest = f"?{after}" if after and not after.startswith("#") else after
    else:
        rest = after
    return before + rest, value in _ON


def from_url(url: str, *, retry_timeout: float | None = None) -> Checkpointer:
    """A checkpointer for a store URL: ``sqlite:///path/file.db``, ``memory://``, ``postgresql://...``.

    A bare path is a SQLite file. ``retry_timeout``: how long PostgreSQL may be
    unreachable before calls give up (``PgCheckpointer``'s default if ``None``).
    A PostgreSQL URL may carry ``agentrun_listen=off``: runs poll for stop
    requests instead of listening (behind PgBouncer in transaction mode).
    Raises ``ValueError`` for an unknown scheme or ``agentrun_listen`` value.
    """
    if url.startswith("memory:"):
        return InMemoryCheckpointer()
    if url.startswith("sqlite:///"):
        return SqliteCheckpointer(url.removeprefix("sqlite:///") or ":memory:")
    if url.startswith(("postgres://", "postgresql://")):
        from .postgres import PgCheckpointer

        dsn, listen = _listen_option(url)
        options: dict[str, Any] = {} if listen else {"listen_for_stops": False}
        if retry_timeout is not None:
            options["retry_timeout"] = retry_timeout
        return PgCheckpointer(dsn, **options)
    if "://" not in url:
        return SqliteCheckpointer(url)
    raise ValueError(f"unknown store URL scheme in {url.split('://')[0]!r}:// (use sqlite:///, postgresql://)")


def open_store(
    url: str,
    *,
    redis_url: str | None = None,
    redis_prefix: str = "agentrun",
    cache_ttl: float = 3600.0,
    retry_timeout: float | None = None,
) -> Checkpointer:
    """The store for ``url`` (see ``from_url``), behind the Redis hot cache when ``redis_url`` is set.

    The one factory of the runner and the operator. Nothing connects until
    ``setup()`` or the first call; a Redis that is down costs a warning, the
    store works without it. Raises ``ValueError`` for an unknown scheme.
    """
    store = from_url(url, retry_timeout=retry_timeout)
    if not redis_url:
        return store
    from .cached import CachedStore

    return CachedStore(store, redis_url=redis_url, redis_prefix=redis_prefix, cache_ttl=cache_ttl)


__all__ = [
    "CachedStore",
    "Checkpoint",
    "CheckpointWrite",
    "Checkpointer",
    "ControlStore",
    "InMemoryCheckpointer",
    "Intent",
    "LedgerEntry",
    "LedgerStore",
    "PgCheckpointer",
    "Progress",
    "RunInputsRecord",
    "SqliteCheckpointer",
    "StateStore",
    "from_url",
    "open_store",
]
