"""Checkpointers: the protocols (``base``), one module per backend, the Redis hot cache as a wrapper.

Modules: ``base`` (the three protocols, ``Checkpointer``, ``HistoryReads``, ``StopWatch``), ``listen``
(the one listen-with-backoff loop and the typed events of ``watch_progress``), ``batch`` (calls of one
loop turn served together), ``group`` (the ledger's group commit), ``memory``, ``sqlite``,
``postgres`` (``PgCheckpointer``: its constructor, fencing, stops, run inputs, threads) composed of
``pg_connection`` (pool, retries, transactions, the fence), ``pg_state`` (checkpoints), ``pg_ledger``
(ledger and intents) and ``pg_reads`` (the history reads), with ``pg_schema`` (migrations),
``pg_progress`` (progress NOTIFY and LISTEN), ``pg_listen`` (stops heard by LISTEN), ``pg_history`` and
``pg_inspect`` (the history's SQL), ``pg_url`` (agentrun's own URL parameters); ``cached`` (the Redis
hot cache over any store) with ``redis_cache`` and ``redis_stops`` (stops heard on Redis).

Adding a store backend (say ``foo://``), in the order that gives a working store:

1. ``checkpoint/foo.py``: a ``Checkpointer`` subclass with a ``backend = "foo"`` name; implement every
   abstract method of ``StateStore``, ``LedgerStore`` and ``ControlStore`` (the contract is ``base``'s
   docstring). Override ``aget_progress`` with a cheap read, ``watch_stops``/``watch_progress`` if the
   store can push (the defaults poll), ``ledger_put_many``/``intent_claim`` with one round trip if it has
   them (``batch.TurnBatch`` gathers the calls of one loop turn). Split by concern like ``pg_*`` if large.
2. Here: a branch in ``from_url`` for the scheme, and ``_LAZY`` (and ``__all__``) if the class is exported,
   so importing agentrun never imports its driver. ``agentrun/__init__.py`` lists the lazy names again
   only for ``agentrun.FooCheckpointer``.
3. ``tests/support/checkpointers.py``: the backend in ``BACKENDS`` (and ``Backend.open``): the contract
   suite (``tests/support/checkpointer_contract.py``) then runs against it in tests/unit.
4. Optional, each independent of the others:
   - the history server: implement ``base.HistoryReads`` (``thread_rows`` and the inspector's reads);
     ``agentrun_history`` takes any store that does, with no change there;
   - the LangGraph saver: a ``RowStore`` (``integrations/langgraph/rows.py``) in
     ``integrations/langgraph/foo_rows.py`` and its line in ``rows.ROW_STORES``;
   - the operator: it accepts ``postgresql://`` (and ``sqlite:///`` on a single-machine cluster) in
     ``agentrun_operator/decide/storeconfig.py``; a store that pods on several nodes can share adds its
     scheme there.

``PgCheckpointer``, ``CachedStore`` and ``SqliteCheckpointer`` load on first
use, so importing agentrun imports neither asyncpg, redis nor sqlite3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    Checkpoint,
    Checkpointer,
    CheckpointWrite,
    ControlStore,
    HistoryReads,
    Intent,
    LedgerEntry,
    LedgerStore,
    Progress,
    RunInputsRecord,
    StateStore,
    ThreadRows,
)
from .memory import InMemoryCheckpointer
from .pg_url import listen_dsn, parse_store_url, without_params

if TYPE_CHECKING:
    from .cached import CachedStore
    from .postgres import PgCheckpointer
    from .sqlite import SqliteCheckpointer

# Loaded on first use: a runner pod on PostgreSQL never imports sqlite3 (nor asyncpg on SQLite).
_LAZY = {"PgCheckpointer": ".postgres", "CachedStore": ".cached", "SqliteCheckpointer": ".sqlite"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _listen_option(url: str) -> tuple[str, bool]:
    """``url`` without ``agentrun_listen``, and whether it asks to listen (the default).

    Other agentrun parameters (``agentrun_pooler``) stay in: ``PgCheckpointer`` reads them itself.
    Raises ``ValueError`` for an unknown agentrun parameter or value (``pg_url``).
    """
    return without_params(url, frozenset({"agentrun_listen"})), parse_store_url(url).listen


def from_url(url: str, *, retry_timeout: float | None = None, listen_url: str | None = None) -> Checkpointer:
    """A checkpointer for a store URL: ``sqlite:///path/file.db``, ``memory://``, ``postgresql://...``.

    A bare path is a SQLite file. ``retry_timeout``: how long PostgreSQL may be
    unreachable before calls give up (``PgCheckpointer``'s default if ``None``).
    A PostgreSQL URL may carry ``agentrun_pooler=transaction`` (it goes
    through PgBouncer in transaction mode: no session state, runs hear of stop
    requests on Redis or by polling) and ``agentrun_listen=off`` (runs poll
    for stop requests instead of listening); ``pg_url`` says more.
    ``listen_url``: a direct DSN of the same PostgreSQL database where
    ``watch_progress`` LISTENs (``PgCheckpointer``'s ``listen_dsn``). Raises
    ``ValueError`` for an unknown scheme or agentrun parameter.
    """
    if url.startswith("memory:"):
        return InMemoryCheckpointer()
    if url.startswith("sqlite:///") or "://" not in url:
        from .sqlite import SqliteCheckpointer

        if url.startswith("sqlite:///"):
            return SqliteCheckpointer(url.removeprefix("sqlite:///") or ":memory:")
        return SqliteCheckpointer(url)
    if url.startswith(("postgres://", "postgresql://")):
        from .postgres import PgCheckpointer

        options: dict[str, Any] = {}
        if retry_timeout is not None:
            options["retry_timeout"] = retry_timeout
        return PgCheckpointer(url, listen_dsn=listen_url, **options)
    raise ValueError(f"unknown store URL scheme in {url.split('://')[0]!r}:// (use sqlite:///, postgresql://)")


def open_store(
    url: str,
    *,
    redis_url: str | None = None,
    redis_prefix: str = "agentrun",
    cache_ttl: float = 3600.0,
    retry_timeout: float | None = None,
    listen_url: str | None = None,
) -> Checkpointer:
    """The store for ``url`` (see ``from_url``), behind the Redis hot cache when ``redis_url`` is set.

    The one factory of the runner and the operator. Nothing connects until
    ``setup()`` or the first call; a Redis that is down costs a warning, the
    store works without it. Raises ``ValueError`` for an unknown scheme.
    """
    store = from_url(url, retry_timeout=retry_timeout, listen_url=listen_url)
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
    "HistoryReads",
    "InMemoryCheckpointer",
    "Intent",
    "LedgerEntry",
    "LedgerStore",
    "PgCheckpointer",
    "Progress",
    "RunInputsRecord",
    "SqliteCheckpointer",
    "StateStore",
    "ThreadRows",
    "from_url",
    "listen_dsn",
    "open_store",
]
