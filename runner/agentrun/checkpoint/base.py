"""The checkpointer interface every backend implements.

A checkpointer stores, per thread: versioned state rows (one per durable
step), the thread's messages (written incrementally: a step sends only the
messages it added or replaced), the tool ledger, tool intents and stop
requests. The engine is the only caller; backends hold no graph logic.

Contract shared by all backends (the conformance suite in
``tests/unit/test_checkpointers.py`` runs against each):

- ``aput(thread_id, write, expected_version=v)`` commits state and its new
  messages atomically at version ``v + 1``, or raises ``StaleStateError``
  when the thread is no longer at ``v``. Nothing of a failed write lands.
- ``ledger_put`` is insert-if-absent: the first recorded result for a key
  stays authoritative, a second write is a no-op that returns ``False``.
- ``ledger_get`` returns whatever is stored (the engine decides whether it
  is well-formed); it raises ``StorageError`` when the store cannot be read.
- Ledger rows, intents and stop requests belong to a thread, and deleting
  the thread deletes them.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from ..messages import Message

RunStatus = Literal["running", "interrupted", "completed", "stopped", "failed"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "stopped", "failed"})


@dataclass
class Checkpoint:
    """The latest durable state of a thread."""

    thread_id: str
    version: int
    values: dict[str, Any]
    messages: list[Message]
    current_node: str | None
    step: int
    status: RunStatus
    # Run bookkeeping: run_id, pending interrupts, resume values, error, tool call counts.
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)

    @property
    def interrupts(self) -> list[dict[str, Any]]:
        return list(self.meta.get("interrupts") or [])


@dataclass
class CheckpointWrite:
    """One step's durable write: the new state row and only the messages that changed.

    ``messages`` holds ``(index, message)`` pairs: indexes at or past the
    stored count are appends, lower ones replace a message in place.
    ``message_count`` is the total after the write.
    """

    values: dict[str, Any]
    current_node: str | None
    step: int
    status: RunStatus
    meta: dict[str, Any]
    message_count: int
    messages: list[tuple[int, Message]] = field(default_factory=list)


@dataclass(frozen=True)
class Progress:
    """Where a thread is, read cheaply: what the operator mirrors into the AgentRun status."""

    thread_id: str
    version: int
    current_node: str | None
    step: int
    status: RunStatus
    updated_at: float
    # False when the step is known only from a hot cache (``durable_checkpoint_every_step: false``):
    # a crash resumes from ``version``, not from this step.
    durable: bool = True
    # The newest attempt registered for the thread, where the backend tracks it.
    attempt: int | None = None
    error: dict[str, Any] | None = None
    stop_reason: str | None = None
    tool_calls: dict[str, int] = field(default_factory=dict)
    interrupts: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> Progress:
        meta = checkpoint.meta
        return cls(
            thread_id=checkpoint.thread_id,
            version=checkpoint.version,
            current_node=checkpoint.current_node,
            step=checkpoint.step,
            status=checkpoint.status,
            updated_at=checkpoint.created_at,
            error=meta.get("error"),
            stop_reason=meta.get("stop_reason"),
            tool_calls=dict(meta.get("tool_calls") or {}),
            interrupts=list(meta.get("interrupts") or []),
        )


@dataclass(frozen=True)
class LedgerEntry:
    key: str
    tool_name: str
    # The stored envelope as decoded JSON; ``None`` when the stored text was not JSON.
    result: Any
    created_at: float


@dataclass(frozen=True)
class Intent:
    key: str
    tool_name: str
    idempotency_key: str | None
    started_at: float


class Checkpointer(abc.ABC):
    """Durable storage of thread state, the tool ledger, intents and stop requests."""

    backend = "base"

    async def setup(self) -> None:
        """Create or migrate the schema; idempotent, safe to call from every process."""

    async def aclose(self) -> None:
        """Release connections; the checkpointer cannot be used afterwards."""

    # -- state -------------------------------------------------------------

    @abc.abstractmethod
    async def aget(self, thread_id: str) -> Checkpoint | None:
        """The latest durable checkpoint with all its messages, or ``None`` for an unknown thread."""

    @abc.abstractmethod
    async def aput(
        self, thread_id: str, write: CheckpointWrite, *, expected_version: int, attempt: int | None = None
    ) -> int:
        """Commit ``write`` at ``expected_version + 1`` and return that version.

        Raises ``StaleStateError`` if the thread's latest version is not
        ``expected_version``, and ``FencedError`` if ``attempt`` is older than
        the newest attempt registered for the thread.
        """

    async def aget_progress(self, thread_id: str) -> Progress | None:
        """Version, node, step and outcome of the thread's latest state, or ``None`` for an unknown thread.

        This default reads the whole checkpoint; backends override it with a cheaper query.
        """
        checkpoint = await self.aget(thread_id)
        return None if checkpoint is None else Progress.from_checkpoint(checkpoint)

    async def cache_put(self, thread_id: str, write: CheckpointWrite, *, version: int) -> None:
        """Record a non-durable step (``durable_checkpoint_every_step: false``).

        Backends without a hot cache keep nothing: the next durable write
        carries every message since the last one.
        """

    # -- ledger and intents ------------------------------------------------

    @abc.abstractmethod
    async def ledger_get(self, thread_id: str, key: str) -> LedgerEntry | None: ...

    @abc.abstractmethod
    async def ledger_put(
        self, thread_id: str, key: str, tool_name: str, result: Any, *, attempt: int | None = None
    ) -> bool:
        """Record a completed call; ``False`` if the key was already recorded (first result wins).

        Raises ``FencedError`` like ``aput``.
        """

    @abc.abstractmethod
    async def ledger_list(self, thread_id: str) -> list[LedgerEntry]: ...

    @abc.abstractmethod
    async def intent_get(self, thread_id: str, key: str) -> Intent | None: ...

    @abc.abstractmethod
    async def intent_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        idempotency_key: str | None,
        *,
        attempt: int | None = None,
    ) -> None:
        """Record that a call with side effects is about to start (kept if already present).

        Raises ``FencedError`` like ``aput``: a fenced attempt must not start side effects.
        """

    # -- fencing -----------------------------------------------------------

    @abc.abstractmethod
    async def register_attempt(self, thread_id: str, attempt: int) -> None:
        """Claim the thread for ``attempt``; later writes from older attempts raise ``FencedError``.

        Raises ``FencedError`` if a newer attempt already registered.
        """

    # -- stop requests -----------------------------------------------------

    @abc.abstractmethod
    async def request_stop(self, thread_id: str, reason: str = "") -> None:
        """Ask the process running ``thread_id`` to stop; kept until the run acknowledges it."""

    @abc.abstractmethod
    async def stop_requested(self, thread_id: str) -> str | None:
        """The reason of a pending stop request (possibly ``""``), or ``None`` if there is none."""

    @abc.abstractmethod
    async def clear_stop(self, thread_id: str) -> None: ...

    # -- threads -----------------------------------------------------------

    @abc.abstractmethod
    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread with its states, messages, ledger, intents and stop request."""

    @abc.abstractmethod
    async def list_threads(self) -> list[str]: ...
