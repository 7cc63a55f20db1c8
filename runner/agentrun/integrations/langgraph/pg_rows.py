"""The LangGraph tables on PostgreSQL (pg_schema migration 13), through ``PgCheckpointer``'s own plumbing.

Every call runs through the store's transaction runner, so it inherits the
store's guarantees: transient failures retried with backoff for the store's
``retry_timeout``, then ``StoreUnavailableError`` (the runner exits 8);
configuration errors at once as ``StoreConfigError``. ``put`` and
``put_writes`` are one statement each, one round trip (server-side
functions, pg_schema migration 14); a ``put`` that carries its parent's
pending writes (the saver's super-step, the per-step path) is one statement
too (migration 18). Every write locks our
thread row ``FOR SHARE`` and checks the owner first (``base.check_fence``),
exactly like a ledger record: a superseded attempt's write raises
``FencedError`` and nothing of it lands, and a registration of a newer
attempt waits for writes in flight. Every write is idempotent (a retry after
a lost COMMIT acknowledgement lands the same rows).

HAZARDS
- LangGraph checkpoints are not linearly versioned: time travel and
  ``update_state`` fork from any checkpoint, so ``put`` does no
  compare-and-set on the parent; fencing is what keeps a stale pod out.
- ``list`` reads the matching checkpoint rows (without their values) and
  filters metadata in Python, exactly as LangGraph's in-memory saver
  compares; a thread with a very long history pays for that read.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import asyncpg
from typing_extensions import override

from agentrun.checkpoint.base import Intent, LedgerEntry
from agentrun.checkpoint.pg_connection import _loads
from agentrun.checkpoint.postgres import PgCheckpointer, _fence_txn, _tool_row_outcome

from .rows import BlobRow, CheckpointRow, Claim, Fence, Loaded, Prefetched, Query, RowStore, WriteRow

if TYPE_CHECKING:
    from agentrun.checkpoint.pg_schema import Connection

# A checkpoint with its new blobs, and a task's writes: one statement each, one round trip, autocommitted
# (pg_schema migration 14: the thread row FOR SHARE, the fence, the inserts). Blobs: DO NOTHING, a (channel,
# version) is written once and LangGraph never gives one version two values. Checkpoints: DO UPDATE, a put of
# an id that exists is the same checkpoint again (a retried write) or LangGraph rewriting it; the last write
# wins, as in LangGraph's own PostgreSQL saver. Writes: a regular write (idx >= 0) is kept if present (a
# task's first result stays, LangGraph's rule); a special one (error, interrupt, resume, scheduled: idx < 0)
# is replaced by the latest.
_PUT = """
    SELECT o_outcome, o_owner_run_uid, o_owner_attempt
    FROM agentrun_lg_put($1, $2, $3, $4, $5, $6, $7, $8, $9::json, $10, $11, $12, $13, $14, $15, $16)
"""
# A super-step (migration 18): the writes of the tasks that ran from the parent checkpoint, the new checkpoint
# and its blobs, one statement and one commit, with the same conflict rules as _PUT and _PUT_WRITES.
_PUT_STEP = """
    SELECT o_outcome, o_owner_run_uid, o_owner_attempt
    FROM agentrun_lg_put_step($1, $2, $3, $4, $5, $6, $7, $8, $9::json, $10, $11, $12, $13, $14, $15, $16,
                              $17, $18, $19, $20, $21, $22, $23)
