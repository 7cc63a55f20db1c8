"""The store's interfaces: three small protocols, ``Checkpointer`` for a store that has all three, ``HistoryReads``.

A store keeps, per thread: versioned state rows (one per durable step), the
thread's messages (written incrementally: a step sends only the messages it
added or replaced), the tool ledger, tool intents, the run that owns the
thread (fencing) and stop requests. Backends hold no graph logic.

- ``StateStore``: versioned reads and writes of thread state. What the Redis
  hot cache (``cached.CachedStore``) wraps.
- ``LedgerStore``: the tool ledger and intents (what replay-safety rests on).
- ``ControlStore``: fencing registration, stop requests, progress (read, and
  heard as it happens: ``watch_progress``) and the turn records of request
  keys: all the operator needs, and all it should depend on.
- ``Checkpointer``: all three; what the engine takes, and the base class of
  every backend (memory, SQLite, PostgreSQL) and of ``CachedStore``.
- ``HistoryReads``: the read-only reads of the history server (``ThreadRows``
  and the inspector's); PostgreSQL's only (a server-side store to share).

Contract shared by all backends (the conformance suite,
``tests/support/checkpointer_contract.py``, runs it per protocol against each):

- ``aput(thread_id, write, expected_version=v)`` commits state and its new
  messages atomically at version ``v + 1``, or raises ``StaleStateError``
  when the thread is no longer at ``v``. Nothing of a failed write lands.
- ``ledger_put`` is insert-if-absent: the first recorded result for a key
  stays authoritative, a second write is a no-op that returns ``False``.
  ``ledger_replace`` is the one exception, for repair: it swaps a row only
  if it still holds exactly the text the caller read (compare-and-swap), so
  of two repairers one wins and a well-formed row is never replaced.
- ``ledger_put_many`` answers per row as ``ledger_put`` would (the group
  commit of parallel calls, ``checkpoint.group``); ``intent_claim`` returns
  the intent already recorded for a key, or records this one.
- ``ledger_get`` returns whatever is stored (the engine decides whether it
  is well-formed); it raises ``StorageError`` when the store cannot be read.
- Fencing (``register_attempt``, see ``claim`` and ``check_fence`` for the
  rule): a thread outlives its AgentRuns, so ownership is a run uid plus its
  attempt; every write that carries an older attempt of the owner, or
  another run's uid, raises ``FencedError`` and nothing of it lands.
- A write with ``record_turn`` and a ``request_key`` in its meta upserts the
  turn record (``turn_fields``) in its own transaction: the record lands
  exactly when the checkpoint does.
- Ledger rows, intents, ownership, stop requests and turn records belong to
  a thread, and deleting the thread deletes them.
"""

from __future__ import annotations

import abc
import asyncio
import math
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ..errors import FencedError
from ..messages import Message
from .listen import ProgressEvent, nothing

RunStatus = Literal["running", "interrupted", "completed", "stopped", "failed"]


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
        """The interrupts the checkpoint is paused on (``[]`` when it is not paused)."""
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
    # Also upsert the turn record of ``meta["request_key"]`` in the same transaction (see ``Turn``).
    # The engine sets it on a turn's first checkpoint and on interrupted and terminal ones only,
    # so plain steps do not pay for it.
    record_turn: bool = False
    # The channels of ``values`` that changed since this run's last durable write (``None``: unknown,
    # all of them). A store may write only these on top of its previous row (PostgreSQL does).
    changed: frozenset[str] | None = None


@dataclass(frozen=True)
class Head:
    """The cheap head of a thread: its latest version, and which life of the thread id it is.

    ``incarnation`` changes when a thread is deleted and created again under
    the same id, so nothing cached for the old thread passes for the new one.
    """

    version: int
    incarnation: str


@dataclass(frozen=True)
class Commit:
    """What a durable write committed: the new version, the thread's incarnation, the commit time."""

    version: int
    incarnation: str
    created_at: float


# The size bounds of what a turn and progress carry (status fields, not transcripts).
RESULT_MESSAGE_LIMIT = 1024
TOOL_ERROR_MESSAGE_LIMIT = 512


