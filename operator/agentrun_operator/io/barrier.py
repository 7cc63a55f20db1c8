"""kopf's index barrier without its thundering herd: a new leader with 10,000 runs starts in seconds, not never.

kopf (1.45) starts no handler before every index holds its initial listing: each object of an indexed
resource gets a toggle in one ``ToggleSet(all)`` while it is listed, dropped once it is indexed, and each
object's worker waits on that set (``processing.py``: ``operator_indexed.wait_for(True)``). The set is an
``asyncio.Condition``: every toggle made or dropped wakes *every* waiting worker, each of which takes the
condition's lock in turn to re-check. N objects cost about N² wake-ups: measured at 1,200 runs about 10 s
of a new leader's start, at 10,200 runs no handler had run after 7 minutes (bench/REPORT.md, the
operator at ten times the load).

``QuietToggleSet`` keeps kopf's contract (same class, same methods, the same ``all``/``any`` rule) but its
waiters wait on an ``asyncio.Event`` per state, set or cleared when the set's state is recomputed: after a
toggle is made or dropped, and whenever one of its toggles is turned (``Toggle.turn_to`` notifies the
shared condition, whose ``notify_all`` recomputes first). One recomputation per change, one wake-up per
waiter once: N objects cost O(N).

``install()`` puts it in place of the one ``ToggleSet`` kopf's orchestrator makes for that barrier (the name
``aiotoggles`` in ``kopf._core.reactor.orchestration``, nothing else of kopf's is touched).

HAZARD: this reaches into kopf's private modules. ``install`` checks that the names it replaces are still
there and does nothing otherwise (logged): a kopf upgrade then brings the herd back, not a failure. The
version it was written against is ``KOPF_VERSION``; re-measure the scale phase (``bench/operator.py``)
after upgrading kopf.
"""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from kopf._cogs.aiokits import aiotoggles
from kopf._core.reactor import orchestration

log = logging.getLogger("agentrun_operator.barrier")

KOPF_VERSION = "1.45.2"


class _RecomputingCondition(asyncio.Condition):
    """The set's condition: whoever notifies it (a toggle turned, a toggle made or dropped) recomputes first."""

    def __init__(self, recompute: Callable[[], None]) -> None:
        super().__init__()
        self._recompute = recompute

    def notify_all(self) -> None:
        self._recompute()
        super().notify_all()


class QuietToggleSet(aiotoggles.ToggleSet):
    """``kopf``'s ``ToggleSet`` whose waiters are woken once, when the set's state changes (module docstring)."""

    def __init__(self, fn: Callable[[Iterable[bool]], bool]) -> None:
        super().__init__(fn)
        self._on, self._off = asyncio.Event(), asyncio.Event()
        self._condition = _RecomputingCondition(self._recompute)
        self._recompute()

    def _recompute(self) -> None:
        on = self.is_on()
        (self._on if on else self._off).set()
        (self._off if on else self._on).clear()

    async def wait_for(self, __state: bool) -> None:
        """Return once the set is on (``True``) or off (``False``); at once if it already is."""
        while self.is_on() != bool(__state):
            await (self._on if __state else self._off).wait()


def install() -> bool:
    """Use ``QuietToggleSet`` for kopf's index barrier; ``False`` (and a warning) when kopf no longer fits."""
    found = getattr(orchestration, "aiotoggles", None)
    if getattr(found, "ToggleSet", None) is QuietToggleSet:
        return True  # installed already
    if found is not aiotoggles or not hasattr(aiotoggles, "ToggleSet"):
        log.warning(
            "kopf %s: its index barrier is not where agentrun expects it (written for kopf %s); left as it is, "
            "so a new leader with thousands of runs starts slowly",
            _kopf_version(),
            KOPF_VERSION,
        )
        return False
    shim = types.ModuleType(aiotoggles.__name__)
    shim.__dict__.update(aiotoggles.__dict__)
    shim.ToggleSet = QuietToggleSet  # type: ignore[attr-defined]
    orchestration.aiotoggles = shim  # type: ignore[attr-defined]
    return True


def _kopf_version() -> Any:
    try:
        return metadata.version("kopf")
    except metadata.PackageNotFoundError:
        return "?"
