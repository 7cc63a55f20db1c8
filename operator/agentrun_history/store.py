"""The history server's side of the store: read-only reads, and the progress notifications that make views live.

Reads go through the store's ``HistoryReads`` protocol (``thread_rows``: one
read-only snapshot per history); PostgreSQL implements it, SQLite and memory
do not (``STORES``). The server never writes: it calls no write method, and its store
role needs only ``SELECT`` on the agentrun schema (plus ``LISTEN``, which
PostgreSQL grants to every role). ``setup()`` still checks the schema version
first (a no-op once it is current, the runners migrate it).

``ProgressHub`` holds one LISTEN connection (never through a transaction
pooler: the store Secret's ``postgresListenDsn`` then, else none) on ``agentrun_progress``
(``pg_progress.CHANNEL``: the runner notifies, throttled to about once a
second per thread plus a trailing one, after its checkpoints commit) and
wakes the live views of that thread. HAZARDS: a notification is a hint, not
the data (the view reads the store again); while the connection is down the
live views fall back to their periodic check (``POLL_SECONDS`` in the
server), and notifications sent meanwhile are lost, which costs only that
delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from agentrun import inspector
from agentrun.checkpoint import from_url, listen_dsn
from agentrun.checkpoint.base import HistoryReads, ThreadRows
from agentrun.checkpoint.listen import Listening, Progressed
from agentrun.checkpoint.pg_progress import CHANNEL
from agentrun.checkpoint.postgres import PgCheckpointer

log = logging.getLogger("agentrun.history")
# Which stores implement HistoryReads, and why only they: said by the startup error and README.
STORES = (
    "PostgreSQL (postgresql://...) only: SQLite and memory keep one machine's runs, with no server for a history "
    "Deployment to share"
)
RECORDED_LIMIT = 1000  # the newest runs the store recorded, for the list's deleted ones: a bound on one read


class HistoryStore:
    """The store, read only; ``rows`` of a thread for ``agentrun.history.build``."""

    def __init__(self, dsn: str) -> None:
        # The runners' own URL parsing (agentrun_* parameters included). A short retry bound: a person waits.
        # No stop listener opens: this process never watches a run's stops.
        store = from_url(dsn, retry_timeout=5.0)
        if not isinstance(store, HistoryReads):
            raise ValueError(
                f"the history server reads a store with the history reads: {STORES}; not {dsn.split(':')[0]}"
            )
        self.store: HistoryReads = store

    async def rows(self, thread_id: str, run_uid: str | None) -> ThreadRows:
        """What the history of ``thread_id`` shows, restricted to ``run_uid``'s rows where it has any."""
        return await self.store.thread_rows(thread_id, run_uid=run_uid)

    async def conversation(self, thread_id: str, run_uid: str | None) -> inspector.Conversation:
        """The run's input and the thread's newest messages (``agentrun.inspector``)."""
        return inspector.conversation(*await self.store.thread_conversation(thread_id, run_uid=run_uid))

    async def step(self, thread_id: str, version: int) -> inspector.StepDetail | None:
        """Version ``version`` of ``thread_id``: its state, what its step changed, its messages; None if none."""
        found = await self.store.thread_step(thread_id, version)
        return inspector.step(found, version) if found is not None else None

    async def find_run(self, namespace: str, name: str) -> tuple[str, str | None] | None:
        """The thread and run uid a deleted AgentRun ``namespace/name`` recorded its turn under, or ``None``."""
        return await self.store.find_run(namespace, name)

    async def recorded_runs(self, namespace: str | None) -> list[dict[str, Any]]:
        """The AgentRuns that recorded a turn (``namespace``'s, or all), newest first: deleted ones among them."""
        return await self.store.recorded_runs(namespace, limit=RECORDED_LIMIT)

    async def aclose(self) -> None:
        """Close the store's pool."""
        await self.store.aclose()


class ProgressHub:
    """Wakes the waiters of a thread when the store says it made progress (one LISTEN connection)."""

    def __init__(self, dsn: str, *, listen: str | None = None) -> None:
        # LISTEN needs a session: never through a transaction pooler (then ``listen`` names the direct DSN,
        # the store Secret's postgresListenDsn); None: no LISTEN, the live views poll.
        self.dsn = listen_dsn(listen or dsn)
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self.listening = False

    def start(self) -> None:
        """Listen for progress in the background (not behind a transaction pooler: the live views poll then)."""
        if self.dsn is None:
            log.info("the store is reached through a transaction pooler: no LISTEN, live views poll")
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="agentrun-history-listen")

    def subscribe(self, thread_id: str) -> asyncio.Event:
        """An event set each time ``thread_id`` progresses (a live view waits on it); ``unsubscribe`` it after."""
        event = asyncio.Event()
        self._waiters.setdefault(thread_id, set()).add(event)
        return event

    def unsubscribe(self, thread_id: str, event: asyncio.Event) -> None:
        """Stop waking ``event``."""
        waiters = self._waiters.get(thread_id)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[thread_id]

    async def _run(self) -> None:
        assert self.dsn is not None
        # A store object only for its watch_progress (the shared listen-with-backoff loop): it opens no pool.
        progress = PgCheckpointer(self.dsn).watch_progress(name="agentrun-history")
        try:
            async with contextlib.aclosing(progress):
                async for event in progress:
                    if isinstance(event, Progressed):
                        for waiter in self._waiters.get(event.thread_id, ()):
                            waiter.set()
                    elif isinstance(event, Listening):
                        self.listening = True
                        log.info("listening on %s for run progress", CHANNEL)
                    elif event.was_up:
                        self.listening = False
                        log.warning("the progress notification connection was lost; live views poll until it is back")
                    else:
                        self.listening = False
                        log.warning("cannot listen for progress (%s); retrying in %.0f s", event.error, event.retry_in)
        finally:
            self.listening = False

    async def aclose(self) -> None:
        """Stop listening."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