@dataclass(frozen=True)
class Turn:
    """One request on a thread: the turn started with ``request_key``, and how it stands.

    Written in the same transaction as the turn's first checkpoint and as its
    interrupted and terminal checkpoints (``CheckpointWrite.record_turn``), so
    it never contradicts the state rows; between those points ``status`` may
    lag behind the thread (``running`` while it runs). ``version`` is the
    state version of the last write that recorded it. ``result`` (completed
    turns): ``{"message": <final assistant message, at most 1024 chars>,
    "digest": "sha256:<hex of the full content>", "truncated": bool}``;
    ``error``: ``{"code", "message", ...}``; ``tool_calls``: executed,
    replayed, failed, in_doubt. Goes with its thread.
    """

    thread_id: str
    request_key: str
    run_uid: str | None
    status: RunStatus
    version: int
    started_at: float
    updated_at: float
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    tool_calls: dict[str, int] = field(default_factory=dict)


def turn_fields(write: CheckpointWrite) -> dict[str, Any] | None:
    """What a write records in its turn record (``None``: no turn record to write); one rule for every backend."""
    key = write.meta.get("request_key")
    if not write.record_turn or not isinstance(key, str) or not key:
        return None
    return {
        "request_key": key,
        "run_uid": write.meta.get("run_uid"),
        "status": write.status,
        "error": write.meta.get("error") if write.status == "failed" else None,
        "result": write.meta.get("result") if write.status == "completed" else None,
        "tool_calls": dict(write.meta.get("tool_calls") or {}),
    }


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
    # The owner of the thread (the run uid and attempt registered last), where the backend tracks it.
    attempt: int | None = None
    run_uid: str | None = None
    # ``Head.incarnation``, where the backend reads it with the progress.
    incarnation: str | None = None
    error: dict[str, Any] | None = None
    stop_reason: str | None = None
    # Keys executed, replayed, failed, in_doubt (older checkpoints: the first two only). PostgreSQL's
    # executed includes the results recorded since the checkpoint (``context.executed_since``).
    tool_calls: dict[str, int] = field(default_factory=dict)
    interrupts: list[dict[str, Any]] = field(default_factory=list)
    # The identity of the thread's latest turn (``Turn.request_key``), if it was started with one.
    request_key: str | None = None
    # ``Turn.result``, set when ``status`` is completed.
    result: dict[str, Any] | None = None
    # The turn's last failed tool call: {"tool", "code", "message" (at most 512 chars)}; never its arguments.
    last_tool_error: dict[str, Any] | None = None
    # The turn's model usage by model (meta ``model_usage``, shape in ``agentrun.usage``); empty if none.
    model_usage: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_meta(
        cls,
        meta: Mapping[str, Any],
        *,
        thread_id: str,
        version: int,
        current_node: str | None,
        step: int,
        status: RunStatus,
        updated_at: float,
        attempt: int | None = None,
        run_uid: str | None = None,
        incarnation: str | None = None,
    ) -> Progress:
        """The progress of a state row from its meta (all of it, or only its ``PROGRESS_META`` keys)."""
        return cls(
            thread_id=thread_id,
            version=version,
            current_node=current_node,
            step=step,
            status=status,
            updated_at=updated_at,
            attempt=attempt,
            run_uid=run_uid,
            incarnation=incarnation,
            error=meta.get("error"),
            stop_reason=meta.get("stop_reason"),
            tool_calls=dict(meta.get("tool_calls") or {}),
            interrupts=list(meta.get("interrupts") or []),
            request_key=meta.get("request_key"),
            result=meta.get("result") if status == "completed" else None,
            last_tool_error=meta.get("last_tool_error"),
            model_usage=dict(meta.get("model_usage") or {}),
        )

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> Progress:
        """The progress a whole checkpoint shows (no owner, no incarnation: the default ``aget_progress``)."""
        return cls.from_meta(
            checkpoint.meta,
            thread_id=checkpoint.thread_id,
            version=checkpoint.version,
            current_node=checkpoint.current_node,
            step=checkpoint.step,
            status=checkpoint.status,
            updated_at=checkpoint.created_at,
        )


