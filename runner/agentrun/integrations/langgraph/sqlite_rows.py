"""The LangGraph tables on SQLite (sqlite.py migration 7), through ``SqliteCheckpointer``'s own worker thread.

Every write runs in ``BEGIN IMMEDIATE`` on the store's single connection,
checks the owner under that write lock (``base.check_fence``) and lands
whole or not at all. Reads run in one read transaction. ``hazards`` as in
``pg_rows``: no compare-and-set on a checkpoint's parent (LangGraph forks),
metadata filtered in Python.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from typing_extensions import override

from agentrun.checkpoint.sqlite import SqliteCheckpointer

from .rows import BlobRow, CheckpointRow, Fence, Loaded, Query, RowStore, WriteRow

T = TypeVar("T")

_PUT_BLOB = """
    INSERT INTO lg_blobs (thread_id, checkpoint_ns, channel, version, blob_type, blob) VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
"""
_PUT_CHECKPOINT = """
    INSERT INTO lg_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type,
                                checkpoint, metadata_type, metadata, channel_versions, run_id, attempt, run_uid,
                                created_at)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = excluded.parent_checkpoint_id, checkpoint_type = excluded.checkpoint_type,
        checkpoint = excluded.checkpoint, metadata_type = excluded.metadata_type, metadata = excluded.metadata,
        channel_versions = excluded.channel_versions, run_id = excluded.run_id, attempt = excluded.attempt,
        run_uid = excluded.run_uid
"""
# A regular write (idx >= 0) is kept if present; a special one (idx < 0) is replaced (see pg_rows).
_PUT_WRITE = """
    INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, value_type, value,
                           task_path, attempt, run_uid)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        channel = excluded.channel, value_type = excluded.value_type, value = excluded.value,
        task_path = excluded.task_path, attempt = excluded.attempt, run_uid = excluded.run_uid
    WHERE lg_writes.idx < 0
"""
_COLUMNS = """
    thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint, metadata_type,
    metadata, channel_versions, run_id
"""
_GET_ONE = f"SELECT {_COLUMNS} FROM lg_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
_GET_LATEST = f"""
    SELECT {_COLUMNS} FROM lg_checkpoints WHERE thread_id = ? AND checkpoint_ns = ?
    ORDER BY checkpoint_id DESC LIMIT 1
"""
_LIST = f"""
    SELECT {_COLUMNS} FROM lg_checkpoints
    WHERE (?1 IS NULL OR thread_id = ?1) AND (?2 IS NULL OR checkpoint_ns = ?2)
      AND (?3 IS NULL OR checkpoint_id = ?3) AND (?4 IS NULL OR checkpoint_id < ?4)
    ORDER BY thread_id, checkpoint_ns, checkpoint_id DESC
"""
_WRITES = """
    SELECT task_id, idx, channel, value_type, value, task_path FROM lg_writes
    WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""
