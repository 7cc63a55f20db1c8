"""What the LangGraph saver stores, as rows: one protocol, one implementation per store (``ROW_STORES``).

The saver (``saver.py``) turns LangGraph's checkpoints into these rows and
back; a row store only moves bytes, under our store's transactions, retries
and fencing. Values are LangGraph's serializer output (``dumps_typed``: a
type tag and bytes), never decoded here.

A checkpoint's channel values are not in its row: each channel's value is a
blob keyed by ``(channel, version)``, written once when the version is new
(LangGraph's ``new_versions``), so an unchanged channel costs nothing per step.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrun.checkpoint.base import Intent, LedgerEntry

# Each backend's row store by the store's ``backend`` name, as "module:class" (loaded on first use: a PostgreSQL
# runner never imports sqlite3, nor a SQLite one asyncpg). A new backend with LangGraph tables adds its line here.
ROW_STORES: dict[str, str] = {
    "postgres": "agentrun.integrations.langgraph.pg_rows:PgRows",
    "sqlite": "agentrun.integrations.langgraph.sqlite_rows:SqliteRows",
}

# A blob whose channel had a new version but no value (LangGraph's "empty" marker): skipped on read.
EMPTY = "empty"


@dataclass(frozen=True)
class Fence:
    """The writer: a write of an attempt older than the thread's owner, or of another run, is refused."""

    attempt: int | None = None
    run_uid: str | None = None


@dataclass(frozen=True)
class BlobRow:
    """A stored channel value of a LangGraph checkpoint (its serde type and bytes)."""

    channel: str
    version: str
    type: str
    blob: bytes | None


@dataclass(frozen=True)
class WriteRow:
    """A stored pending write of a LangGraph task."""

    task_id: str
    idx: int
    channel: str
    type: str
    value: bytes | None
    task_path: str = ""


@dataclass(frozen=True)
class CheckpointRow:
    """A stored LangGraph checkpoint: its ids, parent, serialized checkpoint and metadata."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    type: str
    checkpoint: bytes
    metadata_type: str
    metadata: bytes
    # channel -> version (as text) of the checkpoint: the blobs it uses.
    channel_versions: dict[str, str]
    run_id: str | None = None

    def stored(self) -> tuple[Any, ...]:
        """Its values in the order the stores' checkpoint statements take them (the versions as JSON text)."""
        return (
            self.thread_id,
            self.checkpoint_ns,
            self.checkpoint_id,
            self.parent_checkpoint_id,
            self.type,
            self.checkpoint,
            self.metadata_type,
            self.metadata,
            json.dumps(self.channel_versions),
            self.run_id,
        )


@dataclass
class Loaded:
    """A checkpoint row with its pending writes and the blobs of the versions it names."""

    row: CheckpointRow
    writes: list[WriteRow] = field(default_factory=list)
    blobs: dict[tuple[str, str], BlobRow] = field(default_factory=dict)


@dataclass(frozen=True)
class Query:
    """Which checkpoints ``list`` returns, newest first per thread and namespace (``None``: any)."""

    thread_id: str | None = None
    checkpoint_ns: str | None = None
    checkpoint_id: str | None = None
    # Only checkpoints older than this id (uuid6 ids sort in time order).
    before: str | None = None


@dataclass(frozen=True)
class Claim:
    """A side-effect call's start to record (``intent_claim``'s arguments)."""

    key: str
    tool_name: str
    idempotency_key: str | None
    args_digest: str | None


@dataclass(frozen=True)
class Prefetched:
    """A message's ledger entries and intent claims, read and made before its calls start (``lookup_and_claim``).

    ``keys``: every key looked up (absent from ``entries``: no entry); ``claimed``: per claimed key the
    intent recorded before, or ``None`` when this start was recorded now.
    """

    keys: frozenset[str]
    entries: dict[str, LedgerEntry]
    claimed: dict[str, Intent | None]


class RowStore(Protocol):
    """The LangGraph tables of one of our stores. Every write is fenced and runs in one transaction."""

    # Whether the store's connections belong to the event loop that opened them (asyncpg pools do).
    bound_to_loop: bool = False

    @abc.abstractmethod
    async def put(
        self, row: CheckpointRow, blobs: list[BlobRow], *, fence: Fence, parent_writes: Sequence[WriteRow] = ()
    ) -> None:
        """Insert (or overwrite, same id) a checkpoint and insert its new blobs (kept if present).

        ``parent_writes``: pending writes of the checkpoint's parent (the tasks that produced this one),
        stored with it in the same transaction as ``put_writes`` would store them.
        """

    @abc.abstractmethod
    async def put_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, writes: list[WriteRow], *, fence: Fence
    ) -> None:
        """Insert pending writes: a regular write (idx >= 0) is kept if present, a special one replaced."""

    @abc.abstractmethod
    async def get(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None) -> Loaded | None:
        """The checkpoint with this id (the newest of the namespace if ``None``), its writes and blobs, in one read."""

    @abc.abstractmethod
    async def select(self, query: Query) -> list[CheckpointRow]:
        """The checkpoints matching ``query``, newest first within each thread and namespace."""

    @abc.abstractmethod
    async def load(self, rows: list[CheckpointRow]) -> list[Loaded]:
        """Each row with its pending writes and the blobs of its channel versions."""

    @abc.abstractmethod
    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread: its LangGraph tables and, with them, all our store keeps for it."""

    @abc.abstractmethod
    async def delete_for_runs(self, run_ids: list[str]) -> None:
        """Delete the checkpoints whose metadata ``run_id`` is one of ``run_ids``, and their writes."""

    @abc.abstractmethod
    async def copy_thread(self, source: str, target: str, *, fence: Fence) -> None:
        """Copy every checkpoint, write and blob of ``source`` to ``target`` (kept where ``target`` has it)."""

    @abc.abstractmethod
    async def prune(self, thread_ids: list[str], *, keep_latest: bool, fence: Fence) -> None:
        """Delete each thread's checkpoints (all, or all but the newest per namespace) and what only they used."""
