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

What is kept per run (its timers, retries, whether a reconcile is queued or running, its thread) is in
its ``RunRecord`` (``io/runs.py``), shared with the rest of the operator and dropped with it.

Every timer and task here runs in an empty ``contextvars.Context``, not in the
caller's: a caller may be a kopf handler (a Secret's event), whose context
holds kopf's cause (the watch event and the object's full body), and a run's
timer lives until its next reconcile: a copied context kept every run's last pod
or AgentRun event alive when kopf delivered those (about half the operator's
memory per run; now io/informer.py does).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

from .memory import Releaser
from .runs import RunRecord, Runs

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
        runs: Runs | None = None,
        releaser: Releaser | None = None,
    ) -> None:
        self.resync_seconds = resync
        self.waiting_resync_seconds = resync if waiting_resync is None else waiting_resync
        self.coalesce = coalesce
        self._run = run  # reconcile the run with this uid; raises when the reconcile failed
        self.runs = runs if runs is not None else Runs()
        self._tasks: set[asyncio.Task[None]] = set()
        self.reconciles = 0  # reconciles started here (not kopf's), for the metrics and tests
        # Told of every reconcile's start and end: gives back the memory of a burst once it drained (io/memory.py)
        self.releaser = releaser if releaser is not None else Releaser()

    # -- which runs a thread's progress wakes ----------------------------------------------------

    def track(self, uid: str, thread: str) -> None:
        """Follow run ``uid`` on ``thread``: its thread's progress wakes it."""
        self.runs.track(uid, thread)

    def untrack(self, uid: str) -> None:
        """Stop following run ``uid`` (it ended)."""
        if self.runs.get(uid) is not None:
            self.runs.track(uid, None)

    # -- triggers ----------------------------------------------------------------------------------

    def progress(self, thread: str) -> None:
        """``thread`` made progress: reconcile its runs, folded to at most one reconcile per ``coalesce`` seconds."""
        for uid in self.runs.on_thread(thread):
            if (record := self.runs.get(uid)) is not None:
                self._progress(record)

    def _progress(self, record: RunRecord) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        last = record.last_progress
        if last is None or now - last >= self.coalesce:
            record.last_progress = now
            self.kick(record.uid)
        elif record.folding is None:
            record.folding = loop.call_later(
                last + self.coalesce - now, self._folded, record, context=contextvars.Context()
            )

    def _folded(self, record: RunRecord) -> None:
        record.folding = None
        record.last_progress = asyncio.get_running_loop().time()
        self.kick(record.uid)

    def after(self, uid: str, *, wake: datetime | None, live: bool, waiting: bool = False) -> None:
        """Set the run's timer after a reconcile: its next deadline, or the resync if that is sooner (the
        slower one when ``waiting``: the run waits for a human)."""
        delays: list[float] = []
        if wake is not None:
            delays.append(max(0.0, (wake - datetime.now(UTC)).total_seconds()) + LATE)
        if live:
            resync = self.waiting_resync_seconds if waiting else self.resync_seconds
            delays.append(resync * random.uniform(0.75, 1.25))
        self._set_timer(self.runs.record(uid), min(delays) if delays else None)

    def resync(self, uids: Iterable[str]) -> None:
        """Reconcile the runs ``uids`` now (a store back from an outage, or gone)."""
        loop = asyncio.get_running_loop()
        for uid in uids:
            loop.call_later(random.uniform(0, RESYNC_SPREAD), self.kick, uid, context=contextvars.Context())

    def _set_timer(self, record: RunRecord, delay: float | None) -> None:
        if record.timer is not None:
            record.timer.cancel()
            record.timer = None
        if delay is not None and self.runs.get(record.uid) is record:  # not forgotten meanwhile
            record.timer = asyncio.get_running_loop().call_later(
                delay, self._fire, record, context=contextvars.Context()
            )

    def _fire(self, record: RunRecord) -> None:
        record.timer = None
        self.kick(record.uid)

    def kick(self, uid: str) -> None:
        """Reconcile the run soon (once, however many kicks arrive before it starts)."""
        record = self.runs.record(uid)
        if record.running:
            record.again = True
            return
        if record.queued:
            return
        record.queued = True
        task = asyncio.create_task(
            self._reconcile(record), name=f"agentrun-reconcile-{uid}", context=contextvars.Context()
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def now(self, uid: str) -> None:
        """Reconcile the run in the caller's task (a watch event's handler), with the retries of ``kick``."""
        record = self.runs.record(uid)
        if record.running or record.queued:
            self.kick(uid)
            return
        await self._reconcile(record)

    async def _reconcile(self, record: RunRecord) -> None:
        record.queued = False
        record.running = True
        self.reconciles += 1
        self.releaser.started()
        try:
            await self._run(record.uid)
            record.failures = 0
        except Exception as e:
            record.failures += 1
            delay = RETRY_DELAYS[min(record.failures, len(RETRY_DELAYS)) - 1]
            log.warning(
                "reconcile of run %s failed (%s: %s); retrying in %.0fs", record.uid, type(e).__name__, e, delay
            )
            self._set_timer(record, delay)
        finally:
            self.releaser.ended()
            record.running = False
            if record.again:
                record.again = False
                if self.runs.get(record.uid) is record:  # not forgotten meanwhile (deleted)
                    self.kick(record.uid)

    async def aclose(self) -> None:
        """Cancel every pending wake-up."""
        self.releaser.close()
        for record in self.runs:
            record.cancel_timers()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):  # shutting down
                await task