_BLOB = """
    SELECT blob_type, blob FROM lg_blobs WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ?
"""
_DELETE_RUN_WRITES = """
    DELETE FROM lg_writes WHERE EXISTS (
        SELECT 1 FROM lg_checkpoints c WHERE c.run_id IN (SELECT value FROM json_each(?))
          AND c.thread_id = lg_writes.thread_id AND c.checkpoint_ns = lg_writes.checkpoint_ns
          AND c.checkpoint_id = lg_writes.checkpoint_id)
"""
_RUN_THREADS = "SELECT DISTINCT thread_id FROM lg_checkpoints WHERE run_id IN (SELECT value FROM json_each(?))"
_DELETE_RUN_CHECKPOINTS = "DELETE FROM lg_checkpoints WHERE run_id IN (SELECT value FROM json_each(?))"
_SOURCE_EXISTS = "SELECT 1 FROM lg_checkpoints WHERE thread_id = ? LIMIT 1"
_COPY_BLOBS = """
    INSERT INTO lg_blobs (thread_id, checkpoint_ns, channel, version, blob_type, blob)
    SELECT ?2, checkpoint_ns, channel, version, blob_type, blob FROM lg_blobs WHERE thread_id = ?1
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
"""
_COPY_CHECKPOINTS = """
    INSERT INTO lg_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type,
                                checkpoint, metadata_type, metadata, channel_versions, run_id, attempt, run_uid,
                                created_at)
    SELECT ?2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint, metadata_type,
           metadata, channel_versions, run_id, ?3, ?4, created_at
    FROM lg_checkpoints WHERE thread_id = ?1
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO NOTHING
"""
_COPY_WRITES = """
    INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, value_type, value,
                           task_path, attempt, run_uid)
    SELECT ?2, checkpoint_ns, checkpoint_id, task_id, idx, channel, value_type, value, task_path, ?3, ?4
    FROM lg_writes WHERE thread_id = ?1
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
"""
_PRUNE_CHECKPOINTS = """
    DELETE FROM lg_checkpoints WHERE thread_id = ?1 AND (?2 = 0 OR checkpoint_id < (
        SELECT max(l.checkpoint_id) FROM lg_checkpoints l
        WHERE l.thread_id = lg_checkpoints.thread_id AND l.checkpoint_ns = lg_checkpoints.checkpoint_ns))
"""
_PRUNE_WRITES = """
    DELETE FROM lg_writes WHERE thread_id = ? AND NOT EXISTS (
        SELECT 1 FROM lg_checkpoints c WHERE c.thread_id = lg_writes.thread_id
          AND c.checkpoint_ns = lg_writes.checkpoint_ns AND c.checkpoint_id = lg_writes.checkpoint_id)
"""
_PRUNE_BLOBS = """
    DELETE FROM lg_blobs WHERE thread_id = ? AND NOT EXISTS (
        SELECT 1 FROM lg_checkpoints c, json_each(c.channel_versions) v
        WHERE c.thread_id = lg_blobs.thread_id AND c.checkpoint_ns = lg_blobs.checkpoint_ns
          AND v.key = lg_blobs.channel AND v.value = lg_blobs.version)
"""

_Record = tuple[str, str, str, str | None, str, bytes, str, bytes, str, str | None]


def _row(r: _Record) -> CheckpointRow:
    return CheckpointRow(
        thread_id=r[0],
        checkpoint_ns=r[1],
        checkpoint_id=r[2],
        parent_checkpoint_id=r[3],
        type=r[4],
        checkpoint=bytes(r[5]),
        metadata_type=r[6],
        metadata=bytes(r[7]),
        channel_versions=dict(json.loads(r[8])),
        run_id=r[9],
    )


def _load(conn: sqlite3.Connection, rows: Sequence[CheckpointRow]) -> list[Loaded]:
    loaded = []
    for row in rows:
        one = Loaded(row)
        key = (row.thread_id, row.checkpoint_ns, row.checkpoint_id)
        for w in conn.execute(_WRITES, key):
            one.writes.append(WriteRow(w[0], w[1], w[2], w[3], None if w[4] is None else bytes(w[4]), w[5]))
        for channel, version in row.channel_versions.items():
            b = conn.execute(_BLOB, (row.thread_id, row.checkpoint_ns, channel, version)).fetchone()
            if b is not None:
                one.blobs[(channel, version)] = BlobRow(channel, version, b[0], None if b[1] is None else bytes(b[1]))
        loaded.append(one)
    return loaded