"""
# A message's ledger work before its calls start, in one round trip (LedgerToolNode's prefetch): the entries of
# every key (and of the side-effect keys' pause markers), and the intents of the side-effect calls that have no
# entry claimed by migration 17's agentrun_claim_intents (fenced; the recorded intent, or this one recorded). A
# key with an entry is not claimed: that call is a replay, it never starts (as when looked up, then claimed).
_LOOKUP_CLAIM = """
    WITH found AS (
        SELECT e.tool_call_id, e.tool_name, COALESCE(e.result_text, e.result::text) AS result,
               extract(epoch FROM e.created_at)::float8 AS created_at
        FROM tool_executions e WHERE e.thread_id = $1 AND e.tool_call_id = ANY($2::text[])
    ), wanted AS (
        SELECT c.key, c.tool, c.idem, c.digest, c.ord
        FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS c (key, tool, idem, digest, ord)
        WHERE NOT EXISTS (SELECT 1 FROM found f WHERE f.tool_call_id = c.key)
    )
    SELECT (SELECT COALESCE(json_agg(json_build_array(f.tool_call_id, f.tool_name, f.result, f.created_at)), '[]')
            FROM found f)::text AS found,
           ARRAY(SELECT w.key FROM wanted w ORDER BY w.ord) AS claimed_keys, i.*
    FROM agentrun_claim_intents(
        $1, ARRAY(SELECT w.key FROM wanted w ORDER BY w.ord), ARRAY(SELECT w.tool FROM wanted w ORDER BY w.ord),
        ARRAY(SELECT w.idem FROM wanted w ORDER BY w.ord), ARRAY(SELECT w.digest FROM wanted w ORDER BY w.ord),
        $7, $8) AS i
"""
_PUT_WRITES = """
    SELECT o_outcome, o_owner_run_uid, o_owner_attempt
    FROM agentrun_lg_put_writes($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
"""
_COLUMNS = """
    thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint, metadata_type,
    metadata, channel_versions, run_id
"""
# COLLATE "C": checkpoint ids are uuid6 strings, whose byte order is their time order.
_GET_ONE = f"""
    SELECT {_COLUMNS} FROM lg_checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3
"""
_GET_LATEST = f"""
    SELECT {_COLUMNS} FROM lg_checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2
    ORDER BY checkpoint_id COLLATE "C" DESC LIMIT 1
"""
_LIST = f"""
    SELECT {_COLUMNS} FROM lg_checkpoints
    WHERE ($1::text IS NULL OR thread_id = $1) AND ($2::text IS NULL OR checkpoint_ns = $2)
      AND ($3::text IS NULL OR checkpoint_id = $3) AND ($4::text IS NULL OR checkpoint_id COLLATE "C" < $4)
    ORDER BY thread_id, checkpoint_ns, checkpoint_id COLLATE "C" DESC
"""
_WRITES = """
    SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, value_type, value, task_path
    FROM lg_writes w
    JOIN unnest($1::text[], $2::text[], $3::text[]) AS c (thread_id, checkpoint_ns, checkpoint_id)
        USING (thread_id, checkpoint_ns, checkpoint_id)
"""
_BLOBS = """
    SELECT thread_id, checkpoint_ns, channel, version, blob_type, blob
    FROM lg_blobs
    JOIN unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k (thread_id, checkpoint_ns, channel, version)
        USING (thread_id, checkpoint_ns, channel, version)
"""
# Our thread row goes, and with it (ON DELETE CASCADE) its checkpoints, writes and blobs, ledger and owner.
_DELETE_THREAD = "DELETE FROM threads WHERE thread_id = $1"
_DELETE_RUN_WRITES = """
    DELETE FROM lg_writes w USING lg_checkpoints c
    WHERE c.run_id = ANY($1::text[]) AND w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
      AND w.checkpoint_id = c.checkpoint_id
"""
_DELETE_RUN_CHECKPOINTS = "DELETE FROM lg_checkpoints WHERE run_id = ANY($1::text[]) RETURNING thread_id"
_COPY_CHECKPOINTS = """
    INSERT INTO lg_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type,
                                checkpoint, metadata_type, metadata, channel_versions, run_id, attempt, run_uid)
    SELECT $2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint, metadata_type,
           metadata, channel_versions, run_id, $3, $4
    FROM lg_checkpoints WHERE thread_id = $1
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO NOTHING
"""
_COPY_BLOBS = """
    INSERT INTO lg_blobs (thread_id, checkpoint_ns, channel, version, blob_type, blob)
    SELECT $2, checkpoint_ns, channel, version, blob_type, blob FROM lg_blobs WHERE thread_id = $1
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
"""
_COPY_WRITES = """
    INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, value_type, value,
                           task_path, attempt, run_uid)
    SELECT $2, checkpoint_ns, checkpoint_id, task_id, idx, channel, value_type, value, task_path, $3, $4
    FROM lg_writes WHERE thread_id = $1
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
"""
_SOURCE_EXISTS = "SELECT EXISTS (SELECT 1 FROM lg_checkpoints WHERE thread_id = $1)"
# keep_latest: every checkpoint but the newest of each namespace, then the writes of those gone.
_PRUNE_CHECKPOINTS = """
    DELETE FROM lg_checkpoints c WHERE c.thread_id = $1 AND ($2 = false OR c.checkpoint_id COLLATE "C" < (
        SELECT max(l.checkpoint_id COLLATE "C") FROM lg_checkpoints l
        WHERE l.thread_id = c.thread_id AND l.checkpoint_ns = c.checkpoint_ns))