# A ledger key with this suffix marks a call that paused in LangGraph interrupt() (integrations.langgraph.tools):
# a marker, not a tool's result, so counting the ledger's results skips it.
PAUSED_SUFFIX = ":paused"

# The meta keys ``Progress.from_meta`` reads: what a backend selects when it reads progress without the whole meta.
PROGRESS_META = (
    "error",
    "stop_reason",
    "tool_calls",
    "interrupts",
    "request_key",
    "result",
    "last_tool_error",
    "model_usage",
)


@dataclass(frozen=True)
class LedgerEntry:
    """One ledger row: the recorded result of a completed tool call, by ledger key."""

    key: str
    tool_name: str
    # The stored envelope as decoded JSON; ``None`` when the stored text was not JSON.
    result: Any
    created_at: float
    # The stored text exactly: what ``ledger_replace(expected_text=...)`` compares against.
    text: str | None = None


@dataclass(frozen=True)
class LedgerRow:
    """One completed call to record: what ``ledger_put`` takes, for ``ledger_put_many``."""

    key: str
    tool_name: str
    result: Any


@dataclass(frozen=True)
class Intent:
    """A tool call with side effects that started: recorded before it runs, so a replay can tell it was in doubt."""

    key: str
    tool_name: str
    idempotency_key: str | None
    started_at: float
    # SHA-256 of the call's arguments (``ledger.args_digest``): a start of the key with other arguments is
    # another call's (edited since). ``None`` for intents recorded before digests were.
    args_digest: str | None = None


@dataclass(frozen=True)
class RunInputsRecord:
    """The input and resume value of one attempt, written by the operator before it creates the pod.

    They travel through the store, not the environment: Linux caps one
    environment string at 128 KiB, and an AgentRun's input may be larger.
    """

    input: dict[str, Any] | None
    resume: dict[str, Any] | None


# -- fencing: one rule, every backend ----------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """The run that owns a thread: the uid of its AgentRun (``None`` outside Kubernetes) and its attempt."""

    run_uid: str | None
    attempt: int


def claim(thread_id: str, owner: Owner | None, *, attempt: int, run_uid: str | None, seen: bool) -> Owner:
    """The owner after ``run_uid``'s ``attempt`` registers on a thread owned by ``owner``.

    Backends call this under the thread's lock. ``seen``: ``run_uid``
    registered on this thread before. The rule:

    - the owner's run (same uid, or both ``None``): a newer or equal attempt
      takes over, an older one raises ``FencedError``;
    - another run that registered here before was superseded by the owner:
      ``FencedError`` naming the owner (a pod of an old AgentRun cannot take
      the thread back);
    - a run never seen here is a new AgentRun on a thread that outlived the
      previous one: it claims the thread, whatever its attempt number;
    - without a run uid only attempt numbers count (the rule before uids).

    Limit: "newer" means "registered later". Two AgentRuns started on one
    thread at once end with the later registrant owning it; the other is
    fenced at its next write.
    """
    if owner is None:
        return Owner(run_uid, attempt)
    if run_uid == owner.run_uid or run_uid is None:
        _check_attempt(thread_id, owner, attempt)
        return Owner(run_uid, attempt)
    if seen:
        raise FencedError(
            f"thread {thread_id!r} is owned by {_describe(owner)}; run {run_uid} was superseded and must stop "
            "without further side effects"
        )
    return Owner(run_uid, attempt)


def check_fence(thread_id: str, owner: Owner | None, *, attempt: int | None, run_uid: str | None) -> None:
    """Raise ``FencedError`` unless a write of ``run_uid``'s ``attempt`` may land on a thread owned by ``owner``.

    Refused: another run's uid (when both are set), or an attempt older than
    the owner's. A writer without a run uid or attempt is checked on what it has.
    """
    if owner is None:
        return
    if run_uid is not None and owner.run_uid is not None and run_uid != owner.run_uid:
        raise FencedError(
            f"thread {thread_id!r} is owned by {_describe(owner)}; run {run_uid} was superseded and must stop "
            "without further side effects"
        )
    if attempt is not None:
        _check_attempt(thread_id, owner, attempt)


