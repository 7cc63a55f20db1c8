"""``AgentrunSaver``: a LangGraph ``BaseCheckpointSaver`` kept in agentrun's own store (PostgreSQL or SQLite).

What it promises (and LangGraph's conformance suite checks, every base
capability and the extended ones, ``tests/.../test_langgraph_conformance.py``):

- checkpoints, their channel values and pending writes live in our store,
  under our thread rows (tables ``lg_checkpoints``, ``lg_blobs``,
  ``lg_writes``, created by the store's own migrations); a channel value is
  written once per version, not once per step;
- a super-step is one statement and one commit: a task's pending writes
  wait (at most ``hold_writes``, 2 ms) for the checkpoint that follows them
  and go with it (``hold``: the window, and what a crash in it re-runs);
- every write is fenced like our own: a saver built with the runner's
  ``attempt`` and ``run_uid`` raises ``FencedError`` (and writes nothing)
  once a newer attempt registered on the thread;
- outages are ridden out by the store's own retries; past its
  ``retry_timeout`` calls raise ``StoreUnavailableError`` (the runner exits 8);
- ``delete_thread`` deletes the thread from our store: its LangGraph
  history, our ledger and its ownership go together;
- sync methods are thin wrappers that run the async ones on agentrun's one
  blocking-API loop (``agentrun.blocking``);
- the store is set up (created or migrated) on first use, in whichever loop
  uses it; ``setup()`` does it at a time of your choosing, from sync code
  (``saver.setup()``, on the blocking-API loop) or async code
  (``await saver.setup()``).

HAZARDS
- A store used through the sync methods belongs to that loop: do not also use
  the same PostgreSQL store object from another event loop (asyncpg pools are
  bound to one loop). SQLite has no such limit. In particular a sync program
  must not ``asyncio.run(saver.setup())``: the PostgreSQL pool would belong to
  a loop that is closed when ``invoke`` runs. The saver refuses that with a
  ``RuntimeError`` saying what to call instead.
- Checkpoints are not compare-and-set on their parent: LangGraph forks on
  purpose (``update_state``, time travel). Two live writers of one thread are
  kept apart by fencing only, i.e. only when each registered its attempt.
- ``list`` filters metadata in Python over the thread's checkpoint rows (as
  LangGraph's in-memory saver compares): fine for a thread's history, not a
  query engine across many threads.
"""

from __future__ import annotations

import asyncio
import importlib
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Generator, Iterator, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from typing_extensions import override

from agentrun import blocking
from agentrun.checkpoint.base import Checkpointer
from agentrun.errors import FencedError, StoreUnavailableError
from agentrun.faults import fault_point

from .hold import WRITE_HOLD_WINDOW, Held, Ride, Rider, WriteHold
from .rows import EMPTY, ROW_STORES, BlobRow, CheckpointRow, Fence, Loaded, Query, RowStore, WriteRow


def row_store(store: Checkpointer) -> RowStore:
    """The LangGraph tables of ``store`` (``rows.ROW_STORES``); ``TypeError`` for a store without them (memory)."""
    inner = getattr(store, "inner", store)  # CachedStore: the hot cache covers our own state rows only
    where = ROW_STORES.get(inner.backend)
    if where is None:
        raise TypeError(
            f"AgentrunSaver needs a store with LangGraph tables ({', '.join(sorted(ROW_STORES))}), "
            f"not {type(inner).__name__}; for tests without a store use LangGraph's InMemorySaver"
        )
    module, name = where.split(":")
    factory: Callable[[Checkpointer], RowStore] = getattr(importlib.import_module(module), name)
    return factory(inner)


class _Done(Coroutine[Any, Any, None]):
    """What ``setup()`` returns when it already set the store up (called outside any event loop).

    A coroutine that finishes at its first step, so awaiting it is a no-op and
    so is ``asyncio.run(saver.setup())`` (``setup()`` ran before that loop
    existed, on the loop ``invoke`` uses); unlike a native coroutine, dropping
    it unawaited (plain ``saver.setup()``) warns of nothing.
    """

    def send(self, value: Any) -> None:
        raise StopIteration

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> None:
        raise typ if val is None else val

    def close(self) -> None:
        pass

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}}