"""
_PRUNE_WRITES = """
    DELETE FROM lg_writes w WHERE w.thread_id = $1 AND NOT EXISTS (
        SELECT 1 FROM lg_checkpoints c WHERE c.thread_id = w.thread_id AND c.checkpoint_ns = w.checkpoint_ns
          AND c.checkpoint_id = w.checkpoint_id)
"""
# A blob no remaining checkpoint names is unreachable (LangGraph reads blobs only by a checkpoint's versions).
_PRUNE_BLOBS = """
    DELETE FROM lg_blobs b WHERE b.thread_id = $1 AND NOT EXISTS (
        SELECT 1 FROM lg_checkpoints c CROSS JOIN LATERAL json_each_text(c.channel_versions) v
        WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns AND v.key = b.channel
          AND v.value = b.version)
"""


def _row(record: asyncpg.Record) -> CheckpointRow:
    return CheckpointRow(
        thread_id=record["thread_id"],
        checkpoint_ns=record["checkpoint_ns"],
        checkpoint_id=record["checkpoint_id"],
        parent_checkpoint_id=record["parent_checkpoint_id"],
        type=record["checkpoint_type"],
        checkpoint=bytes(record["checkpoint"]),
        metadata_type=record["metadata_type"],
        metadata=bytes(record["metadata"]),
        channel_versions=dict(json.loads(record["channel_versions"])),
        run_id=record["run_id"],
    )


async def _load_txn(conn: Connection, rows: Sequence[CheckpointRow]) -> list[Loaded]:
    """Each row's writes and blobs, two queries for all of them."""
    loaded = [Loaded(row) for row in rows]
    if not rows:
        return loaded
    by_key = {(r.thread_id, r.checkpoint_ns, r.checkpoint_id): one for r, one in zip(rows, loaded, strict=True)}
    for w in await conn.fetch(
        _WRITES, [r.thread_id for r in rows], [r.checkpoint_ns for r in rows], [r.checkpoint_id for r in rows]
    ):
        value = None if w["value"] is None else bytes(w["value"])
        write = WriteRow(w["task_id"], w["idx"], w["channel"], w["value_type"], value, w["task_path"])
        by_key[(w["thread_id"], w["checkpoint_ns"], w["checkpoint_id"])].writes.append(write)
    wanted = [(r.thread_id, r.checkpoint_ns, ch, v) for r in rows for ch, v in r.channel_versions.items()]
    if wanted:
        blobs: dict[tuple[str, str], dict[tuple[str, str], BlobRow]] = defaultdict(dict)
        columns = [list(c) for c in zip(*wanted, strict=True)]
        for b in await conn.fetch(_BLOBS, *columns):
            blob = None if b["blob"] is None else bytes(b["blob"])
            row = BlobRow(b["channel"], b["version"], b["blob_type"], blob)
            blobs[(b["thread_id"], b["checkpoint_ns"])][(row.channel, row.version)] = row
        for one in loaded:
            one.blobs = blobs.get((one.row.thread_id, one.row.checkpoint_ns), {})
    return loaded


