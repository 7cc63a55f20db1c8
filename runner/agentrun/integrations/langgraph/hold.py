"""A super-step in one statement: a task's pending writes held for the checkpoint that follows them.

LangGraph's loop stores a super-step in two calls: ``aput_writes`` as each
task finishes (its writes, filed under the checkpoint the task ran from), then
``aput`` once every task of the step finished (the next checkpoint, whose
parent is that one). ``WriteHold`` keeps a task's writes back for at most
``window`` seconds: when the next checkpoint comes within it (the common
case: the last task's writes and the checkpoint are microseconds apart), the
saver stores both in one statement, one round trip and one commit; otherwise
the writes go alone when the window ends (writes of tasks that finished
together in one statement), as they did before.

Durable before visible: ``aput_writes`` returns only once its writes are
stored, whichever way they went. LangGraph waits for its put_writes futures
before a run returns or raises (its executor's exit waits for every
submitted task) and, for delta channels and error handlers, before the next
step starts; with ``durability="sync"`` it waits for each checkpoint before
the next super-step. So nothing a held write caused (an output, an interrupt
shown to a person, the runner's status) is seen before the write is stored.

WHAT A CRASH LOSES (the window's limit): writes held when the process dies
are lost, as if the task had died just before it finished: on resume
LangGraph finds no pending writes for it and runs it again. Pending writes
matter on resume only when the super-step's checkpoint was not stored, and
then only those of tasks that finished while a sibling still ran; a write
held ``window`` seconds is stored alone. So a crash re-runs a finished task
only if it came within ``window`` (plus the statement's own time, as for any
write) of the task finishing: the same re-run LangGraph does for a task that
died a moment earlier. (The window of writes filed under a checkpoint that is
itself still being stored starts when it is stored: until then a crash
resumes from its parent, where those tasks never ran, so nothing is at
risk.) A side-effecting tool under ``LedgerToolNode`` is not
protected by pending writes but by the ledger (its result is recorded the
moment it returns, in its own commit): its re-run answers from the ledger.
Special writes (error, interrupt, resume, scheduled: LangGraph's
``WRITES_IDX_MAP``, idx < 0) are never held: a person or the runner acts on
them, so they are stored before ``aput_writes`` returns, as before.

Failure: held writes share the fate of the statement that carries them. A
fenced or failed checkpoint statement raises its error in every
``aput_writes`` whose writes it carried; nothing of it landed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from agentrun.checkpoint.base import CheckpointWrite, Commit

from .rows import WriteRow

# The default window (seconds): far longer than LangGraph takes from a step's last task to its checkpoint
# (tens of microseconds), far shorter than any node worth checkpointing.
WRITE_HOLD_WINDOW = 0.002

# Whose writes: (thread id, checkpoint namespace, checkpoint id), the checkpoint the tasks ran from.
Key = tuple[str, str, str]
Send = Callable[[Key, list[WriteRow]], Awaitable[None]]


@dataclass
class Held:
    """Writes waiting for their checkpoint; ``done`` resolves when they are stored (or failed)."""

    key: Key
    rows: list[WriteRow]
    done: asyncio.Future[None]
    timer: asyncio.TimerHandle | None = None
    nodes: list[str] = field(default_factory=list)

    def settle(self, error: BaseException | None) -> None:
        """Answer every ``aput_writes`` waiting on these writes."""
        if self.done.done():
            return
        if error is None:
            self.done.set_result(None)
        elif isinstance(error, asyncio.CancelledError):
            self.done.cancel()
        else:
            self.done.set_exception(error)


def _retrieve(future: asyncio.Future[None]) -> None:
    # A waiter cancelled meanwhile leaves the outcome unread: read it, so asyncio does not warn about it.
    if not future.cancelled():
        future.exception()


class WriteHold:
    """The writes of one saver held for their checkpoint; see the module docstring."""

    def __init__(self, window: float, send: Send) -> None:
        self.window = window
        self._send = send  # stores writes on their own (the window ended, no checkpoint took them)
        self._held: dict[Key, Held] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Checkpoints being stored now: the window of writes filed under one starts when it is stored.
        self._writing: set[Key] = set()

    def add(self, key: Key, rows: list[WriteRow], node: str) -> asyncio.Future[None]:
        """Hold ``rows`` for the checkpoint whose parent ``key`` names; the future resolves once they are stored.

        Await it shielded (``asyncio.shield``): a cancelled waiter must not cancel its siblings' outcome.
        """
        loop = asyncio.get_running_loop()
        held = self._held.get(key)
        if held is None:
            done: asyncio.Future[None] = loop.create_future()
            done.add_done_callback(_retrieve)
            held = self._held[key] = Held(key, [], done)
            if key not in self._writing:
                held.timer = loop.call_later(self.window, self._release, key, held)
        held.rows.extend(rows)
        held.nodes.append(node)
        return held.done

    def writing(self, key: Key) -> None:
        """The checkpoint ``key`` names is being stored: writes filed under it wait for that (their window later).

        Nothing is at risk meanwhile: until that checkpoint is stored, a crash resumes from its parent, where
        the tasks that wrote under it have not run.
        """
        self._writing.add(key)

    def written(self, key: Key) -> None:
        """The checkpoint ``key`` names was stored (or failed): the window of the writes filed under it starts."""
        self._writing.discard(key)
        held = self._held.get(key)
        if held is not None and held.timer is None:
            held.timer = asyncio.get_running_loop().call_later(self.window, self._release, key, held)

    def take(self, key: Key) -> Held | None:
        """The writes held for ``key`` (the new checkpoint's parent), now the caller's to store and settle."""
        held = self._held.pop(key, None)
        if held is not None and held.timer is not None:
            held.timer.cancel()
        return held

    def send_alone(self, held: Held) -> None:
        """Store writes ``take`` returned on their own, now (their checkpoint could not take them)."""
        self._release(held.key, held)

    def _release(self, key: Key, held: Held) -> None:
        """The window ended before a checkpoint took the writes: store them alone."""
        if self._held.get(key) is held:
            del self._held[key]
        task = asyncio.get_running_loop().create_task(self._store(key, held), name=f"agentrun-lg-writes-{key[0]}")
        self._tasks.add(task)  # a reference until it ends (the loop holds tasks weakly)
        task.add_done_callback(self._tasks.discard)

    async def _store(self, key: Key, held: Held) -> None:
        try:
            await self._send(key, held.rows)
        except BaseException as e:
            held.settle(e)
            if not isinstance(e, Exception):
                raise
            return
        held.settle(None)


class Ride(Protocol):
    """A progress row of ours waiting for the thread's next checkpoint, to go in its statement (``run._Mirror``).

    The saver stores it with the checkpoint (``acommit_with_lg_step``) and calls
    ``landed`` exactly once: with the commit, or with the error that kept it out
    (then the checkpoint went alone, unless the error was fatal to both).
    """

    thread_id: str
    write: CheckpointWrite
    expected_version: int
    attempt: int | None
    run_uid: str | None

    def landed(self, commit: Commit | None, error: BaseException | None) -> None:
        """The row's outcome: stored with ``commit``, or kept out by ``error``."""


# Gives the saver the progress row waiting for ``thread_id``'s next checkpoint, if one waits.
Rider = Callable[[str], Ride | None]
