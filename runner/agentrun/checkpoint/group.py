"""Group commit of the tool ledger: parallel calls that finish together share one commit.

The tool node runs the calls of one assistant message concurrently, and each
records its result the moment it returns (``ledger.record``). With a
``LedgerGroup`` the records of calls that finish close together go to the
store as one batch (``LedgerStore.ledger_put_many``: on PostgreSQL one
statement and one commit instead of one per call). The first record of a
batch opens it; the batch is written

- as soon as every sibling call still running waits in it: the common case,
  calls that all finished together, waits for nothing;
- else when ``window`` seconds have passed since it opened.

A call that finishes after its batch was written (a slow tool) opens a batch
of its own, which it writes at once when it is the last call running: a slow
tool is never held back for its siblings, and keeps its own commit.

WINDOW (the limit of the guarantee): after a call returns, its result stays
unrecorded at most ``window`` longer than a call recorded on its own (plus
the commit itself, as for any call). A crash in that span loses the record as
it would in a lone call's commit: on replay the call runs again (a call with
side effects is in doubt, under its policy). The window is the store's
``ledger_group_window``: PostgreSQL's default is ``LEDGER_GROUP_WINDOW``
(2 ms), set per store (``PgCheckpointer(ledger_group_window=...)``, or
``agentrun_ledger_window_ms`` in the store URL); 0 turns grouping off.

Failure: a batch has one fate. A fenced batch records nothing and raises
``FencedError`` in every call of it; a failed write raises its error in each,
and the ledger's failure policy (``ledger.record``) applies per call. Each
row's outcome (recorded now, or already recorded by someone else) comes back
to its own call, so "first well-formed write wins" and the repair of a
malformed row stay per call.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..errors import StorageError
from ..faults import fault_point
from .base import LedgerRow

if TYPE_CHECKING:
    from .base import LedgerStore

# The default window (seconds): a few round trips on a local network, far below any tool's own time.
LEDGER_GROUP_WINDOW = 0.002


class _Batch:
    """Records waiting to be written together; the first one's call writes them (the leader)."""

    __slots__ = ("closed", "followers", "rows")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.rows: list[LedgerRow] = []
        self.followers: list[asyncio.Future[bool]] = []  # the calls of rows[1:], in order
        self.closed: asyncio.Future[None] = loop.create_future()  # set when no record may join any more


class LedgerGroup:
    """The ledger records of one assistant message's parallel calls; see the module docstring.

    ``siblings``: how many calls the message has. Every one of them must call
    ``leave`` once it ends, whatever happened (recorded, replayed, failed,
    paused, cancelled): a batch waits for the calls still running only.
    """

    def __init__(
        self,
        store: LedgerStore,
        thread_id: str,
        *,
        siblings: int,
        window: float,
        attempt: int | None,
        run_uid: str | None,
    ) -> None:
        self.store = store
        self.thread_id = thread_id
        self.window = window
        self.attempt = attempt
        self.run_uid = run_uid
        self._running = siblings
        self._open: _Batch | None = None

    def leave(self) -> None:
        """A sibling call ended: it records nothing more, so the open batch need not wait for it."""
        self._running -= 1
        self._close_if_complete()

    async def put(self, row: LedgerRow) -> bool:
        """Record ``row`` with the siblings that finish within the window; ``ledger_put``'s answer for it.

        Raises what the batch's write raised (``FencedError`` for a fenced batch).
        """
        loop = asyncio.get_running_loop()
        batch = self._open
        if batch is None:
            batch = self._open = _Batch(loop)
            batch.rows.append(row)
            self._close_if_complete()
            return await self._lead(batch, loop)
        batch.rows.append(row)
        mine: asyncio.Future[bool] = loop.create_future()
        batch.followers.append(mine)
        self._close_if_complete()
        return await mine

    def _close_if_complete(self) -> None:
        batch = self._open
        if batch is not None and len(batch.rows) >= self._running:
            self._close(batch)

    def _close(self, batch: _Batch) -> None:
        if self._open is batch:
            self._open = None
        if not batch.closed.done():
            batch.closed.set_result(None)

    async def _lead(self, batch: _Batch, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait until the batch closes (complete, or the window passed), write it, answer every call of it."""
        try:
            if not batch.closed.done():
                timer = loop.call_later(self.window, self._close, batch)
                try:
                    await batch.closed
                finally:
                    timer.cancel()
            outcomes = await self.store.ledger_put_many(
                self.thread_id, batch.rows, attempt=self.attempt, run_uid=self.run_uid
            )
            if len(outcomes) != len(batch.rows):  # a store's bug must not leave the siblings waiting forever
                raise StorageError(f"the store answered {len(outcomes)} outcomes for a batch of {len(batch.rows)}")
        except BaseException as e:
            self._close(batch)  # a cancelled leader: later records open a batch of their own
            for follower in batch.followers:
                if follower.done():
                    continue
                if isinstance(e, Exception):
                    follower.set_exception(e)
                else:
                    follower.cancel()  # the node is being cancelled (a stop): its siblings are too
            raise
        if len(batch.rows) > 1:
            fault_point("after_ledger_group_commit", str(len(batch.rows)))
        for follower, outcome in zip(batch.followers, outcomes[1:], strict=True):
            if not follower.done():
                follower.set_result(outcome)
        return outcomes[0]