def _check_attempt(thread_id: str, owner: Owner, attempt: int) -> None:
    if attempt < owner.attempt:
        raise FencedError(
            f"thread {thread_id!r}: attempt {attempt} is fenced off by newer attempt {owner.attempt}; "
            "this attempt must stop without further side effects"
        )


def _describe(owner: Owner) -> str:
    run = f"AgentRun uid {owner.run_uid}" if owner.run_uid else "a run without uid"
    return f"{run} (attempt {owner.attempt})"


@dataclass(frozen=True)
class ThreadRows:
    """A thread's recorded rows, as plain dicts; digests and JSON values as JSON text where noted.

    A digest (``history.Digest``'s fields) is JSON text or None. A row PostgreSQL could not read carries
    ``unreadable`` (which row, why) and only what its stored text gives; ``unreadable`` lists them all.
    """

    # interrupts: [{id, message, payload: digest}]; resume: {id: digest}; resume_all: digest;
    # error, result, stop_reason: JSON (a long one cut to a JSON string)
    states: list[dict[str, Any]] = field(default_factory=list)
    # id, role, tool_call_id, is_error, content: digest, tool_calls: [{id, name, arguments: digest}]
    messages: list[dict[str, Any]] = field(default_factory=list)
    # result_sha256, result_bytes (of the stored envelope), result_preview, result_truncated, result_is_error,
    # args_digest (``ledger.args_digest`` of the call's arguments, as the envelope's "args"; None before digests)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    intents: list[dict[str, Any]] = field(default_factory=list)  # args_digest, as the ledger's
    inputs: list[dict[str, Any]] = field(default_factory=list)  # resume: digest of its JSON text, or None
    owner: dict[str, Any] | None = None
    stop: dict[str, Any] | None = None
    unreadable: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Whether the store holds nothing of the thread (no state, ledger row, intent or run input)."""
        return not self.states and not self.ledger and not self.intents and not self.inputs


# -- the protocols -------------------------------------------------------------------------------


@runtime_checkable
class StateStore(Protocol):
    """Versioned thread state. Writes are optimistic (``expected_version``) and fenced."""

    backend: str

    @abc.abstractmethod
    async def setup(self) -> None:
        """Create or migrate the schema; idempotent, safe to call from every process."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release connections; the store cannot be used afterwards."""

    @abc.abstractmethod
    async def aget(self, thread_id: str) -> Checkpoint | None:
        """The latest durable checkpoint with all its messages, or ``None`` for an unknown thread."""

    @abc.abstractmethod
    async def ahead(self, thread_id: str) -> Head | None:
        """The latest version and incarnation from one cheap read, or ``None`` for a thread without state."""

    @abc.abstractmethod
    async def acommit(
        self,
        thread_id: str,
        write: CheckpointWrite,
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> Commit:
        """Commit ``write`` at ``expected_version + 1``; returns what was committed.

        Raises ``StaleStateError`` if the thread's latest version is not
        ``expected_version``, and ``FencedError`` if the writer (``run_uid``,
        ``attempt``) no longer owns the thread (``check_fence``).
        """

    @abc.abstractmethod
    async def aput(
        self,
        thread_id: str,
        write: CheckpointWrite,
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> int:
        """``acommit`` returning only the new version."""

    @abc.abstractmethod
    async def cache_put(self, thread_id: str, write: CheckpointWrite, *, version: int) -> None:
        """Record a non-durable step (``durable_checkpoint_every_step: false``); not fenced.

        Stores without a hot cache keep nothing: the next durable write
        carries every message since the last one.
        """

    @abc.abstractmethod
    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread with its states, messages, ledger, intents, owner and stop request."""

    @abc.abstractmethod
    async def list_threads(self) -> list[str]:
        """Ids of the threads that have state."""


@runtime_checkable
class LedgerStore(Protocol):
    """The tool ledger (first result wins) and the intents of calls with side effects."""

    @abc.abstractmethod
    async def ledger_get(self, thread_id: str, key: str) -> LedgerEntry | None:
        """What is stored for ``key``, well-formed or not; raises ``StorageError`` if unreadable."""

    @abc.abstractmethod
    async def ledger_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        result: Any,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> bool:
        """Record a completed call; ``False`` if the key was already recorded (first result wins).

        Raises ``FencedError`` like ``StateStore.acommit``.
        """

    @abc.abstractmethod
    async def ledger_replace(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        result: Any,
        *,
        expected_text: str,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> bool:
        """Replace the entry of ``key`` only if it is ``tool_name``'s and its text is exactly ``expected_text``.

        For repairing a malformed entry after the tool ran again: ``False``
        when the entry changed since it was read (another repairer won; its
        result stays authoritative) or is gone. Raises ``FencedError`` like
        ``ledger_put``.
        """

    @abc.abstractmethod
    async def ledger_list(self, thread_id: str) -> list[LedgerEntry]:
        """Every entry of the thread, oldest first."""

    @abc.abstractmethod
    async def intent_get(self, thread_id: str, key: str) -> Intent | None:
        """The recorded start of a call with side effects, or ``None``."""

    @abc.abstractmethod
    async def intent_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        idempotency_key: str | None,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
        args_digest: str | None = None,
    ) -> None:
        """Record that a call with side effects is about to start (kept if already present).

        ``args_digest``: the digest of its arguments, kept with it. Raises
        ``FencedError`` like ``ledger_put``: a fenced run must not start side effects.
        """

    async def ledger_put_many(
        self,
        thread_id: str,
        rows: Sequence[LedgerRow],
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> list[bool]:
        """Record several completed calls; per row, ``ledger_put``'s answer (``False``: already recorded).

        The group commit of parallel calls (``checkpoint.group``). This default
        writes row by row, so a failure part-way leaves the rows before it
        recorded; PostgreSQL overrides it with one statement and one commit, all
        or nothing. Raises ``FencedError`` like ``ledger_put`` (a fenced batch
        records nothing) and what the store raises for a failed write.
        """
        return [
            await self.ledger_put(thread_id, row.key, row.tool_name, row.result, attempt=attempt, run_uid=run_uid)
            for row in rows
        ]

    async def intent_claim(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        idempotency_key: str | None,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
        args_digest: str | None = None,
    ) -> Intent | None:
        """The intent already recorded for ``key`` (the call started before: it is in doubt), else record this one.

        ``None``: nothing was recorded before and this start now is. This default
        is ``intent_get`` then ``intent_put`` (two round trips); PostgreSQL does
        both in one statement. Raises ``FencedError`` like ``intent_put``.
        """
        existing = await self.intent_get(thread_id, key)
        if existing is not None:
            return existing
        await self.intent_put(
            thread_id, key, tool_name, idempotency_key, attempt=attempt, run_uid=run_uid, args_digest=args_digest
        )
        return None

    @property
    def ledger_group_window(self) -> float:
        """Seconds a finished call's record may wait for its parallel siblings' (``checkpoint.group``); 0: none.

        Worth it where a commit costs a round trip (PostgreSQL: 2 ms by default);
        the embedded stores write each record on its own.
        """
        return 0.0


@runtime_checkable
class ControlStore(Protocol):
    """Who owns a thread, stop requests, and where the thread is: what the operator needs."""

    @abc.abstractmethod
    async def setup(self) -> None:
        """Create or migrate the schema; idempotent, safe to call from every process."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release connections; the store cannot be used afterwards."""

    @abc.abstractmethod
    async def register_attempt(self, thread_id: str, attempt: int, *, run_uid: str | None = None) -> None:
        """Claim the thread for ``run_uid``'s ``attempt`` under the thread's lock (the rule: ``claim``).

        Later writes of older attempts and of superseded runs raise
        ``FencedError``; so does this call when the caller is itself fenced.
        """

    @abc.abstractmethod
    async def request_stop(self, thread_id: str, reason: str = "") -> None:
        """Ask the process running ``thread_id`` to stop; kept until the run acknowledges it."""

    @abc.abstractmethod
    async def stop_requested(self, thread_id: str) -> str | None:
        """The reason of a pending stop request (possibly ``""``), or ``None`` if there is none."""

    @abc.abstractmethod
    async def clear_stop(self, thread_id: str) -> None:
        """Acknowledge a stop request; clearing none is fine."""

    @abc.abstractmethod
    async def aget_progress(self, thread_id: str) -> Progress | None:
        """Version, node, step, owner and outcome of the thread's latest state, or ``None`` for an unknown thread."""

    @abc.abstractmethod
    async def aget_turn(self, thread_id: str, request_key: str) -> Turn | None:
        """The turn of ``thread_id`` started with ``request_key``, or ``None`` if there is none."""

    @abc.abstractmethod
    def watch_progress(self, *, name: str = "agentrun-progress") -> AsyncGenerator[ProgressEvent, None]:
        """The progress of every thread of this store as it is told, until the generator is closed.

        Typed events (``listen``): ``Listening`` once the listen is in place (again), ``Progressed`` per
        thread that committed, ``Deaf`` when it failed (retried with backoff). A hint, never the data;
        what committed while nobody listened was not heard. ``name``: what the listening connection
        is called on the server (PostgreSQL's ``application_name``). A store that cannot tell yields
        nothing and ends (SQLite, memory, PostgreSQL behind a transaction pooler without a direct DSN).
        """

    @abc.abstractmethod
    async def put_run_inputs(
        self,
        thread_id: str,
        *,
        run_uid: str,
        attempt: int,
        input: dict[str, Any] | None,
        resume: dict[str, Any] | None,
    ) -> None:
        """Record the input and resume value of ``run_uid``'s ``attempt`` (an upsert: writing it again is fine).

        Creates the thread row if missing; the record goes with the thread.
        Older attempts' records of the same run are dropped (the runner reads
        its own once, at start). Raises ``StorageError`` if the values are
        not JSON or the store cannot be written.
        """

    @abc.abstractmethod
    async def aget_run_inputs(self, thread_id: str, *, run_uid: str, attempt: int) -> RunInputsRecord | None:
        """What ``put_run_inputs`` recorded for exactly this run uid and attempt, or ``None``."""


class StopWatch:
    """When a run must ask its store for a stop request (``stop_requested``); this base polls.

    A check is due at once (before a run's first node), then every
    ``interval`` seconds (the run's ``stop_poll_interval``). A store that is
    told of stop requests returns a subclass that is due when ``notify`` was
    called and polls only while it cannot hear (``poll_interval``; PostgreSQL:
    ``pg_listen``). ``notify`` only makes the next check due: the store stays
    the truth.
    """

    def __init__(self) -> None:
        self._notified = True
        self._checked_at = -math.inf
        self._heard: asyncio.Event | None = None

    def notify(self) -> None:
        """Make the next check due (the store stays the truth: a notification is a hint)."""
        self._notified = True
        if self._heard is not None:
            self._heard.set()

    async def heard(self) -> None:
        """Return once a notification is pending (at once if one is): what a node's supervisor waits on."""
        if self._heard is None:
            self._heard = asyncio.Event()
        if not self._notified:
            await self._heard.wait()

    def poll_interval(self, interval: float) -> float:
        """Seconds between checks nobody asked for (``math.inf``: none)."""
        return interval

    def due(self, now: float, interval: float) -> bool:
        """Whether to ask the store now (loop time ``now``); a ``True`` counts as the check."""
        if self._notified or now - self._checked_at >= self.poll_interval(interval):
            self._notified = False
            if self._heard is not None:
                self._heard.clear()
            self._checked_at = now
            return True
        return False

    async def aclose(self) -> None:
        """Stop watching (the run ended)."""


class WatchedThreads:
    """The runs' watches by thread id, for a store that hears stop requests (``pg_listen``, ``redis_stops``).

    What it hears names a thread; ``notify`` makes each of that thread's
    watches due. Empty when no run watches: the hearing then ends.
    """

    def __init__(self) -> None:
        self._by_thread: dict[str, set[StopWatch]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_thread)

    def add(self, thread_id: str, watch: StopWatch) -> None:
        """Watch ``thread_id`` with ``watch`` (a thread may have several: one per run in this process)."""
        self._by_thread.setdefault(thread_id, set()).add(watch)

    def remove(self, thread_id: str, watch: StopWatch) -> None:
        """Forget ``watch`` of ``thread_id``; a thread with no watch left is dropped."""
        watches = self._by_thread.get(thread_id)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._by_thread[thread_id]

    def notify(self, thread_id: str) -> None:
        """A stop request for ``thread_id`` was heard: make each of its watches due."""
        for watch in self._by_thread.get(thread_id, ()):
            watch.notify()

    def threads(self) -> list[str]:
        """The thread ids watched now (what a sweep asks the store about)."""
        return list(self._by_thread)

    def clear(self) -> None:
        """Forget every watch (the hearing ends)."""
        self._by_thread.clear()


@runtime_checkable
class HistoryReads(Protocol):
    """What the history server reads (read only, each from one snapshot): the run history and inspector rows.

    PostgreSQL implements it (``pg_history``, ``pg_inspect``). SQLite and memory do not: their runs stay on one
    machine, with no server for a history Deployment to share. A backend that implements it gets the history
    server (``agentrun_history.store``) without a change there.
    """

    async def aclose(self) -> None:
        """Release connections; the store cannot be used afterwards."""

    async def thread_rows(self, thread_id: str, *, run_uid: str | None = None) -> ThreadRows:
        """Everything the run history shows of ``thread_id`` (``agentrun.history.build``'s input)."""

    async def thread_conversation(
        self, thread_id: str, *, run_uid: str | None = None
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int, str | None]:
        """The run's input, the thread's newest messages, their total, the graph's structure (``inspector``)."""

    async def thread_step(self, thread_id: str, version: int) -> dict[str, Any] | None:
        """One state version of ``thread_id``: its state by key, the one before, its messages; None if none."""

    async def find_run(self, namespace: str, name: str) -> tuple[str, str | None] | None:
        """The thread and run uid a (deleted) AgentRun recorded its turn under, or ``None``."""

    async def recorded_runs(self, namespace: str | None, *, limit: int = 500) -> list[dict[str, Any]]:
        """The AgentRuns that recorded a turn (``namespace``'s, or all), newest first."""


class Checkpointer(StateStore, LedgerStore, ControlStore, abc.ABC):
    """A store with all three protocols: what the engine needs. Backends subclass it.

    Defaults: ``aput`` is ``acommit``'s version, ``cache_put`` keeps nothing,
    ``aget_progress`` reads the whole checkpoint (backends override it with a
    cheaper query), ``setup``/``aclose`` do nothing.
    """

    backend = "base"

    async def setup(self) -> None:
        """Create or migrate the schema; idempotent, safe to call from every process."""

    async def aclose(self) -> None:
        """Release connections; the store cannot be used afterwards."""

    async def aput(
        self,
        thread_id: str,
        write: CheckpointWrite,
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> int:
        """Commit ``write`` at ``expected_version + 1`` and return that version (see ``acommit``)."""
        commit = await self.acommit(
            thread_id, write, expected_version=expected_version, attempt=attempt, run_uid=run_uid
        )
        return commit.version

    async def cache_put(self, thread_id: str, write: CheckpointWrite, *, version: int) -> None:
        """Keep nothing: without a hot cache the next durable write carries every message since the last."""

    async def watch_stops(self, thread_id: str) -> StopWatch:
        """How the run of ``thread_id`` learns of stop requests: polling ``stop_requested``, by default.

        PostgreSQL overrides it with a notification (``pg_listen``); SQLite and memory poll.
        """
        return StopWatch()

    def watch_progress(self, *, name: str = "agentrun-progress") -> AsyncGenerator[ProgressEvent, None]:
        """Nothing to hear, by default: PostgreSQL LISTENs and the Redis cache subscribes (``listen``)."""
        return nothing()

    async def aget_progress(self, thread_id: str) -> Progress | None:
        """Progress from the whole checkpoint (no owner, no incarnation); backends override it."""
        checkpoint = await self.aget(thread_id)
        return None if checkpoint is None else Progress.from_checkpoint(checkpoint)