class AgentrunSaver(BaseCheckpointSaver[str]):
    """``AgentrunSaver(store)``: LangGraph checkpoints in ``store`` (``agentrun.checkpoint.from_url(...)``).

    ``attempt`` and ``run_uid``: the writer's identity for fencing (the
    runner passes its own); without them writes are not fenced. The store
    is set up on first use; ``setup()`` does it earlier (sync or async).
    ``hold_writes``: seconds a task's pending writes may wait for the
    checkpoint that follows them, to go in one statement with it (``hold``;
    default 2 ms; 0 stores each task's writes on its own at once).
    """

    def __init__(
        self,
        store: Checkpointer,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
        serde: SerializerProtocol | None = None,
        hold_writes: float = WRITE_HOLD_WINDOW,
    ) -> None:
        super().__init__(serde=serde)
        self.store = store
        self.rows = row_store(store)
        self.fence = Fence(attempt=attempt, run_uid=run_uid)
        # A task's writes wait up to this long for the checkpoint after them, to share its statement (hold.py).
        self._hold = WriteHold(hold_writes, self._send_writes)
        # A LangGraph run's progress row (run.py's mirror) that may ride in the next checkpoint's statement: set by
        # the runner; taken only when the store can take both in one (PostgreSQL, ``rides_lg_steps``).
        self.rider: Rider | None = None
        self._rides = bool(getattr(store, "rides_lg_steps", False))
        # Stores that row now, whatever is staged (``run._Mirror.send_now``): LedgerToolNode calls it beside its
        # ledger prefetch, so the progress names the tool node before any of its side effects can happen.
        self.progress_now: Callable[[str], Awaitable[None]] | None = None
        # The loop the store was last set up in: set up again in another (cheap when current), refused
        # when that loop has closed and the store's connections belonged to it (``_ready``).
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AgentrunSaver:
        """A saver on a new store for ``url`` (``sqlite:///path.db`` or ``postgresql://...``)."""
        from agentrun.checkpoint import from_url

        return cls(from_url(url), **kwargs)

    def setup(self) -> Awaitable[None]:
        """Create or migrate the store's schema (the LangGraph tables are one of its migrations).

        Sync or async, as the saver is: in a sync program ``saver.setup()``
        does it at once, on agentrun's blocking-API loop where ``invoke`` and
        ``stream`` use the store; in async code ``await saver.setup()``
        (``asetup``). Optional: the saver sets the store up on first use.
        Raises what the store raises (``StoreConfigError``,
        ``StoreUnavailableError``, ``StorageError``) and ``RuntimeError`` for a
        PostgreSQL store set up in an event loop that has closed since.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # sync code: the loop the sync methods run the store on
            blocking.run(self.asetup, caller="setup")
            return _Done()
        return self.asetup()

    async def asetup(self) -> None:
        """``setup()`` in async code: create or migrate the store's schema for use in the running loop."""
        loop = asyncio.get_running_loop()
        self._refuse_a_closed_loop(loop)
        await self.store.setup()
        self._loop = loop

    async def _ready(self) -> None:
        """Set the store up on first use in this loop (a no-op once it was)."""
        if self._loop is not asyncio.get_running_loop():
            await self.asetup()

    def _refuse_a_closed_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """``RuntimeError`` when the store's connections belong to a loop that has closed: they cannot be used."""
        previous = self._loop
        if previous is not None and previous is not loop and previous.is_closed() and self.rows.bound_to_loop:
            raise RuntimeError(
                "AgentrunSaver's PostgreSQL store was set up in an event loop that has closed since (for example "
                "asyncio.run(saver.asetup()) before app.invoke() in a sync program); its connections belonged to "
                "that loop. In a sync program call saver.setup(), or nothing (the saver sets the store up on first "
                "use); in async code set it up and use it in the same loop"
            )

    async def aclose(self) -> None:
        """Close the agentrun store under the saver (``RuntimeError`` if its connections' loop has closed)."""
        self._refuse_a_closed_loop(asyncio.get_running_loop())
        await self.store.aclose()
        self._loop = None  # closed stores open their connections again in whichever loop uses them next

    def close(self) -> None:
        """``aclose`` from sync code (on the blocking-API loop, where the sync methods used the store)."""
        blocking.run(self.aclose, caller="close")

    async def __aenter__(self) -> AgentrunSaver:
        await self.asetup()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> AgentrunSaver:
        self.setup()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- rows <-> LangGraph ------------------------------------------------------------------

    def _tuple(self, loaded: Loaded, metadata: CheckpointMetadata | None = None) -> CheckpointTuple:
        row = loaded.row
        checkpoint: Checkpoint = self.serde.loads_typed((row.type, row.checkpoint))
        values: dict[str, Any] = {}
        for channel, version in row.channel_versions.items():
            blob = loaded.blobs.get((channel, version))
            if blob is not None and blob.type != EMPTY:
                values[channel] = self.serde.loads_typed((blob.type, blob.blob or b""))
        writes = sorted(loaded.writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
        parent = row.parent_checkpoint_id
        return CheckpointTuple(
            config=_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=metadata if metadata is not None else self._metadata(row),
            parent_config=_config(row.thread_id, row.checkpoint_ns, parent) if parent else None,
            pending_writes=[(w.task_id, w.channel, self.serde.loads_typed((w.type, w.value or b""))) for w in writes],
        )

    def _metadata(self, row: CheckpointRow) -> CheckpointMetadata:
        metadata: CheckpointMetadata = self.serde.loads_typed((row.metadata_type, row.metadata))
        return metadata

    # -- async API ------------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``, else the newest of its namespace), or ``None``."""
        await self._ready()
        configurable = config["configurable"]
        loaded = await self.rows.get(
            str(configurable["thread_id"]), configurable.get("checkpoint_ns", ""), get_checkpoint_id(config)
        )
        return None if loaded is None else self._tuple(loaded)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first (per thread and namespace), filtered by metadata equality, at most ``limit``."""
        await self._ready()
        configurable = config["configurable"] if config else {}
        thread_id = configurable.get("thread_id")
        query = Query(
            thread_id=None if thread_id is None else str(thread_id),
            checkpoint_ns=configurable.get("checkpoint_ns"),
            checkpoint_id=get_checkpoint_id(config) if config else None,
            before=get_checkpoint_id(before) if before else None,
        )
        chosen: list[tuple[CheckpointRow, CheckpointMetadata]] = []
        for row in await self.rows.select(query):
            if limit is not None and len(chosen) >= limit:
                break
            metadata = self._metadata(row)
            if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                continue
            chosen.append((row, metadata))
        if not chosen:
            return
        for loaded, (_, metadata) in zip(await self.rows.load([r for r, _ in chosen]), chosen, strict=True):
            yield self._tuple(loaded, metadata)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` and the values of its ``new_versions``; returns the config naming it.

        Raises ``FencedError`` when this saver's attempt was superseded, ``StoreUnavailableError``
        when the store stayed unreachable past its retry bound.
        """
        await self._ready()
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns: str = configurable.get("checkpoint_ns", "")
        parent = configurable.get("checkpoint_id")
        # Taken before the checkpoint is serialized (a long history takes a while): its timer must not fire meanwhile.
        held = None if parent is None else self._hold.take((thread_id, checkpoint_ns, str(parent)))
        this = (thread_id, checkpoint_ns, checkpoint["id"])
        self._hold.writing(this)
        try:
            await self._put(config, checkpoint, metadata, new_versions, held)
        finally:
            self._hold.written(this)
        return _config(thread_id, checkpoint_ns, checkpoint["id"])

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        held: Held | None,
    ) -> None:
        """The checkpoint's statement, carrying ``held`` (its parent's pending writes) when there are any."""
        try:
            row, blobs = self._rows(config, checkpoint, metadata, new_versions)
        except BaseException:
            if held is not None:
                self._hold.send_alone(held)  # the writes are fine: they go on their own
            raise
        if (ride := self._ride(row.thread_id)) is not None and await self._put_riding(row, blobs, held, ride):
            return
        if held is None:
            await self.rows.put(row, blobs, fence=self.fence)
            return
        try:
            await self.rows.put(row, blobs, fence=self.fence, parent_writes=held.rows)
        except BaseException as e:
            held.settle(e)  # the writes shared the statement: they did not land either
            raise
        fault_point("after_lg_step_commit", ",".join(held.nodes))
        held.settle(None)

    def _ride(self, thread_id: str) -> Ride | None:
        if self.rider is None or not self._rides:
            return None
        return self.rider(thread_id)

    async def _put_riding(self, row: CheckpointRow, blobs: list[BlobRow], held: Held | None, ride: Ride) -> bool:
        """The checkpoint (with ``held``) and ``ride`` in one statement; ``False``: the ride could not go, the
        checkpoint still has to (its writes unsettled).

        An error of the ride alone (its version was taken, its values would not encode) leaves the checkpoint to
        go alone: LangGraph's durability does not wait on our mirror. A fenced writer or a store down stays
        fatal to both, as the checkpoint alone would meet the same.
        """
        try:
            step = self.rows.step_args(row, blobs, self.fence, held.rows if held is not None else ())  # type: ignore[attr-defined]
            commit = await self.store.acommit_with_lg_step(  # type: ignore[attr-defined]
                ride.thread_id,
                ride.write,
                step,
                expected_version=ride.expected_version,
                attempt=ride.attempt,
                run_uid=ride.run_uid,
            )
        except BaseException as e:
            ride.landed(None, e)
            if isinstance(e, Exception) and not isinstance(e, FencedError | StoreUnavailableError):
                return False  # the ride's own error: the checkpoint goes alone
            if held is not None:  # fatal to both, or cancelled (the statement may or may not have landed)
                held.settle(e)
            raise
        ride.landed(commit, None)
        # The detail: the held writes' nodes, and the row's LangGraph step (a test picks one ride of several).
        fault_point("after_progress_ride", f"{','.join(held.nodes) if held is not None else ''}:{ride.write.step}")
        if held is not None:
            held.settle(None)
        return True

    def _rows(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[CheckpointRow, list[BlobRow]]:
        """``checkpoint`` as our rows: the checkpoint without its values, and a blob per new channel version."""
        configurable = config["configurable"]
        body = checkpoint.copy()
        values: dict[str, Any] = body.pop("channel_values")  # type: ignore[misc]
        blobs = []
        for channel, version in new_versions.items():
            kind, data = self.serde.dumps_typed(values[channel]) if channel in values else (EMPTY, b"")
            blobs.append(BlobRow(channel, str(version), kind, data))
        kind, data = self.serde.dumps_typed(body)
        full_metadata = get_checkpoint_metadata(config, metadata)
        meta_kind, meta_data = self.serde.dumps_typed(full_metadata)
        run_id = full_metadata.get("run_id")
        row = CheckpointRow(
            thread_id=str(configurable["thread_id"]),
            checkpoint_ns=configurable.get("checkpoint_ns", ""),
            checkpoint_id=checkpoint["id"],
            parent_checkpoint_id=configurable.get("checkpoint_id"),
            type=kind,
            checkpoint=data,
            metadata_type=meta_kind,
            metadata=meta_data,
            channel_versions={k: str(v) for k, v in checkpoint["channel_versions"].items()},
            run_id=None if run_id is None else str(run_id),
        )
        return row, blobs

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for the checkpoint ``config`` names (fenced, like ``aput``).

        Returns once they are stored: regular writes may wait up to ``hold_writes`` seconds for the
        checkpoint that follows them, to share its statement (``hold``: what a crash may lose then).
        """
        await self._ready()
        configurable = config["configurable"]
        rows = []
        for idx, (channel, value) in enumerate(writes):
            kind, data = self.serde.dumps_typed(value)
            rows.append(WriteRow(task_id, WRITES_IDX_MAP.get(channel, idx), channel, kind, data, task_path))
        key = (
            str(configurable["thread_id"]),
            configurable.get("checkpoint_ns", ""),
            str(configurable["checkpoint_id"]),
        )
        if self._hold.window <= 0 or not rows or any(w.idx < 0 for w in rows):
            # Special writes (error, interrupt, resume) are acted on at once: stored before this returns.
            await self._send_writes(key, rows)
            return
        node = task_path.rsplit(", ", 1)[-1]
        stored = self._hold.add(key, rows, node)
        fault_point("after_lg_writes_held", node)
        await asyncio.shield(stored)

    async def _send_writes(self, key: tuple[str, str, str], rows: list[WriteRow]) -> None:
        """Pending writes on their own statement (not held, or held past the window)."""
        thread_id, checkpoint_ns, checkpoint_id = key
        await self.rows.put_writes(thread_id, checkpoint_ns, checkpoint_id, rows, fence=self.fence)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the thread from our store: its checkpoints and writes, and our ledger and owner with them."""
        await self._ready()
        await self.rows.delete_thread(str(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is one of ``run_ids``."""
        await self._ready()
        await self.rows.delete_for_runs([str(r) for r in run_ids])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, write and value of one thread to another (the complete parent chain)."""
        await self._ready()
        await self.rows.copy_thread(str(source_thread_id), str(target_thread_id), fence=self.fence)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep the newest checkpoint per namespace (and its writes and values); ``delete``: all."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy must be 'keep_latest' or 'delete', not {strategy!r}")
        await self._ready()
        await self.rows.prune([str(t) for t in thread_ids], keep_latest=strategy == "keep_latest", fence=self.fence)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Zero-padded counter and a random tail (LangGraph's own format): sorts as text, unique per write."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- sync API: the async one on agentrun's blocking loop --------------------------------------

    @override
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return blocking.run(lambda: self.aget_tuple(config), caller="get_tuple")

    @override
    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        return blocking.iterate(
            lambda: cast(
                AsyncGenerator[CheckpointTuple, None], self.alist(config, filter=filter, before=before, limit=limit)
            ),
            caller="list",
        )

    @override
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return blocking.run(lambda: self.aput(config, checkpoint, metadata, new_versions), caller="put")

    @override
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        blocking.run(lambda: self.aput_writes(config, writes, task_id, task_path), caller="put_writes")

    @override
    def delete_thread(self, thread_id: str) -> None:
        blocking.run(lambda: self.adelete_thread(thread_id), caller="delete_thread")

    @override
    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        blocking.run(lambda: self.adelete_for_runs(run_ids), caller="delete_for_runs")

    @override
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        blocking.run(lambda: self.acopy_thread(source_thread_id, target_thread_id), caller="copy_thread")

    @override
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        blocking.run(lambda: self.aprune(thread_ids, strategy=strategy), caller="prune")