class SqliteRows(RowStore):
    """The LangGraph tables of ``store`` (its file, worker thread and write lock)."""

    def __init__(self, store: SqliteCheckpointer) -> None:
        self.store = store

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self.store._run(lambda conn: self.store._write_txn(conn, fn))

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def run(conn: sqlite3.Connection) -> T:
            # One read transaction: a checkpoint, its writes and blobs as one snapshot.
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")

        return await self.store._run(run)

    def _fence(self, conn: sqlite3.Connection, thread_id: str, fence: Fence) -> None:
        self.store._ensure_thread(conn, thread_id, time.time())
        self.store._check_fence(conn, thread_id, fence.attempt, fence.run_uid)

    @override
    async def put(
        self, row: CheckpointRow, blobs: list[BlobRow], *, fence: Fence, parent_writes: Sequence[WriteRow] = ()
    ) -> None:
        def txn(conn: sqlite3.Connection) -> None:
            self._fence(conn, row.thread_id, fence)
            if parent_writes and row.parent_checkpoint_id is not None:
                self._insert_writes(
                    conn, row.thread_id, row.checkpoint_ns, row.parent_checkpoint_id, parent_writes, fence
                )
            conn.executemany(
                _PUT_BLOB, [(row.thread_id, row.checkpoint_ns, b.channel, b.version, b.type, b.blob) for b in blobs]
            )
            conn.execute(
                _PUT_CHECKPOINT,
                (
                    *row.stored(),
                    fence.attempt,
                    fence.run_uid,
                    time.time(),
                ),
            )

        await self._write(txn)

    @override
    async def put_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, writes: list[WriteRow], *, fence: Fence
    ) -> None:
        def txn(conn: sqlite3.Connection) -> None:
            self._fence(conn, thread_id, fence)
            self._insert_writes(conn, thread_id, checkpoint_ns, checkpoint_id, writes, fence)

        if writes:
            await self._write(txn)

    @staticmethod
    def _insert_writes(
        conn: sqlite3.Connection,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[WriteRow],
        fence: Fence,
    ) -> None:
        conn.executemany(
            _PUT_WRITE,
            [
                (
                    thread_id,
                    checkpoint_ns,
                    checkpoint_id,
                    w.task_id,
                    w.idx,
                    w.channel,
                    w.type,
                    w.value,
                    w.task_path,
                    fence.attempt,
                    fence.run_uid,
                )
                for w in writes
            ],
        )

    @override
    async def get(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None) -> Loaded | None:
        def query(conn: sqlite3.Connection) -> Loaded | None:
            if checkpoint_id is None:
                record = conn.execute(_GET_LATEST, (thread_id, checkpoint_ns)).fetchone()
            else:
                record = conn.execute(_GET_ONE, (thread_id, checkpoint_ns, checkpoint_id)).fetchone()
            return None if record is None else _load(conn, [_row(record)])[0]

        return await self._read(query)

    @override
    async def select(self, query: Query) -> list[CheckpointRow]:
        def run(conn: sqlite3.Connection) -> list[CheckpointRow]:
            args = (query.thread_id, query.checkpoint_ns, query.checkpoint_id, query.before)
            return [_row(r) for r in conn.execute(_LIST, args)]

        return await self._read(run)

    @override
    async def load(self, rows: list[CheckpointRow]) -> list[Loaded]:
        return await self._read(lambda conn: _load(conn, rows))

    @override
    async def delete_thread(self, thread_id: str) -> None:
        await self._write(lambda conn: conn.execute("DELETE FROM threads WHERE thread_id = ?", (thread_id,)))

    @override
    async def delete_for_runs(self, run_ids: list[str]) -> None:
        def txn(conn: sqlite3.Connection) -> None:
            ids = json.dumps(run_ids)
            threads = [r[0] for r in conn.execute(_RUN_THREADS, (ids,))]
            conn.execute(_DELETE_RUN_WRITES, (ids,))
            conn.execute(_DELETE_RUN_CHECKPOINTS, (ids,))
            for thread_id in threads:
                conn.execute(_PRUNE_BLOBS, (thread_id,))

        if run_ids:
            await self._write(txn)

    @override
    async def copy_thread(self, source: str, target: str, *, fence: Fence) -> None:
        def txn(conn: sqlite3.Connection) -> None:
            if conn.execute(_SOURCE_EXISTS, (source,)).fetchone() is None:
                return
            self._fence(conn, target, fence)
            conn.execute(_COPY_BLOBS, (source, target))
            conn.execute(_COPY_CHECKPOINTS, (source, target, fence.attempt, fence.run_uid))
            conn.execute(_COPY_WRITES, (source, target, fence.attempt, fence.run_uid))

        await self._write(txn)

    @override
    async def prune(self, thread_ids: list[str], *, keep_latest: bool, fence: Fence) -> None:
        def txn(conn: sqlite3.Connection) -> None:
            for thread_id in sorted(set(thread_ids)):
                if conn.execute(_SOURCE_EXISTS, (thread_id,)).fetchone() is None:
                    continue
                self._fence(conn, thread_id, fence)
                conn.execute(_PRUNE_CHECKPOINTS, (thread_id, int(keep_latest)))
                conn.execute(_PRUNE_WRITES, (thread_id,))
                conn.execute(_PRUNE_BLOBS, (thread_id,))

        if thread_ids:
            await self._write(txn)
