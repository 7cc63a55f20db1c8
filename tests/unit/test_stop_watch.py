"""When a run asks its store for a stop request (``StopWatch``): at once, then polling or only when told.

The contract protected: a run checks before its first node; a polling watch
(SQLite, memory, a PostgreSQL listener that is down) checks at least every
``stop_poll_interval``, so a stop lands within it; a watch that is told
(``notify``) checks at its next chance and never later.
"""

from __future__ import annotations

import math

import pytest

from agentrun.checkpoint.base import StopWatch


class Told(StopWatch):
    """A watch of a store that hears stop requests: never polls."""

    def poll_interval(self, interval: float) -> float:
        return math.inf


def test_a_polling_watch_checks_at_once_then_every_interval() -> None:
    watch = StopWatch()
    assert watch.due(100.0, 0.5), "a run must check before its first node"
    assert not watch.due(100.2, 0.5)
    assert not watch.due(100.49, 0.5)
    assert watch.due(100.5, 0.5), "a polling watch must check every stop_poll_interval"
    assert not watch.due(100.6, 0.5)


def test_a_told_watch_checks_at_once_then_only_when_notified() -> None:
    watch = Told()
    assert watch.due(0.0, 0.5), "a run must check before its first node"
    assert not any(watch.due(t, 0.5) for t in (1.0, 10.0, 3600.0)), "a listening watch polled"
    watch.notify()
    assert watch.due(3600.1, 0.5), "a notified stop was not checked at the next chance"
    assert not watch.due(3600.2, 0.5), "one notification is one check"


def test_a_notification_makes_a_polling_watch_due_before_its_interval() -> None:
    watch = StopWatch()
    assert watch.due(0.0, 1.0)
    watch.notify()
    assert watch.due(0.1, 1.0)


def test_a_store_url_can_turn_listening_off_for_pgbouncer() -> None:
    """``agentrun_listen=off`` in the store Secret's URL makes runner pods poll; asyncpg never sees it."""
    from agentrun.checkpoint import from_url
    from agentrun.checkpoint.postgres import PgCheckpointer

    store = from_url("postgresql://u:pw@db:6432/app?agentrun_listen=off&sslmode=disable")
    assert isinstance(store, PgCheckpointer) and not store.listen_for_stops
    assert store.dsn == "postgresql://u:pw@db:6432/app?sslmode=disable"
    store = from_url("postgresql://u:pw@db/app?sslmode=disable&agentrun_listen=false", retry_timeout=5)
    assert isinstance(store, PgCheckpointer) and not store.listen_for_stops and store.retry_timeout == 5
    assert store.dsn == "postgresql://u:pw@db/app?sslmode=disable"
    default = from_url("postgresql://u:pw@db/app")
    assert (
        isinstance(default, PgCheckpointer) and default.listen_for_stops and default.dsn == "postgresql://u:pw@db/app"
    )
    with pytest.raises(ValueError, match="agentrun_listen"):
        from_url("postgresql://db/app?agentrun_listen=maybe")