class PgRows(RowStore):
    """The LangGraph tables of ``store`` (its pool, schema, retries and fencing)."""

    bound_to_loop = True  # an asyncpg pool belongs to the loop that opened it

    def __init__(self, store: PgCheckpointer) -> None:
        self.store = store

    async def _fenced(self, op: str, thread_id: str, fence: Fence, sql: str, *args: Any) -> None:
        """One autocommitted statement of the fenced functions (migration 14), retried as the store retries."""

        async def once() -> None:
            async with self.store._connection() as conn:  # a transaction of its own behind a transaction pooler
                row = await conn.fetchrow(sql, *args)
            _tool_row_outcome(thread_id, row, attempt=fence.attempt, run_uid=fence.run_uid)

        await self.store._call(op, once)

    @override
    async def put(
        self, row: CheckpointRow, blobs: list[BlobRow], *, fence: Fence, parent_writes: Sequence[WriteRow] = ()
    ) -> None:
        if parent_writes and row.parent_checkpoint_id is not None:
            await self._put_step(row, blobs, fence, parent_writes)
            return
        await self._fenced(
            "langgraph checkpoint",
            row.thread_id,
            fence,
            _PUT,
            *_checkpoint_args(row, blobs, fence),
        )

    async def _put_step(
        self, row: CheckpointRow, blobs: list[BlobRow], fence: Fence, writes: Sequence[WriteRow]
    ) -> None:
        await self._fenced(
            "langgraph step", row.thread_id, fence, _PUT_STEP, row.thread_id, *self.step_args(row, blobs, fence, writes)
        )

    @staticmethod
    def step_args(
        row: CheckpointRow, blobs: list[BlobRow], fence: Fence, writes: Sequence[WriteRow]
    ) -> tuple[Any, ...]:
        """A super-step's parameters of ``agentrun_lg_put_step`` after the thread id (migration 18).

        Also what ``acommit_with_lg_step`` carries beside a progress row (migration 19).
        """
        return (
            *_checkpoint_args(row, blobs, fence)[1:],
            row.parent_checkpoint_id,
            [w.task_id for w in writes],
            [w.idx for w in writes],
            [w.channel for w in writes],
            [w.type for w in writes],
            [w.value for w in writes],
            [w.task_path for w in writes],
        )

    @override
    async def put_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, writes: list[WriteRow], *, fence: Fence
    ) -> None:
        if not writes:
            return
        await self._fenced(
            "langgraph writes",
            thread_id,
            fence,
            _PUT_WRITES,
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            fence.attempt,
            fence.run_uid,
            [w.task_id for w in writes],
            [w.idx for w in writes],
            [w.channel for w in writes],
            [w.type for w in writes],
            [w.value for w in writes],
            [w.task_path for w in writes],
        )

    async def lookup_and_claim(
        self, thread_id: str, keys: Sequence[str], claims: Sequence[Claim], *, fence: Fence
    ) -> Prefetched:
        """``keys``' ledger entries, and the intents of ``claims`` whose key has no entry, in one statement.

        Per claimed key the intent recorded before (the call is in doubt) or ``None`` (recorded now), as
        ``intent_claim`` answers. Raises ``FencedError`` for a superseded writer (nothing claimed).
        """
        tries = 0

        async def once() -> Prefetched:
            nonlocal tries
            tries += 1
            async with self.store._connection() as conn:
                row = await conn.fetchrow(
                    _LOOKUP_CLAIM,
                    thread_id,
                    list(keys),
                    [c.key for c in claims],
                    [c.tool_name for c in claims],
                    [c.idempotency_key for c in claims],
                    [c.args_digest for c in claims],
                    fence.attempt,
                    fence.run_uid,
                )
            _tool_row_outcome(thread_id, row, attempt=fence.attempt, run_uid=fence.run_uid)
            assert row is not None
            entries = {
                key: LedgerEntry(key, tool, _loads(text), float(at), text=text)
                for key, tool, text, at in json.loads(row["found"])
            }
            claimed: dict[str, Intent | None] = {}
            fields = zip(
                row["claimed_keys"],
                row["o_rows"],
                row["o_tool_names"],
                row["o_idempotency_keys"],
                row["o_started_at"],
                row["o_args_digests"],
                strict=True,
            )
            for key, outcome, tool, idem, at, digest in fields:
                # Recorded now, or a retry finding its own first try: this start is the first.
                first = outcome == "inserted" or (outcome == "own" and tries > 1)
                claimed[key] = None if first else Intent(key, str(tool), idem, float(at or 0.0), digest)
            return Prefetched(keys=frozenset(keys), entries=entries, claimed=claimed)

        return await self.store._call("ledger lookup and intent claim", once)

    @override
    async def get(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None) -> Loaded | None:
        async def query(conn: Connection) -> Loaded | None:
            if checkpoint_id is None:
                record = await conn.fetchrow(_GET_LATEST, thread_id, checkpoint_ns)
            else:
                record = await conn.fetchrow(_GET_ONE, thread_id, checkpoint_ns, checkpoint_id)
            if record is None:
                return None
            return (await _load_txn(conn, [_row(record)]))[0]

        return await self.store._read("langgraph get", query, snapshot=True)

    @override
    async def select(self, query: Query) -> list[CheckpointRow]:
        async def run(conn: Connection) -> list[CheckpointRow]:
            records = await conn.fetch(_LIST, query.thread_id, query.checkpoint_ns, query.checkpoint_id, query.before)
            return [_row(r) for r in records]

        return await self.store._read("langgraph list", run)

    @override
    async def load(self, rows: list[CheckpointRow]) -> list[Loaded]:
        return await self.store._read("langgraph load", lambda conn: _load_txn(conn, rows), snapshot=True)

    @override
    async def delete_thread(self, thread_id: str) -> None:
        async def txn(conn: Connection) -> None:
            await conn.execute(_DELETE_THREAD, thread_id)

        await self.store._write("langgraph delete_thread", txn)

    @override
    async def delete_for_runs(self, run_ids: list[str]) -> None:
        async def txn(conn: Connection) -> None:
            await conn.execute(_DELETE_RUN_WRITES, run_ids)
            threads = {r["thread_id"] for r in await conn.fetch(_DELETE_RUN_CHECKPOINTS, run_ids)}
            for thread_id in sorted(threads):
                await conn.execute(_PRUNE_BLOBS, thread_id)

        if run_ids:
            await self.store._write("langgraph delete_for_runs", txn)

    @override
    async def copy_thread(self, source: str, target: str, *, fence: Fence) -> None:
        async def txn(conn: Connection) -> None:
            if not await conn.fetchval(_SOURCE_EXISTS, source):
                return
            await _fence_txn(conn, target, fence.attempt, fence.run_uid)
            args: list[Any] = [source, target]
            await conn.execute(_COPY_BLOBS, *args)
            await conn.execute(_COPY_CHECKPOINTS, *args, fence.attempt, fence.run_uid)
            await conn.execute(_COPY_WRITES, *args, fence.attempt, fence.run_uid)

        await self.store._write("langgraph copy_thread", txn)

    @override
    async def prune(self, thread_ids: list[str], *, keep_latest: bool, fence: Fence) -> None:
        async def txn(conn: Connection) -> None:
            for thread_id in sorted(set(thread_ids)):
                if not await conn.fetchval(_SOURCE_EXISTS, thread_id):
                    continue  # nothing to prune (and no thread row to create for the fence)
                await _fence_txn(conn, thread_id, fence.attempt, fence.run_uid)
                await conn.execute(_PRUNE_CHECKPOINTS, thread_id, keep_latest)
                await conn.execute(_PRUNE_WRITES, thread_id)
                await conn.execute(_PRUNE_BLOBS, thread_id)

        if thread_ids:
            await self.store._write("langgraph prune", txn)


def _checkpoint_args(row: CheckpointRow, blobs: list[BlobRow], fence: Fence) -> tuple[Any, ...]:
    """The checkpoint's and its blobs' parameters, in the order both fenced functions (migrations 14, 18) take them."""
    return (
        *row.stored(),
        fence.attempt,
        fence.run_uid,
        [b.channel for b in blobs],
        [b.version for b in blobs],
        [b.type for b in blobs],
        [b.blob for b in blobs],
    )
