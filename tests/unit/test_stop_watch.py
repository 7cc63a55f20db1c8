"""When a run asks its store for a stop request (``StopWatch``): at once, then polling or only when told.

The contract protected: a run checks before its first node; a polling watch
(SQLite, memory, a PostgreSQL listener that is down) checks at least every
``stop_poll_interval``, so a stop lands within it; a watch that is told
(``notify``) checks at its next chance and never later.
"""

from __future__ import annotations

import math

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
