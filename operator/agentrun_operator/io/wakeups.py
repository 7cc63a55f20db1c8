"""When a run is reconciled besides its own watch events: store progress, due deadlines, a slow resync, retries.

The AgentRun watch starts the reconcile of a run first seen or of a new
generation of its spec, and the pod watch one for a pod event
(``io/handlers.py``), both through ``now``; everything else comes through
here, one asyncio timer per run at most (no task per run, no polling):

- ``progress(thread)``: the store committed a step of that thread
  (``io/notify.py``). The first one after a quiet spell reconciles at once;
  more within ``coalesce`` seconds are folded into one reconcile at the end of
  that window, so the status gets at most one progress patch per ``coalesce``
  seconds per run (and at once for every phase change, which comes from a pod
  event or the runner's outcome).
- ``after(uid, wake=...)``: called after every reconcile with the earliest
  deadline ``decide.wake.next_wake`` found (backoff, stop grace, lost node,
  image pull, active deadline, store outage, ttl); the run's timer is set to
  that, or to the resync (``resync`` seconds, jittered by ±25 % so that runs
  created together do not resync together; ``waiting_resync`` for a run
  waiting for a human, which only events and deadlines change) if sooner. A new reconcile
  replaces the timer: a superseded deadline never fires.
- a reconcile that raised is retried after 1, 2, 5, then every 10 seconds.
- ``resync(uids)``: reconcile these runs soon, spread over ``RESYNC_SPREAD``
  seconds (a store's listener reconnected: progress may have been missed).

A kick while the run's reconcile is running is remembered and runs once more
afterwards (the reconcile may have read the store just before the commit that
woke it); kicks while one is queued are the same reconcile.

Every timer and task here runs in an empty ``contextvars.Context``, not in the
caller's: the caller is often a kopf handler, whose context holds kopf's cause
(the watch event and the object's full body), and a run's timer lives until
its next reconcile: a copied context kept every run's last pod or AgentRun
event alive (about half the operator's memory per run).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

log = logging.getLogger("agentrun_operator.wakeups")

RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0)
RESYNC_SPREAD = 2.0
# A deadline is stored with whole seconds and the loop's clock is not the wall clock: wake a little after.
LATE = 0.05


class Wakeups:
    """When runs are reconciled besides their watch events (the module docstring): progress, deadlines, the resync."""

    def __init__(
        self,
        *,
        resync: float,
        coalesce: float,
        run: Callable[[str], Awaitable[None]],
        waiting_resync: float | None = None,
    ) -> None:
        self.resync_seconds = resync
        self.waiting_resync_seconds = resync if waiting_resync is None else waiting_resync
        self.coalesce = coalesce
        self._run = run  # reconcile the run with this uid; raises when the reconcile failed
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._queued: set[str] = set()
        self._running: set[str] = set()
        self._again: set[str] = set()
        self._last_progress: dict[str, float] = {}
        self._folding: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._threads: dict[str, set[str]] = {}  # store thread id -> uids of the live runs on it
        self._thread_of: dict[str, str] = {}
        self.reconciles = 0  # reconciles started here (not kopf's), for the metrics and tests

    # -- which runs a thread's progress wakes ----------------------------------------------------

    def track(self, uid: str, thread: str) -> None:
        """Follow run ``uid`` on ``thread``: its thread's progress wakes it."""
        if self._thread_of.get(uid) == thread:
            return
        self.untrack(uid)
        self._thread_of[uid] = thread
        self._threads.setdefault(thread, set()).add(uid)

    def untrack(self, uid: str) -> None:
        """Stop following run ``uid`` (it ended or is gone)."""
        thread = self._thread_of.pop(uid, None)
        if thread is not None:
            uids = self._threads.get(thread, set())
            uids.discard(uid)
            if not uids:
                self._threads.pop(thread, None)

    def forget(self, uid: str) -> None:
        """The run is gone: drop its timers and its thread."""
        self.untrack(uid)
        for handles in (self._timers, self._folding):
            handle = handles.pop(uid, None)
            if handle is not None:
                handle.cancel()
        self._last_progress.pop(uid, None)
        self._failures.pop(uid, None)

    # -- triggers ----------------------------------------------------------------------------------

    def progress(self, thread: str) -> None:
        """``thread`` made progress: reconcile its runs, folded to at most one reconcile per ``coalesce`` seconds."""
        for uid in list(self._threads.get(thread, ())):
            self._progress(uid)

    def _progress(self, uid: str) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        last = self._last_progress.get(uid)
        if last is None or now - last >= self.coalesce:
            self._last_progress[uid] = now
            self.kick(uid)
        elif uid not in self._folding:
            self._folding[uid] = loop.call_later(
                last + self.coalesce - now, self._folded, uid, context=contextvars.Context()
            )

    def _folded(self, uid: str) -> None:
        self._folding.pop(uid, None)
        self._last_progress[uid] = asyncio.get_running_loop().time()
        self.kick(uid)

    def after(self, uid: str, *, wake: datetime | None, live: bool, waiting: bool = False) -> None:
        """Set the run's timer after a reconcile: its next deadline, or the resync if that is sooner (the
        slower one when ``waiting``: the run waits for a human)."""
        delays: list[float] = []
        if wake is not None:
            delays.append(max(0.0, (wake - datetime.now(UTC)).total_seconds()) + LATE)
        if live:
            resync = self.waiting_resync_seconds if waiting else self.resync_seconds
            delays.append(resync * random.uniform(0.75, 1.25))
        self._set_timer(uid, min(delays) if delays else None)

    def resync(self, uids: Iterable[str]) -> None:
        """Reconcile the runs ``uids`` now (a store back from an outage, or gone)."""
        loop = asyncio.get_running_loop()
        for uid in uids:
            loop.call_later(random.uniform(0, RESYNC_SPREAD), self.kick, uid, context=contextvars.Context())

    def _set_timer(self, uid: str, delay: float | None) -> None:
        old = self._timers.pop(uid, None)
        if old is not None:
            old.cancel()
        if delay is not None:
            self._timers[uid] = asyncio.get_running_loop().call_later(
                delay, self._fire, uid, context=contextvars.Context()
            )

    def _fire(self, uid: str) -> None:
        self._timers.pop(uid, None)
        self.kick(uid)

    def kick(self, uid: str) -> None:
        """Reconcile the run soon (once, however many kicks arrive before it starts)."""
        if uid in self._running:
            self._again.add(uid)
            return
        if uid in self._queued:
            return
        self._queued.add(uid)
        task = asyncio.create_task(
            self._reconcile(uid), name=f"agentrun-reconcile-{uid}", context=contextvars.Context()
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def now(self, uid: str) -> None:
        """Reconcile the run in the caller's task (a watch event's handler), with the retries of ``kick``."""
        if uid in self._running or uid in self._queued:
            self.kick(uid)
            return
        await self._reconcile(uid)

    async def _reconcile(self, uid: str) -> None:
        self._queued.discard(uid)
        self._running.add(uid)
        self.reconciles += 1
        try:
            await self._run(uid)
            self._failures.pop(uid, None)
        except Exception as e:
            failures = self._failures[uid] = self._failures.get(uid, 0) + 1
            delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS)) - 1]
            log.warning("reconcile of run %s failed (%s: %s); retrying in %.0fs", uid, type(e).__name__, e, delay)
            self._set_timer(uid, delay)
        finally:
            self._running.discard(uid)
            if uid in self._again:
                self._again.discard(uid)
                self.kick(uid)

    async def aclose(self) -> None:
        """Cancel every pending wake-up."""
        for handle in [*self._timers.values(), *self._folding.values()]:
            handle.cancel()
        self._timers.clear()
        self._folding.clear()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):  # shutting down
                await task
